"""Masked-language-model corruption and loss, as pure functions on arrays (inside jit).

RetroMAE (Xiao et al. 2022, "RetroMAE: Pre-Training Retrieval-oriented Language Models Via Masked Auto-Encoder",
Sec. 3.2) corrupts the same text twice: lightly for the encoder (ratio 0.15-0.3) and heavily for the decoder
(0.5-0.7). Each corruption picks exactly k = max(1, round(ratio * n)) of a row's n maskable tokens (real tokens
that are not special tokens: [CLS], [SEP], [PAD], [UNK], [MASK] are never picked), then applies BERT's rule
(Devlin et al. 2019, Sec. 3.1): 80 % of the picked tokens become [MASK], 10 % a random non-special token, 10 % stay.
The loss is the cross-entropy at the picked positions only.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

IGNORE = -1  # label of a position that is not predicted


def maskable(input_ids: jax.Array, attention_mask: jax.Array, special_ids: jax.Array) -> jax.Array:
    """input_ids, attention_mask: [B, L]; special_ids: [S] -> bool [B, L]: real tokens that are not special."""
    return attention_mask.astype(bool) & ~jnp.isin(input_ids, special_ids)


def choose(key: jax.Array, can: jax.Array, ratio: float) -> jax.Array:
    """can: bool [B, L] -> bool [B, L] with exactly max(1, round(ratio * n_b)) True entries per row among the
    n_b maskable ones (none when n_b = 0), uniformly at random."""
    n = can.sum(axis=1)
    k = jnp.where(n > 0, jnp.maximum(1, jnp.round(ratio * n)), 0).astype(jnp.int32)
    u = jnp.where(can, jax.random.uniform(key, can.shape), 2.0)  # non-maskable positions rank last
    rank = jnp.argsort(jnp.argsort(u, axis=1), axis=1)
    return (rank < k[:, None]) & can


def corrupt(key: jax.Array, input_ids: jax.Array, selected: jax.Array, *, mask_id: int, vocab_size: int,
            special_ids: jax.Array, p_mask: float = 0.8, p_random: float = 0.1) -> tuple[jax.Array, jax.Array]:
    """BERT's 80/10/10 rule on the selected positions. input_ids: [B, L] int; selected: bool [B, L] ->
    (corrupted ids [B, L], labels [B, L]: the original id where selected, IGNORE elsewhere). A random
    replacement that falls on a special token becomes [MASK]."""
    k1, k2 = jax.random.split(key)
    r = jax.random.uniform(k1, input_ids.shape)
    rand = jax.random.randint(k2, input_ids.shape, 0, vocab_size, dtype=input_ids.dtype)
    rand = jnp.where(jnp.isin(rand, special_ids), mask_id, rand)
    ids = jnp.where(selected & (r < p_mask), jnp.asarray(mask_id, input_ids.dtype), input_ids)
    ids = jnp.where(selected & (r >= p_mask) & (r < p_mask + p_random), rand, ids)
    labels = jnp.where(selected, input_ids, IGNORE)
    return ids, labels


def max_selected(length: int, ratio: float) -> int:
    """An upper bound of max(1, round(ratio * n)) for n <= length: the static number of predicted slots."""
    return max(1, math.ceil(ratio * length))


def gather_selected(hidden: jax.Array, labels: jax.Array, m: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The predicted positions first: hidden [B, L, H], labels [B, L] -> (hidden [B, m, H], labels [B, m],
    valid bool [B, m]). m must be >= the number of labelled positions of any row (``max_selected``)."""
    sel = labels != IGNORE
    idx = jnp.argsort(~sel, axis=1, stable=True)[:, :m]
    h = jnp.take_along_axis(hidden, idx[..., None], axis=1)
    lab = jnp.take_along_axis(labels, idx, axis=1)
    return h, jnp.maximum(lab, 0), jnp.take_along_axis(sel, idx, axis=1)


def mlm_loss(logits: jax.Array, labels: jax.Array, valid: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """logits: [B, m, V] float32, labels: [B, m] int, valid: bool [B, m] -> (mean cross-entropy over the valid
    slots, accuracy of the argmax, number of valid slots)."""
    logz = jax.nn.logsumexp(logits, axis=-1)
    gold = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    w = valid.astype(jnp.float32)
    n = jnp.maximum(w.sum(), 1.0)
    loss = ((logz - gold) * w).sum() / n
    acc = ((jnp.argmax(logits, axis=-1) == labels) * w).sum() / n
    return loss, acc, w.sum()
