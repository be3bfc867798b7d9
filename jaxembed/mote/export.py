"""A MoTE model's experts in Hugging Face layout: the expert files of a full MoTE export, written and read back.

A full export (``jaxembed.export.export_mote``) is the dense model of the default expert (``config.json``,
``model.safetensors``) plus two files: ``mote_config.json`` (``MoTESpec.to_json``: experts, layers, routing,
default) and ``mote_experts.safetensors``, every expert's feed-forward weights of the MoTE layers in PyTorch
layout, keyed ``experts.<expert>.<Hugging Face key>`` (the keys ``transformers.AutoModel`` uses for the dense
block, ``jaxembed.models.mapping``).

- ``hf_expert_tensors``: a MoTE model -> those tensors;
- ``from_hf_experts``: a dense model + those tensors -> the MoTE model (all experts, or those a task uses);
- ``read_spec``: a folder's ``mote_config.json`` -> its ``MoTESpec`` (None for a dense folder).

``jaxembed.loading.load`` uses ``read_spec`` and ``from_hf_experts`` to load such a folder.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Mapping

import numpy as np

from jaxembed.errors import UserError
from jaxembed.mote.block import dense_path, is_expert_path
from jaxembed.mote.spec import CONFIG_FILE, WEIGHTS_FILE, MoTESpec
from jaxembed.mote.upcycling import rebuild_model, require_spec, split_model


def _ffn_paths(dense_config, spec: MoTESpec) -> dict[tuple, tuple]:
    """Flax path -> shape of the dense model's feed-forward parameters in the MoTE layers."""
    from jaxembed import models

    layers = set(spec.layers)
    return {p: s for p, s in models.param_shapes(models.abstract_model(dense_config)).items()
            if len(p) > 2 and p[0] == "layers" and p[1] in layers and p[2] == "ffn"}


def hf_expert_tensors(model) -> dict[str, np.ndarray]:
    """Every expert's feed-forward weights of the MoTE layers in PyTorch layout, keyed
    ``experts.<expert>.<Hugging Face key>`` (the keys ``transformers.AutoModel`` uses for the dense block)."""
    from jaxembed import models
    from jaxembed.models import mapping

    backbone, _ = split_model(model)
    spec = require_spec(backbone)
    dense_cfg = dataclasses.replace(backbone.config, mote=None)
    rules = models.spec_for(dense_cfg.model_type).rules(dense_cfg)
    flat = {p: a for p, a in models.flat_params(backbone).items() if is_expert_path(p)}
    out = {}
    for e, name in enumerate(spec.experts):
        sub = {dense_path(p): a[e] for p, a in flat.items()}
        for k, v in mapping.flax_to_hf(rules, sub, dense_cfg.num_layers).items():
            out[f"experts.{name}.{k}"] = v
    return out


def from_hf_experts(dense_model, spec: MoTESpec, tensors: Mapping[str, np.ndarray], source: str = WEIGHTS_FILE):
    """The MoTE model with ``dense_model``'s shared weights and the experts ``spec.experts`` read from ``tensors``
    (``experts.<expert>.<Hugging Face key>``, as ``hf_expert_tensors`` writes them). Experts of the file that
    ``spec`` does not list are not read (a task-specific load)."""
    from jaxembed import models
    from jaxembed.models import mapping

    backbone, _ = split_model(dense_model)
    dense_cfg = backbone.config
    rules = models.spec_for(dense_cfg.model_type).rules(dense_cfg)
    expected = _ffn_paths(dense_cfg, spec)
    per_expert = []
    for name in spec.experts:
        prefix = f"experts.{name}."
        sub = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        if not sub:
            raise UserError(f"{source}: no weights for expert {name!r} (fix: re-export the MoTE model)")
        params, unused = mapping.hf_to_flax(rules, sub, dense_cfg.num_layers, expected, (),
                                            f"{source} (expert {name})")
        if unused:
            raise UserError(f"{source}: expert {name!r} has tensors outside the MoTE layers {spec.layers}: "
                            f"{', '.join(unused[:5])}")
        per_expert.append(params)
    new_cfg = dataclasses.replace(dense_cfg, mote=spec)
    dense = models.flat_params(backbone)
    params = {}
    for path in models.param_shapes(models.abstract_model(new_cfg)):
        if is_expert_path(path):
            dp = dense_path(path)
            params[path] = np.stack([np.asarray(p[dp]) for p in per_expert])
        else:
            params[path] = dense[path]
    return rebuild_model(dense_model, new_cfg, params)


def read_spec(folder) -> MoTESpec | None:
    """The MoTE spec of a model folder (``mote_config.json``), or None for a dense folder."""
    from pathlib import Path

    p = Path(folder) / CONFIG_FILE
    if not p.exists():
        return None
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise UserError(f"{p}: invalid JSON at line {e.lineno}: {e.msg}") from None
    return MoTESpec.from_json(d, str(p))
