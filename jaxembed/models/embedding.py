"""The sentence-embedding model: backbone -> pooling -> optional Dense layers -> L2 normalisation.

Mirrors a sentence-transformers pipeline (Transformer, Pooling, Dense*, Normalize) so that a Hugging Face /
sentence-transformers folder maps onto it one to one, and back on export.
"""

from __future__ import annotations

import contextlib
import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxembed import pooling
from jaxembed.models import dropout, init_model
from jaxembed.models.layers import RuntimeOptions, dense, gelu

# sentence-transformers Dense activation names (torch class paths) <-> ours.
DENSE_ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.activation.ReLU": "relu",
    "torch.nn.modules.activation.GELU": "gelu",
    "torch.nn.modules.activation.SiLU": "silu",
}
_ACT_FNS = {"identity": lambda x: x, "tanh": jnp.tanh, "relu": jax.nn.relu,
            "gelu": gelu, "silu": jax.nn.silu}


@dataclasses.dataclass(frozen=True)
class DenseSpec:
    """A sentence-transformers ``Dense`` module: y = act(x W + b)."""

    in_features: int
    out_features: int
    bias: bool = True
    activation: str = "identity"


@dataclasses.dataclass(frozen=True)
class HeadConfig:
    """Everything after the backbone. pooling: one of ``pooling.MODES``; include_prompt=False excludes the
    instruction tokens from pooling (INSTRUCTOR); dense: Dense layers after pooling; normalize: L2 at the end."""

    pooling: str = "mean"
    include_prompt: bool = True
    dense: tuple[DenseSpec, ...] = ()
    normalize: bool = True

    def __post_init__(self):
        if self.pooling not in pooling.MODES:
            raise ValueError(f"pooling={self.pooling!r} is not supported; allowed: {', '.join(pooling.MODES)}")
        for d in self.dense:
            if d.activation not in _ACT_FNS:
                raise ValueError(f"Dense activation {d.activation!r} is not supported; allowed: {', '.join(_ACT_FNS)}")


def _dropout_tokens(active: bool, slots):
    """``dropout.tokens(*slots())`` when dropout is ``active``, else nothing (inference builds no ids)."""
    return dropout.tokens(*slots()) if active else contextlib.nullcontext()


class DenseLayer(nnx.Module):
    def __init__(self, spec: DenseSpec, opts: RuntimeOptions, rngs: nnx.Rngs):
        self.activation = spec.activation
        self.linear = dense(spec.in_features, spec.out_features, ("embed", None), bias=spec.bias, opts=opts, rngs=rngs)

    def __call__(self, x):
        return _ACT_FNS[self.activation](self.linear(x).astype(jnp.float32))


class EmbeddingModel(nnx.Module):
    """backbone: any registered architecture (``jaxembed.models``); head: pooling / dense / normalisation."""

    def __init__(self, backbone: nnx.Module, head: HeadConfig, *, rngs: nnx.Rngs | None = None):
        self.backbone = backbone
        self.head = head
        rngs = rngs or nnx.Rngs(0)
        self.dense = nnx.List([DenseLayer(d, backbone.config, rngs) for d in head.dense])

    @classmethod
    def init(cls, config, head: HeadConfig, seed: int = 0) -> "EmbeddingModel":
        """A randomly initialised embedding model for an architecture config."""
        return cls(init_model(config, seed), head, rngs=nnx.Rngs(seed + 1))

    @property
    def config(self):
        return self.backbone.config

    @property
    def dim(self) -> int:
        return self.head.dense[-1].out_features if self.head.dense else self.config.hidden_size

    def __call__(self, input_ids, attention_mask, prompt_lengths=None, token_type_ids=None, *, dim: int | None = None,
                 deterministic: bool = True, rngs: nnx.Rngs | None = None,
                 experts: jax.Array | None = None, text_ids: jax.Array | None = None) -> jax.Array:
        """input_ids, attention_mask: [B, L]; prompt_lengths: [B] instruction tokens to exclude from pooling
        (used only when head.include_prompt is False); dim: Matryoshka truncation; experts: MoTE expert index per
        row [B] (None: the default expert; dense models take None); text_ids: [B] the id of each row's text for
        the dropout masks (``jaxembed.models.dropout``; default: the row index). -> [B, D] float32."""
        def slots():  # each slot's text id and position
            ids = jnp.arange(input_ids.shape[0], dtype=jnp.int32) if text_ids is None else text_ids
            return (jnp.broadcast_to(jnp.asarray(ids, jnp.int32)[:, None], input_ids.shape),
                    dropout.padded_positions(attention_mask))

        with _dropout_tokens(not deterministic and rngs is not None, slots):
            hidden = self.backbone(input_ids, attention_mask, token_type_ids, deterministic=deterministic, rngs=rngs,
                                   experts=experts)
        pl = None if self.head.include_prompt else prompt_lengths
        x = pooling.pool(self.head.pooling, hidden, attention_mask, pl)
        return self._head(x, dim)

    def encode_packed(self, packed, *, dim: int | None = None, deterministic: bool = True,
                      rngs: nnx.Rngs | None = None, experts: jax.Array | None = None,
                      text_ids: jax.Array | None = None) -> jax.Array:
        """Embeddings of packed texts (``jaxembed.packing``): ``packed`` holds input_ids, segment_ids, positions,
        token_text [R, L] (token_type_ids optional) and text_row, text_start, text_len, text_prompt [N] (other keys
        are ignored). experts: MoTE expert, one for all texts (a scalar: the fast path) or one per text [N] (texts
        of different experts may share a row: each text's tokens go through its expert); text_ids: [N] the id of
        each text for the dropout masks (default: its index in the pack). -> [N, D] float32 in the pack's text
        order, equal to ``__call__`` on the texts' padded rows (dropout too, with the same ids; dummy slots: finite,
        meaningless).
        """
        token_text = jnp.asarray(packed["token_text"])
        if experts is not None and jnp.ndim(experts) == 1:  # per text -> per token (-1 on padding)
            experts = jnp.asarray(experts, jnp.int32)
            experts = jnp.where(token_text >= 0, experts[jnp.maximum(token_text, 0)], -1)
        def slots():  # each slot's text id (-1 on padding) and position
            if text_ids is None:
                return token_text, packed["positions"]
            ids = jnp.asarray(text_ids, jnp.int32)
            return jnp.where(token_text >= 0, ids[jnp.maximum(token_text, 0)], -1), packed["positions"]

        with _dropout_tokens(not deterministic and rngs is not None, slots):
            hidden = self.backbone(packed["input_ids"], None, packed.get("token_type_ids"),
                                   deterministic=deterministic, rngs=rngs, experts=experts,
                                   segment_ids=packed["segment_ids"], positions=packed["positions"])
        prompt = None if self.head.include_prompt else packed["text_prompt"]
        x = pooling.pool_packed(self.head.pooling, hidden, token_text, packed["positions"], packed["text_row"],
                                packed["text_start"], packed["text_len"], prompt)
        return self._head(x, dim)

    def _head(self, x: jax.Array, dim: int | None) -> jax.Array:
        """Pooled [N, H] -> Dense layers -> Matryoshka truncation / L2 normalisation -> [N, D]."""
        for layer in self.dense:
            x = layer(x)
        return pooling.matryoshka(x, dim, normalize=self.head.normalize)
