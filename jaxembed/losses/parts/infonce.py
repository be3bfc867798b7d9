"""InfoNCE over the global batch (``jaxembed.losses.infonce``): the plain contrastive loss, through the run's
contrastive path (``parts.contrastive``); no setting of its own."""

from __future__ import annotations

from jaxembed.losses.parts.base import CONTRASTIVE, Loss, NoSettings


def rows(settings: NoSettings, rows, weights, kind: str):
    """The contrastive loss of the rows weighted by ``weights``."""
    return rows.contrastive(rows.q, rows.c, rows.pos_index, weights, kind)


LOSS = Loss("infonce", "InfoNCE", CONTRASTIVE, NoSettings, rows,
            "(query, positive, hard negatives) rows: triplets, pairs, classification, sentence-transformers rows")
