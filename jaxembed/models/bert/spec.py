"""The BERT family's facts (``jaxembed.models.architecture``): BERT / MiniLM, RoBERTa, XLM-RoBERTa, CamemBERT."""

from jaxembed.models.architecture import Architecture, TinySize, layer_attention_cost
from jaxembed.models.bert.model import BertConfig, BertModel
from jaxembed.models.bert.params import IGNORE, PREFIXES, adapt, rules


def matrix_params(config: BertConfig) -> int:
    """Weights of all layers' matrices: q / k / v / output projections and the two feed-forward matrices."""
    h = config.hidden_size
    return config.num_layers * (4 * h * h + 2 * h * config.intermediate_size)


def tiny(size: TinySize) -> dict:
    """BERT / MiniLM: post-LN, GELU, absolute positions."""
    return dict(model_type="bert", vocab_size=size.vocab_size, hidden_size=size.hidden_size,
                num_hidden_layers=size.num_layers, num_attention_heads=size.num_heads,
                intermediate_size=2 * size.hidden_size, max_position_embeddings=size.max_positions)


ARCH = Architecture(
    model_types=("bert", "roberta", "xlm-roberta", "camembert"),
    config=BertConfig, model=BertModel, rules=rules, prefixes=PREFIXES, ignore=IGNORE, adapt=adapt,
    matrix_params=matrix_params, attention_width=lambda config: config.hidden_size,
    lora_target=r"attention\.(query|key|value|output)$|ffn\.(experts\.)?(intermediate|output)$",
    tiny={"bert": tiny}, packing_cost=layer_attention_cost, uses_token_types=True,
    hf_extra_linear=("pooler.dense",),
)
