"""Matryoshka's settings (``jaxembed.losses.matryoshka``): the objective summed over truncated prefixes of the
embeddings, with weights."""

from __future__ import annotations

import dataclasses

from jaxembed.losses.parts.base import Feature, Settings, is_number, refuse, setting


@dataclasses.dataclass(frozen=True)
class MatryoshkaSettings(Settings):
    """dims: the prefixes, e.g. (384, 256, 128, 64); weights: one per prefix, e.g. (1, .3, .2, .1); () = off."""

    dims: tuple = setting("matryoshka_dims", ())
    weights: tuple = setting("matryoshka_weights", ())

    @classmethod
    def check_section(cls, section) -> None:
        dims, ws = tuple(section.matryoshka_dims), tuple(section.matryoshka_weights)
        if any((not isinstance(d, int)) or d <= 0 for d in dims) or list(dims) != sorted(dims, reverse=True):
            raise refuse("matryoshka_dims", dims, "positive integers in decreasing order, e.g. (384, 256, 128, 64)")
        if len(dims) != len(ws):
            raise refuse("matryoshka_weights", ws, f"one weight per dimension of loss.matryoshka_dims {dims}")
        if any(not is_number(w) or w < 0 for w in ws) or (ws and not any(w > 0 for w in ws)):
            raise refuse("matryoshka_weights", ws, "numbers >= 0, at least one > 0, e.g. (1, .3, .2, .1)")
        if dims and section.impl == "shard_map":
            raise refuse("impl", section.impl, "'jit' when loss.matryoshka_dims is set (Matryoshka runs on global "
                                               "arrays)")

    @classmethod
    def card(cls, v: dict) -> str:
        if not v["dims"]:
            return ""
        return f", Matryoshka dims {list(v['dims'])} weights {list(v['weights'] or ())}"


FEATURE = Feature("matryoshka", MatryoshkaSettings)
