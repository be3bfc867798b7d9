"""MoTE up-cycling and its inverses: a dense model -> a MoTE model, and a MoTE model -> dense models.

- ``upcycle`` (MoTE 3.1.1): the MoTE model whose experts, in the blocks ``spec.layers`` lists, all start as copies of
  the dense block's feed-forward sublayer and its norms (``jaxembed.mote.block``: what an expert is). So at step 0
  the MoTE model computes exactly the dense model for every task (tests: <= 1e-6).
- ``extract_expert``: the dense model (original architecture) of one expert: the per-task model.
- ``average_experts`` (MoTE App. B, expert averaging): the dense model whose feed-forward blocks are the mean of
  the experts'.
- ``select_experts``: the MoTE model that keeps some experts only (MoTE 3.1: inactive experts can be offloaded).

Each takes an ``EmbeddingModel`` or a backbone of any registered architecture, and builds the new model from flat
parameters (``jaxembed.models.model_from_params``): no per-architecture code here.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

import numpy as np
from flax import nnx

from jaxembed.errors import UserError
from jaxembed.mote.block import dense_path, is_expert_path

if TYPE_CHECKING:
    from jaxembed.mote.spec import MoTESpec


def split_model(model):
    """(backbone, rewrap(backbone) -> model of the same kind as ``model``)."""
    from jaxembed.models.embedding import EmbeddingModel

    if isinstance(model, EmbeddingModel):
        def rewrap(backbone):
            new = EmbeddingModel(backbone, model.head)
            nnx.update(new.dense, nnx.state(model.dense))
            return new

        return model.backbone, rewrap
    return model, lambda backbone: backbone


def rebuild_model(model, config, params: dict):
    from jaxembed import models

    backbone, rewrap = split_model(model)
    return rewrap(models.model_from_params(config, params))


def get_spec(model) -> MoTESpec | None:
    backbone, _ = split_model(model)
    return getattr(backbone.config, "mote", None)


def require_spec(model) -> MoTESpec:
    spec = get_spec(model)
    if spec is None:
        raise UserError("this is a dense model without task experts (fix: up-cycle it with jaxembed.mote.upcycle, "
                        "or train with model.mote.enabled=True)")
    return spec


def upcycle(model, spec: MoTESpec):
    """MoTE 3.1.1: the MoTE model whose experts all start as copies of ``model``'s feed-forward blocks (and norms).
    ``model``: an EmbeddingModel or a backbone of any registered architecture. Its embeddings at step 0 equal the
    dense model's for every expert."""
    from jaxembed import models

    backbone, _ = split_model(model)
    config = backbone.config
    if getattr(config, "mote", None) is not None:
        raise UserError("the model already has task experts; up-cycling starts from a dense model")
    bad = [i for i in spec.layers if not 0 <= i < config.num_layers]
    if bad:
        raise UserError(f"MoTE layers {bad} are outside the model's {config.num_layers} layers")
    new_cfg = dataclasses.replace(config, mote=spec)
    dense = models.flat_params(backbone)
    params = {}
    for path, shape in models.param_shapes(models.abstract_model(new_cfg)).items():
        a = dense[dense_path(path)]
        params[path] = np.broadcast_to(a, shape) if is_expert_path(path) else a
    return rebuild_model(model, new_cfg, params)


def _expert_params(model, pick: Callable[[np.ndarray], np.ndarray], spec: MoTESpec | None):
    """(params, config) of a model built from ``model``'s parameters with pick(stack [E, ...]) for every expert
    stack; spec None -> the dense architecture."""
    from jaxembed import models

    backbone, _ = split_model(model)
    config = dataclasses.replace(backbone.config, mote=spec)
    params = {}
    for path, a in models.flat_params(backbone).items():
        if is_expert_path(path):
            params[path if spec is not None else dense_path(path)] = pick(a)
        else:
            params[path] = a
    return params, config


def extract_expert(model, name: str):
    """The dense model (original architecture) whose feed-forward blocks are expert ``name``'s: the per-task model
    of that expert, with the same embeddings as the MoTE model routed to it."""
    spec = require_spec(model)
    e = spec.index(name)
    params, config = _expert_params(model, lambda a: a[e], None)
    return rebuild_model(model, config, params)


def average_experts(model, names: Sequence[str] | None = None):
    """MoTE App. B, expert averaging: the dense model (original architecture) whose feed-forward blocks are the
    mean of the experts' (all of them, or ``names``), norms included. Means are taken in float32."""
    spec = require_spec(model)
    idx = [spec.index(n) for n in (names or spec.experts)]

    def mean(a):
        return np.mean(np.asarray(a[idx], np.float32), axis=0).astype(a.dtype)

    params, config = _expert_params(model, mean, None)
    return rebuild_model(model, config, params)


def select_experts(model, names: Iterable[str]):
    """The MoTE model that keeps only the experts ``names`` (e.g. those of one task): its device memory holds
    those experts only (MoTE 3.1: inactive experts can be offloaded)."""
    spec = require_spec(model)
    sub = spec.subset(names)
    idx = [spec.index(n) for n in sub.experts]
    params, config = _expert_params(model, lambda a: a[idx], sub)
    return rebuild_model(model, config, params)
