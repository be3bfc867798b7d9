"""The GIST guide's settings (``jaxembed.losses.gist``; the guide is loaded by ``jaxembed.train.loss``): a guide
model (folder / hub id, the student's tokenizer) that masks false negatives, the candidates it finds closer to the
query than g(q, p) - margin."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from jaxembed.errors import UserError
from jaxembed.losses.parts.base import Feature, Settings, number, one_of, setting

MARGIN_STRATEGIES = ("absolute", "relative")


@dataclasses.dataclass(frozen=True)
class GistSettings(Settings):
    """guide: '' = no guide; margin; margin_strategy: 'absolute' | 'relative' (margin x |g(q, p)|)."""

    guide: str = setting("gist_guide", "")
    margin: float = setting("gist_margin", 0.0,
                            number("0: mask what the guide finds at least as close as the positive"))
    margin_strategy: str = setting("gist_margin_strategy", "absolute", one_of(*MARGIN_STRATEGIES))

    @classmethod
    def check_section(cls, section) -> None:
        guide = section.gist_guide
        if guide:
            p = Path(os.path.expanduser(str(guide)))
            hub_id = not str(guide).startswith((".", "/", "~")) and str(guide).count("/") == 1 and not p.exists()
            if not (p.is_dir() and (p / "config.json").is_file()) and not hub_id:
                raise UserError(f"config.loss.gist_guide = {str(guide)!r}: no model folder there (fix: a model folder "
                                "or hub id with the same tokenizer as model.name, e.g. the model itself or a larger "
                                "one of its family; '' = no guide)")

    @classmethod
    def card(cls, v: dict) -> str:
        return f", GIST guide `{v['guide']}`" if v["guide"] else ""


FEATURE = Feature("gist", GistSettings)
