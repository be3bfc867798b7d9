"""Hugging Face <-> Flax mapping table for T5 / mT5 encoders (keys of ``T5EncoderModel``).

The token embedding is ``shared.weight``; HF ties ``encoder.embed_tokens.weight`` to it, and a checkpoint may carry
either key or both (``state_dict()`` has both, ``save_pretrained`` keeps ``shared.weight``, some older exports only
the alias). ``adapt`` records which of them the checkpoint has in ``config.hf_embed_keys``; ``rules`` then maps each
of them to ``shared.embedding``, so import accepts either and export writes back the same key(s) (a freshly
initialised model exports ``shared.weight`` only, which transformers ties on load).

Full ``T5ForConditionalGeneration`` / ``T5Model`` checkpoints load too: their ``decoder.*`` and ``lm_head.*`` keys
are in ``IGNORE``.
"""

from jaxembed.models.mapping import Rule, linear, norm

EMBED_KEYS = ("shared.weight", "encoder.embed_tokens.weight")
# base_model_prefix of T5ForSequenceClassification / T5ForQuestionAnswering ...; stripped on import.
PREFIXES = ("transformer.",)
# Decoder, LM and task heads, and the tied embedding alias when it is not the key we read.
IGNORE = (r"^decoder\.", r"^lm_head\.", r"^classification_head\.", r"^classifier\.", r"^qa_outputs\.",
          r"^encoder\.embed_tokens\.weight$")


def rules(config) -> list[Rule]:
    A = "encoder.block.{i}.layer.0"
    F = "encoder.block.{i}.layer.1"
    r = [Rule(key, "shared.embedding") for key in config.hf_embed_keys]
    r += [
        Rule("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
             "relative_attention_bias.embedding"),
        *norm(f"{A}.layer_norm", "layers.{i}.attention.norm", bias=False),
        *linear(f"{A}.SelfAttention.q", "layers.{i}.attention.q", bias=False),
        *linear(f"{A}.SelfAttention.k", "layers.{i}.attention.k", bias=False),
        *linear(f"{A}.SelfAttention.v", "layers.{i}.attention.v", bias=False),
        *linear(f"{A}.SelfAttention.o", "layers.{i}.attention.o", bias=False),
        *norm(f"{F}.layer_norm", "layers.{i}.ffn.norm", bias=False),
    ]
    if config.is_gated_act:
        r += [*linear(f"{F}.DenseReluDense.wi_0", "layers.{i}.ffn.wi_0", bias=False),
              *linear(f"{F}.DenseReluDense.wi_1", "layers.{i}.ffn.wi_1", bias=False)]
    else:
        r += linear(f"{F}.DenseReluDense.wi", "layers.{i}.ffn.wi", bias=False)
    r += [*linear(f"{F}.DenseReluDense.wo", "layers.{i}.ffn.wo", bias=False),
          *norm("encoder.final_layer_norm", "final_norm", bias=False)]
    return r


def adapt(config, keys) -> dict:
    """Config overrides read off the checkpoint: which key(s) hold the shared token embedding."""
    present = tuple(k for k in EMBED_KEYS if k in keys)
    return {"hf_embed_keys": present or ("shared.weight",)}
