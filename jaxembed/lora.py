"""LoRA: low-rank adapters on the linear layers of any backbone (Hu et al. 2021, "LoRA: Low-Rank Adaptation of
Large Language Models", arXiv 2106.09685), the way PEFT implements them.

A targeted linear layer y = x W0 + b (W0 [in, out], frozen) becomes (LoRA Eq. 3, PEFT's ``lora.Linear``)

    y = x W0 + b + (alpha / r) * (dropout(x) A) B,     A [in, r], B [r, out]

with A ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT: kaiming_uniform(a=sqrt(5))) and B = 0, so the adapted model starts
exactly at the base model. Only A and B are trained: they are ``nnx.LoRAParam`` variables (``TRAINABLE``), the
base weights stay ``nnx.Param``; the trainer splits the model by that type (jaxembed.train), so the base weights
are never differentiated, carry no optimizer state and are not in the checkpoints (they come from the model folder;
``<workdir>/lora_base.json`` holds their fingerprint so that a changed folder is caught on resume).

- ``apply(model, spec)``: surgery on a loaded ``EmbeddingModel``: every ``nnx.Linear`` of the backbone whose path
  matches ``spec.target`` is replaced in place by a ``LoRALinear`` holding it (parameter paths gain ``.base``:
  ``backbone.layers.0.attention.q_proj.base.kernel``, ``...q_proj.lora_a``). No backbone code changes.
- MoTE (jaxembed.mote): an expert block's linear layers carry a leading expert axis [E, in, out]; their adapters
  get one too ([E, in, r], [E, r, out]): adapters per expert, updated only for the routed experts
  (jaxembed.runs.optim.routed_adamw reads the ``experts`` level of the path, as for the experts' own weights).
- Dropout acts in train mode only (``train.dropout``, as PEFT's ``lora_dropout`` acts under ``model.train()``):
  a layer with adapters draws one key from the layer's ``rngs`` (``jaxembed.models.layers.layer_dropout_key``, set
  by ``run_layers`` for layers with a sublayer whose ``layer_dropout`` > 0), each adapter folds its own index into it.
- ``merged(model)``: the plain model with W = W0 + (alpha / r) A B (the export ``merged``); ``peft_tensors`` /
  ``peft_config``: the adapter in PEFT's layout (``adapter_model.safetensors``: ``base_model.model.<Hugging Face
  module>.lora_A.weight`` [r, in] and ``lora_B.weight`` [out, r]), written by jaxembed.export.export_lora.

Targets: ``model.lora.target`` is a regular expression searched (``re.search``) in the path of each linear layer
of the backbone (``backbone.layers.3.attention.q_proj``; its weight ``...q_proj.kernel`` matches too); '' takes
the architecture's default (``default_target``, each architecture's ``lora_target``: attention q/k/v/o and the
feed-forward projections).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections as mc
import numpy as np
from flax import nnx

from jaxembed import choices, models
from jaxembed.errors import UserError
from jaxembed.models import dropout
from jaxembed.models.layers import layer_dropout_key
from jaxembed.runs.rundir import NAMES, RunDir

#: the variable type of the adapter weights: the trainable parameters of a LoRA run
TRAINABLE = nnx.LoRAParam
EXPORTS = ("merged", "adapter", "both")
#: ``model.lora.base_dtype``: the storage dtype of the frozen base weights
BASE_DTYPES = choices.TRAIN_DTYPES
BASE_FILE = NAMES["lora_base_json"]
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"

def default_target(model_type: str) -> str:
    """The default target of ``model_type``: attention q / k / v / o and the feed-forward projections (MoTE experts
    included), as its architecture declares it (``jaxembed.models.architecture``; a registered folder's too)."""
    return models.spec_for(model_type).lora_target


@dataclasses.dataclass(frozen=True)
class LoRASpec:
    """``model.lora``: rank r, alpha (scale alpha / r), dropout on the adapter's input (in train mode: needs
    ``train.dropout``), target (regex searched in the linear layers' paths; '' = the architecture's default), export
    (merged: W0 + scale A B | adapter: the PEFT folder alone, in adapter/ | both: the merged folder with adapter/
    inside), base_dtype (the frozen base weights' storage dtype: float32 / bfloat16; the adapters stay in the model's
    parameter dtype). The config's ``model.lora`` section is ``section()`` (``enabled`` then these fields), checked
    by ``validate_config``; a run's is read by ``from_config``; the model card's LoRA row is ``card_row``."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target: str = ""
    export: str = "merged"
    base_dtype: str = "float32"

    @property
    def scale(self) -> float:
        return float(self.alpha) / int(self.rank)

    def target_for(self, model_type: str) -> str:
        return self.target or default_target(model_type)

    @classmethod
    def section(cls) -> mc.ConfigDict:
        """The config's ``model.lora`` section with its defaults: ``enabled`` (off), then the fields."""
        return mc.ConfigDict(dict(enabled=False, **dataclasses.asdict(cls())))

    @classmethod
    def from_config(cls, m) -> LoRASpec:
        """The settings of a run's ``model.lora`` section; a key it lacks (an older config.json) takes its
        default."""
        return cls(**{f.name: type(f.default)(m.get(f.name, f.default)) for f in dataclasses.fields(cls)})

    @staticmethod
    def card_row(lora: dict, export: str | None) -> tuple[str, str] | None:
        """The model card's LoRA row of a run's ``model.lora`` section (a plain dict; None when LoRA is off);
        export: what this export holds."""
        if not lora.get("enabled"):
            return None
        return ("LoRA", f"rank {lora.get('rank')}, alpha {_num(lora.get('alpha'))}, dropout "
                        f"{_num(lora.get('dropout'))}, target `{lora.get('target') or 'attention + MLP'}` "
                        f"(base weights frozen; this export: {export})")


def _num(x) -> str:
    """A number as the model card writes it (``jaxembed.export.card``): floats to 4 significant digits."""
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def spec_from_config(config) -> LoRASpec | None:
    """The run's ``LoRASpec`` (``config.model.lora``), or None when LoRA is off."""
    c = config.model.get("lora") if "lora" in config.model else None
    if c is None or not c.enabled:
        return None
    return LoRASpec.from_config(c)


def validate_config(c, train_dropout: bool) -> None:
    """One-line errors for ``model.lora`` (the targets against the model: ``check_targets``)."""
    def bad(key, allowed):
        return UserError(f"config.model.lora.{key} = {c[key]!r} is not valid: {allowed}")

    if not isinstance(c.rank, int) or isinstance(c.rank, bool) or c.rank < 1:
        raise bad("rank", "an integer >= 1, e.g. 8 or 16")
    if isinstance(c.alpha, bool) or not isinstance(c.alpha, (int, float)) or not np.isfinite(c.alpha) or c.alpha <= 0:
        raise bad("alpha", "a positive number (the scale is alpha / rank), e.g. 16 or 2 x rank")
    if isinstance(c.dropout, bool) or not isinstance(c.dropout, (int, float)) or not 0 <= c.dropout < 1:
        raise bad("dropout", "a probability in [0, 1), e.g. 0.05")
    if c.export not in EXPORTS:
        raise bad("export", f"allowed: {', '.join(EXPORTS)}")
    if c.get("base_dtype", "float32") not in BASE_DTYPES:
        raise bad("base_dtype", f"allowed: {', '.join(BASE_DTYPES)} (the frozen base weights' storage dtype)")
    if not isinstance(c.target, str):
        raise bad("target", "a regular expression (string) searched in the linear layers' paths; '' = default")
    try:
        re.compile(c.target)
    except re.error as e:
        raise bad("target", f"a regular expression ({e})") from None
    if c.dropout > 0 and not train_dropout:
        raise UserError(f"config.model.lora.dropout = {c.dropout} acts only in train mode, and config.train.dropout "
                        "is False (fix: set train.dropout=True (the backbone's own dropout then acts too, as under "
                        "PEFT's model.train()), or model.lora.dropout=0)")


# ------------------------------------------------------------------------------------------------ the module


class LoRALinear(nnx.Module):
    """A frozen ``nnx.Linear`` (``base``) plus the adapter (module docstring). Kernels with leading axes (MoTE's
    expert stack [E, in, out]) get adapters with the same leading axes. Logical sharding axes: A takes the
    kernel's input axis, B its output axis, the rank axis is replicated."""

    def __init__(self, base: nnx.Linear, spec: LoRASpec, key: jax.Array, uid: int):
        self.base = base
        kernel = base.kernel
        *lead, din, dout = kernel.shape
        axes = tuple(kernel.get_metadata().get("out_sharding") or (None,) * kernel.ndim)
        bound = 1.0 / np.sqrt(din)
        a = jax.random.uniform(key, (din, spec.rank), kernel.dtype, -bound, bound)
        a = jnp.array(jnp.broadcast_to(a, (*lead, din, spec.rank)))  # every expert starts from the same A
        self.lora_a = TRAINABLE(a, out_sharding=axes[:-1] + (None,), eager_sharding=False)
        self.lora_b = TRAINABLE(jnp.zeros((*lead, spec.rank, dout), kernel.dtype),
                                out_sharding=axes[:-2] + (None, axes[-1]), eager_sharding=False)
        self.scale = spec.scale
        self.rate = float(spec.dropout)
        self.uid = int(uid)

    @property
    def layer_dropout(self) -> float:
        """The adapter's dropout rate: > 0 asks ``run_layers`` for a dropout key per layer call."""
        return self.rate

    def __call__(self, x: jax.Array) -> jax.Array:
        """x: [..., in] -> [..., out]: base(x) + scale * (dropout(x) A) B in the base layer's compute dtype."""
        y = self.base(x)
        key = layer_dropout_key()
        h = x
        if self.rate > 0 and key is not None:
            h = dropout.apply(h, self.rate, jax.random.fold_in(key, self.uid))
        dtype = self.base.dtype or jnp.result_type(x.dtype, self.lora_a.dtype)
        a, b = self.lora_a[...].astype(dtype), self.lora_b[...].astype(dtype)
        z = jnp.matmul(jnp.matmul(h.astype(dtype), a), b)
        return y + (z * jnp.asarray(self.scale, dtype)).astype(y.dtype)


# -------------------------------------------------------------------------------------------- the surgery


def _dotted(path) -> str:
    return ".".join(str(p) for p in path)


def linear_paths(model) -> list[str]:
    """Dotted paths of the backbone's linear layers (``backbone.layers.0.attention.q_proj`` ...), the candidates
    of ``model.lora.target``."""
    return [_dotted(p) for p, n in nnx.iter_graph(model)
            if isinstance(n, nnx.Linear) and p and p[0] == "backbone"]


def select(paths: list[str], target: str, model_type: str) -> list[str]:
    """The paths ``target`` ('' = the default of ``model_type``) picks; none is a one-line UserError."""
    pattern = re.compile(target or default_target(model_type))
    picked = [p for p in paths if pattern.search(p) or pattern.search(p + ".kernel")]
    if not picked:
        which = (f"config.model.lora.target = {target!r}" if target else
                 f"the default LoRA target of {model_type} ({pattern.pattern!r})")
        raise UserError(f"{which} matches no linear layer of the model, e.g. {', '.join(paths[:4])} (fix: a regular "
                        "expression searched in these paths, e.g. 'q_proj|v_proj' or 'attention')")
    return picked


def check_targets(config) -> None:
    """``model.lora.target`` against the structure of the configured model (read from its config.json, no weights:
    an abstract model): a regex that matches nothing stops the run before anything is written."""
    spec = spec_from_config(config)
    if spec is None:
        return
    from jaxembed import loading

    folder = loading.resolve(config.model.name)
    st = loading.read_sentence_transformers(folder)
    try:
        hf_cfg = json.loads((st.transformer_dir / "config.json").read_text(encoding="utf-8"))
        cfg = models.config_from_hf(hf_cfg, where=str(st.transformer_dir / "config.json"))
    except (OSError, ValueError, TypeError) as e:
        if isinstance(e, UserError):
            raise
        raise UserError(f"{st.transformer_dir / 'config.json'}: cannot read the model config ({e})") from None
    from jaxembed.mote.settings import MoTESettings

    mote = MoTESettings.from_config(config.model.get("mote") or {})
    if mote.enabled:
        cfg = dataclasses.replace(cfg, mote=mote.spec(cfg.num_layers))
    backbone = models.abstract_model(cfg)
    paths = ["backbone." + _dotted(p) for p, n in nnx.iter_graph(backbone) if isinstance(n, nnx.Linear)]
    select(paths, spec.target, cfg.model_type)


def apply(model, spec: LoRASpec, seed: int = 0) -> list[str]:
    """Replace, in place, every targeted linear layer of ``model`` (an EmbeddingModel) by a ``LoRALinear``
    around it. Returns the targeted paths. The adapters' A come from ``seed``."""
    if any(isinstance(n, LoRALinear) for _, n in nnx.iter_graph(model)):
        raise UserError("the model already has LoRA adapters")
    nodes = {_dotted(p): (p, n) for p, n in nnx.iter_graph(model)}
    picked = select(linear_paths(model), spec.target, model.config.model_type)
    key = jax.random.key(seed)
    for uid, dotted in enumerate(picked):
        path, base = nodes[dotted]
        parent = nodes[_dotted(path[:-1])][1] if len(path) > 1 else model
        wrapped = LoRALinear(base, spec, jax.random.fold_in(key, uid), uid)
        if isinstance(path[-1], int):
            parent[path[-1]] = wrapped
        else:
            setattr(parent, path[-1], wrapped)
    cast_base(model, spec.base_dtype)
    return picked


def cast_base(model, dtype: str) -> None:
    """Store the frozen base weights (every floating ``nnx.Param`` that is not an adapter) in ``dtype``, in place.
    The adapters keep their dtype (float32 master weights, as their AdamW moments). bfloat16 halves the base's
    memory, as a PEFT model loaded in bfloat16 does; every layer computes in its compute dtype (``model.dtype``),
    so a float32 compute upcasts the rounded weights, and the trained adapters fit the rounded base."""
    target = jnp.dtype(dtype)
    frozen = nnx.state(model, nnx.All(nnx.Param, nnx.Not(TRAINABLE)))
    cast = lambda x: x.astype(target) if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != target else x  # noqa
    nnx.update(model, jax.tree.map(cast, frozen))


def adapters(model) -> dict[str, LoRALinear]:
    """Dotted path -> LoRALinear of every adapted layer."""
    return {_dotted(p): n for p, n in nnx.iter_graph(model) if isinstance(n, LoRALinear)}


def count(model) -> tuple[int, int]:
    """(adapter parameters, base parameters) of a model with adapters."""
    _, lora_state, base = nnx.split(model, TRAINABLE, nnx.Param)
    size = lambda s: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(s))  # noqa: E731
    return size(lora_state), size(base)


def delta(layer: LoRALinear) -> np.ndarray:
    """scale * A B [..., in, out] in float32 (numpy): what merging adds to the base kernel."""
    a = np.asarray(jax.device_get(layer.lora_a[...]), np.float32)
    b = np.asarray(jax.device_get(layer.lora_b[...]), np.float32)
    return np.float32(layer.scale) * np.matmul(a, b)


def merged(model):
    """The plain model (no adapters, same architecture) with every adapted kernel W0 + scale * A B, computed in
    float32 and stored in the model's parameter dtype (the export ``merged``)."""
    from jaxembed import mote

    backbone, rewrap = mote.split_model(model)
    layers = {tuple(p): n for p, n in nnx.iter_graph(backbone) if isinstance(n, LoRALinear)}
    _, params = nnx.split(backbone, nnx.Param)
    out = {}
    for path, var in nnx.to_flat_state(params):
        path = tuple(path)
        if isinstance(var, TRAINABLE):
            continue
        if len(path) >= 2 and path[-2] == "base" and path[:-2] in layers:
            layer = layers[path[:-2]]
            value = np.asarray(jax.device_get(var[...]), np.float32)
            if path[-1] == "kernel":
                value = value + delta(layer)
            out[path[:-2] + path[-1:]] = value
        else:
            out[path] = var[...]
    return rewrap(models.model_from_params(backbone.config, out))


# ------------------------------------------------------------------------------------------- base weights


def base_fingerprint(model) -> str:
    """A digest of the frozen base weights (every ``nnx.Param`` that is not an adapter: path, dtype, shape, bytes)."""
    h = hashlib.sha256()
    _, _, base, _ = nnx.split(model, TRAINABLE, nnx.Param, ...)
    for path, var in nnx.to_flat_state(base):
        a = np.ascontiguousarray(np.asarray(jax.device_get(var[...])))
        h.update(f"{_dotted(path)}|{a.dtype}|{a.shape}|".encode())
        h.update(a.reshape(-1).view(np.uint8))  # the raw bytes (bfloat16 has no buffer-protocol format)
    return h.hexdigest()[:32]


def check_base(rd: RunDir, fingerprint: str, source: str) -> None:
    """``<workdir>/lora_base.json``: written by the run's first start; on a later start (a resume, an export from
    the workdir) the base weights must be the ones the adapters were trained on. A checkpoint holds the adapters
    only, so other base weights would silently give another model: a UserError."""
    from jaxembed.runs import atomic_files

    path = rd.lora_base_json
    if path.exists():
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            old = {}
        has_ckpt = any(p.name.isdigit() for p in rd.checkpoints.glob("*"))
        if old.get("fingerprint") != fingerprint and has_ckpt:
            raise UserError(f"{path}: the base model's weights changed since the run started (fingerprint "
                            f"{old.get('fingerprint')} of {old.get('source')!r}, now {fingerprint} of {source!r}); "
                            "the checkpoints hold the LoRA adapters only (fix: restore the base model folder the run "
                            "started from, or use a new --workdir)")
        if old.get("fingerprint") == fingerprint:
            return
    atomic_files.write_json(path, {"fingerprint": fingerprint, "source": str(source)})


# ---------------------------------------------------------------------------------------- PEFT's layout


def _hf_modules(backbone_config) -> dict[tuple, str]:
    """Flax module path (of the dense backbone, e.g. ('layers', 0, 'attention', 'q_proj')) -> Hugging Face module
    name (``layers.0.self_attn.q_proj``), from the architecture's mapping table."""
    from jaxembed.models import mapping

    cfg = dataclasses.replace(backbone_config, mote=None)
    out = {}
    for hf_key, path, transform in mapping.expand(models.spec_for(cfg.model_type).rules(cfg), cfg.num_layers):
        if transform == "transpose" and path[-1] == "kernel" and hf_key.endswith(".weight"):
            out[path[:-1]] = hf_key[: -len(".weight")]
    return out


def target_modules(picked: list[str], every: list[str]) -> list[str]:
    """PEFT's ``target_modules`` for the Hugging Face modules ``picked`` among ``every`` linear module of the
    model: the shortest common name suffixes (2 parts or more, not starting at a layer number, e.g.
    ``self_attn.q_proj``) that select exactly ``picked`` under PEFT's rule (a module name equal to, or ending in
    '.' + an entry), else the full names."""
    want = set(picked)
    depth = max(len(n.split(".")) for n in picked)
    for k in range(2, depth + 1):
        names = sorted({".".join(n.split(".")[-k:]) for n in picked})
        if any(t.split(".")[0].isdigit() for t in names):
            continue
        got = {m for m in every if any(m == t or m.endswith("." + t) for t in names)}
        if got == want:
            return names
    return sorted(want)


def peft_tensors(model, expert: int | None = None) -> tuple[dict[str, np.ndarray], list[str], list[str]]:
    """(adapter_model.safetensors tensors, the Hugging Face modules adapted, every Hugging Face linear module) of a
    model with adapters. PEFT keys: ``base_model.model.<module>.lora_A.weight`` [r, in] and ``lora_B.weight``
    [out, r]. A MoTE model: the adapters of expert index ``expert`` in the expert layers (the rest shared)."""
    from jaxembed import mote

    backbone, _ = mote.split_model(model)
    cfg = backbone.config
    names = _hf_modules(cfg)
    tensors, picked = {}, []
    for path, layer in ((tuple(p), n) for p, n in nnx.iter_graph(backbone) if isinstance(n, LoRALinear)):
        a = np.asarray(jax.device_get(layer.lora_a[...]), np.float32)
        b = np.asarray(jax.device_get(layer.lora_b[...]), np.float32)
        if mote.is_expert_path(path):
            if expert is None:
                raise UserError("a MoTE model's adapters are per expert: give the expert")
            a, b = a[expert], b[expert]
            path = mote.dense_path(path)
        name = names.get(path)
        if name is None:
            raise UserError(f"LoRA layer {_dotted(path)} has no Hugging Face module in the {cfg.model_type} mapping "
                            "table (fix: target the backbone's transformer layers only)")
        tensors[f"base_model.model.{name}.lora_A.weight"] = np.ascontiguousarray(a.T)
        tensors[f"base_model.model.{name}.lora_B.weight"] = np.ascontiguousarray(b.T)
        picked.append(name)
    # Hugging Face linear modules that transformers' model has and ours not (never targets; kept out of the short
    # target names so that PEFT does not pick them)
    every = sorted(set(names.values()) | set(models.spec_for(cfg.model_type).hf_extra_linear))
    return tensors, picked, every


def peft_config(spec: LoRASpec, picked: list[str], every: list[str], base: str) -> dict:
    """adapter_config.json (PEFT's LoraConfig fields)."""
    alpha = int(spec.alpha) if float(spec.alpha).is_integer() else float(spec.alpha)
    return {"peft_type": "LORA", "task_type": "FEATURE_EXTRACTION", "base_model_name_or_path": str(base),
            "r": int(spec.rank), "lora_alpha": alpha, "lora_dropout": float(spec.dropout),
            "target_modules": target_modules(picked, every), "bias": "none", "fan_in_fan_out": False,
            "use_rslora": False, "use_dora": False, "init_lora_weights": True, "inference_mode": True,
            "modules_to_save": None, "layers_to_transform": None, "layers_pattern": None, "revision": None}


def experts_share_base(model) -> bool:
    """MoTE: whether every expert's base (frozen) weights are the same, i.e. the experts differ by their adapters
    only, so each expert is the dense base model plus that expert's adapter."""
    from jaxembed import mote

    backbone, _ = mote.split_model(model)
    _, _, base, _ = nnx.split(backbone, TRAINABLE, nnx.Param, ...)
    for path, var in nnx.to_flat_state(base):
        if mote.is_expert_path(tuple(path)):
            a = np.asarray(jax.device_get(var[...]))
            if not all(np.array_equal(a[0], a[e]) for e in range(1, a.shape[0])):
                return False
    return True


def host_base(model) -> Any:
    """The model's non-adapter state (base weights and the rest) as host arrays, split off like the trainer's."""
    _, _, rest = nnx.split(model, TRAINABLE, ...)
    return jax.device_get(rest)
