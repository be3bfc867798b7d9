"""Gemma 2 and Gemma 3 (text) decoders as embedding backbones: RMSNorm with (1 + w), embeddings scaled by
sqrt(hidden), GeGLU, pre / post norms around both sublayers, attention logit soft-capping, alternating sliding /
global layers (Gemma 3: its local RoPE base and q/k norms), EmbeddingGemma's bidirectional attention."""
from jaxembed.models.gemma.model import GemmaConfig, GemmaModel
from jaxembed.models.gemma.params import IGNORE, PREFIXES, adapt, rules
from jaxembed.models.gemma.spec import ARCH

__all__ = ["ARCH", "GemmaConfig", "GemmaModel", "rules", "adapt", "PREFIXES", "IGNORE"]
