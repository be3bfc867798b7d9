"""Qwen2 / Qwen3 decoder as a text-embedding backbone, numerically matching ``transformers`` (``Qwen2Model`` /
``Qwen3Model``: last hidden state after the final RMSNorm). The block is the shared decoder
(``jaxembed.models.decoder``: pre-norm attention, SwiGLU feed-forward ``ffn`` with its RMSNorm, the unit a MoTE
task expert replaces; causal or bidirectional; padded or packed rows).

Qwen2: q/k/v projections with bias, o_proj without. Qwen3: ``attention_bias`` for all four projections (usually
False) and per-head RMSNorm of q and k (``q_norm``/``k_norm`` over head_dim) before RoPE. Default RoPE only
(Llama-style scalings: ``jaxembed.models.llama``); no sliding window.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxembed.models.decoder import FULL, DecoderConfig, DecoderModel, hf_kwargs, is_causal
from jaxembed.models.rope import RopeSpec, from_hf as rope_from_hf

def _rope_theta(hf: dict[str, Any]) -> float:
    """RoPE base from a transformers 5 ``rope_parameters`` dict or a transformers 4 ``rope_theta`` (+
    ``rope_scaling``) config. Only the default (unscaled) RoPE is supported."""
    spec = rope_from_hf(hf)
    if spec.type != "default":
        raise ValueError(f"rope_type={spec.type!r} is not supported for {hf.get('model_type', 'qwen2')} (only "
                         "'default' RoPE)")
    return spec.theta


@dataclasses.dataclass(frozen=True, kw_only=True)
class Qwen2Config(DecoderConfig):
    model_type: str = "qwen2"
    vocab_size: int = 151936
    hidden_size: int = 4096
    intermediate_size: int = 22016
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = 32
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    attention_bias: bool = True  # q/k/v bias (Qwen2: always; Qwen3: attention_bias, also on o_proj)

    ARCHITECTURES = {"qwen2": "Qwen2Model", "qwen3": "Qwen3Model"}

    @property
    def o_bias(self) -> bool:
        """Qwen2's o_proj never has a bias; Qwen3 uses attention_bias for all four projections."""
        return self.attention_bias and self.model_type == "qwen3"

    @property
    def rope(self) -> RopeSpec:
        return RopeSpec(theta=self.rope_theta)

    @classmethod
    def from_hf(cls, hf: dict[str, Any], **overrides) -> "Qwen2Config":
        model_type = hf.get("model_type", "qwen2")
        if hf.get("use_sliding_window"):
            raise ValueError("use_sliding_window=true is not supported (sliding-window attention)")
        if any(t != FULL for t in (hf.get("layer_types") or [])):
            raise ValueError(f"layer_types={hf['layer_types']!r}: only full attention is supported")
        kw = hf_kwargs(hf, cls.HF_FIELDS)
        kw["rope_theta"] = _rope_theta(hf)
        if model_type == "qwen3":
            kw.update(attention_bias=bool(hf.get("attention_bias", False)), qk_norm=True)
        else:  # transformers' Qwen2Attention hard-codes bias=True on q/k/v, whatever the config says
            kw.update(attention_bias=True, qk_norm=False)
        if not is_causal(hf):
            kw["causal"] = False
        kw.update(overrides)
        return cls(model_type=model_type, **kw)

    def to_hf(self) -> dict[str, Any]:
        d = self.base_hf(self.HF_FIELDS)
        if self.model_type == "qwen2" and self.head_dim == self.hidden_size // self.num_attention_heads:
            del d["head_dim"]  # not a Qwen2Config field; transformers derives it
        d.update(
            model_type=self.model_type,
            architectures=[self.ARCHITECTURES[self.model_type]],
            rope_parameters=self.rope.to_hf(),
            use_sliding_window=False,
            layer_types=[FULL] * self.num_hidden_layers,
        )
        if self.model_type == "qwen3":
            d["attention_bias"] = self.attention_bias
        if not self.causal:
            d["is_causal"] = False
        return d


class Qwen2Model(DecoderModel):
    """Qwen2 / Qwen3 backbone (``jaxembed.models.decoder.DecoderModel`` with a ``Qwen2Config``)."""
