"""Hugging Face <-> Flax mapping table for Gemma 2 / Gemma 3 text (keys of ``Gemma2Model`` /
``Gemma3TextModel``): the shared decoder table (``jaxembed.models.decoder.rules``) with Gemma's four norms per
layer (``post_attention_layernorm`` on the attention output, ``pre_`` / ``post_feedforward_layernorm`` in ``ffn``)
and Gemma 3's q/k norms."""

from jaxembed.models.decoder import IGNORE, PREFIXES, adapt, rules

__all__ = ["IGNORE", "PREFIXES", "adapt", "rules"]
