"""Hugging Face <-> Flax mapping table for Qwen2 / Qwen3 (keys of ``Qwen2Model`` / ``Qwen3Model``): the shared
decoder table (``jaxembed.models.decoder.rules``) with Qwen2's q/k/v biases or Qwen3's q/k norms."""

from jaxembed.models.decoder import IGNORE, PREFIXES, adapt, rules

__all__ = ["IGNORE", "PREFIXES", "adapt", "rules"]
