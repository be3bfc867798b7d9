"""The losses a run's ``loss.type`` or a dataset's ``loss`` may name, and the loss-side features, one entry each
(``PARTS``, in order): a ``Loss`` (name, title, kind, its settings, its hook, the data it needs) or a ``Feature``
(its settings), declared beside its code in ``jaxembed/losses/parts/``. The config's ``loss`` section and its checks
(``section_defaults``, ``check_section``: ``jaxembed.config``), each run's settings (``section_settings``:
``jaxembed.train.loss``), the readers (``jaxembed.data.readers``: which datasets keep every pair with its score),
the data checks (``jaxembed.data.loss_checks``), the objective (``jaxembed.losses.objective``: each loss's hook)
and the model card (``card_text``) read it; none of them names a loss of its own. It imports nothing of JAX, so the
data layer reads it too.

Adding a loss: one file in ``jaxembed/losses/parts/`` (its settings, its hook) and one entry in ``PARTS``
(``register`` adds one at run time). docs/architecture.md walks through an example.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from jaxembed.choices import LiveNames
from jaxembed.losses.parts import angle, contrastive, cosent, distill, gist, infonce, matryoshka, peg
from jaxembed.losses.parts.base import CONTRASTIVE, SCORED, Feature, Loss, Settings, positive  # noqa: F401

#: every part in order: its config keys follow ``loss.type`` and ``loss.temperature`` in this order, its card text
#: too (a loss's only when it is the run's ``loss.type``); a row's loss kind index is its loss's place among LOSSES
PARTS: list[Loss | Feature] = [
    contrastive.FEATURE,
    infonce.LOSS,
    peg.LOSS,
    matryoshka.FEATURE,
    distill.FEATURE,
    cosent.LOSS,
    angle.LOSS,
    gist.FEATURE,
]

LOSS_TABLE: dict[str, Loss] = {}


def _index() -> None:
    LOSS_TABLE.clear()
    LOSS_TABLE.update((x.name, x) for x in PARTS if isinstance(x, Loss))


def register(part: Loss | Feature) -> None:
    """Add a loss or a feature after the others (its settings' keys join the config's loss section)."""
    if any(x.name == part.name for x in PARTS):
        raise ValueError(f"a loss part named {part.name!r} is already registered")
    PARTS.append(part)
    _index()


def unregister(name: str) -> None:
    PARTS[:] = [x for x in PARTS if x.name != name]
    _index()


_index()


def names_of_kind(kind: str | None) -> tuple[str, ...]:
    """The losses of ``kind`` (None: every loss), in table order, as LOSS_TABLE holds them now."""
    return tuple(n for n, x in LOSS_TABLE.items() if kind is None or x.kind == kind)


#: every loss, and those of each kind, in table order (a row's loss kind index is its place in LOSSES)
LOSSES: Sequence[str] = LiveNames(partial(names_of_kind, None))
CONTRASTIVE_LOSSES: Sequence[str] = LiveNames(partial(names_of_kind, CONTRASTIVE))
SCORED_LOSSES: Sequence[str] = LiveNames(partial(names_of_kind, SCORED))

#: the section's own keys, before the parts': the run's loss and the default temperature (a dataset's
#: ``temperature`` overrides it for its batches)
HEAD = dict(type="infonce", temperature=0.05)


def titles(names) -> str:
    """``'CoSENT / AnglE'``: the losses ``names`` in prose, for messages."""
    return " / ".join(LOSS_TABLE[n].title for n in names)


def quoted(names) -> str:
    """``"'cosent' / 'angle'"``: the losses ``names`` as a config writes them, for messages."""
    return " / ".join(repr(n) for n in names)


def section_defaults() -> dict[str, Any]:
    """The config's ``loss`` section: HEAD, then each part's keys and defaults (a key two parts share, e.g.
    ``scored_scale``, once)."""
    out = dict(HEAD)
    for part in PARTS:
        for key, default in part.settings.defaults().items():
            if key in out and out[key] != default:
                raise ValueError(f"loss.{key}: {part.name} declares the default {default!r}, another part {out[key]!r}")
            out.setdefault(key, default)
    return out


def check_section(section) -> None:
    """The checks of the config's loss section: ``loss.type``, ``loss.temperature``, then each part's (UserError,
    one line)."""
    from jaxembed.losses.parts.base import one_of, refuse

    for key, check in (("type", one_of(*LOSSES)), ("temperature", positive)):
        allowed = check(section[key])
        if allowed:
            raise refuse(key, section[key], allowed)
    for part in PARTS:
        part.settings.check(section)


def section_settings(section) -> dict[str, Settings]:
    """{part name: its settings} of a run's (checked) loss section."""
    return {part.name: part.settings.from_section(section) for part in PARTS}


def card_text(loss_section: dict) -> str:
    """The run's loss on the model card beyond its name and temperature: each part's words in order, a loss's only
    when it is ``loss.type`` (a setting missing from an older config.json is written as None)."""
    run_loss = loss_section.get("type")
    return "".join(part.settings.card_of(loss_section) for part in PARTS
                   if not isinstance(part, Loss) or part.name == run_loss)
