"""Losses on scored pairs (STS-style data: sentence1, sentence2, a similarity score): the model's similarity of
each pair must rank the pairs as their scores do, across the whole (global) batch.

CoSENT (Su 2022, "CoSENT (1): a more effective sentence vector scheme than Sentence-BERT", kexue.fm/archives/8847;
Huang et al. 2024, TASLP; the "cosine objective" of AnglE, Li & Li 2023, arXiv:2309.12871, Eq. 1;
sentence-transformers' ``CoSENTLoss``), with lambda = ``scale`` (20)::

    L = log(1 + sum_{(i, j): y_i > y_j} exp(lambda * (cos_j - cos_i)))

over pairs i, j of the batch (cos_i = cos(u_i, v_i) of pair i, y_i its score).

AnglE (Li & Li 2023, arXiv:2309.12871: the angle objective, Eq. 5, on the angle difference of the two texts in
complex space, Eq. 3-4; sentence-transformers' ``AnglELoss``): the same ranking objective with the angle similarity
in place of the cosine. Each embedding's first and second halves are the real and imaginary parts (an odd width is
padded with a zero); after L2 normalisation, the sum over dimensions of the complex quotient u / v is
cos(u, v) + i * sin_term with sin_term = sum_d (u_im v_re - u_re v_im), and::

    angle_sim(u, v) = |cos(u, v) + sin_term(u, v)|

(the reference code's ``angle_loss`` with pooling 'sum'; sentence-transformers' ``pairwise_angle_sim``). AnglE's
combined objective (Eq. 6: w1 L_cos + w2 L_ibn + w3 L_angle) is available as L_angle + ``cosine_weight`` * L_cos;
its in-batch-negative term needs positive pairs, which the contrastive losses give (a dataset of pairs with
``loss='infonce'``).

A pair takes part when its weight is > 0 and its score is finite; pairs with equal scores are never compared.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxembed.losses.core import normalize
from jaxembed.losses.table import LOSS_TABLE, SCORED_LOSSES as KINDS


def cosine_pairs(u: jax.Array, v: jax.Array) -> jax.Array:
    """cos(u_i, v_i) of each pair. u, v: [B, D] -> [B]."""
    return jnp.sum(normalize(u) * normalize(v), axis=1)


def angle_pairs(u: jax.Array, v: jax.Array) -> jax.Array:
    """angle_sim(u_i, v_i) = |cos + sin_term| of each pair (module docstring). u, v: [B, D] -> [B]."""
    u, v = normalize(u), normalize(v)
    if u.shape[1] % 2:
        pad = ((0, 0), (0, 1))
        u, v = jnp.pad(u, pad), jnp.pad(v, pad)
    h = u.shape[1] // 2
    cos = jnp.sum(u * v, axis=1)
    sin = jnp.sum(u[:, h:] * v[:, :h] - u[:, :h] * v[:, h:], axis=1)
    return jnp.abs(cos + sin)


def ranking_loss(sims: jax.Array, scores: jax.Array, member: jax.Array, scale: float = 20.0
                 ) -> tuple[jax.Array, jax.Array]:
    """log(1 + sum_{y_i > y_j} exp(scale * (sim_j - sim_i))) over the member pairs.

    sims: [B] the model's similarity of each pair; scores: [B] the labels (NaN allowed where not a member);
    member: [B] bool. Returns (loss, number of ordered pairs (i, j) compared). Materialises [B, B]."""
    scores = jax.lax.stop_gradient(jnp.where(member, scores, 0.0))
    d = scale * (sims[None, :] - sims[:, None])  # [i, j]: scale * (sim_j - sim_i)
    pair = member[:, None] & member[None, :] & (scores[:, None] > scores[None, :])
    x = jnp.where(pair, d, -jnp.inf).reshape(-1)
    loss = jax.nn.logsumexp(jnp.concatenate([jnp.zeros((1,), x.dtype), x]))
    return loss, jnp.sum(pair.astype(jnp.float32))


def cosent_loss(u: jax.Array, v: jax.Array, scores: jax.Array, member: jax.Array, scale: float
                ) -> tuple[jax.Array, jax.Array]:
    """CoSENT: the ranking loss on the cosines of the pairs."""
    return ranking_loss(cosine_pairs(u, v), scores, member, scale)


def angle_loss(u: jax.Array, v: jax.Array, scores: jax.Array, member: jax.Array, scale: float,
               cosine_weight: float = 0.0) -> tuple[jax.Array, jax.Array]:
    """AnglE: the ranking loss on the angle similarities, plus cosine_weight x CoSENT's (Eq. 6's w1, w3 = 1)."""
    loss, n = ranking_loss(angle_pairs(u, v), scores, member, scale)
    if cosine_weight:
        loss = loss + cosine_weight * ranking_loss(cosine_pairs(u, v), scores, member, scale)[0]
    return loss, n


def scored_loss(kind: str, u: jax.Array, v: jax.Array, scores: jax.Array, weights: jax.Array | None,
                settings=None, **fields) -> tuple[jax.Array, jax.Array]:
    """A scored-pair loss of ``jaxembed.losses.table`` (CoSENT, AnglE) on global arrays: (loss, number of ordered
    pairs compared), by its settings' ``pairs_loss``.

    u, v: [B, D] raw embeddings of each pair's two texts; scores: [B] (NaN: not a scored pair); weights: [B] (0:
    not a member) or None; settings: the loss's settings (default: its defaults), with ``fields`` replaced (e.g.
    ``scale=5.0``; AnglE's ``cosine_weight``)."""
    if kind not in KINDS:
        raise ValueError(f"scored-pair loss {kind!r} is not one of {', '.join(KINDS)}")
    settings = dataclasses.replace(settings or LOSS_TABLE[kind].settings(), **fields)
    member = jnp.isfinite(scores)
    if weights is not None:
        member = member & (weights > 0)
    return settings.pairs_loss(u, v, scores, member)


def scored_rows(settings, rows, weights: jax.Array, kind: str) -> tuple[jax.Array, dict]:
    """The hook of a scored-pair loss (``jaxembed.losses.objective``): its loss on the rows weighted by
    ``weights``, each row's pair being (query, positive) with the row's pair score; metrics ``<kind>_loss``."""
    if rows.pair_score is None:
        raise ValueError(f"{kind} needs the pair scores")
    loss, _ = scored_loss(kind, rows.q, rows.c[rows.pos_index], rows.pair_score, weights, settings)
    return loss, {f"{kind}_loss": loss}
