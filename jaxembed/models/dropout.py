"""Dropout masks drawn per token of a text, with a quarter of the random-number work of ``jax.random.bernoulli``.

What a mask element depends on. Each element's random bits are a counter-based hash (threefry2x32) of the call
site's key and the element's coordinates *within its text*: the text's id, the token's position in the text and
the feature (hidden states) or the query position, key position and head (attention probabilities). The train
step gives every text of a step a global id (its index in the plan's batch: the queries, then the candidates;
jaxembed.train.encode) and draws one key per step, so a text gets the same masks whether it is alone in a padded
row or packed with others, in whichever row, sub-batch or device it lands: the default run (packing and dropout
on) trains the same model on any device count, and packed rows equal padded rows with dropout on. The caller
states the coordinates for a block of code (``tokens``: the text id and position of every slot [B, L]); without
them a padded layout is assumed (the text is the row, the position the column), which is what a direct call on
padded rows gives.

Cost. ``jax.random.bernoulli`` draws one uniform float per element from one threefry2x32 evaluation (which yields
64 random bits; it keeps 32 and uses 23); on a CPU those evaluations are most of dropout's cost. Here both 32-bit
outputs of each evaluation are cut into two 16-bit uniforms: four mask elements per evaluation, split along an
axis that does not depend on the layout (the features of a hidden state, the heads of an attention matrix). The
keep probability is rounded to a multiple of 2^-16 (0.9 -> 0.899994). The four parts are compared with the
threshold before they are joined, so what XLA stores is a bool mask, not the random words. The counters are
elementwise functions of the token arrays (sharded like the activation), so a mask is drawn where its activation
lives. Keys of another PRNG implementation draw their words with ``jax.random.bits`` over the array (two elements
per word; those masks follow the layout).

``Dropout`` is ``flax.nnx.Dropout`` with this mask (and the same inverted scaling: kept values / keep probability).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.extend.random import threefry2x32_p

_ONE = 1 << 16
_POSITIONS = 1 << 16  # attention masks: a query / key position takes 16 bits of a counter word


@dataclasses.dataclass(frozen=True)
class Tokens:
    """The coordinates of a batch's slots: text [B, L] int32, the id of each slot's text (unique within a step;
    any value on padding); position [B, L] int32, the slot's position within its text."""

    text: jax.Array
    position: jax.Array


_TOKENS: contextvars.ContextVar = contextvars.ContextVar("jaxembed_dropout_tokens", default=None)


@contextlib.contextmanager
def tokens(text: jax.Array, position: jax.Array):
    """Within the block, dropout masks of [B, L, ...] activations and [B, N, L, L] attention probabilities are
    drawn per (text, position) from these slot coordinates (``Tokens``; both [B, L])."""
    tok = _TOKENS.set(Tokens(jnp.asarray(text, jnp.int32), jnp.asarray(position, jnp.int32)))
    try:
        yield
    finally:
        _TOKENS.reset(tok)


def current_tokens() -> Tokens | None:
    """The slot coordinates set by the innermost ``tokens`` block, or None."""
    return _TOKENS.get()


def padded_positions(attention_mask: jax.Array) -> jax.Array:
    """attention_mask [B, L] (a padded row's text, left- or right-aligned) -> each slot's position in its text
    [B, L] int32 (0 on leading padding, the last position on trailing padding)."""
    m = jnp.asarray(attention_mask).astype(jnp.int32)
    return jnp.maximum(jnp.cumsum(m, axis=1) - 1, 0)


def _bits(kd, x0, x1):
    return threefry2x32_p.bind(kd[0], kd[1], x0, x1)


def _quarters(y0, y1, t, axis: int) -> jax.Array:
    """The four 16-bit parts of (y0, y1) compared with ``t``, joined along ``axis``: low y0, high y0, low y1,
    high y1."""
    low = _ONE - 1
    return jnp.concatenate([(y0 & low) < t, (y0 >> 16) < t, (y1 & low) < t, (y1 >> 16) < t], axis=axis)


def keep_mask(key: jax.Array, keep_prob: float, shape: tuple[int, ...], tok: Tokens | None = None) -> jax.Array:
    """Bernoulli(keep_prob) mask of an activation, bool ``shape`` = lead + (F,), drawn per token.

    Token i (an index into lead) has a text id t_i and a position p_i: ``tok`` (text and position of shape lead,
    e.g. [B, L] for [B, L, F]), or by default t_i = the row-major index of i over lead[:-1] and p_i = i's index
    along lead[-1] (a padded batch: text = row, position = column). With P = ceil(F / 4) and (y0, y1) =
    threefry2x32(key, (t_i, p_i * P + f % P)), feature f of token i takes, for f // P = 0, 1, 2, 3, the low 16 bits
    of y0, its high 16 bits, the low of y1, the high of y1; it is kept when that is below round(keep_prob * 2^16).
    (Elsewhere -- a key of another PRNG, or lead[-1] * P >= 2^32 -- two elements per word of ``jax.random.bits``
    over ``shape``.)"""
    shape = tuple(int(d) for d in shape)
    if not shape:
        return keep_mask(key, keep_prob, (1,))[0]
    lead, last = shape[:-1], shape[-1]
    t = jnp.uint32(round(keep_prob * _ONE))
    kd = _threefry_key(key)
    p = -(-last // 4)
    cols = lead[-1] if lead else 1
    if kd is None or cols * p >= 2**32:
        words = jax.random.bits(key, lead + ((last + 1) // 2,), jnp.uint32)
        pairs = jnp.repeat(words, 2, axis=-1)[..., :last]
        shift = (jnp.arange(last, dtype=jnp.uint32) % 2) * 16
        return ((pairs >> shift) & (_ONE - 1)) < t
    if tok is None:
        text, pos = _padded_coordinates(lead)
    else:
        if tuple(tok.text.shape) != lead or tuple(tok.position.shape) != lead:
            raise ValueError(f"dropout of a {shape} activation with token coordinates of shape "
                             f"{tuple(tok.text.shape)} (they must be its leading axes {lead})")
        text, pos = tok.text, tok.position
    j = jax.lax.broadcasted_iota(jnp.uint32, lead + (p,), len(lead))
    x0 = jnp.broadcast_to(text.astype(jnp.uint32)[..., None], lead + (p,))
    x1 = pos.astype(jnp.uint32)[..., None] * jnp.uint32(p) + j
    y0, y1 = _bits(kd, x0, x1)
    return _quarters(y0, y1, t, -1)[..., :last]


def attention_keep_mask(key: jax.Array, keep_prob: float, shape: tuple[int, int, int, int],
                        tok: Tokens | None = None) -> jax.Array:
    """Bernoulli(keep_prob) mask of attention probabilities, bool ``shape`` = [B, N, T, S], drawn per pair of
    tokens of a text.

    Query slot (b, t) has text id x[b, t] and position q[b, t], key slot (b, s) position k[b, s]: ``tok`` ([B, L]
    with L = T = S), or by default x = b, q = t, k = s (a padded batch). With P = ceil(N / 4), head n = g + P * c
    (g < P) has the key k_g = threefry2x32(key, (0, g)) (``jax.random.fold_in(key, g)``) and (y0, y1) =
    threefry2x32(k_g, (x[b, t], q[b, t] * 2^16 + k[b, s])); c = 0, 1, 2, 3 takes the low 16 bits of y0, its high
    16 bits, the low of y1, the high of y1; kept when below round(keep_prob * 2^16). Within a text (the pairs
    attention keeps) an element thus depends on (text, query position, key position, head) only. Rows longer than
    2^16 slots are refused. (A key of another PRNG: two elements per word of ``jax.random.bits``.)"""
    b, n, tq, sk = (int(d) for d in shape)
    kd = _threefry_key(key)
    if kd is None:
        return keep_mask(key, keep_prob, shape)
    if max(tq, sk) > _POSITIONS:
        raise ValueError(f"attention dropout draws positions below {_POSITIONS}; this row has {max(tq, sk)} slots")
    if tok is None:
        text = jax.lax.broadcasted_iota(jnp.uint32, (b, tq), 0)
        q = jax.lax.broadcasted_iota(jnp.uint32, (b, tq), 1)
        k = jax.lax.broadcasted_iota(jnp.uint32, (b, sk), 1)
    else:
        if tuple(tok.text.shape) != (b, tq) or tq != sk:
            raise ValueError(f"attention dropout of a {tuple(shape)} matrix with token coordinates of shape "
                             f"{tuple(tok.text.shape)} (they must be [B, L] with L = T = S)")
        text, q, k = (a.astype(jnp.uint32) for a in (tok.text, tok.position, tok.position))
    t = jnp.uint32(round(keep_prob * _ONE))
    p = -(-n // 4)
    g = jnp.arange(p, dtype=jnp.uint32)
    kg = _bits(kd, jnp.zeros_like(g), g)  # the key of each head group: fold_in(key, g)
    kg = tuple(w.reshape(1, p, 1, 1) for w in kg)
    x0 = jnp.broadcast_to(text[:, None, :, None], (b, p, tq, sk))
    x1 = jnp.broadcast_to(q[:, None, :, None] * jnp.uint32(_POSITIONS) + k[:, None, None, :], (b, p, tq, sk))
    y0, y1 = _bits(kg, x0, x1)
    return _quarters(y0, y1, t, 1)[:, :n]


def _padded_coordinates(lead: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """(text, position) of shape ``lead``: the row-major index over lead[:-1], the index along lead[-1]."""
    if not lead:
        return jnp.zeros((), jnp.uint32), jnp.zeros((), jnp.uint32)
    pos = jax.lax.broadcasted_iota(jnp.uint32, lead, len(lead) - 1)
    text = jnp.zeros(lead, jnp.uint32)
    stride = 1
    for axis in range(len(lead) - 2, -1, -1):
        text = text + jax.lax.broadcasted_iota(jnp.uint32, lead, axis) * jnp.uint32(stride)
        stride *= lead[axis]
    return text, pos


def _threefry_key(key: jax.Array) -> jax.Array | None:
    """The two uint32 words of a threefry2x32 key (typed or raw), or None for another implementation."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if "threefry" not in str(jax.random.key_impl(key)):
            return None
        return jax.random.key_data(key)
    return key if key.shape == (2,) and key.dtype == jnp.uint32 else None


def apply(x: jax.Array, rate: float, key: jax.Array) -> jax.Array:
    """Inverted dropout of x with probability ``rate``: kept values / (1 - rate), dropped ones 0. Inside a
    ``tokens`` block x is [B, L, ...] and its mask is ``keep_mask`` of [B, L, F] (F: the product of the trailing
    axes) with the block's coordinates; elsewhere ``keep_mask`` of x's shape."""
    if rate <= 0.0:
        return x
    if rate >= 1.0:
        return jnp.zeros_like(x)
    tok = current_tokens()
    if tok is None:
        keep = keep_mask(key, 1.0 - rate, x.shape)
    else:
        if x.ndim < 3 or tuple(x.shape[:2]) != tuple(tok.text.shape):
            raise ValueError(f"dropout of a {tuple(x.shape)} activation inside a dropout.tokens block for slots "
                             f"{tuple(tok.text.shape)} (activations there are [B, L, ...])")
        flat = tuple(x.shape[:2]) + (math.prod(x.shape[2:]),)
        keep = keep_mask(key, 1.0 - rate, flat, tok).reshape(x.shape)
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
