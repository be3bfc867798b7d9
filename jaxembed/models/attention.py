"""Scaled dot-product attention behind one interface, with block-diagonal masking by segment
(docs/design.md, Architecture).

Who attends to whom is given by segment ids [B, L] (``Segments``): a token attends to the tokens of its own
segment, and with ``causal`` only to those at or before it. A packed row (``jaxembed.packing``) has one segment
per text (1, 2, ...) and padding as segment 0; a padded row (one text) has the attention mask as segment ids
(1 = text, 0 = padding). Padding thus attends only to padding: no row of the attention matrix is ever empty
(every query sees itself), which keeps every kernel finite, and a real token never sees padding or another text.

Implementations (``model.attention``; ``IMPLEMENTATIONS``):

- ``xla``: the reference, everywhere, with a boolean [B, 1, T, S] mask built from the segment ids; attention
  dropout and the T5 bias are only supported here. On CPUs: heads-first batched products, the softmax normalised
  after the product, with its own backward (``xla_attention(heads_first=True)``, faster per attention call on
  a CPU core); elsewhere ``jax.nn.dot_product_attention(implementation='xla')`` / einsums. Both give the
  same outputs and gradients (tests/test_attention.py).
- ``cudnn``: cuDNN flash attention (CUDA GPU, Hopper or later, bfloat16 / float16). Segments go in as
  per-segment lengths and offsets (cuDNN's packed "THD" layout, ``jax._src.cudnn.fused_attention_stablehlo``:
  ``jax.nn.dot_product_attention`` only takes one length per row), so no mask or bias tensor is built and no
  bias gradient is computed. Padding at the end (or start) of a row is a segment of its own.
- ``pallas``: the Pallas/Triton flash attention of ``jax.experimental.pallas.ops.gpu.attention.mha`` with
  segment ids (GPU; any float dtype). The row is padded to a multiple of the kernel's block.
- ``pallas_flash``: jaxembed's own Pallas flash attention (``jaxembed.models.flash_dropout``; GPU) with attention
  dropout inside the kernel, its mask drawn from the einsum path's hash (bit-identical); segment ids, causal,
  grouped-query heads. Never timed on a device, so ``auto`` does not choose it.
- ``splash``: TPU splash attention (``jax.experimental.pallas.ops.tpu.splash_attention``) with ``SegmentIds``
  and a full or causal mask; rows padded to a multiple of 128.
- ``te``: Transformer Engine's JAX fused attention (``transformer_engine.jax.attention.fused_attn``) with a
  ``SequenceDescriptor`` from segment ids and positions (CUDA GPU; imported only when asked for).
- ``auto``: per platform: TPU -> splash; otherwise (GPU included) xla. Calls splash cannot serve (the T5 bias,
  attention dropout in training) use xla. In the recorded H200 run (figures: docs/scaling.md, attention
  kernels), cudnn's training step was far slower than xla's (JAX's wrapper sizes cuDNN's statistics and work by
  B x max segments) and cudnn failed outright on long padded rows; pallas's attention call alone was a little
  faster than xla's. So GPU runs use xla unless a kernel is asked for.

Sliding windows (Mistral, Gemma's local layers) and attention logit soft-capping (Gemma 2) are applied by xla
(in the mask / on the logits) and by splash (``LocalMask``, ``attn_logits_soft_cap``). A window at least as long
as the row is no window, so every kernel serves it; cudnn, pallas and te asked for a shorter one, or for
soft-capping, are a one-line ``UserError`` (soft-capping when the model is built, the window when the step is
traced, since it depends on the row length).

An explicit request that cannot run (wrong platform, missing package, T5's position bias) is a one-line
``UserError`` when the model is built (``check``), before any work; a fused kernel asked to apply attention
dropout is one when the training step is traced. Grouped-query attention (fewer key/value heads) is expanded
for the kernels that need equal head counts.

The GPU / TPU kernels are checked against ``xla`` in tests/test_attention.py: in Pallas interpret mode on CPU
(``pallas``, ``splash``) and on the accelerator itself under ``-m gpu``.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from jaxembed.choices import ATTENTION_KERNELS as IMPLEMENTATIONS
from jaxembed.errors import UserError
from jaxembed.models import dropout as _dropout

_PLATFORM = {"cudnn": "gpu", "te": "gpu", "pallas": "gpu", "pallas_flash": "gpu", "splash": "tpu"}
_DROPOUT = ("xla", "pallas_flash")  # the implementations that apply attention dropout
# Kernels that apply a sliding window / attention logit soft-capping themselves (besides xla).
_WINDOW = _SOFTCAP = ("splash",)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Segments:
    """Which tokens may attend to which. ids: [B, L] int32, 0 = padding, 1, 2, ... = the text of each token within
    its row (a padded batch: the attention mask); positions: [B, L] int32 position of each token within its text,
    or None (derived from the ids when a kernel needs them). Each text's tokens are contiguous, as
    ``jaxembed.packing`` and padding lay them out: cudnn and te see segments as runs of equal ids."""

    ids: jax.Array
    positions: jax.Array | None = None


def as_segments(x) -> Segments:
    """A ``Segments`` from itself or from an attention mask [B, L] (1 = token, 0 = padding)."""
    return x if isinstance(x, Segments) else Segments(jnp.asarray(x).astype(jnp.int32))


def positions_from_segments(ids: jax.Array) -> jax.Array:
    """ids [B, L] (segments contiguous) -> position of each token within its run of equal ids, [B, L] int32."""
    b, l = ids.shape
    col = jnp.broadcast_to(jnp.arange(l, dtype=jnp.int32), (b, l))
    boundary = jnp.concatenate([jnp.ones((b, 1), bool), ids[:, 1:] != ids[:, :-1]], axis=1)
    start = jax.lax.cummax(jnp.where(boundary, col, 0), axis=1)
    return col - start


def segment_mask(ids: jax.Array, causal: bool, window: int | None = None) -> jax.Array:
    """ids [B, L] -> bool [B, 1, L, L]: query t may attend key s (same segment; and s <= t when causal; and
    t - s < window when causal, |t - s| < window when not, with a sliding ``window``)."""
    m = ids[:, :, None] == ids[:, None, :]
    if causal or window is not None:
        l = ids.shape[1]
        d = jnp.arange(l)[:, None] - jnp.arange(l)[None, :]  # t - s
        keep = d >= 0 if causal else jnp.ones((l, l), bool)
        if window is not None:
            keep = keep & (jnp.abs(d) < window)
        m = m & keep[None]
    return m[:, None]


# ------------------------------------------------------------------------------------------------ selection


def _platform() -> str:
    return jax.default_backend()


def _cuda_capability() -> tuple[int, ...] | None:
    """Compute capability of the first CUDA device, or None when there is none."""
    if _platform() != "gpu":
        return None
    cc = getattr(jax.devices()[0], "compute_capability", None)
    try:
        return tuple(int(x) for x in str(cc).split(".")) if cc else None
    except ValueError:
        return None


def _cudnn_ok(dtype, head_dim: int) -> str | None:
    """None when the cuDNN packed-layout flash attention can run here, else why not."""
    cc = _cuda_capability()
    if cc is None:
        return f"needs a CUDA GPU (this process runs on {_platform()})"
    if cc < (9, 0):
        return f"needs a Hopper or later GPU for segment (packed) layouts (this one has compute capability {cc})"
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"needs model.dtype bfloat16 or float16 (got {jnp.dtype(dtype).name})"
    if head_dim % 8 or head_dim > 256:
        return f"needs a head dimension that is a multiple of 8 and <= 256 (got {head_dim})"
    return None


def _fix(name: str) -> str:
    return f"(fix: model.attention='auto' or 'xla'; got model.attention={name!r})"


def check(name: str, *, dtype, head_dim: int, bias: bool = False, softcap: bool = False) -> None:
    """Raise a one-line UserError when implementation ``name`` cannot run this model here: unknown name, wrong
    platform, missing package, an unsupported feature (the T5 position bias, Gemma 2's logit soft-capping).
    Called when a model is built. (A sliding window depends on the row length: see ``resolve``.)"""
    if name not in IMPLEMENTATIONS:
        raise UserError(f"model.attention={name!r} is not valid (fix: one of {', '.join(IMPLEMENTATIONS)})")
    if name in ("auto", "xla"):
        return
    if bias:
        raise UserError(f"model.attention={name!r} has no additive position bias, which this model (T5) needs "
                        f"{_fix(name)}")
    if softcap and name not in _SOFTCAP:
        raise UserError(f"model.attention={name!r} has no attention logit soft-capping, which this model (Gemma) "
                        f"needs {_fix(name)}")
    if name == "te":
        try:
            import transformer_engine.jax  # noqa: F401
        except ImportError:
            raise UserError("model.attention='te' needs Transformer Engine (fix: pip install "
                            "'transformer_engine[jax]' on a CUDA machine, or model.attention='auto')") from None
    if _platform() != _PLATFORM[name]:
        raise UserError(f"model.attention={name!r} runs on {_PLATFORM[name].upper()} only (this process runs on "
                        f"{_platform()}) {_fix(name)}")
    if name == "cudnn":
        why = _cudnn_ok(dtype, head_dim)
        if why:
            raise UserError(f"model.attention='cudnn' {why} {_fix(name)}")


def resolve(name: str, *, dtype, head_dim: int, bias: bool, dropout: bool, window: bool = False,
            softcap: bool = False) -> str:
    """The implementation that runs a call: ``name``, or for ``auto`` the platform's fast kernel when it supports
    the call (no bias, no active dropout; a sliding window shorter than the row and soft-capping only where the
    kernel has them), else ``xla``. A fused kernel asked for what it lacks raises a one-line UserError (when the
    step is traced: a window matters only for rows longer than it)."""
    if name == "auto":
        if bias or dropout:
            return "xla"
        return "splash" if _platform() == "tpu" else "xla"  # GPU: xla (module docstring)
    if name not in _DROPOUT and dropout:
        raise UserError(f"model.attention={name!r} has no attention dropout, which this training step uses (fix: "
                        "model.attention='auto' (xla while dropout is on), 'pallas_flash' or train.dropout=False)")
    if name != "xla" and window and name not in _WINDOW:
        raise UserError(f"model.attention={name!r} has no sliding-window attention, which this model needs for rows "
                        "longer than its window (fix: model.attention='auto' or 'xla', or rows no longer than the "
                        "window)")
    if name != "xla" and softcap and name not in _SOFTCAP:
        raise UserError(f"model.attention={name!r} has no attention logit soft-capping, which this model (Gemma) "
                        f"needs {_fix(name)}")
    return name


# -------------------------------------------------------------------------------------------------- kernels


def _expand_kv(k, v, n: int):
    kh = k.shape[2]
    if kh == n:
        return k, v
    return jnp.repeat(k, n // kh, axis=2), jnp.repeat(v, n // kh, axis=2)


def softcap_logits(logits: jax.Array, cap: float) -> jax.Array:
    """Attention logit soft-capping (Gemma 2, Gemma Team 2024, section 2): cap * tanh(logits / cap)."""
    return cap * jnp.tanh(logits / cap)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _softmax_av(logits, mask, keep, v, keep_prob):
    return _softmax_av_fwd(logits, mask, keep, v, keep_prob)[0]


def _softmax_av_fwd(logits, mask, keep, v, keep_prob):
    """softmax(logits where mask) [with dropout: kept / keep_prob] @ v, normalised after the product.

    logits: float32 [B, N, T, S] (scaled, biased); mask: bool [B or 1, 1, T, S]; keep: None, or the bool dropout
    mask [B, N, T, S] with ``keep_prob`` (a Python float); v: [B, N, S, D] -> [B, N, T, D]. The row sums divide
    the [T, D] product instead of the [T, S] probabilities (one pass fewer over the largest tensor), as flash
    attention does."""
    m = jax.lax.stop_gradient(jnp.max(jnp.where(mask, logits, -jnp.inf), axis=-1, keepdims=True))
    e = jnp.where(mask, jnp.exp(logits - m), 0.0)
    s = jnp.sum(e, axis=-1, keepdims=True)
    ed = e if keep is None else jnp.where(keep, e, 0.0) * (1.0 / keep_prob)
    o = jnp.matmul(ed.astype(v.dtype), v, preferred_element_type=jnp.float32) / s
    return o.astype(v.dtype), (e, s, keep, v, o)


def _softmax_av_bwd(keep_prob, res, do):
    """The standard attention backward: dV = Pd^T dO; dPd = dO V^T; dP = dropout(dPd); dlogits = P (dP - delta)
    with delta = rowsum(dO * O) (= rowsum(P * dP), also with dropout)."""
    e, s, keep, v, o = res
    p = e / s
    pd = p if keep is None else jnp.where(keep, p, 0.0) * (1.0 / keep_prob)
    dv = jnp.matmul(jnp.swapaxes(pd, -1, -2).astype(v.dtype), do, preferred_element_type=jnp.float32)
    dp = jnp.matmul(do, jnp.swapaxes(v, -1, -2), preferred_element_type=jnp.float32)
    if keep is not None:
        dp = jnp.where(keep, dp, 0.0) * (1.0 / keep_prob)
    delta = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1, keepdims=True)
    return p * (dp - delta), None, None, dv.astype(v.dtype)


_softmax_av.defvjp(_softmax_av_fwd, _softmax_av_bwd)


def _xla_heads_first(q, k, v, mask, *, scale, bias, softcap, keep, keep_prob):
    """q [B, T, N, D], k / v [B, S, N, D] (heads expanded) -> [B, T, N, D]: heads-first batched products and
    ``_softmax_av`` (keep: dropout mask [B, N, T, S] or None); softcap: through autodiff of the logits (its
    derivative is in the logits' gradient)."""
    qh, kh, vh = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))  # [B, N, T or S, D]
    logits = jnp.matmul(qh, jnp.swapaxes(kh, -1, -2), preferred_element_type=jnp.float32) * scale
    if softcap is not None:
        logits = softcap_logits(logits, softcap)
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)
    return jnp.swapaxes(_softmax_av(logits, mask, keep, vh, keep_prob), 1, 2)


def xla_attention(q, k, v, seg: Segments, *, causal=False, bias=None, scale=None, dropout_rate=0.0,
                  deterministic=True, rngs=None, window=None, softcap=None, heads_first: bool | None = None):
    """The reference. q: [B, T, N, D]; k, v: [B, S, K, D]; bias: additive [1 or B, N, T, S]; window: sliding
    window (``segment_mask``); softcap: logits = softcap * tanh(scaled logits / softcap), before the mask (as
    transformers' Gemma) -> [B, T, N, D]. heads_first (default: on CPUs): the same attention as heads-first
    batched products with the normalisation after the product and its own backward (``_softmax_av``), faster than
    the einsum path on a CPU core (a MiniLM layer's attention call, forward and backward). Not measured on a GPU,
    so GPUs keep the einsum path (``heads_first=False``)."""
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    mask = segment_mask(seg.ids, causal, window)
    dropout = dropout_rate > 0.0 and not deterministic
    if heads_first is None:
        heads_first = _platform() == "cpu"
    if heads_first:
        k, v = _expand_kv(k, v, q.shape[2])
        b, t, n, _ = q.shape
        keep = _dropout.attention_keep_mask(rngs.dropout(), 1.0 - dropout_rate, (b, n, t, k.shape[1]),
                                            _dropout.current_tokens()) if dropout else None
        return _xla_heads_first(q, k, v, mask, scale=scale, bias=bias, softcap=softcap, keep=keep,
                                keep_prob=1.0 - dropout_rate if dropout else 1.0)
    if not dropout and softcap is None:
        return jax.nn.dot_product_attention(q, k, v, bias=None if bias is None else bias.astype(q.dtype), mask=mask,
                                            scale=scale, implementation="xla")
    k, v = _expand_kv(k, v, q.shape[2])
    logits = jnp.einsum("btnd,bsnd->bnts", q, k, preferred_element_type=jnp.float32) * scale
    if softcap is not None:
        logits = softcap_logits(logits, softcap)
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1)
    if dropout:
        keep = _dropout.attention_keep_mask(rngs.dropout(), 1.0 - dropout_rate, probs.shape, _dropout.current_tokens())
        probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
    return jnp.einsum("bnts,bsnd->btnd", probs.astype(v.dtype), v)


def segment_runs(ids: jax.Array, max_runs: int | None = None) -> tuple[jax.Array, jax.Array]:
    """Runs of equal ids per row as cuDNN's packed layout wants them: (lengths [B, M] with -1 after the last run,
    offsets [B, M + 1] of each run's first column, -1 after the last run). Padding is a run of its own.
    max_runs: M, the most runs a row may have (None: L, which always holds); the caller guarantees it (runs past
    it are dropped)."""
    b, l = ids.shape
    m_cols = l if max_runs is None else min(int(max_runs), l)
    boundary = jnp.concatenate([jnp.ones((b, 1), bool), ids[:, 1:] != ids[:, :-1]], axis=1)
    run = jnp.cumsum(boundary, axis=1, dtype=jnp.int32) - 1
    nruns = run[:, -1:] + 1
    counts = jax.vmap(lambda r: jnp.bincount(r, length=l))(run).astype(jnp.int32)
    m = jnp.arange(l, dtype=jnp.int32)[None]
    lengths = jnp.where(m < nruns, counts, -1)
    starts = jnp.cumsum(counts, axis=1, dtype=jnp.int32) - counts
    offsets = jnp.concatenate([jnp.where(m < nruns, starts, -1), jnp.full((b, 1), -1, jnp.int32)], axis=1)
    return lengths[:, :m_cols], jnp.concatenate([offsets[:, :m_cols], offsets[:, -1:]], axis=1)


def cudnn_attention(q, k, v, seg: Segments, *, causal=False, scale=None, max_runs: int | None = None):
    """cuDNN flash attention in the packed (THD) layout: one segment per run of equal ids. CUDA, Hopper+.
    max_runs: the most runs of equal ids a row has (``segment_runs``; None: the row length)."""
    from jax._src.cudnn.fused_attention_stablehlo import MaskType, dot_product_attention

    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    lengths, offsets = segment_runs(seg.ids, max_runs)
    return dot_product_attention(q, k, v, q_seqlen=lengths, kv_seqlen=lengths, q_offsets=offsets,
                                 kv_offsets=offsets, scale=scale,
                                 mask_type=MaskType.PADDING_CAUSAL if causal else MaskType.PADDING,
                                 qkv_layout="BTNH")


def _pad_rows(x, length: int, value):
    pad = length - x.shape[1]
    if pad == 0:
        return x
    widths = [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)
    return jnp.pad(x, widths, constant_values=value)


def pallas_attention(q, k, v, seg: Segments, *, causal=False, scale=None, interpret: bool = False):
    """``jax.experimental.pallas.ops.gpu.attention.mha`` with segment ids (GPU; ``interpret`` runs it on CPU)."""
    from jax.experimental.pallas.ops.gpu import attention as pa

    b, l, n, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    k, v = _expand_kv(k, v, n)
    block = 128 if l >= 128 else max(16, 1 << (l - 1).bit_length())
    lp = -(-l // block) * block
    ids = _pad_rows(seg.ids, lp, -1)  # extra slots: a segment of their own
    qp, kp, vp = (_pad_rows(t, lp, 0) for t in (q, k, v))
    small = min(32, block)
    sizes = pa.BlockSizes(block_q=block, block_k=block, block_q_dkv=small, block_kv_dkv=small, block_q_dq=small,
                          block_kv_dq=small)
    out = pa.mha(qp, kp, vp, ids, sm_scale=scale, causal=causal, block_sizes=sizes, interpret=interpret)
    return out[:, :l]


def splash_attention(q, k, v, seg: Segments, *, causal=False, scale=None, window=None, softcap=None,
                     interpret: bool = False):
    """TPU splash attention with ``SegmentIds``, a sliding ``window`` as a ``LocalMask`` and soft-capping as
    ``attn_logits_soft_cap`` (``interpret`` runs it on CPU)."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    b, l, n, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    k, v = _expand_kv(k, v, n)
    lp = -(-l // 128) * 128
    ids = _pad_rows(seg.ids, lp, -1)
    qp, kp, vp = (jnp.swapaxes(_pad_rows(t, lp, 0), 1, 2) for t in (q * jnp.asarray(scale, q.dtype), k, v))
    shape = (lp, lp)
    if window is not None:  # keys s with t - (window - 1) <= s <= t (+ window - 1 when not causal)
        one = sa.LocalMask(shape, (window - 1, 0 if causal else window - 1), 0)
    else:
        one = sa.CausalMask(shape) if causal else sa.FullMask(shape)
    mask = sa.MultiHeadMask([one for _ in range(n)])
    kernel = sa.make_splash_mha(mask, head_shards=1, q_seq_shards=1, attn_logits_soft_cap=softcap,
                                interpret=interpret)
    out = jax.vmap(lambda qq, kk, vv, s: kernel(qq, kk, vv, segment_ids=sa.SegmentIds(q=s, kv=s)))(qp, kp, vp, ids)
    return jnp.swapaxes(out, 1, 2)[:, :l]


def te_attention(q, k, v, seg: Segments, *, causal=False, scale=None):
    """Transformer Engine fused attention, THD layout from segment ids and positions (CUDA GPU)."""
    try:
        from transformer_engine.jax.attention import (AttnBiasType, AttnMaskType, QKVLayout, SequenceDescriptor,
                                                      fused_attn)
    except ImportError:
        raise UserError("model.attention='te' needs Transformer Engine (fix: pip install 'transformer_engine[jax]' "
                        "on a CUDA machine, or model.attention='auto')") from None
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    pos = positions_from_segments(seg.ids) if seg.positions is None else seg.positions
    desc = SequenceDescriptor.from_segment_ids_and_pos((seg.ids, seg.ids), (pos, pos))
    return fused_attn((q, k, v), None, desc, None, attn_bias_type=AttnBiasType.NO_BIAS,
                      attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK if causal else AttnMaskType.PADDING_MASK,
                      qkv_layout=QKVLayout.THD_THD_THD, scaling_factor=scale, dropout_probability=0.0,
                      is_training=True, max_segments_per_seq=q.shape[1])


def attention(q, k, v, segments, *, causal: bool = False, bias=None, scale: float | None = None,
              dropout_rate: float = 0.0, deterministic: bool = True, rngs=None, implementation: str = "xla",
              window: int | None = None, softcap: float | None = None):
    """Multi-head (or grouped-query) scaled dot-product attention, block-diagonal by segment.

    q: [B, T, N, D]; k, v: [B, T, K, D] with N a multiple of K; segments: ``Segments`` or an attention mask
    [B, T] (1 = token, 0 = padding); causal: also only keys at or before the query; bias: additive
    [1 or B, N, T, T] (T5's position bias; xla only); scale: default 1/sqrt(D) (T5: 1.0); dropout on the attention
    probabilities when ``dropout_rate > 0`` and not ``deterministic`` (xla only); window: sliding window (Mistral,
    Gemma): causal, keys s with 0 <= t - s < window; bidirectional, |t - s| < window. Distances are columns of
    the row, which within a text (contiguous) are distances of positions; a window of T or more is no limit.
    softcap: attention logit soft-capping (Gemma 2). implementation: one of ``IMPLEMENTATIONS`` (module
    docstring). -> [B, T, N, D]."""
    seg = as_segments(segments)
    use_dropout = dropout_rate > 0.0 and not deterministic
    if window is not None and window >= q.shape[1]:
        window = None  # no row is longer than the window: full attention (any kernel)
    impl = resolve(implementation, dtype=q.dtype, head_dim=q.shape[-1], bias=bias is not None,
                   dropout=use_dropout, window=window is not None, softcap=softcap is not None)
    if impl == "xla":
        return xla_attention(q, k, v, seg, causal=causal, bias=bias, scale=scale, dropout_rate=dropout_rate,
                             deterministic=deterministic, rngs=rngs, window=window, softcap=softcap)
    if bias is not None:
        raise UserError(f"model.attention={impl!r} has no additive position bias (T5) {_fix(impl)}")
    if impl == "pallas_flash":
        from jaxembed.models import flash_dropout
        return flash_dropout.flash_attention(q, k, v, seg, causal=causal, scale=scale,
                                             dropout_rate=dropout_rate if use_dropout else 0.0,
                                             key=rngs.dropout() if use_dropout else None,
                                             tokens=_dropout.current_tokens(), interpret=_platform() != "gpu")
    if impl == "splash":
        return splash_attention(q, k, v, seg, causal=causal, scale=scale, window=window, softcap=softcap)
    fn = {"cudnn": cudnn_attention, "pallas": pallas_attention, "te": te_attention}[impl]
    return fn(q, k, v, seg, causal=causal, scale=scale)
