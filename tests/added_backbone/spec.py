"""The folder's facts (``jaxembed.models.architecture.Architecture``), its tiny model and that model's tokenizer."""

from added_backbone.model import TinyEncoderConfig, TinyEncoderModel
from added_backbone.params import IGNORE, PREFIXES, adapt, rules
from added_backbone.tokenizer import TINY_TOKENIZER

from jaxembed.models.architecture import Architecture, TinySize, layer_attention_cost


def matrix_params(config: TinyEncoderConfig) -> int:
    """Weights of all layers' matrices: q / k / v / output projections and the two feed-forward matrices."""
    h = config.hidden_size
    return config.num_layers * (4 * h * h + 2 * h * config.intermediate_size)


def tiny(size: TinySize) -> dict:
    """A tiny_encoder of the size asked."""
    return dict(model_type="tiny_encoder", vocab_size=size.vocab_size, hidden_size=size.hidden_size,
                num_hidden_layers=size.num_layers, num_attention_heads=size.num_heads,
                intermediate_size=2 * size.hidden_size, max_position_embeddings=size.max_positions)


ARCH = Architecture(
    model_types=("tiny_encoder",),
    config=TinyEncoderConfig, model=TinyEncoderModel, rules=rules, prefixes=PREFIXES, ignore=IGNORE, adapt=adapt,
    matrix_params=matrix_params, attention_width=lambda config: config.hidden_size,
    lora_target=r"attention\.(query|key|value|output)$|ffn\.(experts\.)?(intermediate|output)$",
    tiny={"tiny_encoder": tiny}, packing_cost=layer_attention_cost, uses_token_types=True,
    tiny_tokenizer=TINY_TOKENIZER,
)
