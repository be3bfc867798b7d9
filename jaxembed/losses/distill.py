"""Distillation from a teacher's scores of each query's own candidates (its positive and hard negatives).

Notation: B queries, K candidate slots per query (the loader's layout: slot 0 the positive, slots 1..K-1 the hard
negatives), s_ik the student's cosine similarity of query i and its candidate k, t_ik the teacher's score (NaN:
no score), v_ik whether slot k holds a candidate.

KL (RocketQAv2, Ren et al. 2021, its dynamic listwise distillation: the KL divergence between the teacher's and the
student's distributions over a query's candidate list; FlagEmbedding's ``kd_loss_type='kl_div'``, whose list is the
query's own group as here)::

    p^T_i = softmax_k(t_ik / T),  p^S_i = softmax_k(s_ik / tau)  over the slots with v_ik
    l_i   = KL(p^T_i || p^S_i) = sum_k p^T_ik (log p^T_ik - log p^S_ik)

tau is the batch's contrastive temperature (FlagEmbedding: the student's scores are its contrastive logits) and T
the teacher's (FlagEmbedding: 1 on reranker scores; bi-encoder cosines, as ``jaxembed teacher-score`` writes, need a
temperature like the student's). FlagEmbedding minimises the cross-entropy -sum_k p^T log p^S, which differs from
the KL by the teacher's entropy, a constant: the gradients are equal and the KL is 0 at a perfect match.

MarginMSE (Hofstätter et al. 2020, "Improving Efficient Neural Ranking Models with Cross-Architecture Knowledge
Distillation", the Margin-MSE loss; sentence-transformers' ``MarginMSELoss``), for each hard negative k >= 1::

    l_ik = ((s_i0 - s_ik) - (t_i0 - t_ik))^2

on cosine similarities: the teacher's scores should be on the cosine scale (teacher-score writes cosines).

A query takes part when its weight is > 0, its positive has a teacher score and so has every candidate in its
slots (KL; MarginMSE: each negative with a score counts); the loss is the weighted mean over those queries (KL) or
(query, negative) pairs (MarginMSE). Teacher scores are constants (no gradient).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxembed.losses.core import normalize
from jaxembed.losses.parts import distill as declared

KINDS = tuple(k for k in declared.KINDS if k != "none")  # the distillations (loss.distill: also 'none', off)


def group_sims(q: jax.Array, c: jax.Array, pos_index: jax.Array | None, K: int) -> jax.Array:
    """Cosine similarity of each query with its own K candidate slots. q: [B, D], c: [N, D] (raw; normalised
    here); pos_index: [B] (slot 0 of query i is column pos_index[i], its slots are the next K columns), or None for
    the loader's layout (N = B * K, query i's slots are rows [iK, (i+1)K): a reshape, which keeps a batch-sharded c
    sharded) -> [B, K]."""
    q, c = normalize(q), normalize(c)
    if pos_index is None:
        group = c.reshape(q.shape[0], K, c.shape[-1])
    else:
        group = c[pos_index[:, None] + jnp.arange(K, dtype=pos_index.dtype)[None, :]]
    return jnp.einsum("bd,bkd->bk", q, group, preferred_element_type=jnp.float32)


def kl_terms(s: jax.Array, teacher: jax.Array, valid: jax.Array, temperature, teacher_temperature
             ) -> tuple[jax.Array, jax.Array]:
    """Per-query KL(teacher || student) over the query's own slots (module docstring).

    s: [B, K] student cosines; teacher: [B, K] (NaN = no score); valid: [B, K] bool. Returns (l [B], used [B] bool:
    the query has teacher scores for every filled slot, and at least two slots)."""
    teacher = jax.lax.stop_gradient(jnp.asarray(teacher, jnp.float32))
    has = jnp.isfinite(teacher)
    used = jnp.all(has | ~valid, axis=1) & valid[:, 0] & has[:, 0] & (jnp.sum(valid, axis=1) >= 2)
    keep = valid & used[:, None]  # rows that are not used get one dummy slot below, so nothing is NaN
    keep = keep.at[:, 0].set(True)
    log_ps = jax.nn.log_softmax(jnp.where(keep, s / temperature, -jnp.inf), axis=1)
    log_pt = jax.nn.log_softmax(jnp.where(keep, jnp.where(has, teacher, 0.0) / teacher_temperature, -jnp.inf), axis=1)
    pt = jnp.exp(log_pt)
    terms = jnp.where(keep, pt * (log_pt - log_ps), 0.0)
    return jnp.where(used, jnp.sum(terms, axis=1), 0.0), used


def margin_mse_terms(s: jax.Array, teacher: jax.Array, valid: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per (query, negative) squared margin error (module docstring). s, teacher: [B, K]; valid: [B, K] bool.
    Returns (l [B, K-1], used [B, K-1] bool)."""
    teacher = jax.lax.stop_gradient(jnp.asarray(teacher, jnp.float32))
    has = jnp.isfinite(teacher)
    used = valid[:, 1:] & has[:, 1:] & (valid[:, :1] & has[:, :1])
    t = jnp.where(has, teacher, 0.0)
    err = (s[:, :1] - s[:, 1:]) - (t[:, :1] - t[:, 1:])
    return jnp.where(used, err * err, 0.0), used


def distill_loss(kind: str, q: jax.Array, c: jax.Array, pos_index: jax.Array, teacher: jax.Array,
                 valid: jax.Array, weights: jax.Array | None, *, temperature, teacher_temperature=None
                 ) -> tuple[jax.Array, jax.Array]:
    """The distillation loss on global arrays: (loss, count of the queries (KL) or pairs (MarginMSE) it averages).

    q: [B, D], c: [N, D] raw embeddings; pos_index: [B] or None (``group_sims``); teacher, valid: [B, K]; weights: [B] (a query with weight 0
    takes no part); temperature: the student's tau; teacher_temperature: T (None: tau)."""
    K = teacher.shape[1]
    s = group_sims(q, c, pos_index, K)
    w = jnp.ones(q.shape[0], jnp.float32) if weights is None else jnp.asarray(weights, jnp.float32)
    if kind == "kl":
        tt = temperature if teacher_temperature is None else teacher_temperature
        terms, used = kl_terms(s, teacher, valid, temperature, tt)
        used = used & (w > 0)
        total = jnp.sum(jnp.where(used, w * terms, 0.0))
    elif kind == "margin_mse":
        terms, used = margin_mse_terms(s, teacher, valid)
        used = used & (w > 0)[:, None]
        total = jnp.sum(jnp.where(used, w[:, None] * terms, 0.0))
    else:
        raise ValueError(f"distillation {kind!r} is not one of {', '.join(KINDS)}")
    count = jnp.sum(used.astype(jnp.float32))
    return total / jnp.maximum(count, 1.0), count
