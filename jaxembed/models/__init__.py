"""Model registry: Hugging Face ``model_type`` -> our Flax NNX implementation and its mapping table.

Every architecture package (``bert``, ``qwen2``, ``llama``, ``gemma``, ``t5``; the decoders share
``jaxembed.models.decoder``) exports ``<Name>Config`` (with ``from_hf``, ``to_hf``, ``num_layers``),
``<Name>Model`` (``__call__(input_ids, attention_mask, token_type_ids=None, *, deterministic, rngs, experts=None,
segment_ids=None, positions=None) -> [B, L, H]``: padded rows with ``attention_mask``, or packed rows
(``jaxembed.packing``) with ``segment_ids`` and per-text ``positions``; attention through
``jaxembed.models.attention``, chosen by the config's ``attention``), ``rules(config)``, ``PREFIXES`` (stripped
from checkpoint keys), ``IGNORE`` (regexes of keys that are not encoder weights) and optionally
``adapt(hf_config, keys) -> dict`` (config overrides read off the checkpoint, e.g. whether BERT has a pooler).

Every architecture config also carries ``mote`` (a ``jaxembed.mote.MoTESpec`` or None): with it, the listed
layers' feed-forward sublayers are MoTE task-expert blocks, and ``__call__`` takes ``experts=`` (see
``jaxembed.mote``).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxembed.errors import UserError
from jaxembed.models import mapping
from jaxembed.models.layers import to_dtype

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ArchSpec:
    package: str  # module under jaxembed.models
    config: str  # class names inside it
    model: str
    uses_token_types: bool = False

    def module(self):
        return importlib.import_module(f"jaxembed.models.{self.package}")

    @property
    def config_cls(self):
        return getattr(self.module(), self.config)

    @property
    def model_cls(self):
        return getattr(self.module(), self.model)


ARCHITECTURES: dict[str, ArchSpec] = {
    "bert": ArchSpec("bert", "BertConfig", "BertModel", uses_token_types=True),
    "roberta": ArchSpec("bert", "BertConfig", "BertModel", uses_token_types=True),
    "xlm-roberta": ArchSpec("bert", "BertConfig", "BertModel", uses_token_types=True),
    "camembert": ArchSpec("bert", "BertConfig", "BertModel", uses_token_types=True),
    "qwen2": ArchSpec("qwen2", "Qwen2Config", "Qwen2Model"),
    "qwen3": ArchSpec("qwen2", "Qwen2Config", "Qwen2Model"),
    "llama": ArchSpec("llama", "LlamaConfig", "LlamaModel"),
    "mistral": ArchSpec("llama", "LlamaConfig", "LlamaModel"),
    "gemma2": ArchSpec("gemma", "GemmaConfig", "GemmaModel"),
    "gemma3_text": ArchSpec("gemma", "GemmaConfig", "GemmaModel"),
    "t5": ArchSpec("t5", "T5Config", "T5EncoderModel"),
    "mt5": ArchSpec("t5", "T5Config", "T5EncoderModel"),
}


class UnknownArchitecture(UserError):
    pass


def spec_for(model_type: str | None, where: str = "config.json") -> ArchSpec:
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
    return spec.config_cls.from_hf(hf, **overrides)


def uses_token_types(config) -> bool:
    return spec_for(config.model_type).uses_token_types


def init_model(config, seed: int = 0) -> nnx.Module:
    """A randomly initialised model (HF-style normal(0.02) init)."""
    return spec_for(config.model_type).model_cls(config, rngs=nnx.Rngs(seed))


def abstract_model(config) -> nnx.Module:
    """The model with ShapeDtypeStructs instead of arrays (no memory, no random init)."""
    return nnx.eval_shape(lambda: init_model(config))


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
    mod = spec_for(config.model_type).module()
    adapt: Callable | None = getattr(mod, "adapt", None)
    return dataclasses.replace(config, **adapt(config, keys)) if adapt else config


def load_weights(config, tensors: dict[str, Any], source: str = "checkpoint") -> tuple[nnx.Module, Any]:
    """Import PyTorch-layout tensors into our model. Returns (model, config as adapted to the checkpoint).

    Unused keys that are not known buffers/heads are logged as a warning (never silently dropped)."""
    mod = spec_for(config.model_type).module()
    tensors = _normalise_keys(tensors, mod.PREFIXES)
    config = adapt_config(config, tensors.keys())
    shapes = param_shapes(abstract_model(config))
    params, unused = mapping.hf_to_flax(mod.rules(config), tensors, config.num_layers, shapes, mod.IGNORE, source)
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
    mod = spec_for(config.model_type).module()
    return mapping.flax_to_hf(mod.rules(config), flat_params(model), config.num_layers)
