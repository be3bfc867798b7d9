"""The Hugging Face <-> Flax mapping table: BERT's keys, without a task head's prefix."""

from jaxembed.models.bert.params import IGNORE, adapt, rules  # noqa: F401 (the folder's table)

PREFIXES = ("tiny_encoder.",)
