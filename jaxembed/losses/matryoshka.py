"""Matryoshka representation loss (docs/design.md, KaLM-Embedding): the contrastive loss summed over truncated,
re-normalised prefixes of the embeddings, with weights. KaLM: dims 896, 512, 256, 128, 64 with 1, .3, .2, .1, .1."""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp

from jaxembed.losses.infonce import contrastive_loss

KALM_DIMS = (896, 512, 256, 128, 64)
KALM_WEIGHTS = (1.0, 0.3, 0.2, 0.1, 0.1)


def matryoshka_loss(q, c, pos_index, *, dims: Sequence[int], dim_weights: Sequence[float],
                    loss_fn=contrastive_loss, **kwargs):
    """sum_k weight_k * L(q[:, :d_k], c[:, :d_k]). q: [B, D], c: [N, D]; every d_k <= D (the largest is usually D).

    loss_fn: L(q, c, pos_index, **kwargs) -> (loss, metrics), ``contrastive_loss`` or the whole objective
    (``objective.total_loss``); each prefix is re-normalised there. Metrics are those of the first
    (largest) dimension plus ``loss_dim{d}`` for each prefix; PEG's momentum comes from the first dimension."""
    if len(dims) != len(dim_weights) or not dims:
        raise ValueError(f"matryoshka dims {tuple(dims)} and weights {tuple(dim_weights)} must be non-empty and of "
                         "equal length")
    width = q.shape[-1]
    bad = [d for d in dims if not 0 < d <= width]
    if bad:
        raise ValueError(f"matryoshka dims {bad} exceed the embedding width {width} (or are not positive)")
    total = jnp.asarray(0.0, jnp.float32)
    metrics = {}
    for k, (d, w) in enumerate(zip(dims, dim_weights)):
        loss, m = loss_fn(q[:, :d], c[:, :d], pos_index, **kwargs)
        total = total + w * loss
        if k == 0:
            metrics.update(m)
        metrics[f"loss_dim{d}"] = m["loss"]
    metrics["loss"] = total
    return total, metrics
