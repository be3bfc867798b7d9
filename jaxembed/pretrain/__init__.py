"""Pre-training stages before contrastive fine-tuning.

- ``retromae``: RetroMAE masked auto-encoding (PEG's pre-training; docs/design.md, RetroMAE pre-training): the job,
  its config and export; ``model``: the encoder / decoder / MLM heads and the loss; ``masking``: BERT-style
  corruption and the MLM loss as pure functions; ``data``: texts -> tokens -> length-bucketed batches; ``cli``:
  ``jaxembed pretrain retromae``.
"""
