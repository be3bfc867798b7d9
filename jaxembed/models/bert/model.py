"""BERT-family encoder in Flax NNX (BERT, MiniLM, RoBERTa, XLM-R), numerically matching ``transformers``.

Layer = attention sublayer (returns the residual sum x + attn(x), not yet normalised) followed by the
feed-forward sublayer ``BertFeedForward``, which owns both post-LN norms: LN -> MLP -> residual -> LN. That is the
unit a MoTE task expert replaces (MoTE Fig. 2b: LayerNorm -> MLP -> LayerNorm).

Packed rows (``jaxembed.packing``): ``segment_ids`` and per-text ``positions`` instead of ``attention_mask``;
absolute positions restart at 0 with every text (RoBERTa's offset ``pad_token_id + 1`` added), token types are
per token as in a padded row, and attention is block-diagonal by segment, so each text's states equal its
padded row's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxembed.models.dropout import Dropout
from jaxembed.models.layers import (RuntimeOptions, activation, attention, call_ffn, check_attention, dense, embed,
                                    feed_forward, layer_norm, mote_route, run_layers, segments_for)

# RoBERTa-style models number positions from padding_idx + 1 (HF create_position_ids_from_input_ids).
_OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BertConfig(RuntimeOptions):
    model_type: str = "bert"
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    add_pooler: bool = False

    HF_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
                 "type_vocab_size", "layer_norm_eps", "pad_token_id")

    @property
    def num_layers(self) -> int:
        return self.num_hidden_layers

    @property
    def offset_positions(self) -> bool:
        return self.model_type in _OFFSET_POSITIONS

    @classmethod
    def from_hf(cls, hf: dict[str, Any], **overrides) -> "BertConfig":
        pet = hf.get("position_embedding_type", "absolute")
        if pet not in (None, "absolute"):
            raise ValueError(f"position_embedding_type={pet!r} is not supported (only 'absolute')")
        kw = {k: hf[k] for k in cls.HF_FIELDS if k in hf and hf[k] is not None}
        return cls(model_type=hf.get("model_type", "bert"), **kw, **overrides)

    def to_hf(self) -> dict[str, Any]:
        arch = {"bert": "BertModel", "roberta": "RobertaModel", "xlm-roberta": "XLMRobertaModel",
                "camembert": "CamembertModel"}[self.model_type]
        d = {k: getattr(self, k) for k in self.HF_FIELDS}
        d.update(model_type=self.model_type, architectures=[arch], position_embedding_type="absolute")
        return d


class BertEmbeddings(nnx.Module):
    def __init__(self, c: BertConfig, rngs: nnx.Rngs):
        self.c = c
        self.word_embeddings = embed(c.vocab_size, c.hidden_size, ("vocab", "embed"), opts=c, rngs=rngs)
        self.position_embeddings = embed(c.max_position_embeddings, c.hidden_size, (None, "embed"), opts=c, rngs=rngs)
        self.token_type_embeddings = embed(c.type_vocab_size, c.hidden_size, (None, "embed"), opts=c, rngs=rngs)
        self.layer_norm = layer_norm(c.hidden_size, c.layer_norm_eps, opts=c, rngs=rngs)
        self.dropout = Dropout(c.hidden_dropout_prob)

    def __call__(self, input_ids, token_type_ids, *, deterministic, rngs, positions=None):
        """input_ids: [B, L] int; token_type_ids: [B, L] int or None (all type 0); positions: [B, L] per-text
        positions from 0 (packed rows) or None (padded rows: 0.. per row; RoBERTa: counted over the real tokens)
        -> [B, L, H]."""
        if positions is not None:
            if self.c.offset_positions:  # RoBERTa numbers positions from padding_idx + 1
                positions = positions + self.c.pad_token_id + 1
        elif self.c.offset_positions:
            real = (input_ids != self.c.pad_token_id).astype(jnp.int32)
            positions = jnp.cumsum(real, axis=1) * real + self.c.pad_token_id
        else:
            positions = jnp.arange(input_ids.shape[1])[None, :]
        # no token types (packed rows, single-segment texts): type 0's row added, not gathered per token (its
        # gradient is then a sum, not a scatter-add of every token into one row)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        if token_type_ids is None:
            x = self.token_type_embeddings.add_row(x, 0)
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.layer_norm(x), deterministic=deterministic, rngs=rngs)


class BertAttention(nnx.Module):
    """Self-attention sublayer; returns x + dropout(output(attn(x))) before the post-LN (owned by the FFN)."""

    def __init__(self, c: BertConfig, rngs: nnx.Rngs):
        self.c = c
        h = c.hidden_size
        self.query = dense(h, h, ("embed", "qkv"), bias=True, opts=c, rngs=rngs)
        self.key = dense(h, h, ("embed", "qkv"), bias=True, opts=c, rngs=rngs)
        self.value = dense(h, h, ("embed", "qkv"), bias=True, opts=c, rngs=rngs)
        self.output = dense(h, h, ("qkv", "embed"), bias=True, opts=c, rngs=rngs)
        self.dropout = Dropout(c.hidden_dropout_prob)

    def __call__(self, x, mask, *, deterministic, rngs):
        """x: [B, L, H], mask: ``Segments`` or an attention mask [B, L] -> [B, L, H]."""
        b, l, _ = x.shape
        n = self.c.num_attention_heads
        split = lambda t: t.reshape(b, l, n, -1)
        o = attention(split(self.query(x)), split(self.key(x)), split(self.value(x)), mask,
                      dropout_rate=self.c.attention_probs_dropout_prob, deterministic=deterministic, rngs=rngs,
                      implementation=self.c.attention)
        o = self.output(o.reshape(b, l, -1))
        return x + self.dropout(o, deterministic=deterministic, rngs=rngs)


class BertFeedForward(nnx.Module):
    """Post-LN feed-forward sublayer: h = LN1(s); LN2(h + MLP(h)). s is the attention residual sum.

    The replaceable unit for a MoTE expert (LayerNorm -> MLP -> LayerNorm)."""

    def __init__(self, c: BertConfig, rngs: nnx.Rngs):
        self.pre_norm = layer_norm(c.hidden_size, c.layer_norm_eps, opts=c, rngs=rngs)
        self.intermediate = dense(c.hidden_size, c.intermediate_size, ("embed", "mlp"), bias=True, opts=c, rngs=rngs)
        self.output = dense(c.intermediate_size, c.hidden_size, ("mlp", "embed"), bias=True, opts=c, rngs=rngs)
        self.norm = layer_norm(c.hidden_size, c.layer_norm_eps, opts=c, rngs=rngs)
        self.dropout = Dropout(c.hidden_dropout_prob)
        self.act = activation(c.hidden_act)

    def __call__(self, s, *, deterministic, rngs):
        """s: [B, L, H] -> [B, L, H]."""
        h = self.pre_norm(s)
        y = self.output(self.act(self.intermediate(h)))
        return self.norm(h + self.dropout(y, deterministic=deterministic, rngs=rngs))


class BertLayer(nnx.Module):
    def __init__(self, c: BertConfig, rngs: nnx.Rngs, index: int = 0):
        self.attention = BertAttention(c, rngs)
        self.ffn = feed_forward(c, index, lambda r: BertFeedForward(c, r), rngs)

    def __call__(self, x, mask, route=None, *, deterministic=True, rngs=None):
        """route: MoTE (expert id per row, active experts), see jaxembed.mote; None for a dense model."""
        s = self.attention(x, mask, deterministic=deterministic, rngs=rngs)
        return call_ffn(self.ffn, s, route, deterministic=deterministic, rngs=rngs)


class BertPooler(nnx.Module):
    """HF's pooler (tanh(dense(CLS))); kept only so that checkpoints round-trip. Sentence embeddings do not use it."""

    def __init__(self, c: BertConfig, rngs: nnx.Rngs):
        self.dense = dense(c.hidden_size, c.hidden_size, ("embed", None), bias=True, opts=c, rngs=rngs)


class BertModel(nnx.Module):
    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        check_attention(config, head_dim=config.hidden_size // config.num_attention_heads)
        self.config = config
        self.embeddings = BertEmbeddings(config, rngs)
        self.layers = nnx.List([BertLayer(config, rngs, i) for i in range(config.num_hidden_layers)])
        if config.add_pooler:
            self.pooler = BertPooler(config, rngs)

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, deterministic: bool = True,
                 rngs: nnx.Rngs | None = None, experts: jax.Array | None = None, segment_ids=None,
                 positions=None) -> jax.Array:
        """input_ids, attention_mask, token_type_ids: [B, L] -> last hidden states [B, L, H].
        Packed rows: segment_ids [B, L] (0 = padding, 1.. per text) and positions [B, L] (from 0 per text)
        instead of attention_mask. experts: MoTE expert index (a scalar, per row [B], or per token [B, L]; None:
        the default expert); dense models take None."""
        segments, positions = segments_for(attention_mask, segment_ids, positions)
        x = self.embeddings(input_ids, token_type_ids, deterministic=deterministic, rngs=rngs, positions=positions)
        route = mote_route(self.config, experts, input_ids.shape[0])
        args = (segments,) if route is None else (segments, route)
        return run_layers(self.layers, x, self.config.remat, *args, deterministic=deterministic, rngs=rngs)
