"""Gemma 2 and Gemma 3 (text) decoders' facts (``jaxembed.models.architecture``)."""

from jaxembed.models import decoder
from jaxembed.models.architecture import Architecture, TinySize, layer_attention_cost
from jaxembed.models.gemma.model import GemmaConfig, GemmaModel
from jaxembed.models.gemma.params import IGNORE, PREFIXES, adapt, rules


def _tiny_gemma(name: str, size: TinySize) -> dict:
    head_dim = size.hidden_size // size.num_heads
    return dict(**decoder.tiny_fields(name, size), head_dim=head_dim, query_pre_attn_scalar=head_dim,
                sliding_window=size.window, hidden_activation="gelu_pytorch_tanh", pad_token_id=0,
                tie_word_embeddings=True)


def tiny_gemma2(size: TinySize) -> dict:
    """Gemma 2: soft-capping, alternating sliding / global layers."""
    return dict(model_type="gemma2", **_tiny_gemma("gemma2", size), attn_logit_softcapping=50.0,
                final_logit_softcapping=30.0, rope_parameters=dict(rope_type="default", rope_theta=10000.0))


def tiny_gemma3(size: TinySize) -> dict:
    """Gemma 3 text: q/k norms, a local RoPE base, the last layer global."""
    return dict(model_type="gemma3_text", **_tiny_gemma("gemma3", size),
                layer_types=["sliding_attention"] * (size.num_layers - 1) + ["full_attention"],
                rope_parameters={"full_attention": dict(rope_type="default", rope_theta=1000000.0),
                                 "sliding_attention": dict(rope_type="default", rope_theta=10000.0)})


ARCH = Architecture(
    model_types=tuple(GemmaConfig.ARCHITECTURES),
    config=GemmaConfig, model=GemmaModel, rules=rules, prefixes=PREFIXES, ignore=IGNORE, adapt=adapt,
    matrix_params=decoder.matrix_params, attention_width=decoder.attention_width, lora_target=decoder.LORA_TARGET,
    tiny={"gemma2": tiny_gemma2, "gemma3": tiny_gemma3}, packing_cost=layer_attention_cost,
)
