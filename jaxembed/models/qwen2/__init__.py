"""Qwen2 / Qwen3 decoders as embedding backbones (RoPE, RMSNorm pre-norm, SwiGLU, grouped-query attention)."""
from jaxembed.models.qwen2.model import Qwen2Config, Qwen2Model
from jaxembed.models.qwen2.params import IGNORE, PREFIXES, adapt, rules
from jaxembed.models.qwen2.spec import ARCH

__all__ = ["ARCH", "Qwen2Config", "Qwen2Model", "rules", "adapt", "PREFIXES", "IGNORE"]
