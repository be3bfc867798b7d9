"""The sentence-transformers peer of the benchmarks: the HF Trainer's AdamW (its weight-decay groups)."""

from __future__ import annotations


def trainer_adamw(model, lr: float, weight_decay: float, **kw):
    """The HF Trainer's optimizer: torch AdamW with weight decay on every trainable parameter except LayerNorm /
    RMSNorm weights and biases. ``kw``: betas, eps."""
    import torch
    from torch import nn
    from transformers.trainer_pt_utils import get_parameter_names

    decay = set(get_parameter_names(model, [nn.LayerNorm],
                                    [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in named if n in decay], "weight_decay": weight_decay},
              {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, **kw)
