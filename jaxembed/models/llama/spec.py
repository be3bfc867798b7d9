"""Llama and Mistral decoders' facts (``jaxembed.models.architecture``)."""

from jaxembed.models import decoder
from jaxembed.models.architecture import Architecture, TinySize, layer_attention_cost
from jaxembed.models.llama.model import LlamaConfig, LlamaModel
from jaxembed.models.llama.params import IGNORE, PREFIXES, adapt, rules


def tiny_llama(size: TinySize) -> dict:
    """Llama 3.2 (llama3 RoPE scaling, tied embeddings)."""
    return dict(model_type="llama", **decoder.tiny_fields("llama", size), rms_norm_eps=1e-5, tie_word_embeddings=True,
                rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0,
                                     high_freq_factor=4.0, original_max_position_embeddings=8192))


def tiny_mistral(size: TinySize) -> dict:
    """Mistral, with a sliding window of ``size.window`` tokens."""
    return dict(model_type="mistral", **decoder.tiny_fields("mistral", size), sliding_window=size.window,
                rope_parameters=dict(rope_type="default", rope_theta=1000000.0))


ARCH = Architecture(
    model_types=tuple(LlamaConfig.ARCHITECTURES),
    config=LlamaConfig, model=LlamaModel, rules=rules, prefixes=PREFIXES, ignore=IGNORE, adapt=adapt,
    matrix_params=decoder.matrix_params, attention_width=decoder.attention_width, lora_target=decoder.LORA_TARGET,
    tiny={"llama": tiny_llama, "mistral": tiny_mistral}, packing_cost=layer_attention_cost,
)
