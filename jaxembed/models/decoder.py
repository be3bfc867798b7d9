"""The decoder-only LLM block shared by Qwen2 / Qwen3, Llama, Mistral and Gemma 2 / 3, as a text-embedding
backbone in Flax NNX (the last hidden state after the final RMSNorm, as transformers' ``*Model``), and its
Hugging Face mapping table.

Layer i = attention sublayer, then feed-forward sublayer, each with its residual:

- attention: x + P(o_proj(attn(rope(N_qk(q_proj(n))), rope(N_qk(k_proj(n))), v_proj(n)))), n = input_layernorm(x);
  N_qk: per-head RMSNorm of q and k (Qwen3, Gemma 3); P: ``post_attention_layernorm`` (Gemma) or nothing.
- feed-forward (``ffn``, the unit a MoTE task expert replaces, with all its norms): x + P(down(act(gate(n)) *
  up(n))), n = the pre-feed-forward norm (HF ``post_attention_layernorm`` for Qwen2 / Llama / Mistral,
  ``pre_feedforward_layernorm`` for Gemma); P: ``post_feedforward_layernorm`` (Gemma) or nothing. SwiGLU with
  silu, GeGLU with gelu_pytorch_tanh (Gemma).

What differs per architecture is read off the config (``DecoderConfig``: fields, and properties a subclass
overrides): biases (q/k/v, o, MLP), q/k norms, Gemma's "sandwich" norms, RMSNorm with (1 + w), the embedding
scale sqrt(hidden), the attention scale (Gemma: query_pre_attn_scalar^-1/2), attention logit soft-capping, each
layer's sliding window and each layer's RoPE (``jaxembed.models.rope``; Gemma 3: a local base for sliding layers).

Attention is causal by default (as transformers); ``causal=False`` gives bidirectional attention (padding, and a
sliding window where a layer has one, masked only). Position ids: like transformers with ``position_ids=None``
(what sentence-transformers passes), ``arange(L)`` for every row, also with left padding; RoPE is relative and
padded keys are masked, so a left-padded row's real tokens get the same result as with mask-derived positions
up to rounding; a sliding window counts columns, which within a text are position offsets, as transformers does.

Packed rows (``jaxembed.packing``): ``segment_ids`` and per-text ``positions``; RoPE uses the per-text positions
(restarting at 0), and attention (and its window) stays within a text, so each text's states equal those of its
right-padded row.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from jaxembed.errors import UserError
from jaxembed.models.layers import (RMSNorm, RuntimeOptions, activation, attention, call_ffn, check_attention, dense,
                                    embed, feed_forward, mote_route, run_layers, segments_for, to_dtype)
from jaxembed.models.mapping import Rule, linear, norm
from jaxembed.models.rope import RopeSpec, apply_rope, rope_tables

FULL, SLIDING = "full_attention", "sliding_attention"


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecoderConfig(RuntimeOptions):
    """Fields every decoder backbone has (Hugging Face names). Subclasses add their own, fill ``model_type``'s
    defaults, and override the properties below where the architecture differs."""

    model_type: str
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None  # None: num_attention_heads (filled in by __post_init__)
    head_dim: int | None = None  # None: hidden_size // num_attention_heads (filled in by __post_init__)
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 2048
    attention_dropout: float = 0.0
    attention_bias: bool = False  # q/k/v biases (o_proj: see o_bias)
    mlp_bias: bool = False
    qk_norm: bool = False  # per-head RMSNorm of q and k (Qwen3, Gemma 3)
    tie_word_embeddings: bool = False  # only kept for to_hf (the LM head is not part of the encoder)
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    causal: bool = True  # False: bidirectional attention

    ARCHITECTURES: ClassVar[dict[str, str]] = {}  # model_type -> transformers class, set by each subclass
    HF_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "max_position_embeddings",
                 "attention_dropout", "tie_word_embeddings", "pad_token_id", "bos_token_id", "eos_token_id")

    def __post_init__(self):
        if self.model_type not in self.ARCHITECTURES:
            raise ValueError(f"model_type={self.model_type!r}; expected one of {', '.join(self.ARCHITECTURES)}")
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads}")

    @property
    def num_layers(self) -> int:
        return self.num_hidden_layers

    # ---- what differs per architecture (defaults: Llama)

    @property
    def o_bias(self) -> bool:
        return self.attention_bias

    @property
    def sandwich_norms(self) -> bool:
        """Gemma: post-attention and pre / post feed-forward norms."""
        return False

    @property
    def norm_unit_offset(self) -> bool:
        """Gemma: RMSNorm scales by (1 + w)."""
        return False

    @property
    def embed_scale(self) -> float | None:
        """Gemma: embeddings times sqrt(hidden_size)."""
        return None

    @property
    def attn_scale(self) -> float | None:
        """Logit scale; None: 1 / sqrt(head_dim)."""
        return None

    @property
    def attn_softcap(self) -> float | None:
        return None

    def layer_window(self, i: int) -> int | None:
        """Layer i's sliding window in ``jaxembed.models.attention``'s terms (causal: t - s < W; bidirectional:
        |t - s| < W), or None."""
        return None

    def layer_rope(self, i: int) -> RopeSpec:
        return self.rope

    def base_hf(self, fields: tuple[str, ...]) -> dict[str, Any]:
        """``fields`` as a Hugging Face config dict (eos lists as lists)."""
        d = {k: getattr(self, k) for k in fields}
        if isinstance(d.get("eos_token_id"), tuple):
            d["eos_token_id"] = list(d["eos_token_id"])
        return d


def hf_kwargs(hf: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """The ``fields`` a Hugging Face config dict sets (None values left out)."""
    return {k: hf[k] for k in fields if hf.get(k) is not None}


def is_causal(hf: dict[str, Any]) -> bool:
    """transformers' switch for bidirectional decoders: ``is_causal: false`` in config.json."""
    return hf.get("is_causal") is not False


def _norm(c: DecoderConfig, features: int, rngs: nnx.Rngs, axis_name: str | None = "embed") -> RMSNorm:
    return RMSNorm(features, c.rms_norm_eps, opts=c, rngs=rngs, axis_name=axis_name, unit_offset=c.norm_unit_offset)


class DecoderAttention(nnx.Module):
    """Pre-norm self-attention sublayer of layer ``index`` (module docstring)."""

    def __init__(self, c: DecoderConfig, rngs: nnx.Rngs, index: int = 0):
        self.c = c
        self.window = c.layer_window(index)
        h, d = c.hidden_size, c.head_dim
        self.input_layernorm = _norm(c, h, rngs)
        self.q_proj = dense(h, c.num_attention_heads * d, ("embed", "qkv"), bias=c.attention_bias, opts=c, rngs=rngs)
        self.k_proj = dense(h, c.num_key_value_heads * d, ("embed", "qkv"), bias=c.attention_bias, opts=c, rngs=rngs)
        self.v_proj = dense(h, c.num_key_value_heads * d, ("embed", "qkv"), bias=c.attention_bias, opts=c, rngs=rngs)
        self.o_proj = dense(c.num_attention_heads * d, h, ("qkv", "embed"), bias=c.o_bias, opts=c, rngs=rngs)
        if c.qk_norm:
            self.q_norm = _norm(c, d, rngs, axis_name=None)
            self.k_norm = _norm(c, d, rngs, axis_name=None)
        if c.sandwich_norms:
            self.post_attention_layernorm = _norm(c, h, rngs)

    def __call__(self, x, mask, rope, *, deterministic, rngs):
        """x: [B, L, H], mask: ``Segments`` or an attention mask [B, L], rope: (cos, sin) [B or 1, L, D] ->
        [B, L, H]."""
        b, l, _ = x.shape
        c = self.c
        h = self.input_layernorm(x)
        q = self.q_proj(h).reshape(b, l, c.num_attention_heads, c.head_dim)
        k = self.k_proj(h).reshape(b, l, c.num_key_value_heads, c.head_dim)
        v = self.v_proj(h).reshape(b, l, c.num_key_value_heads, c.head_dim)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        o = attention(q, k, v, mask, causal=c.causal, scale=c.attn_scale, dropout_rate=c.attention_dropout,
                      deterministic=deterministic, rngs=rngs, implementation=c.attention, window=self.window,
                      softcap=c.attn_softcap)
        o = self.o_proj(o.reshape(b, l, -1))
        if c.sandwich_norms:
            o = self.post_attention_layernorm(o)
        return x + o


class DecoderFeedForward(nnx.Module):
    """Pre-norm gated feed-forward sublayer with its residual (module docstring). The replaceable unit for a
    MoTE expert."""

    def __init__(self, c: DecoderConfig, rngs: nnx.Rngs):
        h, m = c.hidden_size, c.intermediate_size
        self.sandwich = c.sandwich_norms
        if self.sandwich:
            self.pre_feedforward_layernorm = _norm(c, h, rngs)
            self.post_feedforward_layernorm = _norm(c, h, rngs)
        else:  # HF's name: the norm after the attention sublayer, i.e. before the MLP
            self.post_attention_layernorm = _norm(c, h, rngs)
        self.gate_proj = dense(h, m, ("embed", "mlp"), bias=c.mlp_bias, opts=c, rngs=rngs)
        self.up_proj = dense(h, m, ("embed", "mlp"), bias=c.mlp_bias, opts=c, rngs=rngs)
        self.down_proj = dense(m, h, ("mlp", "embed"), bias=c.mlp_bias, opts=c, rngs=rngs)
        self.act = activation(c.hidden_act)

    def __call__(self, x, *, deterministic=True, rngs=None):
        """x: [B, L, H] -> [B, L, H]."""
        n = (self.pre_feedforward_layernorm if self.sandwich else self.post_attention_layernorm)(x)
        y = self.down_proj(self.act(self.gate_proj(n)) * self.up_proj(n))
        if self.sandwich:
            y = self.post_feedforward_layernorm(y)
        return x + y


def rope_layout(c: DecoderConfig) -> tuple[tuple[RopeSpec, ...], tuple[int, ...]]:
    """(the distinct RoPEs of the model, the index of each layer's among them)."""
    specs = tuple(dict.fromkeys(c.layer_rope(i) for i in range(c.num_hidden_layers)))
    return specs, tuple(specs.index(c.layer_rope(i)) for i in range(c.num_hidden_layers))


class DecoderLayer(nnx.Module):
    def __init__(self, c: DecoderConfig, rngs: nnx.Rngs, index: int = 0):
        self.rope_index = rope_layout(c)[1][index]
        self.attention = DecoderAttention(c, rngs, index)
        self.ffn = feed_forward(c, index, lambda r: DecoderFeedForward(c, r), rngs)

    def __call__(self, x, mask, ropes, route=None, *, deterministic=True, rngs=None):
        """ropes: (cos, sin) of each of the model's RoPEs; route: MoTE (expert id per row, active experts), see
        jaxembed.mote; None for a dense model."""
        s = self.attention(x, mask, ropes[self.rope_index], deterministic=deterministic, rngs=rngs)
        return call_ffn(self.ffn, s, route, deterministic=deterministic, rngs=rngs)


class DecoderModel(nnx.Module):
    """The backbone: scaled token embeddings -> layers -> final RMSNorm (module docstring)."""

    def __init__(self, config: DecoderConfig, *, rngs: nnx.Rngs):
        check_attention(config, head_dim=config.head_dim, softcap=config.attn_softcap is not None)
        self.config = config
        self.embed_tokens = embed(config.vocab_size, config.hidden_size, ("vocab", "embed"), opts=config, rngs=rngs)
        self.layers = nnx.List([DecoderLayer(config, rngs, i) for i in range(config.num_hidden_layers)])
        self.norm = _norm(config, config.hidden_size, rngs)

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, deterministic: bool = True,
                 rngs: nnx.Rngs | None = None, experts: jax.Array | None = None, segment_ids=None,
                 positions=None) -> jax.Array:
        """input_ids, attention_mask: [B, L] -> last hidden states [B, L, H] (after the final norm).
        Packed rows: segment_ids [B, L] (0 = padding, 1.. per text) and positions [B, L] (from 0 per text)
        instead of attention_mask. token_type_ids is accepted for interface uniformity and ignored. experts: MoTE
        expert index (a scalar, per row [B], or per token [B, L]; None: the default expert); dense models take
        None."""
        c = self.config
        x = self.embed_tokens(input_ids)
        if c.embed_scale is not None:  # transformers rounds the scale to the weights' dtype first
            x = x * jnp.asarray(c.embed_scale, to_dtype(c.param_dtype)).astype(x.dtype)
        segments, positions = segments_for(attention_mask, segment_ids, positions)
        if positions is None:
            # arange positions for every row, like transformers with position_ids=None (see the module docstring).
            positions = jnp.arange(input_ids.shape[1], dtype=jnp.int32)[None, :]
        ropes = tuple(rope_tables(positions, s.inv_freq(c.head_dim), to_dtype(c.dtype)) for s in rope_layout(c)[0])
        route = mote_route(c, experts, input_ids.shape[0])
        args = (segments, ropes) if route is None else (segments, ropes, route)
        x = run_layers(self.layers, x, c.remat, *args, deterministic=deterministic, rngs=rngs)
        return self.norm(x)


# ------------------------------------------------------------------------------------ Hugging Face mapping

# *ForCausalLM / *ForSequenceClassification checkpoints prefix the decoder with ``model.``.
PREFIXES = ("model.",)
# Task heads and non-persistent RoPE buffers that some old checkpoints saved: ignored without a warning.
IGNORE = (r"^lm_head\.", r"^score\.", r"rotary_emb\.inv_freq$", r"rotary_emb\.original_inv_freq$",
          r"self_attn\.rotary_emb\.")


def rules(config: DecoderConfig) -> list[Rule]:
    """The mapping table of transformers' ``*Model`` keys (``layers.{i}.self_attn.q_proj.weight`` ...) for
    ``config``'s biases and norms."""
    L, A, F = "layers.{i}", "layers.{i}.attention", "layers.{i}.ffn"
    r = [
        Rule("embed_tokens.weight", "embed_tokens.embedding"),
        *norm(f"{L}.input_layernorm", f"{A}.input_layernorm", bias=False),
        *linear(f"{L}.self_attn.q_proj", f"{A}.q_proj", bias=config.attention_bias),
        *linear(f"{L}.self_attn.k_proj", f"{A}.k_proj", bias=config.attention_bias),
        *linear(f"{L}.self_attn.v_proj", f"{A}.v_proj", bias=config.attention_bias),
        *linear(f"{L}.self_attn.o_proj", f"{A}.o_proj", bias=config.o_bias),
    ]
    if config.sandwich_norms:
        r += [*norm(f"{L}.post_attention_layernorm", f"{A}.post_attention_layernorm", bias=False),
              *norm(f"{L}.pre_feedforward_layernorm", f"{F}.pre_feedforward_layernorm", bias=False),
              *norm(f"{L}.post_feedforward_layernorm", f"{F}.post_feedforward_layernorm", bias=False)]
    else:
        r += norm(f"{L}.post_attention_layernorm", f"{F}.post_attention_layernorm", bias=False)
    r += [
        *linear(f"{L}.mlp.gate_proj", f"{F}.gate_proj", bias=config.mlp_bias),
        *linear(f"{L}.mlp.up_proj", f"{F}.up_proj", bias=config.mlp_bias),
        *linear(f"{L}.mlp.down_proj", f"{F}.down_proj", bias=config.mlp_bias),
        *norm("norm", "norm", bias=False),
    ]
    if config.qk_norm:
        r += norm(f"{L}.self_attn.q_norm", f"{A}.q_norm", bias=False)
        r += norm(f"{L}.self_attn.k_norm", f"{A}.k_norm", bias=False)
    return r


def adapt(config, keys) -> dict:
    """No optional parts: the config alone determines the parameters."""
    return {}


# ---- the facts every decoder folder declares alike (jaxembed.models.architecture)

#: LoRA's default target: attention q / k / v / o and the gated feed-forward projections
LORA_TARGET = r"(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)$"


def matrix_params(config: DecoderConfig) -> int:
    """Weights of all layers' matrices: q / k / v / o projections (grouped-query k / v) and the gated (3-matrix)
    feed-forward."""
    h = config.hidden_size
    q = config.num_attention_heads * config.head_dim
    kv = config.num_key_value_heads * config.head_dim
    return config.num_layers * (h * q + 2 * h * kv + q * h + 3 * h * config.intermediate_size)


def attention_width(config: DecoderConfig) -> int:
    return config.num_attention_heads * config.head_dim


def tiny_fields(name: str, size) -> dict:
    """The Hugging Face config fields a tiny decoder shares (``jaxembed.models.architecture.TinySize``): feed-forward
    2 x hidden, num_heads // 2 key-value heads (grouped-query attention: num_heads must be even)."""
    if size.num_heads % 2:
        raise UserError(f"tiny_model_dir: {name} needs an even num_heads (grouped-query attention), got "
                        f"{size.num_heads}")
    return dict(vocab_size=size.vocab_size, hidden_size=size.hidden_size, intermediate_size=2 * size.hidden_size,
                num_hidden_layers=size.num_layers, num_attention_heads=size.num_heads,
                num_key_value_heads=size.num_heads // 2, max_position_embeddings=size.max_positions)
