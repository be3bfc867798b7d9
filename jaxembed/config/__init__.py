"""The run config: typed defaults for every section, and ``validate(config)``, which checks every value before any
work starts. A bad value raises a UserError naming the key, the value and the allowed values.

A config file is a Python file with ``get_config(arg=None) -> ConfigDict`` (big_vision style: ``file.py:tiny``
passes ``"tiny"``). It starts from ``default_config()`` and changes what its recipe needs. Command-line overrides
``--config.a.b=VALUE`` are applied on top. The resolved config is written to the run directory. Loading the files,
the overrides and config.json are ``jaxembed.config.io`` (re-exported here).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import ml_collections as mc
from ml_collections import config_dict

from jaxembed.choices import ATTENTION_KERNELS, POOLING_MODES, TRAIN_DTYPES
from jaxembed.config import io as config_io
from jaxembed.config.io import (apply_overrides, override_error, to_json, to_plain,  # noqa: F401 (re-exported)
                                write_resolved)
from jaxembed.data.config import CONTRASTIVE_LOSSES, LOSSES, SCORED_LOSSES  # noqa: F401 (re-exported)
from jaxembed.errors import UserError
from jaxembed.runs.rundir import RunDir
from jaxembed.losses import table as loss_table
from jaxembed.losses.parts import contrastive as contrastive_part, distill as distill_part, gist as gist_part
from jaxembed.packing import PackingSettings


DISTILL = distill_part.KINDS  # the loss section's own choices, declared with their settings (jaxembed/losses/parts/)
GIST_MARGIN_STRATEGIES = gist_part.MARGIN_STRATEGIES
LOSS_IMPLS = contrastive_part.IMPLS
PARAM_SHARDINGS = ("replicate", "fsdp", "fsdp_tp")
DTYPES = TRAIN_DTYPES


def default_config() -> mc.ConfigDict:
    """Every field of a run, with its default. Sections: model, data, plan, loss, optim, train, eval, export."""
    from jaxembed.data.config import default_data_config
    from jaxembed.data.plan import default_plan_config

    c = mc.ConfigDict()
    c.model = mc.ConfigDict(dict(
        name="",                # model folder or Hugging Face hub id (HF / sentence-transformers / jaxembed export)
        dtype="float32",        # computation dtype; 'bfloat16' = mixed precision (params stay param_dtype)
        param_dtype="float32",  # master parameters
        remat=False,            # rematerialise every layer in the backward pass
        remat_policy="nothing",  # what a rematerialised layer keeps: nothing | dots | dots_no_batch (models/layers.py)
        attention="auto",       # choices.ATTENTION_KERNELS: auto picks per platform (jaxembed/models/attention.py)
        pooling="",             # '' keeps the folder's pooling
        causal=config_dict.placeholder(bool),  # decoder backbones: False = bidirectional attention
        max_length=0,           # tokens: 0 keeps the model's max_seq_length, else 2 .. the position table; caps
                                # every dataset's limits; the export's max_seq_length (docs/training.md)
        init_from="",           # start from a previous stage: a run's workdir (its export/, else its latest
                                # checkpoint) or a model folder; '' = model.name. Chains stages (KaLM 1 -> 2).
    ))
    from jaxembed.lora import LoRASpec
    from jaxembed.mote.settings import MoTESettings

    # training features declare their sections beside their code: MoTE task experts (jaxembed/mote/settings.py,
    # docs/mote.md) and LoRA adapters (jaxembed/lora.py, docs/lora.md; the base stays frozen)
    c.model.mote = MoTESettings.section()
    c.model.lora = LoRASpec.section()
    c.data = default_data_config()
    c.data.store = ""           # an existing store (jaxembed data prepare); '' = prepare into <workdir>/store
    c.data.packing = PackingSettings().enabled  # pack several texts per row; False = pad one (jaxembed/packing.py)
    c.plan = default_plan_config()
    # loss.type: 'infonce' | 'peg' | 'cosent' | 'angle' (a dataset's `loss` overrides it for its rows,
    # docs/losses.md); loss.temperature: the default tau (a dataset's `temperature` overrides it); then the settings
    # each loss and loss-side feature declares beside its code (jaxembed/losses/parts/, in jaxembed/losses/table.py)
    c.loss = mc.ConfigDict(loss_table.section_defaults())
    c.optim = mc.ConfigDict(dict(
        lr=2e-5, schedule="linear", warmup_steps=-1, warmup_ratio=0.1, end_factor=0.0,
        weight_decay=0.01, b1=0.9, b2=0.999, eps=1e-8, grad_clip=1.0,
        freeze=(),              # regexes of parameter paths that are not trained, e.g. ('backbone.embeddings',)
    ))
    from jaxembed.train.gradcache import GradCacheSettings

    c.train = mc.ConfigDict(dict(
        seed=0,
        **GradCacheSettings.defaults(),  # gradcache_chunk: > 0 encodes in sub-batches of this many rows; 0 = off
        dropout=True,           # use the model's dropout while training
        log_every=10,
        checkpoint_every=100,   # steps; 0 = only at the end
        checkpoint_minutes=0.0,  # also save every N minutes (0 = off)
        keep_checkpoints=2,
        async_checkpoints=True,
        compile_cache=True,     # keep compiled programs in WORKDIR/jax_cache: a resumed run does not compile again
        max_nonfinite=5,        # stop after this many non-finite steps in a row
        mesh_data=-1, mesh_fsdp=1,
        param_sharding="replicate",
        loader_workers=0,
        length_buckets="pow2",  # 'pow2': pad to 16/32/64/...; 'fine': x1.5 steps (less padding, more compiles)
        progress=config_dict.placeholder(bool),  # progress bar (default: on a terminal)
        inject_nonfinite_steps=(),  # testing aid: steps whose loss and gradients are made NaN (the skip guard runs)
    ))
    c.train.wandb = mc.ConfigDict(dict(  # Weights & Biases, beside metrics.jsonl / TensorBoard (jaxembed/runs/monitor.py)
        enabled=False,          # needs the extra: pip install 'jaxembed[wandb]'
        project="jaxembed",
        entity="",              # '' = your default entity
        mode="online",          # online | offline (sync later: wandb sync) | disabled; WANDB_MODE overrides it
        name="",                # '' = the workdir's name
        tags=(),
    ))
    c.eval = mc.ConfigDict(dict(
        every=0,                # steps between dev evaluations (0 = at the end only, when tasks are given)
        tasks=(),               # dev task names (jaxembed.evaluate), e.g. ('STSBenchmark-dev',), your own sets
                                # dict(name=, type=, path=) and 'mteb:NAME' (jaxembed/evaluate/user_tasks.py)
        max_examples=0,         # subsample each dev set for a fast signal (0 = all)
        best_metric="",         # e.g. 'STSBenchmark-dev/main_score': keep the best checkpoint by it
        best_mode="max",
        before=False,           # also evaluate before training (step 0)
    ))
    c.export = mc.ConfigDict(dict(at_end=True, dir=""))  # '' = <workdir>/export
    c.export.step = "last"      # the step the run's export holds: 'last', or 'best' by eval.best_metric
    c.export.base_model = ""    # the model card's base_model (a hub id); '' = model.name when it is one
    return c


def data_section(c: mc.ConfigDict) -> mc.ConfigDict:
    """The data config proper (``config.data`` without the run-level ``store`` and ``packing`` keys)."""
    d = c.data.copy_and_resolve_references()
    for run_key in ("store", "packing"):
        if run_key in d:
            with d.unlocked():
                del d[run_key]
    if "loss" in c and c.loss.type in SCORED_LOSSES:  # a scored-pair run decides what the store keeps: every pair
        for ds in d.datasets:
            if ds.get("loss") is None:
                ds.loss = c.loss.type
    return d


def load_data_config(spec: str):
    """(data config, where) for the ``--config`` of ``jaxembed data prepare``: ``shared`` (every file of the shared
    training data), or a config file's ``data`` section (or the data config itself when the file returns one)."""
    from jaxembed.data.shared_train import shared_train_config

    if spec == "shared":
        from jaxembed import paths

        d = paths.shared_data_dir()
        if not (d / "train").is_dir():
            raise UserError(f"--config shared: {d / 'train'} does not exist (fix: set JAXEMBED_DATA to the shared "
                            "data folder)")
        return shared_train_config(d), "shared: data"
    cfg = load_config_file(spec, also=", or 'shared'")
    keys = set(cfg.keys()) if hasattr(cfg, "keys") else set()
    if "data" in keys:
        return data_section(cfg), f"{spec}: data"  # a run config: its data section without the run's 'store' key
    if "datasets" in keys:
        return cfg, f"{spec}: data"
    raise UserError(f"{spec}: get_config() returned no 'data' field (fix: add config.data = a data config, see "
                    "jaxembed.data.config.default_data_config)")


def packing_enabled(c: mc.ConfigDict) -> bool:
    """``data.packing`` (True when a config file replaced ``config.data`` without it)."""
    return PackingSettings.from_config(c.data).enabled


def _err(key: str, value: Any, allowed: str) -> UserError:
    return UserError(f"config.{key} = {value!r} is not valid: {allowed}")


def _choice(c, key, allowed):
    v = _get(c, key)
    if v not in allowed:
        raise _err(key, v, f"allowed: {', '.join(map(str, allowed))}")


def _get(c, key):
    cur = c
    for part in key.split("."):
        cur = cur[part]
    return cur


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _in_range(c, key, low, high, low_open=False, high_open=False):
    """A finite number in [low, high] (open ends as given)."""
    v = _get(c, key)
    ok = _number(v) and (v > low if low_open else v >= low) and (v < high if high_open else v <= high)
    if not ok:
        raise _err(key, v, f"a number in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}")


def _integer(c, key, low, extra=()):
    """An integer >= low (or one of ``extra``)."""
    v = _get(c, key)
    ok = isinstance(v, int) and not isinstance(v, bool) and (v >= low or v in extra)
    if not ok:
        more = f" (or {', '.join(map(str, extra))})" if extra else ""
        raise _err(key, v, f"an integer >= {low}{more}")


def _positive(c, key, allow_zero=False, integer=False):
    v = _get(c, key)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (
        v >= 0 if allow_zero else v > 0)
    if integer:
        ok = ok and float(v).is_integer()
    if not ok:
        raise _err(key, v, f"a {'non-negative' if allow_zero else 'positive'} {'integer' if integer else 'number'}")


def validate(c: mc.ConfigDict) -> None:
    """Check every value of a run config; raise UserError at the first problem (naming key and allowed values)."""
    from jaxembed.data.config import validate_data_config
    from jaxembed.data.plan import validate_plan_config

    for section in ("model", "data", "plan", "loss", "optim", "train", "eval", "export"):
        if section not in c:
            raise UserError(f"config.{section} is missing (fix: start from jaxembed.config.default_config())")
    if not c.model.name:
        raise _err("model.name", c.model.name, "a model folder or Hugging Face hub id")
    if c.model.get("init_from"):
        src = Path(os.path.expanduser(str(c.model.init_from)))
        if not src.is_dir():
            raise UserError(f"config.model.init_from = {str(c.model.init_from)!r}: no such folder (fix: the "
                            "workdir of the previous stage (train it first) or a model folder; '' = start from "
                            "model.name)")
        if not RunDir(src).is_run():  # a run: checkpoints/, export/ or its config.json; a model folder: config.json
            raise UserError(f"config.model.init_from = {str(c.model.init_from)!r}: neither a jaxembed run (no "
                            "checkpoints/ or export/) nor a model folder (no config.json) (fix: point it at the "
                            "previous stage's workdir or at an exported model)")
    _choice(c, "model.dtype", DTYPES)
    _choice(c, "model.param_dtype", DTYPES)
    if "attention" in c.model:
        _choice(c, "model.attention", ATTENTION_KERNELS)
    if "remat_policy" in c.model:
        from jaxembed.models.layers import REMAT_POLICIES

        _choice(c, "model.remat_policy", tuple(REMAT_POLICIES))
    if c.model.param_dtype == "bfloat16":  # every recipe trains with AdamW (optim.py)
        raise UserError("config.model.param_dtype = 'bfloat16' is refused: AdamW updates smaller than about 1/512 "
                        "to 1/256 of a weight round away in bfloat16 master weights (at lr 2e-5 most weights would "
                        "never move) (fix: keep model.param_dtype='float32' and set model.dtype='bfloat16' for mixed "
                        "precision)")
    if c.model.pooling:
        _choice(c, "model.pooling", POOLING_MODES)
    ml = c.model.max_length
    if not (isinstance(ml, int) and not isinstance(ml, bool) and ml == 0):  # 0: the model folder's max_seq_length
        from jaxembed.loading import check_max_length

        check_max_length(ml, "config.model.max_length", None, "")  # the position table: _check_lengths
    PackingSettings.check(c.data)
    if not c.data.store:
        validate_data_config(data_section(c), where="config.data")  # incl. one task type per task (MoTE routing)
    elif not (Path(c.data.store) / "manifest.json").exists():
        raise _err("data.store", c.data.store, "a folder written by `jaxembed data prepare` (manifest.json missing)")
    else:
        _check_store_task_types(c.data.store)
    from jaxembed.config.lengths import check_lengths

    check_lengths(c)
    if "mote" in c.model and c.model.mote.enabled:
        from jaxembed import mote

        types = [] if c.data.store else [(d.name, d.task_type) for d in c.data.datasets]
        mote.validate_config(c.model.mote, types)
    if "lora" in c.model and c.model.lora.enabled:
        from jaxembed import lora

        lora.validate_config(c.model.lora, bool(c.train.dropout))
    validate_plan_config(c.plan)
    loss_table.check_section(c.loss)  # loss.type, loss.temperature and each loss's and feature's settings
    from jaxembed.data.loss_checks import check_dataset_losses

    check_dataset_losses(c)  # each dataset's loss: its data (scores, teacher scores) and the run's settings
    from jaxembed.config.scale import check_logit_scales  # after the loss checks: loss.scored_scale > 0

    check_logit_scales(c)
    _positive(c, "optim.lr")
    _choice(c, "optim.schedule", ("linear", "cosine", "constant"))
    if not _number(c.optim.warmup_ratio) or not 0 <= c.optim.warmup_ratio <= 1:
        raise _err("optim.warmup_ratio", c.optim.warmup_ratio, "a fraction in [0, 1]")
    _integer(c, "optim.warmup_steps", 0, extra=(-1,))  # -1: warmup_ratio of the steps
    _in_range(c, "optim.end_factor", 0, 1)
    _in_range(c, "optim.b1", 0, 1, high_open=True)
    _in_range(c, "optim.b2", 0, 1, high_open=True)
    _positive(c, "optim.eps")
    _positive(c, "optim.weight_decay", allow_zero=True)
    _positive(c, "optim.grad_clip", allow_zero=True)
    for i, pat in enumerate(c.optim.freeze):
        try:
            import re

            re.compile(pat)
        except (re.error, TypeError) as e:
            raise _err(f"optim.freeze[{i}]", pat, f"a regular expression ({e})") from None
    for key in ("train.log_every",):
        _positive(c, key, integer=True)
    from jaxembed.train.gradcache import GradCacheSettings

    GradCacheSettings.check(c.train, c.plan.global_batch_size)  # a non-negative divisor of the global batch
    for key in ("train.checkpoint_every", "train.loader_workers", "train.max_nonfinite", "eval.every",
                "eval.max_examples"):
        _positive(c, key, allow_zero=True, integer=True)
    _positive(c, "train.keep_checkpoints", integer=True)
    _integer(c, "train.seed", 0)
    _integer(c, "train.mesh_data", 1, extra=(-1,))  # -1: the devices left by the other axes
    _integer(c, "train.mesh_fsdp", 1, extra=(-1,))
    _positive(c, "train.checkpoint_minutes", allow_zero=True)
    _choice(c, "train.param_sharding", PARAM_SHARDINGS)
    _choice(c, "train.length_buckets", ("pow2", "fine"))
    _check_wandb(c)
    _check_base_model(c)
    _choice(c, "eval.best_mode", ("max", "min"))
    if c.eval.best_metric and "/" not in c.eval.best_metric:
        raise _err("eval.best_metric", c.eval.best_metric, "'TaskName/metric', e.g. 'STSBenchmark-dev/main_score'")
    if c.export.get("step", "last") not in ("last", "best"):
        raise _err("export.step", c.export.step, "'last' (the final step) or 'best' (the best dev step)")
    if c.export.get("step", "last") == "best" and not c.eval.best_metric:
        raise _err("export.step", "best", "set eval.best_metric (and eval.tasks) to say what is best, or 'last'")
    from jaxembed.evaluate.dev import validate_eval

    validate_eval(c.eval)  # task names, a user's own sets (their files), mteb:NAME; best_metric names one of them


WANDB_MODES = ("online", "offline", "disabled")


def _check_wandb(c) -> None:
    """train.wandb: its values, and the wandb package when it is enabled (before any work)."""
    if "wandb" not in c.train:
        return
    w = c.train.wandb
    if not isinstance(w.get("enabled"), bool):
        raise _err("train.wandb.enabled", w.get("enabled"), "True or False")
    _choice(c, "train.wandb.mode", WANDB_MODES)
    for key in ("project", "entity", "name"):
        if not isinstance(w.get(key), str):
            raise _err(f"train.wandb.{key}", w.get(key), "a string")
    if w.enabled and not w.project:
        raise _err("train.wandb.project", w.project, "a W&B project name, e.g. 'jaxembed'")
    tags = w.get("tags")
    if not isinstance(tags, (tuple, list)) or not all(isinstance(t, str) and t for t in tags):
        raise _err("train.wandb.tags", tags, "a tuple of non-empty strings, e.g. ('datacube', 'minilm')")
    if w.enabled and w.mode != "disabled":
        if importlib.util.find_spec("wandb") is None:
            raise UserError("config.train.wandb.enabled = True needs the wandb package (fix: pip install "
                            "'jaxembed[wandb]', or --config.train.wandb.enabled=False)")


def _check_base_model(c) -> None:
    base = c.export.get("base_model", "")
    if not isinstance(base, str) or (base and not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", base)):
        raise _err("export.base_model", base, "a hub id like 'sentence-transformers/all-MiniLM-L6-v2' (the model "
                                              "card's base_model), or '' (model.name when it is a hub id)")


def _check_store_task_types(store: str) -> None:
    """A store's datasets of one task share one task type (MoTE routes a task by its type)."""
    from jaxembed.data.config import check_task_types

    mf = Path(store) / "manifest.json"
    try:
        entries = json.loads(mf.read_text(encoding="utf-8")).get("datasets", [])
        check_task_types([(f"{mf}: datasets[{i}]", d["name"], d["task"], d["task_type"])
                          for i, d in enumerate(entries)])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        if isinstance(e, UserError):
            raise
        raise UserError(f"{mf}: unreadable manifest ({type(e).__name__}: {e}) (fix: prepare the store again)") from None


# ----------------------------------------------------------------------------------------- run directory
# (config files and overrides: jaxembed.config.io, re-exported above; a run's config.json as a config: below)


def load_config_file(spec: str, also: str = "") -> mc.ConfigDict:
    """The run config ``--config SPEC`` names: a Python config file or a recipe (``config_io.load_config_file``),
    or a run's ``config.json``, read as data (nothing in it runs; a key this version lacks is refused by name)."""
    path = config_io.json_config_path(spec, also)
    if path is None:
        return config_io.load_config_file(spec, also)
    return from_json(json.dumps(config_io.read_json_config(path)), where=str(path))


def from_json(text: str, where: str = "") -> mc.ConfigDict:
    """Rebuild a run config from the config.json of a run directory (defaults for any key it lacks). ``where``
    (the file, for ``--config FILE.json``): a key of a section this version does not have is a UserError naming
    it; without it (a run made by another version) such a key is passed over. Top-level keys beyond the
    sections (a recipe's own, e.g. ``curriculum_dir``) are kept."""
    from jaxembed.data.config import dataset_config

    d = json.loads(text)
    c = default_config()
    unknown: list[str] = []
    datasets = d.get("data", {}).pop("datasets", [])

    def merge(node: mc.ConfigDict, values: dict, prefix: str):
        for k, v in values.items():
            if k not in node:
                unknown.append(prefix + k)  # a key this version does not have (a run made by another version)
                continue
            if isinstance(node[k], mc.ConfigDict) and isinstance(v, dict):
                merge(node[k], v, f"{prefix}{k}.")
            elif isinstance(node[k], mc.ConfigDict):
                continue
            else:
                if isinstance(node[k], tuple) and isinstance(v, list):
                    v = tuple(v)
                with node.ignore_type():
                    node[k] = v

    routing = d.get("model", {}).get("mote", {}).pop("routing", None)
    merge(c, d, "")
    extra = [k for k in unknown if "." not in k]
    with c.unlocked():
        for k in extra:  # a recipe's own top-level key
            c[k] = mc.ConfigDict(d[k]) if isinstance(d[k], dict) else d[k]
    unknown = [k for k in unknown if "." in k]
    if where and unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(unknown)}: this version of jaxembed has no such key "
                        "(fix: remove them from the file, or run the jaxembed version that wrote it)")
    if routing is not None:  # a table: its keys are the run's own, not a fixed set
        c.model.mote.routing = mc.ConfigDict({k: tuple(v) for k, v in routing.items()})
    try:
        c.data.datasets = [dataset_config(**x) for x in datasets]
    except UserError as e:
        raise (UserError(f"{where}: data.datasets: {e}") if where else e) from None
    return c


