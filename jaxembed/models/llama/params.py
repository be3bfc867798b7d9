"""Hugging Face <-> Flax mapping table for Llama / Mistral (keys of ``LlamaModel`` / ``MistralModel``): the shared
decoder table (``jaxembed.models.decoder.rules``) with Llama's optional attention and MLP biases."""

from jaxembed.models.decoder import IGNORE, PREFIXES, adapt, rules

__all__ = ["IGNORE", "PREFIXES", "adapt", "rules"]
