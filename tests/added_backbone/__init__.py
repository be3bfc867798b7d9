"""An architecture folder added from outside the package, as docs/architecture.md ("A backbone: one folder") adds
one: ``tiny_encoder``, BERT's encoder under a model type of its own (its model, mapping table, facts and the
tokenizer of its tiny models). tests/test_add_component_backbone_format.py registers it and trains it."""
from added_backbone.spec import ARCH

__all__ = ["ARCH"]
