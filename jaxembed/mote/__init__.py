"""MoTE: Mixture of Task Experts (Romero et al. 2025, ``../shared/papers/mote.md``; DESIGN.md 2.3).

The package's modules are listed below; this file re-exports their public names, so ``jaxembed.mote.X`` works
for every one of them.
"""

from jaxembed.mote.block import (
    MoTEFeedForward, active_experts, dense_path, is_expert_path, make_route, stack_module,
)
from jaxembed.mote.export import from_hf_experts, hf_expert_tensors, read_spec
from jaxembed.mote.spec import (
    CONFIG_FILE, DEFAULT_EXPERT, DEFAULT_EXPERTS, DEFAULT_ROUTING, FORMAT, PLACEMENTS, WEIGHTS_FILE, MoTESpec,
    check_experts, check_routing, mote_layers, routing_tables, spec_from_config, validate_config,
)
from jaxembed.mote.tacl import STATIC, TA_CL, ta_cl
from jaxembed.mote.upcycling import _split_model, average_experts, extract_expert, get_spec, select_experts, upcycle

__all__ = [
    "CONFIG_FILE", "DEFAULT_EXPERT", "DEFAULT_EXPERTS", "DEFAULT_ROUTING", "FORMAT", "PLACEMENTS", "STATIC", "TA_CL",
    "WEIGHTS_FILE", "MoTEFeedForward", "MoTESpec", "active_experts", "average_experts", "check_experts",
    "check_routing", "dense_path", "extract_expert", "from_hf_experts", "get_spec", "hf_expert_tensors",
    "is_expert_path", "make_route", "mote_layers", "read_spec", "routing_tables", "select_experts",
    "spec_from_config", "stack_module", "ta_cl", "upcycle", "validate_config",
]
