"""Llama (2 / 3 / 3.1 / 3.2) and Mistral decoders as embedding backbones (RoPE with Llama 3 / linear / dynamic
scaling, RMSNorm pre-norm, SwiGLU, grouped-query attention, Mistral's sliding window)."""
from jaxembed.models.llama.model import LlamaConfig, LlamaModel
from jaxembed.models.llama.params import IGNORE, PREFIXES, adapt, rules
from jaxembed.models.llama.spec import ARCH

__all__ = ["ARCH", "LlamaConfig", "LlamaModel", "rules", "adapt", "PREFIXES", "IGNORE"]
