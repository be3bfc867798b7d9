"""Llama and Mistral decoders as text-embedding backbones, numerically matching ``transformers`` (``LlamaModel``
/ ``MistralModel``: last hidden state after the final RMSNorm). The block is the shared decoder
(``jaxembed.models.decoder``).

Llama: ``attention_bias`` on all four attention projections, ``mlp_bias`` on the MLP (both usually False); RoPE
``default``, ``linear``, ``dynamic`` or ``llama3`` (Llama 3.1 / 3.2, ``jaxembed.models.rope``). Mistral: no
biases; ``sliding_window`` W (transformers' default 4096 when config.json has no such key; null: none): causal,
a token sees itself and the W - 1 tokens before it; bidirectional (``is_causal: false``), transformers' rule
|t - s| <= W. Within a text in packed rows too. A window at least as long as the row changes nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxembed.models.decoder import DecoderConfig, DecoderModel, hf_kwargs, is_causal
from jaxembed.models.rope import RopeSpec, from_hf as rope_from_hf

_MISTRAL_WINDOW = 4096  # transformers' MistralConfig default


@dataclasses.dataclass(frozen=True, kw_only=True)
class LlamaConfig(DecoderConfig):
    model_type: str = "llama"
    bos_token_id: int | None = 1
    eos_token_id: int | tuple[int, ...] | None = 2
    rope: RopeSpec = RopeSpec()
    sliding_window: int | None = None  # Mistral only

    ARCHITECTURES = {"llama": "LlamaModel", "mistral": "MistralModel"}

    def __post_init__(self):
        super().__post_init__()
        if self.model_type == "llama" and self.sliding_window is not None:
            raise ValueError("sliding_window is a Mistral setting; transformers' Llama has none")
        if self.model_type == "mistral" and (self.attention_bias or self.mlp_bias):
            raise ValueError("Mistral has no attention or MLP biases")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window={self.sliding_window} must be a positive number of tokens (or null)")

    def layer_window(self, i: int) -> int | None:
        if self.sliding_window is None:
            return None
        return self.sliding_window if self.causal else self.sliding_window + 1  # bidirectional: |t - s| <= W

    @classmethod
    def from_hf(cls, hf: dict[str, Any], **overrides) -> "LlamaConfig":
        model_type = hf.get("model_type", "llama")
        kw = hf_kwargs(hf, cls.HF_FIELDS)
        kw["rope"] = rope_from_hf(hf, where=f"{model_type} config")
        if model_type == "mistral":  # transformers' Mistral has no biases, whatever the config says
            kw["sliding_window"] = hf["sliding_window"] if "sliding_window" in hf else _MISTRAL_WINDOW
        else:
            kw.update(attention_bias=bool(hf.get("attention_bias", False)), mlp_bias=bool(hf.get("mlp_bias", False)))
        if not is_causal(hf):
            kw["causal"] = False
        kw.update(overrides)
        return cls(model_type=model_type, **kw)

    def to_hf(self) -> dict[str, Any]:
        d = self.base_hf(self.HF_FIELDS)
        d.update(model_type=self.model_type, architectures=[self.ARCHITECTURES[self.model_type]],
                 rope_parameters=self.rope.to_hf())
        if self.model_type == "mistral":
            d["sliding_window"] = self.sliding_window
        else:
            d.update(attention_bias=self.attention_bias, mlp_bias=self.mlp_bias)
        if not self.causal:
            d["is_causal"] = False
        return d


class LlamaModel(DecoderModel):
    """Llama / Mistral backbone (``jaxembed.models.decoder.DecoderModel`` with a ``LlamaConfig``)."""
