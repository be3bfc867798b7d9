"""PEG's progressive InfoNCE (``jaxembed.losses.infonce``: ``peg_statistics``; docs/design.md, PEG): the
contrastive path with PEG's weights, whose momentum t the train state carries."""

from __future__ import annotations

import dataclasses

from jaxembed.losses.parts.base import CONTRASTIVE, Loss, Settings, momentum, non_negative, setting


@dataclasses.dataclass(frozen=True)
class PegSettings(Settings):
    """alpha: the momentum of t over steps; beta: the margin below the batch's mean positive similarity."""

    alpha: float = setting("peg_alpha", 0.5, momentum)
    beta: float = setting("peg_beta", 0.1, non_negative)

    @classmethod
    def card(cls, v: dict) -> str:
        return f", PEG alpha {v['alpha']} beta {v['beta']}"

    def contrastive_path(self) -> tuple[dict, dict]:
        return {"peg": True}, {"peg_alpha": self.alpha, "peg_beta": self.beta}


def rows(settings: PegSettings, rows, weights, kind: str):
    """The contrastive loss with PEG's weights; in a batch mixing kinds, one without PEG rows leaves the momentum
    as it was."""
    loss, m = rows.contrastive(rows.q, rows.c, rows.pos_index, weights, kind)
    if rows.mixed and "peg_t" in m:
        import jax.numpy as jnp

        prev = jnp.asarray(0.0 if rows.peg_t_prev is None else rows.peg_t_prev, jnp.float32)
        m = dict(m, peg_t=jnp.where(m["active_queries"] > 0, m["peg_t"], prev))
    return loss, m


LOSS = Loss("peg", "PEG", CONTRASTIVE, PegSettings, rows, "(query, positive, hard negatives) rows, as InfoNCE")
