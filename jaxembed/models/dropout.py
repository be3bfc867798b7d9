"""Dropout masks with a quarter of the random-number work of ``jax.random.bernoulli``.

``jax.random.bernoulli`` draws one uniform float per element from one threefry2x32 evaluation (which yields 64
random bits; it keeps 32 and uses 23); on a CPU those evaluations are most of dropout's cost (a MiniLM train step on
packed rows of 128 slots: 2.32 s with dropout, 2.03 s without, one core). ``keep_mask`` keeps both 32-bit outputs of
each evaluation and cuts each into two 16-bit uniforms: four mask elements per evaluation. The keep probability is
rounded to a multiple of 2^-16 (0.9 -> 0.899994). The four parts are compared with the threshold before they are
joined, so what XLA stores is a bool mask, not the random words. Measured on one core in a MiniLM demo-mix train
step (profiler, per op): the random-number fusions 99 ms with two elements per 32-bit word of ``jax.random.bits``,
56 ms with four per evaluation. The counters are the mask's own element indices (an iota of its shape, the last axis
quartered), so a mask of a sharded activation is drawn where the activation lives, as ``jax.random.bits`` draws it.
Keys of another PRNG implementation draw their words with ``jax.random.bits`` (two elements per word).

``Dropout`` is ``flax.nnx.Dropout`` with this mask (and the same inverted scaling: kept values / keep probability).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.extend.random import threefry2x32_p

_ONE = 1 << 16


def keep_mask(key: jax.Array, keep_prob: float, shape: tuple[int, ...]) -> jax.Array:
    """Bernoulli(keep_prob) mask, bool ``shape``. With P = ceil(last / 4) and (y0, y1) = threefry2x32(key, (0, i))
    for i the row-major index into shape[:-1] + (P,): element j of the last axis is, for j // P = 0, 1, 2, 3, the
    low 16 bits of y0, its high 16 bits, the low of y1, the high of y1 at position j % P; kept when below
    round(keep_prob * 2^16)."""
    shape = tuple(int(d) for d in shape)
    if not shape:
        return keep_mask(key, keep_prob, (1,))[0]
    lead, last = shape[:-1], shape[-1]
    t = jnp.uint32(round(keep_prob * _ONE))
    kd = _threefry_key(key)
    p = -(-last // 4)
    if kd is None or math.prod(lead) * p >= 2**32:
        words = jax.random.bits(key, lead + ((last + 1) // 2,), jnp.uint32)
        pairs = jnp.repeat(words, 2, axis=-1)[..., :last]
        shift = (jnp.arange(last, dtype=jnp.uint32) % 2) * 16
        return ((pairs >> shift) & (_ONE - 1)) < t
    counts = _row_major_iota(lead + (p,))
    y0, y1 = threefry2x32_p.bind(kd[0], kd[1], jnp.zeros_like(counts), counts)
    low = _ONE - 1
    return jnp.concatenate([(y0 & low) < t, (y0 >> 16) < t, (y1 & low) < t, (y1 >> 16) < t], axis=-1)[..., :last]


def _threefry_key(key: jax.Array) -> jax.Array | None:
    """The two uint32 words of a threefry2x32 key (typed or raw), or None for another implementation."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if "threefry" not in str(jax.random.key_impl(key)):
            return None
        return jax.random.key_data(key)
    return key if key.shape == (2,) and key.dtype == jnp.uint32 else None


def _row_major_iota(shape: tuple[int, ...]) -> jax.Array:
    """uint32 array of ``shape`` holding each element's row-major index (an iota per axis, times its stride)."""
    out = jnp.zeros(shape, jnp.uint32)
    stride = 1
    for axis in range(len(shape) - 1, -1, -1):
        out = out + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride)
        stride *= shape[axis]
    return out


def apply(x: jax.Array, rate: float, key: jax.Array) -> jax.Array:
    """Inverted dropout of x with probability ``rate``: kept values / (1 - rate), dropped ones 0."""
    if rate <= 0.0:
        return x
    if rate >= 1.0:
        return jnp.zeros_like(x)
    keep = keep_mask(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / jnp.asarray(1.0 - rate, x.dtype), jnp.zeros_like(x))


class Dropout(nnx.Dropout):
    """``flax.nnx.Dropout`` drawing its mask with ``keep_mask`` (``apply``; the models' hidden-state dropout)."""

    def __call__(self, inputs, *, deterministic: bool | None = None, rngs=None) -> jax.Array:
        det = self.deterministic if deterministic is None else deterministic
        if self.rate == 0.0 or det:
            return inputs
        if self.broadcast_dims:
            raise ValueError("jaxembed's Dropout draws one mask element per input element (no broadcast_dims)")
        rngs = self.rngs if rngs is None else rngs
        if rngs is None:
            raise ValueError("dropout is on (deterministic=False) but no rngs were given")
        if isinstance(rngs, nnx.Rngs):
            key = rngs[self.rng_collection]()
        elif isinstance(rngs, nnx.RngStream):
            key = rngs()
        else:
            key = rngs
        return apply(inputs, self.rate, key)
