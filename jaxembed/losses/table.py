"""The losses a run's ``loss.type`` or a dataset's ``loss`` may name, one entry each (``LOSS_TABLE``): its
function, its kind, the data it needs, the ``loss.*`` settings it reads and its text on the model card. The data
config's checks (``jaxembed.data.config``, ``jaxembed.config``), the readers (``jaxembed.data.formats``: which
datasets keep every pair with its score), the data checks (``jaxembed.data.loss_checks``), the objective
(``jaxembed.losses.objective``, ``jaxembed.losses.scored``) and the model card (``jaxembed.model_card``) read it;
none of them names a loss of its own. It imports nothing of JAX, so the data layer reads it too.

Adding a loss: its function in ``jaxembed/losses/`` and one ``Loss`` entry here; a new kind also needs its branch
in ``jaxembed.losses.objective.total_loss``. docs/architecture.md walks through an example.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

#: a query against its positive, its hard negatives and the other candidates of the batch (distillation and the
#: GIST guide act on these rows)
CONTRASTIVE = "contrastive"
#: a pair (sentence1, sentence2) and its similarity score: the model's similarities must rank the pairs as their
#: scores do; every scored pair is kept, with its score, and no score_threshold applies
SCORED = "scored"


@dataclass(frozen=True)
class Loss:
    """One loss. title: its name in prose; kind: CONTRASTIVE or SCORED (how the objective computes its rows and
    what its datasets hold); function: ``module:name`` of its function, imported when a step uses it (a contrastive
    kind's is the step's contrastive loss, PEG through ``LossOptions.peg``; a scored kind's is called by
    ``jaxembed.losses.scored.scored_loss``); data: what its datasets hold, for messages and docs; config_keys: the
    ``loss.*`` settings it reads that the other losses do not; card: its words on the model card's loss line,
    formatted with the run's loss section (only ``config_keys`` may appear in it)."""

    name: str
    title: str
    kind: str
    function: str
    data: str
    config_keys: tuple[str, ...] = ()
    card: str = ""

    def fn(self) -> Callable:
        module, _, attr = self.function.partition(":")
        return getattr(importlib.import_module(module), attr)


LOSS_TABLE: dict[str, Loss] = {x.name: x for x in (
    Loss("infonce", "InfoNCE", CONTRASTIVE, "jaxembed.losses.infonce:contrastive_loss",
         "(query, positive, hard negatives) rows: triplets, pairs, classification, sentence-transformers rows"),
    Loss("peg", "PEG", CONTRASTIVE, "jaxembed.losses.infonce:contrastive_loss",
         "(query, positive, hard negatives) rows, as InfoNCE", config_keys=("peg_alpha", "peg_beta"),
         card=", PEG alpha {peg_alpha} beta {peg_beta}"),
    Loss("cosent", "CoSENT", SCORED, "jaxembed.losses.scored:cosent_loss",
         "scored pairs (sentence1, sentence2, score)", config_keys=("scored_scale",)),
    Loss("angle", "AnglE", SCORED, "jaxembed.losses.scored:angle_loss",
         "scored pairs (sentence1, sentence2, score)", config_keys=("scored_scale", "angle_cosine_weight")),
)}

#: every loss, and those of each kind, in table order (a row's loss kind index is its place in LOSSES)
LOSSES = tuple(LOSS_TABLE)
CONTRASTIVE_LOSSES = tuple(x.name for x in LOSS_TABLE.values() if x.kind == CONTRASTIVE)
SCORED_LOSSES = tuple(x.name for x in LOSS_TABLE.values() if x.kind == SCORED)


def titles(names) -> str:
    """``'CoSENT / AnglE'``: the losses ``names`` in prose, for messages."""
    return " / ".join(LOSS_TABLE[n].title for n in names)


def quoted(names) -> str:
    """``"'cosent' / 'angle'"``: the losses ``names`` as a config writes them, for messages."""
    return " / ".join(repr(n) for n in names)


def card_text(loss_section: dict) -> str:
    """The run's loss on the model card beyond its name and temperature (``Loss.card`` of ``loss.type``; a setting
    missing from an older config.json is written as None)."""
    entry = LOSS_TABLE.get(loss_section.get("type"))
    if entry is None or not entry.card:
        return ""
    return entry.card.format(**{k: loss_section.get(k) for k in entry.config_keys})
