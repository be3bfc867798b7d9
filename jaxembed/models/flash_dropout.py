"""Flash attention with attention dropout inside the kernel (Pallas; GPU through Triton, any platform in
interpret mode): ``model.attention=pallas_flash``.

What it computes. The attention of ``jaxembed.models.attention.xla_attention`` with segment ids (packed rows),
an optional causal mask, grouped-query heads (fewer key/value heads, read in place: head n uses key/value head
n // (N / K)) and dropout on the attention probabilities: softmax(q k^T * scale where allowed), dropped elements 0,
kept ones divided by the keep probability, times v.

How. One program per (row, head, block of queries) walks the blocks of keys with an online softmax in float32
(running maximum, running sum, rescaled accumulator) and never builds a [T, S] tensor in memory. The dropout mask
of a block is computed in the kernel from the same counter-based hash as the einsum path's
(``jaxembed.models.dropout.attention_keep_mask``): for head n = g + P * c (P = ceil(N / 4)) the key of head group
g is threefry2x32(key, (0, g)), and element (t, s) keeps the c-th 16-bit part of threefry2x32(that key,
(text[t], position[t] * 2^16 + position[s])) when it is below round(keep_prob * 2^16). The threefry2x32 rounds are
written here as uint32 adds, rotations and xors (``threefry2x32``), which Triton lowers; so an element's mask is
bit-identical to the einsum path's on any device layout, and a model trains the same with either path.

Backward (a ``jax.custom_vjp``): the forward keeps only the output and the log-sum-exp per query (no
probabilities, no mask). Two kernels recompute the probabilities block by block from q, k and the log-sum-exp
and regenerate the dropout mask from the hash: dq per block of queries, dk / dv per block of keys (per query head;
a group's heads are then summed for grouped-query attention). With Pd the dropped probabilities, dV = Pd^T dO,
dP = dropout(dO V^T), dS = P (dP - delta), delta = rowsum(dO * O).

Layout. Rows are padded to a multiple of the block (extra slots are a segment of their own) and the head
dimension to a power of two (zeros), as Triton wants power-of-two blocks. Rows longer than 2^16 slots are
refused (the hash's position field), as in the einsum path.

Cost, and where it stands. The hash is evaluated per element and per head (a head group's four heads share one
evaluation in the einsum path; here each head recomputes it), and twice more in the backward. It has been checked
against the einsum path in interpret mode on the CPU (tests/test_flash_dropout.py) but never timed on a device,
so ``model.attention=auto`` does not choose it (docs/models.md, attention kernels); benchmarks/gpu/flash_dropout.py
measures it against the einsum path on a GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from jaxembed.errors import UserError
from jaxembed.models import dropout as _dropout

_MASKED = -0.7 * float(np.finfo(np.float32).max)  # a masked logit: finite, so no inf - inf in the kernels
_LOW16 = 0xFFFF


# ---------------------------------------------------------------------------------------------------- the hash


def _rotl(x, r: int):
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def threefry2x32(k0, k1, x0, x1):
    """The threefry2x32 hash (20 rounds) of uint32 counters (x0, x1) under key (k0, k1), with elementwise uint32
    operations only (the kernels' copy of ``jax.extend.random.threefry2x32_p``; equal to it bit for bit)."""
    rotations = ((13, 15, 26, 6), (17, 29, 16, 24))
    k2 = k0 ^ k1 ^ np.uint32(0x1BD11BDA)
    ks = (k0, k1, k2)
    x0, x1 = x0 + k0, x1 + k1
    for i in range(5):
        for r in rotations[i % 2]:
            x0 = x0 + x1
            x1 = _rotl(x1, r) ^ x0
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def _head_key(kd_ref, head, groups: int):
    """The hash key of ``head`` and which 16-bit part of the hash it takes: head = g + groups * part, key =
    threefry2x32(key, (0, g)) (``jax.random.fold_in(key, g)``, as ``attention_keep_mask`` draws it)."""
    h = jnp.asarray(head).astype(jnp.uint32)
    g, part = h % np.uint32(groups), h // np.uint32(groups)
    k0, k1 = threefry2x32(kd_ref[0], kd_ref[1], jnp.zeros_like(g), g)
    return k0, k1, part


def _keep(hk, text_q, pos_q, pos_k, threshold: int):
    """bool [tq, tk]: the dropout mask of a block (queries' text and position, keys' position)."""
    k0, k1, part = hk
    x0 = jnp.broadcast_to(text_q.astype(jnp.uint32)[:, None], (text_q.shape[0], pos_k.shape[0]))
    x1 = (pos_q.astype(jnp.uint32)[:, None] << np.uint32(16)) + pos_k.astype(jnp.uint32)[None, :]
    y0, y1 = threefry2x32(k0, k1, x0, x1)
    word = jnp.where(part < 2, y0, y1)
    return ((word >> ((part & np.uint32(1)) * np.uint32(16))) & np.uint32(_LOW16)) < np.uint32(threshold)


# -------------------------------------------------------------------------------------------------- the kernels


@dataclasses.dataclass(frozen=True)
class _Static:
    """What the kernels are specialised on: scale, causal, keep probability (1.0: no dropout), head groups of the
    hash (ceil(N / 4)), query heads per key/value head, block size, interpret mode."""

    scale: float
    causal: bool
    keep_prob: float
    groups: int
    rep: int
    block: int
    interpret: bool

    @property
    def threshold(self) -> int:
        return round(self.keep_prob * (1 << 16))


def _logits(st: _Static, q, k, seg_q, seg_k, rows, cols):
    """Scaled float32 logits of a block, masked (other segment, or a later key when causal) -> (logits, mask)."""
    s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * st.scale
    mask = seg_q[:, None] == seg_k[None, :]
    if st.causal:
        mask = mask & (rows[:, None] >= cols[None, :])
    return jnp.where(mask, s, _MASKED), mask


def _dot(a, b):
    return jax.lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def _dot_t(a, b):  # a^T b
    return jax.lax.dot_general(a, b, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def _fwd_kernel(kd_ref, q_ref, k_ref, v_ref, seg_ref, text_ref, pos_ref, o_ref, lse_ref, *, st: _Static):
    i, bq = pl.program_id(2), st.block
    hk = _head_key(kd_ref, pl.program_id(1), st.groups)
    qs = pl.ds(i * bq, bq)
    q, seg_q, text_q, pos_q = q_ref[...], seg_ref[qs], text_ref[qs], pos_ref[qs]
    rows = i * bq + jnp.arange(bq)

    def body(j, carry):
        acc, m, l = carry
        ks = pl.ds(j * bq, bq)
        v = v_ref[ks, :]
        s, mask = _logits(st, q, k_ref[ks, :], seg_q, seg_ref[ks], rows, j * bq + jnp.arange(bq))
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        alpha = jnp.exp(m - m_new)
        p = jnp.where(mask, jnp.exp(s - m_new[:, None]), 0.0)
        l = alpha * l + jnp.sum(p, axis=1)
        if st.keep_prob < 1.0:
            p = jnp.where(_keep(hk, text_q, pos_q, pos_ref[ks], st.threshold), p, 0.0)
        return alpha[:, None] * acc + _dot(p.astype(v.dtype), v), m_new, l

    n_k = (i + 1) if st.causal else k_ref.shape[0] // bq
    init = (jnp.zeros(q.shape, jnp.float32), jnp.full((bq,), -jnp.inf, jnp.float32), jnp.zeros((bq,), jnp.float32))
    acc, m, l = jax.lax.fori_loop(0, n_k, body, init)
    o_ref[...] = (acc / (l * st.keep_prob)[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log(l)


def _grad_logits(st: _Static, hk, q, k, v, do, lse, delta, seg_q, seg_k, text_q, pos_q, pos_k, rows, cols):
    """(dS scaled by ``scale``, the dropped probabilities Pd) of a block, from the saved log-sum-exp."""
    s, mask = _logits(st, q, k, seg_q, seg_k, rows, cols)
    p = jnp.where(mask, jnp.exp(s - lse[:, None]), 0.0)
    dp = jax.lax.dot_general(do, v, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    if st.keep_prob < 1.0:
        keep = _keep(hk, text_q, pos_q, pos_k, st.threshold)
        dp = jnp.where(keep, dp, 0.0) / st.keep_prob
        pd = jnp.where(keep, p, 0.0) / st.keep_prob
    else:
        pd = p
    return p * (dp - delta[:, None]) * st.scale, pd


def _dq_kernel(kd_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, seg_ref, text_ref, pos_ref, dq_ref, *,
               st: _Static):
    i, b = pl.program_id(2), st.block
    hk = _head_key(kd_ref, pl.program_id(1), st.groups)
    qs = pl.ds(i * b, b)
    q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]
    seg_q, text_q, pos_q = seg_ref[qs], text_ref[qs], pos_ref[qs]
    rows = i * b + jnp.arange(b)

    def body(j, dq):
        ks = pl.ds(j * b, b)
        k = k_ref[ks, :]
        ds, _ = _grad_logits(st, hk, q, k, v_ref[ks, :], do, lse, delta, seg_q, seg_ref[ks], text_q, pos_q,
                             pos_ref[ks], rows, j * b + jnp.arange(b))
        return dq + _dot(ds.astype(k.dtype), k)

    n_k = (i + 1) if st.causal else k_ref.shape[0] // b
    dq_ref[...] = jax.lax.fori_loop(0, n_k, body, jnp.zeros(q.shape, jnp.float32)).astype(dq_ref.dtype)


def _dkv_kernel(kd_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, seg_ref, text_ref, pos_ref, dk_ref,
                dv_ref, *, st: _Static):
    j, b = pl.program_id(2), st.block
    hk = _head_key(kd_ref, pl.program_id(1), st.groups)
    ks = pl.ds(j * b, b)
    k, v, seg_k, pos_k = k_ref[...], v_ref[...], seg_ref[ks], pos_ref[ks]
    cols = j * b + jnp.arange(b)

    def body(i, carry):
        dk, dv = carry
        qs = pl.ds(i * b, b)
        q, do = q_ref[qs, :], do_ref[qs, :]
        ds, pd = _grad_logits(st, hk, q, k, v, do, lse_ref[qs], delta_ref[qs], seg_ref[qs], seg_k, text_ref[qs],
                              pos_ref[qs], pos_k, i * b + jnp.arange(b), cols)
        return dk + _dot_t(ds.astype(q.dtype), q), dv + _dot_t(pd.astype(do.dtype), do)

    start = j if st.causal else 0
    zero = jnp.zeros(k.shape, jnp.float32)
    dk, dv = jax.lax.fori_loop(start, q_ref.shape[0] // b, body, (zero, zero))
    dk_ref[...], dv_ref[...] = dk, dv


# --------------------------------------------------------------------------------------------------- the calls


def _specs(st: _Static, l: int, d: int):
    """BlockSpecs on grid (row, head, block): a block of one head ([b, D]), a whole row of one head ([L, D]), of
    its key/value head, a block / row of per-query statistics ([B, N, L]), a row of per-slot ids ([B, L])."""
    b, rep = st.block, st.rep
    return dict(
        kd=pl.BlockSpec((2,), lambda r, h, i: (0,)),
        block=pl.BlockSpec((None, b, None, d), lambda r, h, i: (r, i, h, 0)),
        kv_block=pl.BlockSpec((None, b, None, d), lambda r, h, i: (r, i, h // rep, 0)),
        row=pl.BlockSpec((None, l, None, d), lambda r, h, i: (r, 0, h, 0)),
        kv_row=pl.BlockSpec((None, l, None, d), lambda r, h, i: (r, 0, h // rep, 0)),
        stat=pl.BlockSpec((None, None, b), lambda r, h, i: (r, h, i)),
        stat_row=pl.BlockSpec((None, None, l), lambda r, h, i: (r, h, 0)),
        ids=pl.BlockSpec((None, l), lambda r, h, i: (r, 0)),
    )


def _forward(st: _Static, q, k, v, kd, seg, text, pos):
    bsz, l, n, d = q.shape
    sp = _specs(st, l, d)
    return pl.pallas_call(
        functools.partial(_fwd_kernel, st=st), grid=(bsz, n, l // st.block),
        in_specs=[sp["kd"], sp["block"], sp["kv_row"], sp["kv_row"], sp["ids"], sp["ids"], sp["ids"]],
        out_specs=[sp["block"], sp["stat"]],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((bsz, n, l), jnp.float32)],
        interpret=st.interpret, name="flash_dropout_forward",
    )(kd, q, k, v, seg, text, pos)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(st: _Static, q, k, v, kd, seg, text, pos):
    return _forward(st, q, k, v, kd, seg, text, pos)[0]


def _flash_fwd(st, q, k, v, kd, seg, text, pos):
    o, lse = _forward(st, q, k, v, kd, seg, text, pos)
    return o, (q, k, v, kd, seg, text, pos, o, lse)


def _flash_bwd(st, res, do):
    q, k, v, kd, seg, text, pos, o, lse = res
    bsz, l, n, d = q.shape
    delta = jnp.swapaxes(jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1), 1, 2)  # [B, N, L]
    sp = _specs(st, l, d)
    grid = (bsz, n, l // st.block)
    ins = (kd, q, k, v, do, lse, delta, seg, text, pos)
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, st=st), grid=grid,
        in_specs=[sp["kd"], sp["block"], sp["kv_row"], sp["kv_row"], sp["block"], sp["stat"], sp["stat"],
                  sp["ids"], sp["ids"], sp["ids"]],
        out_specs=sp["block"], out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        interpret=st.interpret, name="flash_dropout_dq",
    )(*ins)
    per_head = jax.ShapeDtypeStruct((bsz, l, n, d), jnp.float32)  # dk / dv per query head, summed per group below
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, st=st), grid=grid,
        in_specs=[sp["kd"], sp["row"], sp["kv_block"], sp["kv_block"], sp["row"], sp["stat_row"], sp["stat_row"],
                  sp["ids"], sp["ids"], sp["ids"]],
        out_specs=[sp["block"], sp["block"]], out_shape=[per_head, per_head],
        interpret=st.interpret, name="flash_dropout_dkv",
    )(*ins)
    kh = k.shape[2]
    dk, dv = (x.reshape(bsz, l, kh, st.rep, d).sum(axis=3) for x in (dk, dv))
    return dq, dk.astype(k.dtype), dv.astype(v.dtype), None, None, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def _pad(x, axis: int, size: int, value=0):
    pad = size - x.shape[axis]
    if pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths, constant_values=value)


def _key_words(key) -> jax.Array:
    """The two uint32 words of a threefry2x32 dropout key (typed or raw); another PRNG is a one-line UserError."""
    kd = _dropout._threefry_key(key)
    if kd is None:
        raise UserError("model.attention='pallas_flash' draws its dropout mask with threefry2x32, the default JAX "
                        "PRNG (fix: leave jax_default_prng_impl at threefry2x32, or model.attention='auto')")
    return jnp.asarray(kd, jnp.uint32)


def flash_attention(q, k, v, seg, *, causal: bool = False, scale: float | None = None, dropout_rate: float = 0.0,
                    key=None, tokens: _dropout.Tokens | None = None, block: int | None = None,
                    interpret: bool = False):
    """q: [B, T, N, D]; k, v: [B, T, K, D] (N a multiple of K); seg: ``attention.Segments`` (or its ids [B, T]);
    dropout on the probabilities with ``dropout_rate`` > 0 and the dropout ``key``, its mask drawn per (text,
    position) from ``tokens`` (default: text = row, position = column, as ``attention_keep_mask``); block: queries
    and keys per block (default: 64, or the row rounded up to a power of two, at least 16) -> [B, T, N, D]."""
    ids = getattr(seg, "ids", seg)
    bsz, l, n, d = q.shape
    if l > 1 << 16:
        raise ValueError(f"attention dropout draws positions below {1 << 16}; this row has {l} slots")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    dropout = dropout_rate > 0.0
    if tokens is None:
        text = jnp.broadcast_to(jnp.arange(bsz, dtype=jnp.int32)[:, None], (bsz, l))
        pos = jnp.broadcast_to(jnp.arange(l, dtype=jnp.int32)[None, :], (bsz, l))
    else:
        text, pos = tokens.text, tokens.position
    block = block or min(64, max(16, 1 << (l - 1).bit_length()))
    lp, dp = -(-l // block) * block, 1 << (d - 1).bit_length()
    st = _Static(scale=scale, causal=bool(causal), keep_prob=1.0 - dropout_rate if dropout else 1.0,
                 groups=-(-n // 4), rep=n // k.shape[2], block=block, interpret=bool(interpret))
    kd = _key_words(key) if dropout else jnp.zeros((2,), jnp.uint32)
    q, k, v = (_pad(_pad(x, 1, lp), 3, dp) for x in (q, k, v))
    ids, text, pos = (_pad(jnp.asarray(x, jnp.int32), 1, lp, fill) for x, fill in ((ids, -1), (text, 0), (pos, 0)))
    return _flash(st, q, k, v, kd, ids, text, pos)[:, :l, :, :d]
