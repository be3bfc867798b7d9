"""Qwen2 / Qwen3 decoders' facts (``jaxembed.models.architecture``)."""

from jaxembed.models import decoder
from jaxembed.models.architecture import Architecture, TinySize, layer_attention_cost
from jaxembed.models.qwen2.model import Qwen2Config, Qwen2Model
from jaxembed.models.qwen2.params import IGNORE, PREFIXES, adapt, rules
from jaxembed.models.qwen2.tokenizer import TINY_TOKENIZER


def tiny(size: TinySize) -> dict:
    """Qwen2 (RMSNorm, RoPE, grouped-query attention, SwiGLU, q/k/v biases, tied embeddings as Qwen2-0.5B)."""
    return dict(model_type="qwen2", **decoder.tiny_fields("qwen2", size), rope_theta=1000000.0, rms_norm_eps=1e-6,
                tie_word_embeddings=True)


ARCH = Architecture(
    model_types=tuple(Qwen2Config.ARCHITECTURES),
    config=Qwen2Config, model=Qwen2Model, rules=rules, prefixes=PREFIXES, ignore=IGNORE, adapt=adapt,
    matrix_params=decoder.matrix_params, attention_width=decoder.attention_width, lora_target=decoder.LORA_TARGET,
    tiny={"qwen2": tiny}, packing_cost=layer_attention_cost, tiny_tokenizer=TINY_TOKENIZER,
)
