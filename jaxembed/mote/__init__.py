"""MoTE: Mixture of Task Experts (Romero et al. 2025, arXiv:2506.17781; docs/design.md, MoTE; docs/mote.md).

Every selected transformer block's feed-forward sublayer becomes |E| experts; a whole sequence goes through the
expert of its task ("instruction type", MoTE 3.1): never per token, and queries and documents of one retrieval
batch go through different experts (search query / search document). The modules, each importing only modules
listed above it:

- ``block``: the expert block ``MoTEFeedForward`` (weights stacked [E, ...]), the route it takes (``make_route``:
  one expert per call, per row or per token) and the expert-stack parameter paths; what an expert is, and what
  each routing path costs.
- ``spec``: ``MoTESpec``: the experts, the MoTE layers and the routing (task type -> query expert, document
  expert); the trainer's per-task routing tables.
- ``settings``: ``MoTESettings``, the run config's ``model.mote`` section (keys, defaults, checks, the card's
  MoTE row), declared here and assembled into the config by ``jaxembed.config``.
- ``tacl``: TA-CL (MoTE 3.2, App. D.2): each task type's batching strategy and contrastive temperature.
- ``upcycling``: up-cycling a dense model (MoTE 3.1.1), and the way back to dense models: one expert's model,
  expert averaging (App. B); a MoTE model with some of its experts.
- ``export``: the experts in Hugging Face layout (the expert files of a full MoTE export, written and read).

The model layer (``jaxembed.models``) never imports this package: the ``MoTESpec`` in an architecture config plugs
into the feed-forward interface the backbones expose (``jaxembed.models.layers.feed_forward`` / ``mote_route``).
This file re-exports the modules' public names: ``jaxembed.mote.X`` works for each of them.
"""

from jaxembed.mote.block import (
    MoTEFeedForward, active_experts, dense_path, is_expert_path, make_route, stack_module,
)
from jaxembed.mote.export import from_hf_experts, hf_expert_tensors, read_spec
from jaxembed.mote.spec import (
    CONFIG_FILE, DEFAULT_EXPERT, DEFAULT_EXPERTS, DEFAULT_ROUTING, FORMAT, PLACEMENTS, WEIGHTS_FILE, MoTESpec,
    check_experts, check_routing, mote_layers, routing_tables,
)
from jaxembed.mote.settings import MoTESettings, spec_from_config, validate_config
from jaxembed.mote.tacl import STATIC, TA_CL, ta_cl
from jaxembed.mote.upcycling import average_experts, extract_expert, get_spec, select_experts, split_model, upcycle

__all__ = [
    "CONFIG_FILE", "DEFAULT_EXPERT", "DEFAULT_EXPERTS", "DEFAULT_ROUTING", "FORMAT", "PLACEMENTS", "STATIC", "TA_CL",
    "WEIGHTS_FILE", "MoTEFeedForward", "MoTESettings", "MoTESpec", "active_experts", "average_experts", "check_experts",
    "check_routing", "dense_path", "extract_expert", "from_hf_experts", "get_spec", "hf_expert_tensors",
    "is_expert_path", "make_route", "mote_layers", "read_spec", "routing_tables", "select_experts", "spec_from_config",
    "split_model", "stack_module", "ta_cl", "upcycle", "validate_config",
]
