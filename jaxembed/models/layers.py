"""Building blocks shared by every architecture.

Parameters carry logical axis names (``out_sharding`` metadata, not applied eagerly) so that
``jaxembed.parallel`` can map them to a mesh: data-parallel replicates them, FSDP shards the ``embed`` axis.

Logical axes used: ``vocab``, ``embed`` (model width), ``mlp`` (feed-forward width), ``qkv`` (heads x head_dim of
a projection), ``buckets`` (T5 relative-position buckets), ``heads``.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from jaxembed import choices
from jaxembed.models import attention as _attn
from jaxembed.models.attention import Segments

DTYPES = {name: getattr(jnp, name) for name in choices.DTYPES}

#: ``model.remat_policy``: what a rematerialised layer (``model.remat``) keeps for its backward pass
REMAT_POLICIES = {
    "nothing": None,  # the layer's input only: the backward pass recomputes the whole layer (the least memory)
    "dots": jax.checkpoint_policies.dots_saveable,  # every matmul's output too: no matmul is recomputed
    # the projections' outputs (matmuls without batch dimensions) too; attention's batched matmuls are recomputed
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def remat_option(remat: bool, policy: str = "nothing") -> bool | str:
    """A model config's ``remat`` from ``model.remat`` and ``model.remat_policy``: False (off), True (the policy
    'nothing') or the name of another policy of ``REMAT_POLICIES``."""
    if not remat:
        return False
    return True if policy == "nothing" else policy


def to_dtype(name: str):
    """Map a dtype name from a config (``float32``, ``bfloat16``, ``float16``) to a jnp dtype."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; allowed: {', '.join(DTYPES)}") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class RuntimeOptions:
    """Options every architecture config carries on top of its Hugging Face fields.

    dtype: computation dtype; param_dtype: storage dtype of the parameters; remat: rematerialise each layer in
    the backward pass (activation memory of one layer at a time): True, or a policy name of ``REMAT_POLICIES``
    (what the layer keeps besides its input; True = 'nothing'); mote: a ``jaxembed.mote.MoTESpec`` (MoTE task
    experts in the feed-forward blocks of ``mote.layers``) or None (dense); attention: the attention kernel
    (``model.attention``: ``jaxembed.choices.ATTENTION_KERNELS``, see ``jaxembed.models.attention``).

    ``mote`` plugs into the feed-forward interface below (``feed_forward``, ``mote_route``, ``call_ffn``) through
    ``layers``, ``feed_forward(build, rngs)`` and ``route(experts, batch)``; this module never imports
    ``jaxembed.mote`` (it sits above the model layer).
    """

    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: bool | str = False
    mote: Any = None  # jaxembed.mote.MoTESpec: these layers' feed-forward blocks are task experts; None = dense
    attention: str = "auto"


def _init(initializer, axes: tuple[str | None, ...]):
    return nnx.with_partitioning(initializer, axes, eager_sharding=False)


def dense(
    din: int,
    dout: int,
    axes: tuple[str | None, str | None],
    *,
    bias: bool,
    opts: RuntimeOptions,
    rngs: nnx.Rngs,
    std: float = 0.02,
) -> nnx.Linear:
    """A linear layer (``Dense``); kernel shape [din, dout] (transpose of PyTorch's [dout, din])."""
    return Dense(
        din,
        dout,
        use_bias=bias,
        dtype=to_dtype(opts.dtype),
        param_dtype=to_dtype(opts.param_dtype),
        kernel_init=_init(nnx.initializers.normal(std), axes),
        bias_init=_init(nnx.initializers.zeros_init(), (axes[1],)),
        rngs=rngs,
    )


class Dense(nnx.Linear):
    """``nnx.Linear`` whose bias gradient is summed in float32. Autodiff's transpose of the bias broadcast is a
    reduction in the compute dtype: in bfloat16 a sum over thousands of tokens stalls once the partial sum
    outgrows the addends (on the CPU the bias gradient of 3,456 tokens of cotangent 1 came out as 1,024), where
    PyTorch accumulates in float32. Forward values are nnx.Linear's."""

    def __call__(self, inputs: jax.Array, out_sharding=None) -> jax.Array:
        """inputs [..., din] -> [..., dout]."""
        if self.bias is None:
            return super().__call__(inputs, out_sharding=out_sharding)
        kernel = self.kernel[...]
        inputs, kernel = self.promote_dtype((inputs, kernel), dtype=self.dtype)
        kw = {"out_sharding": out_sharding}
        if self.preferred_element_type is not None:
            kw["preferred_element_type"] = self.preferred_element_type
        if _attn._platform() == "cpu" and self.preferred_element_type is None and out_sharding is None and \
                self.dot_general is jax.lax.dot_general:
            y = _cpu_matmul(inputs, kernel, self.precision)
        else:
            y = self.dot_general(inputs, kernel, (((inputs.ndim - 1,), (0,)), ((), ())), precision=self.precision,
                                 **kw)
        return _add_row(y, self.bias[...], y.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _cpu_matmul(x, kernel, precision):
    """x [..., din] @ kernel [din, dout] -> [..., dout], the values of ``jax.lax.dot_general`` (``Dense`` on CPUs).
    Its backward flattens the tokens and computes the kernel's gradient with the smaller of din / dout as the
    product's rows, the faster orientation of XLA's CPU dot (Eigen) of tokens^T x cotangents; autodiff's transpose
    of the dot leaves XLA the slower one and layout copies around it (figures: docs/models.md)."""
    return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())), precision=precision)


def _cpu_matmul_fwd(x, kernel, precision):
    return _cpu_matmul(x, kernel, precision), (x, kernel)


def _cpu_matmul_bwd(precision, res, g):
    x, kernel = res
    din, dout = kernel.shape
    x2, g2 = x.reshape(-1, din), g.reshape(-1, dout)
    dx = jax.lax.dot_general(g2, kernel, (((1,), (1,)), ((), ())), precision=precision).reshape(x.shape)
    tokens = (((0,), (0,)), ((), ()))
    if din > dout:  # [dout, din] then transposed; the barrier keeps XLA from folding the transpose into the dot
        dk = jax.lax.optimization_barrier(jax.lax.dot_general(g2, x2, tokens, precision=precision)).T
    else:
        dk = jax.lax.dot_general(x2, g2, tokens, precision=precision)
    return dx.astype(x.dtype), dk.astype(kernel.dtype)


_cpu_matmul.defvjp(_cpu_matmul_fwd, _cpu_matmul_bwd)


class Embed(nnx.Embed):
    """``nnx.Embed`` that gathers rows of the table in its parameter dtype and casts the rows, not the table, to
    the compute dtype: the same values, and the backward pass's scatter-add into the table runs in the parameter
    dtype (float32). A bfloat16 scatter-add with repeated indices (every token of a batch into the token-type row,
    the [CLS] / [SEP] / padding rows) is a compare-and-swap loop on GPUs (openxla/xla#26371), slow under that
    contention; it also skips casting the whole table every step."""

    def __call__(self, inputs: jax.Array, out_sharding=None) -> jax.Array:
        """inputs: integer array [...] -> rows [..., features] in the compute dtype."""
        if not jnp.issubdtype(inputs.dtype, jnp.integer):
            raise ValueError("Input type must be an integer or unsigned integer.")
        rows = jnp.take(self.embedding[...], inputs, axis=0)
        return rows if self.dtype is None else rows.astype(self.dtype)

    def add_row(self, x: jax.Array, index: int = 0) -> jax.Array:
        """x [..., features] + row ``index`` in the compute dtype, broadcast (a constant index: no gather). The
        same values as adding ``self(full(index))``; the row's gradient is the sum of x's cotangent over its
        leading axes, accumulated in float32 as the scatter-add would (a bfloat16 sum of thousands of tokens
        loses digits)."""
        return _add_row(x, self.embedding[...][index], jnp.dtype(self.dtype or x.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _add_row(x, row, dtype):
    return x + row.astype(dtype)


def _add_row_fwd(x, row, dtype):
    return _add_row(x, row, dtype), jnp.zeros((0,), row.dtype)


def _add_row_bwd(dtype, like, g):
    return g, jnp.sum(g.astype(jnp.float32), axis=tuple(range(g.ndim - 1))).astype(like.dtype)


_add_row.defvjp(_add_row_fwd, _add_row_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _mul_row(x, row, dtype):
    """x [..., F] * row [F] cast to ``dtype``; the row's gradient sum(g * x) over the leading axes is accumulated
    in float32 (``Dense``'s docstring says why)."""
    return x * row.astype(dtype)


def _mul_row_fwd(x, row, dtype):
    return _mul_row(x, row, dtype), (x, row)


def _mul_row_bwd(dtype, res, g):
    x, row = res
    grow = jnp.sum(g.astype(jnp.float32) * x.astype(jnp.float32), axis=tuple(range(g.ndim - 1)))
    return (g * row.astype(dtype)).astype(x.dtype), grow.astype(row.dtype)


_mul_row.defvjp(_mul_row_fwd, _mul_row_bwd)


def embed(num: int, features: int, axes: tuple[str | None, str | None], *, opts: RuntimeOptions, rngs: nnx.Rngs,
          std: float = 0.02) -> Embed:
    """An embedding table of shape [num, features]."""
    return Embed(
        num,
        features,
        dtype=to_dtype(opts.dtype),
        param_dtype=to_dtype(opts.param_dtype),
        embedding_init=_init(nnx.initializers.normal(std), axes),
        rngs=rngs,
    )


def layer_norm(features: int, eps: float, *, opts: RuntimeOptions, rngs: nnx.Rngs) -> nnx.LayerNorm:
    """LayerNorm with scale and bias, statistics in float32."""
    return nnx.LayerNorm(
        features,
        epsilon=eps,
        dtype=to_dtype(opts.dtype),
        param_dtype=to_dtype(opts.param_dtype),
        scale_init=_init(nnx.initializers.ones_init(), ("embed",)),
        bias_init=_init(nnx.initializers.zeros_init(), ("embed",)),
        rngs=rngs,
    )


class RMSNorm(nnx.Module):
    """Root-mean-square norm without mean subtraction or bias (T5 LayerNorm, Qwen2 / Llama RMSNorm).

    y = x / sqrt(mean(x^2) + eps) * scale, computed in float32 and cast back to the compute dtype,
    like the PyTorch references (which cast to the weight dtype before multiplying).

    unit_offset (Gemma): the stored scale w is centred on 0 (initialised to 0) and y = x / sqrt(mean(x^2) + eps)
    * (1 + w), all in float32, cast at the end (transformers' Gemma2RMSNorm / Gemma3RMSNorm).
    """

    def __init__(self, features: int, eps: float, *, opts: RuntimeOptions, rngs: nnx.Rngs,
                 axis_name: str | None = "embed", unit_offset: bool = False):
        self.eps = eps
        self.unit_offset = unit_offset
        self.dtype = to_dtype(opts.dtype)
        init = nnx.initializers.zeros_init() if unit_offset else nnx.initializers.ones_init()
        self.scale = nnx.Param(_init(init, (axis_name,))(rngs.params(), (features,), to_dtype(opts.param_dtype)))

    def __call__(self, x: jax.Array) -> jax.Array:
        """x: [..., features] -> [..., features]."""
        x32 = x.astype(jnp.float32)
        var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
        if self.unit_offset:
            return (x32 * jax.lax.rsqrt(var + self.eps) * (1.0 + self.scale[...].astype(jnp.float32))).astype(
                self.dtype)
        y = (x32 * jax.lax.rsqrt(var + self.eps)).astype(self.dtype)
        return _mul_row(y, self.scale[...], y.dtype)  # the scale's gradient summed in float32 (Dense)


_SQRT_HALF = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327


def gelu(x):
    """Exact GELU, x * Phi(x) (HF ``gelu``, torch's ``nn.GELU()``), the values of ``jax.nn.gelu(x,
    approximate=False)``. On CPUs as torch computes it, x * (1 + erf(x / sqrt 2)) / 2 (XLA's CPU erfc, which
    jax.nn.gelu uses, is slow), with its own backward, g * (Phi(x) + x phi(x)) from the forward's Phi(x)
    (figures: docs/models.md). GPUs keep jax.nn.gelu until measured there."""
    if _attn._platform() != "cpu":
        return jax.nn.gelu(x, approximate=False)
    return _gelu_cpu(x)


@jax.custom_vjp
def _gelu_cpu(x):
    return x * _phi(x)


def _phi(x):
    """The standard normal CDF, computed in float32 for narrower inputs, in x's dtype."""
    xf = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    return (0.5 + 0.5 * jax.lax.erf(xf * _SQRT_HALF)).astype(x.dtype)


def _gelu_cpu_fwd(x):
    cdf = _phi(x)
    return x * cdf, (x, cdf)


def _gelu_cpu_bwd(res, g):
    x, cdf = res
    xf = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    d = cdf.astype(xf.dtype) + xf * (_INV_SQRT_2PI * jnp.exp(-0.5 * xf * xf))
    return ((g.astype(xf.dtype) * d).astype(x.dtype),)


_gelu_cpu.defvjp(_gelu_cpu_fwd, _gelu_cpu_bwd)


def gelu_new(x):
    """The tanh approximation of GELU (HF ``gelu_new``, ``gelu_pytorch_tanh``)."""
    return jax.nn.gelu(x, approximate=True)


ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": gelu,
    "gelu_new": gelu_new,
    "gelu_pytorch_tanh": gelu_new,
    "gelu_fast": gelu_new,
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "tanh": jnp.tanh,
}


def activation(name: str) -> Callable[[jax.Array], jax.Array]:
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unsupported activation {name!r}; supported: {', '.join(ACTIVATIONS)}") from None


def attention(q, k, v, segments, *, causal: bool = False, bias=None, scale: float | None = None,
              dropout_rate: float = 0.0, deterministic: bool = True, rngs: nnx.Rngs | None = None,
              implementation: str = "xla", window: int | None = None, softcap: float | None = None) -> jax.Array:
    """Multi-head (or grouped-query) scaled dot-product attention, block-diagonal by segment: the one attention
    interface of every architecture (kernels in ``jaxembed.models.attention``).

    q: [B, T, N, D]; k, v: [B, T, K, D] with N a multiple of K (grouped-query attention when K < N);
    segments: ``Segments`` (segment ids [B, T], 0 = padding, 1.. = the text of each token within its row) or an
    attention mask [B, T] (1 = real token, 0 = padding); causal: only keys at or before the query, within its
    text; bias: additive [1 or B, N, T, T] (T5 position bias); scale defaults to 1/sqrt(D) (T5 uses 1.0);
    implementation: ``model.attention`` (one of ``jaxembed.choices.ATTENTION_KERNELS``); window: sliding window within
    a text (Mistral, Gemma); softcap: attention logit soft-capping (Gemma 2). Returns [B, T, N, D].
    """
    return _attn.attention(q, k, v, segments, causal=causal, bias=bias, scale=scale, dropout_rate=dropout_rate,
                           deterministic=deterministic, rngs=rngs, implementation=implementation, window=window,
                           softcap=softcap)


def segments_for(attention_mask: jax.Array | None, segment_ids: jax.Array | None,
                 positions: jax.Array | None) -> tuple[Segments, jax.Array | None]:
    """The attention segments and per-text positions of a forward pass: the padded form (``attention_mask``
    [B, L], one text per row; positions None: each architecture's own) or the packed form (``segment_ids`` [B, L],
    0 = padding, 1.. per text; ``positions`` [B, L] restarting at 0 per text, derived from the segment ids when
    None). -> (Segments, positions or None)."""
    if segment_ids is None:
        if attention_mask is None:
            raise ValueError("give attention_mask (padded rows) or segment_ids (packed rows)")
        return Segments(jnp.asarray(attention_mask).astype(jnp.int32)), None
    ids = jnp.asarray(segment_ids).astype(jnp.int32)
    pos = _attn.positions_from_segments(ids) if positions is None else jnp.asarray(positions).astype(jnp.int32)
    return Segments(ids, pos), pos


def check_attention(c: "RuntimeOptions", *, head_dim: int, bias: bool = False, softcap: bool = False) -> None:
    """A one-line UserError when ``c.attention`` cannot run this model here (see ``jaxembed.models.attention``);
    called when a model is built, before any work."""
    _attn.check(c.attention, dtype=to_dtype(c.dtype), head_dim=head_dim, bias=bias, softcap=softcap)


def run_layers(layers, x: jax.Array, remat: bool | str, *args, rngs: nnx.Rngs | None = None,
               **kwargs) -> jax.Array:
    """Apply ``layers`` in order: x = layer(x, *args, rngs=rngs, **kwargs); with remat each layer is
    rematerialised (``nnx.remat``) so only its inputs (and what the policy ``remat`` names keeps, see
    ``REMAT_POLICIES``) are kept for the backward pass. ``rngs`` goes through the transform as an argument (a
    closure over it would mutate RNG state across trace levels)."""
    policy = REMAT_POLICIES[remat] if isinstance(remat, str) else None
    for layer in layers:
        if remat:
            x = nnx.remat(lambda m, h, r, *a: _call_layer(m, h, *a, rngs=r, **kwargs), policy=policy)(
                layer, x, rngs, *args)
        else:
            x = _call_layer(layer, x, *args, rngs=rngs, **kwargs)
    return x


#: The dropout key of the layer call now running, for sublayers that are called without ``rngs``: LoRA adapters
#: (``jaxembed.lora.LoRALinear``) sit where an ``nnx.Linear`` was and are called as one, x -> y.
_LAYER_DROPOUT_KEY: contextvars.ContextVar = contextvars.ContextVar("jaxembed_layer_dropout_key", default=None)


def layer_dropout_key() -> jax.Array | None:
    """The dropout key of the running layer call (``run_layers``): one draw from the layer's ``rngs`` per call,
    made only when a sublayer sets ``layer_dropout`` > 0 (so models without such sublayers draw exactly as
    before); None in eval mode, without rngs, or outside a layer call."""
    return _LAYER_DROPOUT_KEY.get()


def _draws_layer_key(layer) -> bool:
    return any(isinstance(n, nnx.Module) and getattr(n, "layer_dropout", 0) > 0 for _, n in nnx.iter_graph(layer))


def _call_layer(layer, x, *args, rngs=None, **kwargs):
    """layer(x, ...) with its ``layer_dropout_key`` set (the dropout key of LoRA adapters, jaxembed.lora)."""
    key = None
    if not kwargs.get("deterministic", True) and rngs is not None and _draws_layer_key(layer):
        key = rngs.dropout()
    token = _LAYER_DROPOUT_KEY.set(key)
    try:
        return layer(x, *args, rngs=rngs, **kwargs)
    finally:
        _LAYER_DROPOUT_KEY.reset(token)


def feed_forward(c: RuntimeOptions, index: int, build: Callable[[nnx.Rngs], nnx.Module], rngs: nnx.Rngs) -> nnx.Module:
    """Layer ``index``'s feed-forward sublayer: ``build(rngs)`` (the dense block), or, when ``c.mote`` lists the
    layer, the block ``c.mote.feed_forward(build, rngs)`` makes of it (``jaxembed.mote.MoTEFeedForward``: one
    copy of the dense block per task expert)."""
    spec = c.mote
    if spec is None or index not in spec.layers:
        return build(rngs)
    return spec.feed_forward(build, rngs)


def call_ffn(ffn: nnx.Module, x: jax.Array, route, *, deterministic: bool, rngs: nnx.Rngs | None) -> jax.Array:
    """Apply a feed-forward sublayer; a MoTE block also gets the route (expert id per row, see jaxembed.mote)."""
    if getattr(ffn, "routed", False):
        return ffn(x, route, deterministic=deterministic, rngs=rngs)
    return ffn(x, deterministic=deterministic, rngs=rngs)


def mote_route(c: RuntimeOptions, experts: jax.Array | None, batch: int):
    """The route of a forward pass: None for a dense model; (ids, active [E]) for a MoTE model: ``experts`` None
    (every row to the default expert), a scalar (one expert for the call), [B] (an expert per row) or [B, L] (an
    expert per token: packed rows, each text's tokens routed to its expert; -1 on padding)."""
    if c.mote is None:
        if experts is not None:
            raise ValueError("expert ids given to a dense model (it has no task experts)")
        return None
    return c.mote.route(experts, batch)
