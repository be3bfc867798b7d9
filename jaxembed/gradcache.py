"""Gradient cache: encode a large global batch in sub-batches so that only one sub-batch's activations are alive.

The sub-batches run under ``lax.scan`` with ``jax.checkpoint`` (policy: save nothing). The forward pass keeps only
each sub-batch's embeddings. The contrastive loss then sees all embeddings of the batch at once. The backward pass
recomputes one sub-batch at a time and accumulates the parameter gradients. This is GradCache (Gao et al. 2021)
expressed with JAX transforms, at the same cost: one extra forward pass.

The loss is never split into micro-batches, because that would shrink the pool of negatives. Dropout in
sub-batch k uses ``fold_in(key, k)``, so the recomputation draws the same masks as the forward pass. Sub-batch k is
the strided row set {k, k + n, k + 2n, ...} (n sub-batches), so that a data-sharded batch stays sharded.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp


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
