"""T5 / mT5 encoders' facts (``jaxembed.models.architecture``)."""

from jaxembed.models.architecture import Architecture, TinySize, layer_attention_cost
from jaxembed.models.t5.model import T5Config, T5EncoderModel
from jaxembed.models.t5.params import IGNORE, PREFIXES, adapt, rules


def matrix_params(config: T5Config) -> int:
    """Weights of all layers' matrices: q / k / v / o (heads x d_kv wide) and the feed-forward (gated: 3 matrices)."""
    h = config.hidden_size
    ff = (3 if config.is_gated_act else 2) * h * config.d_ff
    return config.num_layers * (4 * h * attention_width(config) + ff)


def attention_width(config: T5Config) -> int:
    return config.num_heads * config.d_kv


def tiny(size: TinySize) -> dict:
    """A T5 v1.1 encoder (gated-GELU, relative position buckets), the family of GTR and INSTRUCTOR."""
    h = size.hidden_size
    return dict(model_type="t5", vocab_size=size.vocab_size, d_model=h, d_kv=h // size.num_heads, d_ff=2 * h,
                num_layers=size.num_layers, num_heads=size.num_heads, feed_forward_proj="gated-gelu", pad_token_id=0,
                eos_token_id=1)


ARCH = Architecture(
    model_types=("t5", "mt5"),
    config=T5Config, model=T5EncoderModel, rules=rules, prefixes=PREFIXES, ignore=IGNORE, adapt=adapt,
    matrix_params=matrix_params, attention_width=attention_width,
    lora_target=r"attention\.(q|k|v|o)$|ffn\.(experts\.)?(wi|wi_0|wi_1|wo)$",
    tiny={"t5": tiny}, packing_cost=layer_attention_cost,
)
