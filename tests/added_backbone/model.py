"""The model: BERT's (post-LN, GELU, absolute positions) under the Hugging Face model type ``tiny_encoder``."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxembed.models.bert.model import BertConfig, BertModel


@dataclasses.dataclass(frozen=True, kw_only=True)
class TinyEncoderConfig(BertConfig):
    model_type: str = "tiny_encoder"

    @classmethod
    def from_hf(cls, hf: dict[str, Any], **overrides) -> "TinyEncoderConfig":
        kw = {k: hf[k] for k in cls.HF_FIELDS if k in hf and hf[k] is not None}
        return cls(**kw, **overrides)

    def to_hf(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in self.HF_FIELDS}, "model_type": self.model_type,
                "architectures": ["TinyEncoderModel"]}


class TinyEncoderModel(BertModel):
    """``BertModel``'s layers and call (padded or packed rows) for a ``TinyEncoderConfig``."""
