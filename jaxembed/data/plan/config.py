"""The plan config: its defaults (``default_plan_config``), the allowed values, and the checks that name the bad
field and the fix (``validate_plan_config``, ``validate_data_defaults``); the merge of a given config onto the
defaults."""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from jaxembed.errors import UserError

STRATEGIES = ("random", "homogeneous", "heterogeneous", "semi_homogeneous")
SAMPLING = ("size", "weights", "temperature")
INSTANCE_ORDERS = ("e2d", "d2e", "random", "given")
MASK_DIRECTIONS = ("text", "printed")
NEGATIVES = ("first", "sample")
CURRICULUM_UNITS = ("dataset", "task")
WALKS = ("cyclic", "balanced")


def default_plan_config():
    """The plan config (an ``ml_collections.ConfigDict``). Fields:

    global_batch_size  queries per step over all hosts (G)
    steps              > 0: step mode (sample this many steps); 0: epoch mode (steps follow from the epochs)
    epochs             epoch mode: multiplies every dataset's ``epochs``
    sampling           'size' | 'weights' | 'temperature'; None: the data config's (else 'size')
    sampling_temperature  T of p ~ q^(1/T) (q = size proportions); None: the data config's
    strategy           one strategy for every task; None: each task's datasets' ``batching``
    task_strategies    {task name: strategy}, overrides both
    semi_homogeneous_proportion  share of each semi-homogeneous batch that is shuffled across batches, in [0, 1]
    drop_remainder     epoch mode: drop each unit's incomplete last batch (True) or fill it from its next pass
    negatives          'first' (the first num_negatives of ``neg``) | 'sample' (a seeded sample of them)
    seed               None: the data config's seed (else 0)
    scores             per-example scores file (.npz / .json / .npy), needed by the curriculum and the mask
    mask.delta         Data-CUBE Eq. 9 threshold; None = off (all weights 1)
    mask.direction     'text': alpha = 0 where phi < delta (the paper's text); 'printed': alpha = 0 where
                       phi >= delta (Eq. 9 as printed)
    curriculum.enabled       build a Data-CUBE curriculum plan instead of a sampled one
    curriculum.unit          'dataset' (default; Data-CUBE's task = a MEDI dataset) | 'task' (the data
                             config's tasks, their datasets pooled): what the task order orders
    curriculum.walk          'cyclic' (Algorithm 1, default) | 'balanced' (jaxembed: every unit visited in
                             proportion to its size, all units ending together; see ``walk_order``)
    curriculum.task_order    .json (list of names) / .npy (names or indices) / .txt (one name a line)
    curriculum.instance_order  'e2d' (phi descending) | 'd2e' | 'random' | 'given' (from instance_orders)
    curriculum.instance_orders .json {unit: [[dataset, index], ...]} / .npz {unit: int64 [n, 2]}
    """
    import ml_collections as mc
    from ml_collections import config_dict

    c = mc.ConfigDict()
    c.global_batch_size = 64
    c.steps = 0
    c.epochs = 1.0
    c.sampling = config_dict.placeholder(str)
    c.sampling_temperature = config_dict.placeholder(float)
    c.strategy = config_dict.placeholder(str)
    c.task_strategies = mc.ConfigDict()
    c.semi_homogeneous_proportion = 0.25
    c.drop_remainder = True
    c.negatives = "first"
    c.seed = config_dict.placeholder(int)
    c.scores = ""
    c.mask = mc.ConfigDict({"delta": config_dict.placeholder(float), "direction": "text"})
    c.curriculum = mc.ConfigDict({"enabled": False, "unit": "dataset", "walk": "cyclic", "task_order": "",
                                  "instance_order": "e2d", "instance_orders": ""})
    return c


def config_error(key: str, msg: str, fix: str) -> UserError:
    return UserError(f"plan config '{key}': {msg} (fix: {fix})")


def _get(cfg, key, default=None):
    try:
        v = cfg[key]
    except (KeyError, AttributeError, TypeError):
        return default
    return default if v is None else v


def validate_plan_config(cfg) -> None:
    """Raise UserError naming the field and the fix for any bad value. Accepts a ConfigDict or a plain dict."""
    g = _get(cfg, "global_batch_size")
    if not isinstance(g, (int, np.integer)) or isinstance(g, bool) or g <= 0:
        raise config_error("global_batch_size", f"must be a positive integer, got {g!r}", "e.g. global_batch_size=64")
    s = _get(cfg, "steps", 0)
    if not isinstance(s, (int, np.integer)) or isinstance(s, bool) or s < 0:
        raise config_error("steps", f"must be an integer >= 0, got {s!r}", "0 = epoch mode, > 0 = step mode")
    e = _get(cfg, "epochs", 1.0)
    if not isinstance(e, (int, float)) or isinstance(e, bool) or not math.isfinite(e) or e <= 0:
        raise config_error("epochs", f"must be a positive number, got {e!r}", "e.g. epochs=1")
    smp = _get(cfg, "sampling")
    if smp is not None and smp not in SAMPLING:
        raise config_error("sampling", f"unknown value {smp!r}", f"one of {', '.join(SAMPLING)}")
    t = _get(cfg, "sampling_temperature")
    if t is not None and (not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0):
        raise config_error("sampling_temperature", f"must be a positive number, got {t!r}", "e.g. 2.0")
    st = _get(cfg, "strategy")
    if st is not None and st not in STRATEGIES:
        raise config_error("strategy", f"unknown strategy {st!r}", f"one of {', '.join(STRATEGIES)}")
    ts = _get(cfg, "task_strategies", {}) or {}
    for task, v in dict(ts).items():
        if v not in STRATEGIES:
            raise config_error(f"task_strategies.{task}", f"unknown strategy {v!r}", f"one of {', '.join(STRATEGIES)}")
    p = _get(cfg, "semi_homogeneous_proportion", 0.25)
    if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p <= 1.0:
        raise config_error("semi_homogeneous_proportion", f"must be in [0, 1], got {p!r}", "e.g. 0.25")
    if not isinstance(_get(cfg, "drop_remainder", True), bool):
        raise config_error("drop_remainder", "must be true or false", "drop_remainder=True")
    neg = _get(cfg, "negatives", "first")
    if neg not in NEGATIVES:
        raise config_error("negatives", f"unknown value {neg!r}", f"one of {', '.join(NEGATIVES)}")
    seed = _get(cfg, "seed")
    if seed is not None and (not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0):
        raise config_error("seed", f"must be an integer >= 0, got {seed!r}", "e.g. seed=0")
    mask = _get(cfg, "mask", {}) or {}
    delta = _get(mask, "delta")
    if delta is not None and (not isinstance(delta, (int, float)) or not math.isfinite(delta)):
        raise config_error("mask.delta", f"must be a number or None, got {delta!r}",
                           "e.g. mask.delta=0.0, or None = off")
    if _get(mask, "direction", "text") not in MASK_DIRECTIONS:
        raise config_error("mask.direction", f"unknown value {_get(mask, 'direction')!r}", "'text' or 'printed'")
    if delta is not None and not _get(cfg, "scores"):
        raise config_error("mask.delta", "the mask needs per-example scores", "set scores=<file> or mask.delta=None")
    cur = _get(cfg, "curriculum", {}) or {}
    if _get(cur, "enabled", False):
        if _get(cur, "unit", "dataset") not in CURRICULUM_UNITS:
            raise config_error("curriculum.unit", f"unknown value {_get(cur, 'unit')!r}", "'dataset' or 'task'")
        if _get(cur, "walk", "cyclic") not in WALKS:
            raise config_error("curriculum.walk", f"unknown value {_get(cur, 'walk')!r}",
                       "'cyclic' (Algorithm 1) or 'balanced'")
        io = _get(cur, "instance_order", "e2d")
        if io not in INSTANCE_ORDERS:
            raise config_error("curriculum.instance_order", f"unknown value {io!r}",
                               f"one of {', '.join(INSTANCE_ORDERS)}")
        if io == "given" and not _get(cur, "instance_orders"):
            raise config_error("curriculum.instance_orders", "instance_order='given' needs an orders file",
                       "set curriculum.instance_orders=<file> or another instance_order")
        if io in ("e2d", "d2e") and not _get(cfg, "scores"):
            raise config_error("scores", f"curriculum.instance_order={io!r} sorts instances by their scores",
                       "set scores=<file> (Data-CUBE phi per example) or instance_order='random'")
        if not _get(cur, "task_order"):
            raise config_error("curriculum.task_order", "the curriculum needs a task order",
                       "set curriculum.task_order=<.json/.npy/.txt file> from the task-order step")
        if _get(cfg, "strategy") is not None or dict(_get(cfg, "task_strategies", {}) or {}):
            raise config_error("strategy", "a curriculum plan has one task per batch; strategy overrides do not apply",
                       "unset strategy / task_strategies, or disable the curriculum")


def validate_data_defaults(dc: Mapping, where: str) -> None:
    """The sampling, sampling_temperature and seed a plan takes from the data config (or the store's manifest,
    ``where`` says which) when its own config leaves them None: UserError naming the value and the fix."""
    fix = "set it in the data config and prepare the store again, or set it in the plan config"
    smp = dc.get("sampling")
    if smp is not None and smp not in SAMPLING:
        raise UserError(f"{where}: sampling {smp!r} is not one of {', '.join(SAMPLING)} (fix: {fix})")
    t = dc.get("sampling_temperature")
    if t is not None and (not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t <= 0):
        raise UserError(f"{where}: sampling_temperature {t!r} must be a number > 0 (fix: {fix})")
    seed = dc.get("seed")
    if seed is not None and (not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0):
        raise UserError(f"{where}: seed {seed!r} must be an integer >= 0 (fix: {fix})")


def as_plain_dict(cfg) -> dict:
    if cfg is None:
        return {}
    if hasattr(cfg, "to_dict"):
        return cfg.to_dict()
    return {k: (as_plain_dict(v) if isinstance(v, Mapping) else v) for k, v in dict(cfg).items()}


def merged_config(cfg) -> dict:
    """Defaults + given fields, as a plain dict (unknown keys are an error)."""
    base = default_plan_config().to_dict()
    given = as_plain_dict(cfg)

    def merge(b, g, prefix):
        for k, v in g.items():
            if k not in b:
                raise config_error(prefix + k, "unknown field", f"known fields: {', '.join(sorted(b))}")
            if isinstance(b[k], dict) and k != "task_strategies":
                if not isinstance(v, Mapping):
                    raise config_error(prefix + k, f"expected a mapping, got {v!r}", "see default_plan_config()")
                merge(b[k], dict(v), prefix + k + ".")
            else:
                b[k] = dict(v) if isinstance(v, Mapping) else v
        return b

    return merge(base, given, "")
