"""Gradient cache: encode a large global batch in sub-batches so that only one sub-batch's activations are alive.

The sub-batches run under ``lax.scan`` with ``jax.checkpoint`` (policy: save nothing). The forward pass keeps only
each sub-batch's embeddings. The contrastive loss then sees all embeddings of the batch at once. The backward pass
recomputes one sub-batch at a time and accumulates the parameter gradients. This is GradCache (Gao et al. 2021)
expressed with JAX transforms, at the same cost: one extra forward pass.

The loss is never split into micro-batches, because that would shrink the pool of negatives. Dropout in
sub-batch k uses ``fold_in(key, k)``, so the recomputation draws the same masks as the forward pass. Sub-batch k is
the strided row set {k, k + n, k + 2n, ...} (n sub-batches), so that a data-sharded batch stays sharded.

Packed rows (``pool_packed_chunked``; jaxembed.train.encode): the sub-batches are the strided *rows* of the pack,
sized in tokens by the loader (``jaxembed.data.pipeline.Packing.sub_tokens``). A text lies in one row, so each
sub-batch pools the texts of its rows; the pooled vectors [T, H] are merged into one array in the pack's text
order (a text takes the values of its row's sub-batch), which then goes through the Dense head once.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp

from jaxembed.errors import UserError


@dataclasses.dataclass(frozen=True)
class GradCacheSettings:
    """``train.gradcache_chunk`` (``chunk``): > 0 encodes the global batch in sub-batches of this many rows (the
    gradient cache); 0 = off. ``jaxembed.config`` takes the key's default from ``defaults()`` and checks it with
    ``check``; the model card's row is ``card_row``."""

    chunk: int = 0

    @classmethod
    def defaults(cls) -> dict[str, int]:
        """This feature's share of the config's ``train`` section."""
        return {"gradcache_chunk": cls().chunk}

    @staticmethod
    def check(train, global_batch_size: int) -> None:
        """A non-negative integer that divides ``plan.global_batch_size``; raises UserError (one line)."""
        v = train.gradcache_chunk
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
        if not (ok and float(v).is_integer()):
            raise UserError(f"config.train.gradcache_chunk = {v!r} is not valid: a non-negative integer")
        if v and global_batch_size % v:
            raise UserError(f"config.train.gradcache_chunk = {v!r} is not valid: a divisor of "
                            f"plan.global_batch_size ({global_batch_size})")

    @classmethod
    def from_config(cls, train) -> GradCacheSettings:
        """The settings of a run's ``train`` section (a plain dict or a ConfigDict; 0 when the key is missing)."""
        return cls(int(train.get("gradcache_chunk") or 0))

    def card_row(self) -> tuple[str, str] | None:
        """The model card's training row (None when off)."""
        if not self.chunk:
            return None
        return ("gradient cache", f"sub-batches of {self.chunk} {'row' if self.chunk == 1 else 'rows'}")


def encode_chunked(encode_fn: Callable[[Any, dict, jax.Array | None], jax.Array], params: Any, inputs: dict,
                   chunk_size: int | None, key: jax.Array | None = None) -> jax.Array:
    """Embeddings [M, D] of ``inputs`` (a dict of [M, ...] arrays) computed ``chunk_size`` rows at a time.

    encode_fn(params, chunk_inputs, chunk_key) -> [chunk, D]; chunk_key is fold_in(key, k) for sub-batch k (None
    without dropout). chunk_size None or >= M: a single call (no cache). M must be a multiple of chunk_size."""
    m = jax.tree.leaves(inputs)[0].shape[0]
    if chunk_size is None or chunk_size >= m:
        return encode_fn(params, inputs, None if key is None else jax.random.fold_in(key, 0))
    if m % chunk_size:
        raise ValueError(f"gradient cache: {m} rows are not a multiple of the sub-batch size {chunk_size}")
    n = m // chunk_size
    # Strided sub-batches: sub-batch k holds rows k, k + n, k + 2n, ... A batch sharded contiguously over D
    # devices (each holding M / D consecutive rows) then keeps chunk_size / D rows of every sub-batch on every
    # device: no collective, each device encodes only its own rows. (Contiguous sub-batches would put a whole
    # sub-batch on one or two devices and make XLA all-gather the batch: every device encoding every sub-batch.)
    xs = jax.tree.map(lambda x: x.reshape((chunk_size, n) + x.shape[1:]).swapaxes(0, 1), inputs)

    def body(p, x, k):
        sub = None if key is None else jax.random.fold_in(key, k)
        return encode_fn(p, x, sub)

    body = jax.checkpoint(body, policy=jax.checkpoint_policies.nothing_saveable)

    def step(_, xk):
        x, k = xk
        return None, body(params, x, k)

    _, out = jax.lax.scan(step, None, (xs, jnp.arange(n, dtype=jnp.int32)))
    return out.swapaxes(0, 1).reshape((m,) + out.shape[2:])  # back to the input row order


def pool_packed_chunked(pool_fn: Callable[[Any, dict, jax.Array, jax.Array | None], jax.Array], params: Any,
                        rows: dict, text_row: jax.Array, n: int, key: jax.Array | None = None) -> jax.Array:
    """Pooled vectors [T, H] of packed texts computed in ``n`` sub-batches of rows.

    rows: dict of row arrays [S*R, ...] (S shards of R rows; R a multiple of n); text_row: [T] each text's row
    within its shard. Sub-batch k = the rows k, k + n, ... of every shard (as ``encode_chunked``: each device keeps
    R/n rows of every sub-batch). pool_fn(params, sub_rows, sub_text_row, sub_key) -> [T, H]: the pooled vector of
    every text whose row is in the sub-batch (``text_row // n`` within it; other texts: anything finite);
    sub_key = fold_in(key, k) (None without dropout)."""
    m = jax.tree.leaves(rows)[0].shape[0]
    if m % n:
        raise ValueError(f"gradient cache: {m} packed rows are not a multiple of {n} sub-batches")
    xs = jax.tree.map(lambda x: x.reshape((m // n, n) + x.shape[1:]).swapaxes(0, 1), rows)
    sub_row, which = text_row // n, text_row % n

    def body(p, x, k):
        return pool_fn(p, x, sub_row, None if key is None else jax.random.fold_in(key, k))

    body = jax.checkpoint(body, policy=jax.checkpoint_policies.nothing_saveable)

    def step(acc, xk):
        x, k = xk
        return jnp.where((which == k)[:, None], body(params, x, k), acc), None

    x0 = jax.tree.map(lambda x: x[0], xs)
    out = jax.eval_shape(lambda: body(params, x0, jnp.int32(0)))
    acc, _ = jax.lax.scan(step, jnp.zeros(out.shape, out.dtype), (xs, jnp.arange(n, dtype=jnp.int32)))
    return acc
