"""A loss added from outside the package, as docs/architecture.md ("A loss: one file, one entry") adds one: additive
margin InfoNCE (AM-Softmax over the in-batch candidates: the positive's cosine lowered by a margin before the
softmax), with one setting of its own, ``loss.am_margin``. tests/test_add_component_loss.py registers ``LOSS`` in
the loss table and trains it."""

from __future__ import annotations

import dataclasses

from jaxembed.losses.parts.base import CONTRASTIVE, Loss, Settings, non_negative, setting


@dataclasses.dataclass(frozen=True)
class AmSettings(Settings):
    """margin: subtracted from the positive's cosine (CosFace's m)."""

    margin: float = setting("am_margin", 0.2, non_negative)

    @classmethod
    def card(cls, v: dict) -> str:
        return f", additive margin {v['margin']}"


def rows(settings: AmSettings, rows, weights, kind: str):
    """The mean over the weighted rows of logsumexp_j((s_ij - m [j = p_i]) / tau) - (s_ip - m) / tau (filled
    candidates only); metric ``am_loss``."""
    import jax
    import jax.numpy as jnp

    from jaxembed.losses.core import normalize

    sims = normalize(rows.q) @ normalize(rows.c).T
    is_pos = jnp.arange(sims.shape[1])[None, :] == rows.pos_index[:, None]
    logits = (sims - settings.margin * is_pos) / rows.temperature
    valid = jnp.ones(sims.shape[1], bool) if rows.cand_valid is None else rows.cand_valid
    logits = jnp.where(valid[None, :] | is_pos, logits, -jnp.inf)
    per_row = jax.nn.logsumexp(logits, axis=1) - jnp.sum(jnp.where(is_pos, logits, 0.0), axis=1)
    loss = jnp.sum(weights * per_row) / jnp.maximum(jnp.sum(weights > 0), 1)
    return loss, {"am_loss": loss}


LOSS = Loss("am_infonce", "AM-InfoNCE", CONTRASTIVE, AmSettings, rows, "(query, positive, hard negatives) rows")
