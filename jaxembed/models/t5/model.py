"""T5 / mT5 encoder in Flax NNX (GTR, sentence-T5, INSTRUCTOR), numerically matching ``transformers.T5EncoderModel``.

Pre-LN with T5's RMS norm (no mean, no bias), no biases in any linear layer, unscaled dot-product attention
(scale 1.0) plus a learned relative position bias. As in HF, the bias table lives in block 0 only and the bias it
produces is shared by every layer; here the table is a top-level module (``relative_attention_bias``) and the bias
[1, N, L, L] is computed once per call and passed to each layer.

Layer = attention sublayer ``x + dropout(o(attn(norm(x))))`` followed by the feed-forward sublayer
``T5FeedForward`` (``ffn``), which owns its norm, the MLP and the residual: the unit a MoTE task expert replaces.

Packed rows (``jaxembed.packing``): ``segment_ids`` (and ``positions``) instead of ``attention_mask``; attention is
block-diagonal by segment. The relative-position bucket of a query / key pair depends only on (key position -
query position) within the text. A packed text occupies consecutive columns, so that difference equals the
difference of the row's columns, and the [1, N, L, L] bias computed from the row's columns is the per-text bias
wherever attention is allowed (pairs across texts are masked). So packed and padded rows share one bias
(computed in numpy from the static shape).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxembed.models.dropout import Dropout
from jaxembed.models.layers import (RMSNorm, RuntimeOptions, activation, attention, call_ffn, check_attention, dense,
                                    embed, feed_forward, mote_route, run_layers, segments_for, to_dtype)

# HF T5Config / MT5Config defaults for fields a diff-saved config.json may leave out.
_DEFAULTS = {
    "t5": {},
    "mt5": dict(vocab_size=250112, d_ff=1024, num_layers=8, num_heads=6, feed_forward_proj="gated-gelu",
                tie_word_embeddings=False),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class T5Config(RuntimeOptions):
    """Fields of HF ``T5Config`` (defaults are HF's T5 defaults) plus the runtime options.

    hf_embed_keys is not an HF field: it records under which key(s) the checkpoint stored the shared token
    embedding (``shared.weight`` and/or its tied alias ``encoder.embed_tokens.weight``). ``adapt`` sets it from
    the checkpoint's keys so that import accepts either key and export writes back the same key(s).
    """

    model_type: str = "t5"
    vocab_size: int = 32128
    d_model: int = 512
    d_kv: int = 64
    d_ff: int = 2048
    num_layers: int = 6
    num_heads: int = 8
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    dropout_rate: float = 0.1
    layer_norm_epsilon: float = 1e-6
    feed_forward_proj: str = "relu"
    pad_token_id: int = 0
    eos_token_id: int = 1
    tie_word_embeddings: bool = True
    hf_embed_keys: tuple[str, ...] = ("shared.weight",)

    HF_FIELDS = ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads",
                 "relative_attention_num_buckets", "relative_attention_max_distance", "dropout_rate",
                 "layer_norm_epsilon", "feed_forward_proj", "pad_token_id", "eos_token_id", "tie_word_embeddings")

    def __post_init__(self):
        if self.model_type not in _DEFAULTS:
            raise ValueError(f"model_type={self.model_type!r} is not a T5 model (expected 't5' or 'mt5')")
        parts = self.feed_forward_proj.split("-")
        if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
            raise ValueError(f"feed_forward_proj={self.feed_forward_proj!r} is not of the form 'gated-ACT' or 'ACT'")
        activation(self.dense_act_fn)  # fail early on an unsupported activation

    # Aliases other code reads (HF T5Config.attribute_map).
    @property
    def hidden_size(self) -> int:
        return self.d_model

    @property
    def num_hidden_layers(self) -> int:
        return self.num_layers

    @property
    def num_attention_heads(self) -> int:
        return self.num_heads

    @property
    def is_gated_act(self) -> bool:
        return self.feed_forward_proj.split("-")[0] == "gated"

    @property
    def dense_act_fn(self) -> str:
        # As HF: the name after "gated-"; "gated-gelu" is the tanh approximation (T5 v1.1, mT5).
        return "gelu_new" if self.feed_forward_proj == "gated-gelu" else self.feed_forward_proj.split("-")[-1]

    @classmethod
    def from_hf(cls, hf: dict[str, Any], **overrides) -> "T5Config":
        model_type = hf.get("model_type", "t5")
        kw = dict(_DEFAULTS.get(model_type, {}))
        kw.update({k: hf[k] for k in cls.HF_FIELDS if k in hf and hf[k] is not None})
        if isinstance(kw.get("eos_token_id"), (list, tuple)):
            kw["eos_token_id"] = kw["eos_token_id"][0]
        kw.update(overrides)
        return cls(model_type=model_type, **kw)

    def to_hf(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.HF_FIELDS}
        d.update(
            model_type=self.model_type,
            architectures=["MT5EncoderModel" if self.model_type == "mt5" else "T5EncoderModel"],
            num_decoder_layers=self.num_layers,
            initializer_factor=1.0,
            is_encoder_decoder=True,
            decoder_start_token_id=self.pad_token_id,
        )
        return d


@functools.lru_cache(maxsize=64)
def relative_position_buckets(query_length: int, key_length: int, num_buckets: int, max_distance: int) -> np.ndarray:
    """Bidirectional bucket of (key position - query position), exactly as HF ``T5Attention._relative_position_bucket``
    (same float32 operations, so that the truncation to an int agrees at bucket boundaries). [T, S] int32.

    Computed in numpy from the static shape, so the result is a constant under ``jit`` and does not depend on the
    accelerator's ``log`` approximation."""
    rel = np.arange(key_length, dtype=np.int64)[None, :] - np.arange(query_length, dtype=np.int64)[:, None]
    half = num_buckets // 2
    buckets = (rel > 0).astype(np.int64) * half
    rel = np.abs(rel)
    max_exact = half // 2
    is_small = rel < max_exact
    x = np.maximum(rel, 1).astype(np.float32) / np.float32(max_exact)  # the max only avoids log(0) where is_small
    large = max_exact + (np.log(x) / np.float32(math.log(max_distance / max_exact))
                         * np.float32(half - max_exact)).astype(np.int64)
    large = np.minimum(large, half - 1)
    return (buckets + np.where(is_small, rel, large)).astype(np.int32)


class T5Attention(nnx.Module):
    """Self-attention sublayer: x + dropout(o(attn(norm(x)))) with the shared position bias and the padding mask."""

    def __init__(self, c: T5Config, rngs: nnx.Rngs):
        self.c = c
        inner = c.num_heads * c.d_kv
        self.norm = RMSNorm(c.d_model, c.layer_norm_epsilon, opts=c, rngs=rngs)
        # HF T5 init (initializer_factor 1): q ~ (d_model * d_kv)^-1/2, k, v ~ d_model^-1/2, o ~ inner^-1/2.
        self.q = dense(c.d_model, inner, ("embed", "qkv"), bias=False, opts=c, rngs=rngs,
                       std=(c.d_model * c.d_kv) ** -0.5)
        self.k = dense(c.d_model, inner, ("embed", "qkv"), bias=False, opts=c, rngs=rngs, std=c.d_model ** -0.5)
        self.v = dense(c.d_model, inner, ("embed", "qkv"), bias=False, opts=c, rngs=rngs, std=c.d_model ** -0.5)
        self.o = dense(inner, c.d_model, ("qkv", "embed"), bias=False, opts=c, rngs=rngs, std=inner ** -0.5)
        self.dropout = Dropout(c.dropout_rate)

    def __call__(self, x, mask, bias, *, deterministic, rngs):
        """x: [B, L, D], mask: ``Segments`` or an attention mask [B, L], bias: [1, N, L, L] -> [B, L, D]."""
        b, l, _ = x.shape
        h = self.norm(x)
        split = lambda t: t.reshape(b, l, self.c.num_heads, self.c.d_kv)
        o = attention(split(self.q(h)), split(self.k(h)), split(self.v(h)), mask, bias=bias, scale=1.0,
                      dropout_rate=self.c.dropout_rate, deterministic=deterministic, rngs=rngs,
                      implementation=self.c.attention)
        o = self.o(o.reshape(b, l, -1))
        return x + self.dropout(o, deterministic=deterministic, rngs=rngs)


class T5FeedForward(nnx.Module):
    """Feed-forward sublayer (HF ``T5LayerFF``): x + dropout(wo(dropout(act(wi_0(n)) * wi_1(n)))), n = norm(x)
    (gated), or x + dropout(wo(dropout(act(wi(n))))). The replaceable unit for a MoTE expert."""

    def __init__(self, c: T5Config, rngs: nnx.Rngs):
        self.gated = c.is_gated_act
        self.norm = RMSNorm(c.d_model, c.layer_norm_epsilon, opts=c, rngs=rngs)
        std_in = c.d_model ** -0.5
        if self.gated:
            self.wi_0 = dense(c.d_model, c.d_ff, ("embed", "mlp"), bias=False, opts=c, rngs=rngs, std=std_in)
            self.wi_1 = dense(c.d_model, c.d_ff, ("embed", "mlp"), bias=False, opts=c, rngs=rngs, std=std_in)
        else:
            self.wi = dense(c.d_model, c.d_ff, ("embed", "mlp"), bias=False, opts=c, rngs=rngs, std=std_in)
        self.wo = dense(c.d_ff, c.d_model, ("mlp", "embed"), bias=False, opts=c, rngs=rngs, std=c.d_ff ** -0.5)
        self.dropout = Dropout(c.dropout_rate)
        self.act = activation(c.dense_act_fn)

    def __call__(self, x, *, deterministic, rngs):
        """x: [B, L, D] -> [B, L, D]."""
        n = self.norm(x)
        if self.gated:
            h = self.act(self.wi_0(n)) * self.wi_1(n)
        else:
            h = self.act(self.wi(n))
        y = self.wo(self.dropout(h, deterministic=deterministic, rngs=rngs))
        return x + self.dropout(y, deterministic=deterministic, rngs=rngs)


class T5Layer(nnx.Module):
    def __init__(self, c: T5Config, rngs: nnx.Rngs, index: int = 0):
        self.attention = T5Attention(c, rngs)
        self.ffn = feed_forward(c, index, lambda r: T5FeedForward(c, r), rngs)

    def __call__(self, x, mask, bias, route=None, *, deterministic=True, rngs=None):
        """route: MoTE (expert id per row, active experts), see jaxembed.mote; None for a dense model."""
        x = self.attention(x, mask, bias, deterministic=deterministic, rngs=rngs)
        return call_ffn(self.ffn, x, route, deterministic=deterministic, rngs=rngs)


class T5EncoderModel(nnx.Module):
    def __init__(self, config: T5Config, *, rngs: nnx.Rngs):
        check_attention(config, head_dim=config.d_kv, bias=True)
        c = self.config = config
        self.shared = embed(c.vocab_size, c.d_model, ("vocab", "embed"), opts=c, rngs=rngs, std=1.0)
        # HF keeps this table in block 0 (encoder.block.0.layer.0.SelfAttention.relative_attention_bias).
        self.relative_attention_bias = embed(c.relative_attention_num_buckets, c.num_heads, ("buckets", "heads"),
                                             opts=c, rngs=rngs, std=c.d_model ** -0.5)
        self.layers = nnx.List([T5Layer(c, rngs, i) for i in range(c.num_layers)])
        self.final_norm = RMSNorm(c.d_model, c.layer_norm_epsilon, opts=c, rngs=rngs)
        self.dropout = Dropout(c.dropout_rate)

    def position_bias(self, length: int) -> jax.Array:
        """The relative position bias shared by all layers: [1, N, L, L] in the compute dtype."""
        c = self.config
        buckets = relative_position_buckets(length, length, c.relative_attention_num_buckets,
                                            c.relative_attention_max_distance)
        values = self.relative_attention_bias(jnp.asarray(buckets))  # [L, L, N]
        return jnp.transpose(values, (2, 0, 1))[None].astype(to_dtype(c.dtype))

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, deterministic: bool = True,
                 rngs: nnx.Rngs | None = None, experts: jax.Array | None = None, segment_ids=None,
                 positions=None) -> jax.Array:
        """input_ids, attention_mask: [B, L] -> last hidden states [B, L, D] (final norm, then dropout, as HF).
        Packed rows: segment_ids [B, L] (0 = padding, 1.. per text) instead of attention_mask; positions are
        accepted for a uniform interface (the bias depends on column differences only, see the module docstring).
        token_type_ids is accepted for a uniform interface and ignored (T5 has none). experts: MoTE expert index
        (a scalar, per row [B], or per token [B, L]; None: the default expert); dense models take None."""
        del token_type_ids
        segments, _ = segments_for(attention_mask, segment_ids, positions)
        x = self.dropout(self.shared(input_ids), deterministic=deterministic, rngs=rngs)
        bias = self.position_bias(input_ids.shape[1])
        route = mote_route(self.config, experts, input_ids.shape[0])
        args = (segments, bias) if route is None else (segments, bias, route)
        x = run_layers(self.layers, x, self.config.remat, *args, deterministic=deterministic, rngs=rngs)
        return self.dropout(self.final_norm(x), deterministic=deterministic, rngs=rngs)
