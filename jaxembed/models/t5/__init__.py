"""T5 / mT5 encoders (GTR, sentence-T5, INSTRUCTOR): relative position bias, RMS norm, pre-LN, no biases."""
from jaxembed.models.t5.model import T5Config, T5EncoderModel
from jaxembed.models.t5.params import IGNORE, PREFIXES, adapt, rules
from jaxembed.models.t5.spec import ARCH

__all__ = ["ARCH", "T5Config", "T5EncoderModel", "rules", "adapt", "PREFIXES", "IGNORE"]
