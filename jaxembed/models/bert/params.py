"""Hugging Face <-> Flax mapping table for the BERT family (keys of ``BertModel`` / ``RobertaModel``)."""

from jaxembed.models.mapping import Rule, linear, norm

# Prefixes of task-head checkpoints (BertForMaskedLM, RobertaForSequenceClassification ...), stripped on import.
PREFIXES = ("bert.", "roberta.", "xlm_roberta.", "camembert.", "model.")
# Keys that are buffers or task heads, not part of the encoder: ignored without a warning.
IGNORE = (r"position_ids$", r"^cls\.", r"^lm_head\.", r"^classifier\.", r"^qa_outputs\.")


def rules(config) -> list[Rule]:
    L = "encoder.layer.{i}"
    r = [
        Rule("embeddings.word_embeddings.weight", "embeddings.word_embeddings.embedding"),
        Rule("embeddings.position_embeddings.weight", "embeddings.position_embeddings.embedding"),
        Rule("embeddings.token_type_embeddings.weight", "embeddings.token_type_embeddings.embedding"),
        *norm("embeddings.LayerNorm", "embeddings.layer_norm"),
        *linear(f"{L}.attention.self.query", "layers.{i}.attention.query"),
        *linear(f"{L}.attention.self.key", "layers.{i}.attention.key"),
        *linear(f"{L}.attention.self.value", "layers.{i}.attention.value"),
        *linear(f"{L}.attention.output.dense", "layers.{i}.attention.output"),
        *norm(f"{L}.attention.output.LayerNorm", "layers.{i}.ffn.pre_norm"),
        *linear(f"{L}.intermediate.dense", "layers.{i}.ffn.intermediate"),
        *linear(f"{L}.output.dense", "layers.{i}.ffn.output"),
        *norm(f"{L}.output.LayerNorm", "layers.{i}.ffn.norm"),
    ]
    if config.add_pooler:
        r += linear("pooler.dense", "pooler.dense")
    return r


def adapt(config, keys) -> dict:
    """Config overrides read off the checkpoint: keep HF's pooler when the checkpoint has one."""
    return {"add_pooler": "pooler.dense.weight" in keys}
