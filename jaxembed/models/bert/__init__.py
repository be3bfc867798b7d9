"""BERT family: BERT, MiniLM, RoBERTa, XLM-RoBERTa (absolute positions, post-LN, GELU)."""
from jaxembed.models.bert.model import BertConfig, BertModel
from jaxembed.models.bert.params import IGNORE, PREFIXES, adapt, rules
from jaxembed.models.bert.spec import ARCH

__all__ = ["ARCH", "BertConfig", "BertModel", "rules", "adapt", "PREFIXES", "IGNORE"]
