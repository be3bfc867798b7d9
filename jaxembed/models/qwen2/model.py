"""Qwen2 / Qwen3 decoder as a text-embedding backbone in Flax NNX, numerically matching ``transformers``
(``Qwen2Model`` / ``Qwen3Model``: last hidden state after the final RMSNorm).

Layer = attention sublayer (pre-norm: x + o_proj(attn(input_layernorm(x)))) followed by the feed-forward sublayer
``Qwen2FeedForward`` (``ffn``), which owns its RMSNorm (HF ``post_attention_layernorm``), the SwiGLU MLP and the
residual: x + down(silu(gate(norm(x))) * up(norm(x))). That is the unit a MoTE task expert replaces.

Qwen2: q/k/v projections with bias, o_proj without. Qwen3: ``attention_bias`` for all four projections (usually
False) and per-head RMSNorm of q and k (``q_norm``/``k_norm`` over head_dim) before RoPE.

Attention is causal by default (as HF); ``causal=False`` gives bidirectional attention (KaLM / LLM2Vec-style
embedders), only padding is masked then.

Position ids: transformers 5 ``Qwen2Model.forward`` / ``Qwen3Model.forward`` with ``position_ids=None`` (what
sentence-transformers passes: input_ids and attention_mask only) uses ``arange(L)`` for every row, also with left
padding; it does not derive positions from the attention mask (only ``generate`` does, via cumsum(mask) - 1). We do
the same. Because RoPE only encodes relative offsets and padded keys are masked, the real tokens of a left-padded
row get the same result as with mask-derived positions up to rounding.

Packed rows (``jaxembed.packing``): ``segment_ids`` and per-text ``positions``; RoPE uses the per-text positions
(restarting at 0), and attention stays within a text (causal within the text, or bidirectional within it), so
each text's states equal those of its right-padded row.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxembed.models.layers import (RMSNorm, RuntimeOptions, activation, attention, call_ffn, check_attention, dense,
                                    embed, feed_forward, mote_route, run_layers, segments_for, to_dtype)

_ARCHITECTURES = {"qwen2": "Qwen2Model", "qwen3": "Qwen3Model"}


def _rope_theta(hf: dict[str, Any]) -> float:
    """RoPE base from a transformers 5 ``rope_parameters`` dict or a transformers 4 ``rope_theta`` (+
    ``rope_scaling``) config. Only the default (unscaled) RoPE is supported."""
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    for d in (params, scaling):
        kind = d.get("rope_type", d.get("type", "default")) if isinstance(d, dict) else "default"
        if kind not in (None, "default"):
            raise ValueError(f"rope_type={kind!r} is not supported (only 'default' RoPE, no yarn/linear/dynamic "
                             "scaling)")
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    if theta is None:
        theta = hf.get("rope_theta")
    return float(theta) if theta is not None else 10000.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Qwen2Config(RuntimeOptions):
    model_type: str = "qwen2"
    vocab_size: int = 151936
    hidden_size: int = 4096
    intermediate_size: int = 22016
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = 32
    head_dim: int | None = None  # None: hidden_size // num_attention_heads (filled in by __post_init__)
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    attention_dropout: float = 0.0
    attention_bias: bool = True  # q/k/v bias (Qwen2: always; Qwen3: attention_bias, also on o_proj)
    qk_norm: bool = False  # Qwen3 per-head RMSNorm of q and k
    tie_word_embeddings: bool = False  # only kept for to_hf (the LM head is not part of the encoder)
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    causal: bool = True  # False: bidirectional attention (padding mask only)

    HF_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "max_position_embeddings",
                 "attention_dropout", "tie_word_embeddings", "pad_token_id", "bos_token_id", "eos_token_id")

    def __post_init__(self):
        if self.model_type not in _ARCHITECTURES:
            raise ValueError(f"model_type={self.model_type!r}; expected one of {', '.join(_ARCHITECTURES)}")
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

    @property
    def o_bias(self) -> bool:
        """Qwen2's o_proj never has a bias; Qwen3 uses attention_bias for all four projections."""
        return self.attention_bias and self.model_type == "qwen3"

    @classmethod
    def from_hf(cls, hf: dict[str, Any], **overrides) -> "Qwen2Config":
        model_type = hf.get("model_type", "qwen2")
        if hf.get("use_sliding_window"):
            raise ValueError("use_sliding_window=true is not supported (sliding-window attention)")
        if any(t != "full_attention" for t in (hf.get("layer_types") or [])):
            raise ValueError(f"layer_types={hf['layer_types']!r}: only full attention is supported")
        kw = {k: hf[k] for k in cls.HF_FIELDS if hf.get(k) is not None}
        kw["rope_theta"] = _rope_theta(hf)
        if model_type == "qwen3":
            kw.update(attention_bias=bool(hf.get("attention_bias", False)), qk_norm=True)
        else:  # transformers' Qwen2Attention hard-codes bias=True on q/k/v, whatever the config says
            kw.update(attention_bias=True, qk_norm=False)
        if hf.get("is_causal") is False:  # transformers' switch for bidirectional decoders
            kw["causal"] = False
        kw.update(overrides)
        return cls(model_type=model_type, **kw)

    def to_hf(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.HF_FIELDS}
        if isinstance(d["eos_token_id"], tuple):
            d["eos_token_id"] = list(d["eos_token_id"])
        if self.model_type == "qwen2" and self.head_dim == self.hidden_size // self.num_attention_heads:
            del d["head_dim"]  # not a Qwen2Config field; transformers derives it
        d.update(
            model_type=self.model_type,
            architectures=[_ARCHITECTURES[self.model_type]],
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            use_sliding_window=False,
            layer_types=["full_attention"] * self.num_hidden_layers,
        )
        if self.model_type == "qwen3":
            d["attention_bias"] = self.attention_bias
        if not self.causal:
            d["is_causal"] = False
        return d


def rope_tables(positions: jax.Array, head_dim: int, theta: float, dtype) -> tuple[jax.Array, jax.Array]:
    """cos, sin of shape [B or 1, L, head_dim] for integer positions [B or 1, L], computed in float32 (as HF's
    ``Qwen2RotaryEmbedding``) and cast to the compute dtype."""
    inv_freq = 1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x: [B, L, N, D]; cos, sin: [B or 1, L, D]. HF's rotate_half formulation."""
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


class Qwen2Attention(nnx.Module):
    """Pre-norm self-attention sublayer: x + o_proj(attn(input_layernorm(x)))."""

    def __init__(self, c: Qwen2Config, rngs: nnx.Rngs):
        self.c = c
        h, d = c.hidden_size, c.head_dim
        self.input_layernorm = RMSNorm(h, c.rms_norm_eps, opts=c, rngs=rngs)
        self.q_proj = dense(h, c.num_attention_heads * d, ("embed", "qkv"), bias=c.attention_bias, opts=c, rngs=rngs)
        self.k_proj = dense(h, c.num_key_value_heads * d, ("embed", "qkv"), bias=c.attention_bias, opts=c, rngs=rngs)
        self.v_proj = dense(h, c.num_key_value_heads * d, ("embed", "qkv"), bias=c.attention_bias, opts=c, rngs=rngs)
        self.o_proj = dense(c.num_attention_heads * d, h, ("qkv", "embed"), bias=c.o_bias, opts=c, rngs=rngs)
        if c.qk_norm:
            self.q_norm = RMSNorm(d, c.rms_norm_eps, opts=c, rngs=rngs, axis_name=None)
            self.k_norm = RMSNorm(d, c.rms_norm_eps, opts=c, rngs=rngs, axis_name=None)

    def __call__(self, x, mask, cos, sin, *, deterministic, rngs):
        """x: [B, L, H], mask: ``Segments`` or an attention mask [B, L], cos/sin: [B or 1, L, D] -> [B, L, H]."""
        b, l, _ = x.shape
        c = self.c
        h = self.input_layernorm(x)
        q = self.q_proj(h).reshape(b, l, c.num_attention_heads, c.head_dim)
        k = self.k_proj(h).reshape(b, l, c.num_key_value_heads, c.head_dim)
        v = self.v_proj(h).reshape(b, l, c.num_key_value_heads, c.head_dim)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        o = attention(q, k, v, mask, causal=c.causal, dropout_rate=c.attention_dropout,
                      deterministic=deterministic, rngs=rngs, implementation=c.attention)
        return x + self.o_proj(o.reshape(b, l, -1))


class Qwen2FeedForward(nnx.Module):
    """Pre-norm SwiGLU feed-forward sublayer with its residual: x + down(act(gate(n)) * up(n)), n = norm(x).

    The replaceable unit for a MoTE expert."""

    def __init__(self, c: Qwen2Config, rngs: nnx.Rngs):
        h, m = c.hidden_size, c.intermediate_size
        self.post_attention_layernorm = RMSNorm(h, c.rms_norm_eps, opts=c, rngs=rngs)
        self.gate_proj = dense(h, m, ("embed", "mlp"), bias=False, opts=c, rngs=rngs)
        self.up_proj = dense(h, m, ("embed", "mlp"), bias=False, opts=c, rngs=rngs)
        self.down_proj = dense(m, h, ("mlp", "embed"), bias=False, opts=c, rngs=rngs)
        self.act = activation(c.hidden_act)

    def __call__(self, x, *, deterministic=True, rngs=None):
        """x: [B, L, H] -> [B, L, H]."""
        n = self.post_attention_layernorm(x)
        return x + self.down_proj(self.act(self.gate_proj(n)) * self.up_proj(n))


class Qwen2Layer(nnx.Module):
    def __init__(self, c: Qwen2Config, rngs: nnx.Rngs, index: int = 0):
        self.attention = Qwen2Attention(c, rngs)
        self.ffn = feed_forward(c, index, lambda r: Qwen2FeedForward(c, r), rngs)

    def __call__(self, x, mask, cos, sin, route=None, *, deterministic=True, rngs=None):
        """route: MoTE (expert id per row, active experts), see jaxembed.mote; None for a dense model."""
        s = self.attention(x, mask, cos, sin, deterministic=deterministic, rngs=rngs)
        return call_ffn(self.ffn, s, route, deterministic=deterministic, rngs=rngs)


class Qwen2Model(nnx.Module):
    def __init__(self, config: Qwen2Config, *, rngs: nnx.Rngs):
        check_attention(config, head_dim=config.head_dim)
        self.config = config
        self.embed_tokens = embed(config.vocab_size, config.hidden_size, ("vocab", "embed"), opts=config, rngs=rngs)
        self.layers = nnx.List([Qwen2Layer(config, rngs, i) for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, opts=config, rngs=rngs)

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
        segments, positions = segments_for(attention_mask, segment_ids, positions)
        if positions is None:
            # arange positions for every row, like transformers with position_ids=None (see the module docstring).
            positions = jnp.arange(input_ids.shape[1], dtype=jnp.int32)[None, :]
        cos, sin = rope_tables(positions, c.head_dim, c.rope_theta, to_dtype(c.dtype))
        route = mote_route(c, experts, input_ids.shape[0])
        args = (segments, cos, sin) if route is None else (segments, cos, sin, route)
        x = run_layers(self.layers, x, c.remat, *args, deterministic=deterministic, rngs=rngs)
        return self.norm(x)
