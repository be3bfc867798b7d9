"""Model registry: Hugging Face ``model_type`` -> our Flax NNX implementation and everything jaxembed knows about
it (``ARCHITECTURES``, collected from the architecture folders).

Every architecture folder (``bert``, ``qwen2``, ``llama``, ``gemma``, ``t5``; the decoders share
``jaxembed.models.decoder``) exports ``ARCH``, its ``jaxembed.models.architecture.Architecture``: ``<Name>Config``
(with ``from_hf``, ``to_hf``, ``num_layers``), ``<Name>Model`` (``__call__(input_ids, attention_mask,
token_type_ids=None, *, deterministic, rngs, experts=None, segment_ids=None, positions=None) -> [B, L, H]``: padded
rows with ``attention_mask``, or packed rows (``jaxembed.packing``) with ``segment_ids`` and per-text
``positions``; attention through ``jaxembed.models.attention``, chosen by the config's ``attention``), its mapping
table (``rules(config)``, ``PREFIXES`` stripped from checkpoint keys, ``IGNORE`` regexes of keys that are not
encoder weights, ``adapt(hf_config, keys) -> dict``: config overrides read off the checkpoint, e.g. whether BERT
has a pooler), its FLOP formula, LoRA target, tiny configs and packing cost. Every sub-package of this folder is an
architecture folder and must export ``ARCH``; ``register`` adds a folder from outside the package.

Every architecture config also carries ``mote`` (a ``jaxembed.mote.MoTESpec`` or None): with it, the listed
layers' feed-forward sublayers are MoTE task-expert blocks, and ``__call__`` takes ``experts=`` (see
``jaxembed.mote``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
import pkgutil
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxembed.errors import UserError
from jaxembed.models import mapping
from jaxembed.models.architecture import Architecture
from jaxembed.models.layers import to_dtype

log = logging.getLogger(__name__)


def _folders() -> dict[str, Architecture]:
    """Package name -> the ``ARCH`` of every architecture folder (every sub-package here), its package filled in."""
    out = {}
    for info in pkgutil.iter_modules(__path__):
        if info.ispkg:
            package = importlib.import_module(f"{__name__}.{info.name}")
            arch = getattr(package, "ARCH", None)
            if not isinstance(arch, Architecture):
                raise ImportError(f"{package.__name__} is an architecture folder without ARCH (its spec.py declares "
                                  "it)")
            out[package.__name__] = dataclasses.replace(arch, package=package.__name__)
    return out


def _by_model_type(folders: dict[str, Architecture]) -> dict[str, Architecture]:
    out: dict[str, Architecture] = {}
    for arch in folders.values():
        for t in arch.model_types:
            if t in out:
                raise ImportError(f"model_type {t!r} is declared by {out[t].package} and {arch.package}")
            out[t] = arch
    return out


#: the architecture folders (package name -> Architecture), and Hugging Face model_type -> its Architecture
FOLDERS: dict[str, Architecture] = _folders()
ARCHITECTURES: dict[str, Architecture] = _by_model_type(FOLDERS)


def register(package: str) -> Architecture:
    """Add an architecture folder that lives outside this package: ``package`` is its importable name, which
    exports ``ARCH`` as a folder here does. Its model types join ARCHITECTURES and its tiny models
    ``jaxembed.models.tiny``'s; a model type or tiny name already declared is an error. -> its Architecture."""
    if package in FOLDERS:
        raise ValueError(f"architecture folder {package} is already registered")
    arch = dataclasses.replace(importlib.import_module(package).ARCH, package=package)
    taken = {n for a in FOLDERS.values() for n in a.tiny} & set(arch.tiny)
    if taken:
        raise ValueError(f"{package}: tiny model {sorted(taken)[0]!r} is declared by another folder")
    ARCHITECTURES.update(_by_model_type({**FOLDERS, package: arch}))
    FOLDERS[package] = arch
    return arch


def unregister(package: str) -> None:
    arch = FOLDERS.pop(package, None)
    for t in arch.model_types if arch is not None else ():
        ARCHITECTURES.pop(t, None)


class UnknownArchitecture(UserError):
    pass


def spec_for(model_type: str | None, where: str = "config.json") -> Architecture:
    if model_type not in ARCHITECTURES:
        raise UnknownArchitecture(
            f"{where}: model_type={model_type!r} is not supported. Supported: {', '.join(sorted(ARCHITECTURES))}. "
            "Architectures are implemented in jaxembed/models/ (Flax); no remote code is executed."
        )
    return ARCHITECTURES[model_type]


def config_from_hf(hf: dict[str, Any], where: str = "config.json", **overrides):
    """Our frozen config dataclass from a Hugging Face ``config.json`` dict (plus runtime overrides such as
    dtype, param_dtype, remat, causal)."""
    spec = spec_for(hf.get("model_type"), where)
    return spec.config.from_hf(hf, **overrides)


def uses_token_types(config) -> bool:
    return spec_for(config.model_type).uses_token_types


def init_model(config, seed: int = 0) -> nnx.Module:
    """A randomly initialised model (HF-style normal(0.02) init)."""
    return spec_for(config.model_type).model(config, rngs=nnx.Rngs(seed))


def abstract_model(config) -> nnx.Module:
    """The model with ShapeDtypeStructs instead of arrays (no memory, no random init): a new module each call,
    from the structure traced once per config (``config`` is a frozen dataclass)."""
    graphdef, state = _abstract_parts(config)
    return nnx.merge(graphdef, state, copy=True)  # its own Variables: a change to one model stays in it


@functools.lru_cache(maxsize=32)
def _abstract_parts(config) -> tuple:
    """(graphdef, state) of the abstract model. Tracing the random init is the slow part: each parameter's key
    draw updates the RNG counter, and Flax then reads the traced counter's ``sharding``, whose error message JAX
    builds by walking every operation traced so far (0.37 s for all-MiniLM-L6-v2's 6 layers, 0.79 s for 12, 2.45 s
    for 24); loading, export and up-cycling ask for the same config several times."""
    return nnx.split(nnx.eval_shape(lambda: init_model(config)))


def param_shapes(model: nnx.Module) -> dict[tuple, tuple[int, ...]]:
    _, state = nnx.split(model, nnx.Param)
    return {tuple(p): tuple(v.shape) for p, v in nnx.to_flat_state(state)}


def flat_params(model: nnx.Module) -> dict[tuple, np.ndarray]:
    """Flax path -> numpy array of every nnx.Param."""
    _, state = nnx.split(model, nnx.Param)
    return {tuple(p): np.asarray(jax.device_get(v[...])) for p, v in nnx.to_flat_state(state)}


def model_from_params(config, params: dict[tuple, Any]) -> nnx.Module:
    """Build the model directly from arrays (Flax path -> array), cast to ``config.param_dtype``.

    Uses the abstract model, so no random initialisation is done and nothing is allocated twice."""
    graphdef, state = nnx.split(abstract_model(config))
    dtype = to_dtype(config.param_dtype)
    flat = []
    for path, var in nnx.to_flat_state(state):
        path = tuple(path)
        if path not in params:
            raise mapping.MappingError(f"no value for parameter {'.'.join(map(str, path))}")
        flat.append((path, var.replace(jnp.asarray(params[path], dtype=dtype))))
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def _normalise_keys(tensors: dict[str, Any], prefixes: tuple[str, ...]) -> dict[str, Any]:
    """Strip a task-head prefix (``bert.``, ``model.`` ...) when every encoder key has it, and rename the
    old TF-style LayerNorm ``gamma``/``beta`` to ``weight``/``bias`` (as transformers does on load)."""
    out = dict(tensors)
    for p in prefixes:
        if any(k.startswith(p) for k in out) and not any(k.startswith(("embeddings.", "encoder.", "layers.", "shared."))
                                                     for k in out):
            out = {(k[len(p):] if k.startswith(p) else k): v for k, v in out.items()}
            break
    renamed = {}
    for k, v in out.items():
        if k.endswith(".gamma"):
            k = k[: -len("gamma")] + "weight"
        elif k.endswith(".beta"):
            k = k[: -len("beta")] + "bias"
        renamed[k] = v
    return renamed


def adapt_config(config, keys) -> Any:
    """Config overrides read off the checkpoint's keys (optional parts such as BERT's pooler)."""
    return dataclasses.replace(config, **spec_for(config.model_type).adapt(config, keys))


def load_weights(config, tensors: dict[str, Any], source: str = "checkpoint") -> tuple[nnx.Module, Any]:
    """Import PyTorch-layout tensors into our model. Returns (model, config as adapted to the checkpoint).

    Unused keys that are not known buffers/heads are logged as a warning (never silently dropped)."""
    spec = spec_for(config.model_type)
    tensors = _normalise_keys(tensors, spec.prefixes)
    config = adapt_config(config, tensors.keys())
    shapes = param_shapes(abstract_model(config))
    params, unused = mapping.hf_to_flax(spec.rules(config), tensors, config.num_layers, shapes, spec.ignore, source)
    if unused:
        log.warning("%s: %d tensors are not used by the %s encoder: %s%s", source, len(unused), config.model_type,
                    ", ".join(unused[:8]), " ..." if len(unused) > 8 else "")
    return model_from_params(config, params), config


def export_weights(model: nnx.Module) -> dict[str, np.ndarray]:
    """Our parameters as a PyTorch-layout state dict (the keys ``transformers.AutoModel`` expects)."""
    config = model.config
    if getattr(config, "mote", None) is not None:
        raise UserError("a MoTE backbone has no single Hugging Face state dict (fix: jaxembed.export.export writes "
                        "the full MoTE folder; jaxembed.mote.extract_expert / average_experts give dense models)")
    return mapping.flax_to_hf(spec_for(config.model_type).rules(config), flat_params(model), config.num_layers)
