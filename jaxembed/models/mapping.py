"""Declarative Hugging Face <-> Flax parameter mapping, used in both directions.

Each architecture declares a table of :class:`Rule`: a PyTorch state-dict key template, the Flax parameter path
template and the transform between them. ``{i}`` in both templates stands for the layer index. Import applies the
table to a flat dict of numpy arrays (already stripped of model prefixes such as ``bert.`` or ``model.``); export
applies it backwards. Keys the table does not know are reported, never silently dropped.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Sequence

import numpy as np

from jaxembed.errors import UserError

Path = tuple  # a Flax state path, e.g. ("layers", 0, "attention", "query", "kernel")


@dataclasses.dataclass(frozen=True)
class Rule:
    """hf: PyTorch key template; flax: dotted Flax path template; transform: 'none' or 'transpose'
    (PyTorch Linear weight [out, in] <-> Flax kernel [in, out]); per_layer: the templates contain ``{i}``."""

    hf: str
    flax: str
    transform: str = "none"

    @property
    def per_layer(self) -> bool:
        return "{i}" in self.hf


def linear(hf_prefix: str, flax_prefix: str, bias: bool = True) -> list[Rule]:
    """Rules of a PyTorch ``nn.Linear`` <-> ``nnx.Linear``."""
    rules = [Rule(f"{hf_prefix}.weight", f"{flax_prefix}.kernel", "transpose")]
    if bias:
        rules.append(Rule(f"{hf_prefix}.bias", f"{flax_prefix}.bias"))
    return rules


def norm(hf_prefix: str, flax_prefix: str, bias: bool = True) -> list[Rule]:
    """Rules of a LayerNorm (weight/bias <-> scale/bias) or an RMSNorm (weight <-> scale)."""
    rules = [Rule(f"{hf_prefix}.weight", f"{flax_prefix}.scale")]
    if bias:
        rules.append(Rule(f"{hf_prefix}.bias", f"{flax_prefix}.bias"))
    return rules


def _path(dotted: str) -> Path:
    return tuple(int(p) if p.isdigit() else p for p in dotted.split("."))


def expand(rules: Sequence[Rule], num_layers: int) -> list[tuple[str, Path, str]]:
    """Concrete (hf_key, flax_path, transform) triples for a model with ``num_layers`` layers."""
    out = []
    for r in rules:
        layers = range(num_layers) if r.per_layer else [None]
        for i in layers:
            hf = r.hf.format(i=i) if i is not None else r.hf
            fl = r.flax.format(i=i) if i is not None else r.flax
            out.append((hf, _path(fl), r.transform))
    return out


def _apply(x: np.ndarray, transform: str) -> np.ndarray:
    if transform == "none":
        return x
    if transform == "transpose":
        return np.ascontiguousarray(np.swapaxes(x, -1, -2))
    raise ValueError(f"unknown transform {transform!r}")


class MappingError(UserError):
    pass


def hf_to_flax(
    rules: Sequence[Rule],
    tensors: dict[str, np.ndarray],
    num_layers: int,
    expected: dict[Path, tuple[int, ...]],
    ignore: Iterable[str] = (),
    source: str = "checkpoint",
) -> tuple[dict[Path, np.ndarray], list[str]]:
    """Map PyTorch tensors to Flax paths.

    tensors: HF key -> array; expected: Flax path -> shape of every parameter of the target model.
    Returns (flax path -> array, unused HF keys not matched by ``ignore`` regexes). Raises MappingError naming
    every missing key and every shape mismatch.
    """
    out: dict[Path, np.ndarray] = {}
    used = set()
    missing, bad_shape = [], []
    for hf, path, transform in expand(rules, num_layers):
        if path not in expected:
            continue  # the rule is for an optional part this model does not have (e.g. BERT pooler)
        if hf not in tensors:
            missing.append(hf)
            continue
        arr = _apply(np.asarray(tensors[hf]), transform)
        if tuple(arr.shape) != tuple(expected[path]):
            bad_shape.append(f"{hf}: checkpoint {tuple(arr.shape)} vs model {tuple(expected[path])}")
            continue
        out[path] = arr
        used.add(hf)
    unmapped = [p for p in expected if p not in out]
    problems = []
    if missing:
        problems.append(f"missing tensors in {source}: {', '.join(missing[:10])}" + (" ..." if len(missing) > 10 else ""))
    if bad_shape:
        problems.append("shape mismatches: " + "; ".join(bad_shape[:10]))
    if unmapped and not missing and not bad_shape:
        problems.append("model parameters with no mapping rule: " + ", ".join(".".join(map(str, p)) for p in unmapped[:10]))
    if problems:
        raise MappingError(
            f"cannot load {source}: " + " | ".join(problems)
            + ". Check that config.json matches the weights (num_hidden_layers, hidden_size, vocab_size ...)."
        )
    ignore_re = [re.compile(p) for p in ignore]
    unused = sorted(k for k in tensors if k not in used and not any(r.search(k) for r in ignore_re))
    return out, unused


def flax_to_hf(rules: Sequence[Rule], params: dict[Path, np.ndarray], num_layers: int) -> dict[str, np.ndarray]:
    """Map Flax parameters back to PyTorch keys and layouts. Every parameter must be covered by a rule."""
    out = {}
    covered = set()
    for hf, path, transform in expand(rules, num_layers):
        if path in params:
            out[hf] = _apply(np.asarray(params[path]), transform)
            covered.add(path)
    left = [p for p in params if p not in covered]
    if left:
        raise MappingError("parameters with no export rule: " + ", ".join(".".join(map(str, p)) for p in left[:10]))
    return out
