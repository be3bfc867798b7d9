"""Hugging Face <-> Flax mapping table for Qwen2 / Qwen3 (keys of ``Qwen2Model`` / ``Qwen3Model``)."""

from jaxembed.models.mapping import Rule, linear, norm

# Qwen2ForCausalLM / Qwen3ForCausalLM (and sequence-classification) checkpoints prefix the decoder with ``model.``.
PREFIXES = ("model.",)
# Task heads and non-persistent RoPE buffers that some old checkpoints saved: ignored without a warning.
IGNORE = (r"^lm_head\.", r"^score\.", r"rotary_emb\.inv_freq$", r"rotary_emb\.original_inv_freq$",
          r"self_attn\.rotary_emb\.")


def rules(config) -> list[Rule]:
    L, A, F = "layers.{i}", "layers.{i}.attention", "layers.{i}.ffn"
    r = [
        Rule("embed_tokens.weight", "embed_tokens.embedding"),
        *norm(f"{L}.input_layernorm", f"{A}.input_layernorm", bias=False),
        *linear(f"{L}.self_attn.q_proj", f"{A}.q_proj", bias=config.attention_bias),
        *linear(f"{L}.self_attn.k_proj", f"{A}.k_proj", bias=config.attention_bias),
        *linear(f"{L}.self_attn.v_proj", f"{A}.v_proj", bias=config.attention_bias),
        *linear(f"{L}.self_attn.o_proj", f"{A}.o_proj", bias=config.o_bias),
        *norm(f"{L}.post_attention_layernorm", f"{F}.post_attention_layernorm", bias=False),
        *linear(f"{L}.mlp.gate_proj", f"{F}.gate_proj", bias=False),
        *linear(f"{L}.mlp.up_proj", f"{F}.up_proj", bias=False),
        *linear(f"{L}.mlp.down_proj", f"{F}.down_proj", bias=False),
        *norm("norm", "norm", bias=False),
    ]
    if config.qk_norm:
        r += norm(f"{L}.self_attn.q_norm", f"{A}.q_norm", bias=False)
        r += norm(f"{L}.self_attn.k_norm", f"{A}.k_norm", bias=False)
    return r


def adapt(config, keys) -> dict:
    """No optional parts: the config alone determines the parameters (q/k norms and biases come from model_type
    and attention_bias)."""
    return {}
