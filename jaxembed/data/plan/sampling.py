"""Batch plans: for every training step, the global batch as (dataset id, example id) pairs.

A plan is a pure function of (dataset infos, optional per-example scores / curriculum files, plan config, seed).
It is saved next to the run (``plan.npz`` + ``plan.json``); every host loads the same file, so 1 or N hosts see the
same global batches, and resuming needs only the step index.

Arrays (S = steps, G = global batch size)::

    dataset_ids  int32   [S, G]   index into ``dataset_names`` (store order)
    example_ids  int64   [S, G]   example index inside that dataset
    task_ids     int32   [S]      the batch's task (index into ``task_names``), -1 = mixed tasks
    weights      float32 [S, G]   per-example loss weight (Data-CUBE mask alpha, Eq. 9); 1.0 by default
    temperatures float32 [S]      the batch's task temperature; NaN = run default (mixed tasks or unset)

Strategies (per task; a task's strategy comes from its datasets' ``batching`` unless the plan config overrides it):

- ``random``: all datasets of all ``random`` tasks pooled and shuffled together (mixed batches).
- ``homogeneous``: one dataset per batch.
- ``heterogeneous``: one task per batch, drawn across that task's datasets.
- ``semi_homogeneous`` (KaLM Fig. 3): homogeneous batches, then ``semi_homogeneous_proportion`` of each batch's
  rows (the same positions count in every batch) are pulled out, shuffled across all semi-homogeneous batches
  and put back.
- curriculum (Data-CUBE Algorithm 1, lines 18-25; ``curriculum.enabled``): every unit's instances sorted by
  difficulty (a unit is a dataset by default -- the paper's task is a MEDI dataset -- or a task of the data config,
  ``curriculum.unit='task'``); walk the task order cyclically, each visit takes that unit's next batch, a unit
  that runs out is skipped; every batch holds one unit. ``curriculum.walk='balanced'`` (jaxembed's extension):
  the same cycles over the task order, but each unit is visited in a share of them proportional to its size,
  spread evenly, so that all units end together instead of the largest owning the end (``walk_order``).

Two modes:

- epoch mode (``steps = 0``): dataset d contributes ``epochs_d`` copies of each example (a fractional part takes
  a random subset): ``dataset.epochs * plan.epochs`` when the dataset sets ``epochs``; otherwise, with ``size``
  sampling, ``plan.epochs``, and with ``weights`` / ``temperature`` sampling, its share (p_d) of the budget of one
  pass over those datasets (x ``plan.epochs``), so small datasets are up-sampled and large ones down-sampled.
  The batches of every unit are spread evenly over the plan (batch j of a unit with n batches lands at a random
  point of [j/n, (j+1)/n) of the plan). Each unit's incomplete last batch is either dropped
  (``drop_remainder``; the dropped examples are stored in the plan and counted in the summary) or filled with
  examples of the unit's next pass (counted as ``filled``).
- step mode (``steps > 0``): each step draws a unit with probability p_u; each unit streams through successive
  shuffled passes of its examples (without replacement inside a pass). Nothing is dropped. With the curriculum,
  steps that cover less than one pass take about the same random fraction of every unit, ordered as the full
  pass (easy -> difficult in every task), so a short run sees the whole curriculum; more steps repeat passes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from jaxembed.errors import UserError

STRATEGIES = ("random", "homogeneous", "heterogeneous", "semi_homogeneous")
SAMPLING = ("size", "weights", "temperature")
INSTANCE_ORDERS = ("e2d", "d2e", "random", "given")
MASK_DIRECTIONS = ("text", "printed")
NEGATIVES = ("first", "sample")
CURRICULUM_UNITS = ("dataset", "task")
WALKS = ("cyclic", "balanced")
FORMAT = "jaxembed-plan"
VERSION = 1

# rng purposes: independent streams derived from (seed, purpose, ...)
_R_POOL, _R_ORDER, _R_STEPS, _R_SEMI, _R_FRAC, _R_FILL, _R_CURR, _R_SHORT = 11, 12, 13, 14, 15, 16, 17, 18


# --------------------------------------------------------------------------------------------------- config

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


def _bad(key: str, msg: str, fix: str) -> UserError:
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
        raise _bad("global_batch_size", f"must be a positive integer, got {g!r}", "e.g. global_batch_size=64")
    s = _get(cfg, "steps", 0)
    if not isinstance(s, (int, np.integer)) or isinstance(s, bool) or s < 0:
        raise _bad("steps", f"must be an integer >= 0, got {s!r}", "0 = epoch mode, > 0 = step mode")
    e = _get(cfg, "epochs", 1.0)
    if not isinstance(e, (int, float)) or isinstance(e, bool) or not math.isfinite(e) or e <= 0:
        raise _bad("epochs", f"must be a positive number, got {e!r}", "e.g. epochs=1")
    smp = _get(cfg, "sampling")
    if smp is not None and smp not in SAMPLING:
        raise _bad("sampling", f"unknown value {smp!r}", f"one of {', '.join(SAMPLING)}")
    t = _get(cfg, "sampling_temperature")
    if t is not None and (not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0):
        raise _bad("sampling_temperature", f"must be a positive number, got {t!r}", "e.g. 2.0")
    st = _get(cfg, "strategy")
    if st is not None and st not in STRATEGIES:
        raise _bad("strategy", f"unknown strategy {st!r}", f"one of {', '.join(STRATEGIES)}")
    ts = _get(cfg, "task_strategies", {}) or {}
    for task, v in dict(ts).items():
        if v not in STRATEGIES:
            raise _bad(f"task_strategies.{task}", f"unknown strategy {v!r}", f"one of {', '.join(STRATEGIES)}")
    p = _get(cfg, "semi_homogeneous_proportion", 0.25)
    if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p <= 1.0:
        raise _bad("semi_homogeneous_proportion", f"must be in [0, 1], got {p!r}", "e.g. 0.25")
    if not isinstance(_get(cfg, "drop_remainder", True), bool):
        raise _bad("drop_remainder", "must be true or false", "drop_remainder=True")
    neg = _get(cfg, "negatives", "first")
    if neg not in NEGATIVES:
        raise _bad("negatives", f"unknown value {neg!r}", f"one of {', '.join(NEGATIVES)}")
    seed = _get(cfg, "seed")
    if seed is not None and (not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0):
        raise _bad("seed", f"must be an integer >= 0, got {seed!r}", "e.g. seed=0")
    mask = _get(cfg, "mask", {}) or {}
    delta = _get(mask, "delta")
    if delta is not None and (not isinstance(delta, (int, float)) or not math.isfinite(delta)):
        raise _bad("mask.delta", f"must be a number or None, got {delta!r}", "e.g. mask.delta=0.0, or None = off")
    if _get(mask, "direction", "text") not in MASK_DIRECTIONS:
        raise _bad("mask.direction", f"unknown value {_get(mask, 'direction')!r}", "'text' or 'printed'")
    if delta is not None and not _get(cfg, "scores"):
        raise _bad("mask.delta", "the mask needs per-example scores", "set scores=<file> or mask.delta=None")
    cur = _get(cfg, "curriculum", {}) or {}
    if _get(cur, "enabled", False):
        if _get(cur, "unit", "dataset") not in CURRICULUM_UNITS:
            raise _bad("curriculum.unit", f"unknown value {_get(cur, 'unit')!r}", "'dataset' or 'task'")
        if _get(cur, "walk", "cyclic") not in WALKS:
            raise _bad("curriculum.walk", f"unknown value {_get(cur, 'walk')!r}",
                       "'cyclic' (Algorithm 1) or 'balanced'")
        io = _get(cur, "instance_order", "e2d")
        if io not in INSTANCE_ORDERS:
            raise _bad("curriculum.instance_order", f"unknown value {io!r}", f"one of {', '.join(INSTANCE_ORDERS)}")
        if io == "given" and not _get(cur, "instance_orders"):
            raise _bad("curriculum.instance_orders", "instance_order='given' needs an orders file",
                       "set curriculum.instance_orders=<file> or another instance_order")
        if io in ("e2d", "d2e") and not _get(cfg, "scores"):
            raise _bad("scores", f"curriculum.instance_order={io!r} sorts instances by their scores",
                       "set scores=<file> (Data-CUBE phi per example) or instance_order='random'")
        if not _get(cur, "task_order"):
            raise _bad("curriculum.task_order", "the curriculum needs a task order",
                       "set curriculum.task_order=<.json/.npy/.txt file> from the task-order step")
        if _get(cfg, "strategy") is not None or dict(_get(cfg, "task_strategies", {}) or {}):
            raise _bad("strategy", "a curriculum plan has one task per batch; strategy overrides do not apply",
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


def _config_dict(cfg) -> dict:
    if cfg is None:
        return {}
    if hasattr(cfg, "to_dict"):
        return cfg.to_dict()
    return {k: (_config_dict(v) if isinstance(v, Mapping) else v) for k, v in dict(cfg).items()}


def _merged_config(cfg) -> dict:
    """Defaults + given fields, as a plain dict (unknown keys are an error)."""
    base = default_plan_config().to_dict()
    given = _config_dict(cfg)

    def merge(b, g, prefix):
        for k, v in g.items():
            if k not in b:
                raise _bad(prefix + k, "unknown field", f"known fields: {', '.join(sorted(b))}")
            if isinstance(b[k], dict) and k != "task_strategies":
                if not isinstance(v, Mapping):
                    raise _bad(prefix + k, f"expected a mapping, got {v!r}", "see default_plan_config()")
                merge(b[k], dict(v), prefix + k + ".")
            else:
                b[k] = dict(v) if isinstance(v, Mapping) else v
        return b

    return merge(base, given, "")


# --------------------------------------------------------------------------------------------------- the plan

@dataclasses.dataclass(eq=False)
class Plan:
    """A batch plan (see the module docstring for the arrays). ``meta`` holds what the summary needs: mode,
    strategy per task, configured epochs, units, dropped / filled counts; ``dropped`` int64 [n, 2] lists the
    (dataset id, example id) pairs of dropped remainders; ``unit_ids`` int32 [S] says which unit (a dataset, a
    task, or the pool of the random tasks; ``meta["units"]``) each batch was built from."""

    dataset_ids: np.ndarray
    example_ids: np.ndarray
    task_ids: np.ndarray
    weights: np.ndarray
    temperatures: np.ndarray
    task_names: tuple[str, ...]
    dataset_names: tuple[str, ...]
    dataset_tasks: np.ndarray   # int32 [D]: task id of each dataset
    dataset_sizes: np.ndarray   # int64 [D]
    config: dict
    seed: int
    meta: dict
    dropped: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 2), np.int64))
    unit_ids: np.ndarray | None = None  # int32 [S]: the unit (meta["units"]) each batch was built from

    def __post_init__(self):
        if self.unit_ids is None:
            self.unit_ids = np.full(self.dataset_ids.shape[0], -1, np.int32)

    @property
    def steps(self) -> int:
        return int(self.dataset_ids.shape[0])

    @property
    def global_batch_size(self) -> int:
        return int(self.dataset_ids.shape[1])

    def __len__(self) -> int:
        return self.steps

    def row_task_ids(self) -> np.ndarray:
        """int32 [S, G]: the task of every row."""
        return self.dataset_tasks[self.dataset_ids]

    def step(self, i: int) -> dict[str, np.ndarray]:
        """The global batch of step i: dataset_ids [G], example_ids [G], weights [G], task_id, temperature."""
        if not 0 <= i < self.steps:
            raise UserError(f"step {i} is outside the plan (0..{self.steps - 1})")
        return {"dataset_ids": self.dataset_ids[i], "example_ids": self.example_ids[i], "weights": self.weights[i],
                "task_id": int(self.task_ids[i]), "temperature": float(self.temperatures[i])}

    def fingerprint(self) -> str:
        """sha256 (hex, 16 chars) of the arrays and the name tables: equal plans have equal fingerprints."""
        h = hashlib.sha256()
        for a in (self.dataset_ids, self.example_ids, self.task_ids, self.weights, self.temperatures,
                  self.dataset_tasks, self.dataset_sizes, self.unit_ids):
            a = np.ascontiguousarray(a)
            h.update(str((a.dtype.str, a.shape)).encode())
            h.update(a.tobytes())
        h.update(json.dumps([list(self.task_names), list(self.dataset_names)]).encode())
        return h.hexdigest()[:16]

    def check_datasets(self, datasets, where: str = "the store") -> None:
        """Raise UserError unless ``datasets`` (a store or a list of DatasetInfo) has this plan's names and sizes."""
        infos = _infos(datasets)
        names = tuple(i.name for i in infos)
        if names != self.dataset_names:
            raise UserError(f"the plan was built for datasets {list(self.dataset_names)}, but {where} has "
                            f"{list(names)} (fix: rebuild the plan with `jaxembed plan build` on this store)")
        sizes = np.array([int(i.size) for i in infos], np.int64)
        if not np.array_equal(sizes, self.dataset_sizes):
            bad = [f"{n} ({a} vs {b})" for n, a, b in zip(names, self.dataset_sizes, sizes) if a != b]
            raise UserError(f"dataset sizes differ between the plan and {where}: {', '.join(bad)} "
                            "(fix: rebuild the plan on this store)")

    # ---- files
    def save(self, path: str | os.PathLike) -> Path:
        """Write ``path`` (.npz, the arrays) and ``path`` with suffix .json (names, config, seed, meta). Atomic."""
        path = Path(path)
        if path.suffix != ".npz":
            raise UserError(f"{path}: a plan file must end in .npz")
        from jaxembed import runfiles

        side = {"format": FORMAT, "version": VERSION, "fingerprint": self.fingerprint(), "steps": self.steps,
                "global_batch_size": self.global_batch_size, "seed": self.seed,
                "task_names": list(self.task_names), "dataset_names": list(self.dataset_names),
                "config": self.config, "meta": self.meta}
        arrays = dict(dataset_ids=self.dataset_ids, example_ids=self.example_ids, task_ids=self.task_ids,
                      weights=self.weights, temperatures=self.temperatures, dataset_tasks=self.dataset_tasks,
                      dataset_sizes=self.dataset_sizes, dropped=self.dropped, unit_ids=self.unit_ids)
        # each file through its own unique temporary name (host, pid, random), renamed into place: concurrent
        # savers never share a temporary file; a reader between the two renames sees a pair whose fingerprints
        # differ, which ``load`` reports
        runfiles.write_with(path, lambda t: np.savez(t, **arrays), suffix=".npz")
        runfiles.write_text(path.with_suffix(".json"), json.dumps(side, indent=1, default=_json_default) + "\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Plan":
        """Read and validate a plan written by ``save``; errors name the file and the fix."""
        path = Path(path)
        side_path = path.with_suffix(".json")
        if not path.is_file():
            raise UserError(f"{path}: no such plan file (fix: build one with `jaxembed plan build`)")
        if not side_path.is_file():
            raise UserError(f"{side_path}: the plan's sidecar is missing (fix: keep {path.name} and "
                            f"{side_path.name} together, or rebuild the plan)")
        try:
            side = json.loads(side_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise UserError(f"{side_path}:{e.lineno}: invalid JSON ({e.msg}) (fix: rebuild the plan)") from None
        if not isinstance(side, dict) or side.get("format") != FORMAT:
            raise UserError(f"{side_path}: not a jaxembed plan sidecar (fix: rebuild the plan)")
        if side.get("version") != VERSION:
            raise UserError(f"{side_path}: plan format version {side.get('version')} is not supported (this "
                            f"jaxembed reads version {VERSION}; fix: rebuild the plan)")
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except (ValueError, OSError) as e:
            raise UserError(f"{path}: unreadable plan arrays ({e}) (fix: rebuild the plan)") from None
        need = {"dataset_ids": (np.int32, 2), "example_ids": (np.int64, 2), "task_ids": (np.int32, 1),
                "weights": (np.float32, 2), "temperatures": (np.float32, 1), "dataset_tasks": (np.int32, 1),
                "dataset_sizes": (np.int64, 1), "dropped": (np.int64, 2), "unit_ids": (np.int32, 1)}
        for k, (dt, nd) in need.items():
            if k not in arrays:
                raise UserError(f"{path}: array '{k}' is missing (fix: rebuild the plan)")
            if arrays[k].dtype != dt or arrays[k].ndim != nd:
                raise UserError(f"{path}: array '{k}' is {arrays[k].dtype}{list(arrays[k].shape)}, expected "
                                f"{np.dtype(dt)} with {nd} dims (fix: rebuild the plan)")
        plan = cls(arrays["dataset_ids"], arrays["example_ids"], arrays["task_ids"], arrays["weights"],
                   arrays["temperatures"], tuple(side["task_names"]), tuple(side["dataset_names"]),
                   arrays["dataset_tasks"], arrays["dataset_sizes"], side.get("config", {}), int(side["seed"]),
                   side.get("meta", {}), arrays["dropped"], arrays["unit_ids"])
        _validate_plan(plan, str(path))
        if side.get("fingerprint") != plan.fingerprint():
            raise UserError(f"{path}: the arrays do not match {side_path.name} (fingerprint "
                            f"{plan.fingerprint()} vs {side.get('fingerprint')}); the two files come from "
                            "different builds (fix: rebuild the plan)")
        return plan


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(type(o).__name__)


def _validate_plan(plan: Plan, where: str) -> None:
    S, G = plan.dataset_ids.shape
    D, T = len(plan.dataset_names), len(plan.task_names)
    if plan.example_ids.shape != (S, G) or plan.weights.shape != (S, G):
        raise UserError(f"{where}: example_ids / weights shapes differ from dataset_ids [{S}, {G}]")
    if plan.task_ids.shape != (S,) or plan.temperatures.shape != (S,) or plan.unit_ids.shape != (S,):
        raise UserError(f"{where}: task_ids / temperatures / unit_ids must have shape [{S}]")
    if plan.dataset_tasks.shape != (D,) or plan.dataset_sizes.shape != (D,):
        raise UserError(f"{where}: the dataset tables must have {D} entries")
    if S and (plan.dataset_ids.min() < 0 or plan.dataset_ids.max() >= D):
        raise UserError(f"{where}: dataset id out of range [0, {D})")
    if S and (plan.example_ids.min() < 0 or np.any(plan.example_ids >= plan.dataset_sizes[plan.dataset_ids])):
        raise UserError(f"{where}: an example id is out of range of its dataset's size")
    if S and (plan.task_ids.min() < -1 or plan.task_ids.max() >= T):
        raise UserError(f"{where}: task id out of range [-1, {T})")
    if D and (plan.dataset_tasks.min() < 0 or plan.dataset_tasks.max() >= T):
        raise UserError(f"{where}: dataset_tasks out of range [0, {T})")


# --------------------------------------------------------------------------------------------------- inputs

def _infos(datasets) -> list:
    return list(datasets.datasets) if hasattr(datasets, "datasets") else list(datasets)


def _read_named_arrays(path: Path, what: str) -> dict[str, np.ndarray] | np.ndarray:
    if not path.is_file():
        raise UserError(f"{path}: no such {what} file (fix: check the path in the plan config)")
    suf = path.suffix.lower()
    try:
        if suf == ".npz":
            with np.load(path, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        if suf == ".npy":
            return np.load(path, allow_pickle=False)
        if suf == ".json":
            obj = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(obj, dict):
                return {str(k): v for k, v in obj.items()}
            return obj
        if suf == ".txt":
            return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: invalid JSON ({e.msg}) (fix: write valid JSON)") from None
    except ValueError as e:
        raise UserError(f"{path}: unreadable {what} file ({e}) (fix: write it with numpy.save / savez)") from None
    raise UserError(f"{path}: unsupported {what} file type '{suf}' (fix: use .npz, .npy or .json)")


def load_scores(source, datasets) -> dict[str, np.ndarray]:
    """Per-example scores (Data-CUBE phi, Eq. 8) -> {dataset name: float64 [size]}.

    source: a mapping {dataset name: array}, a flat array (all datasets concatenated in store order), or a file:
    .npz (one array per dataset name), .json ({name: [..]} or a flat list), .npy (flat, store order).
    Datasets may be missing from a mapping; sizes and finiteness are checked."""
    infos = _infos(datasets)
    where = str(source) if isinstance(source, (str, os.PathLike)) else "scores"
    obj = _read_named_arrays(Path(source), "scores") if isinstance(source, (str, os.PathLike)) else source
    sizes = {i.name: int(i.size) for i in infos}
    out: dict[str, np.ndarray] = {}
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            if k not in sizes:
                raise UserError(f"{where}: scores for unknown dataset '{k}' (datasets: {', '.join(sizes)}) "
                                "(fix: key the scores by dataset name)")
            out[k] = np.asarray(v, np.float64).reshape(-1)
    else:
        flat = np.asarray(obj, np.float64).reshape(-1)
        total = sum(sizes.values())
        if flat.size != total:
            raise UserError(f"{where}: {flat.size} scores for {total} examples (fix: a flat scores array holds "
                            "one score per example of every dataset, in store order)")
        off = 0
        for n, s in sizes.items():
            out[n] = flat[off:off + s]
            off += s
    for k, v in out.items():
        if v.size != sizes[k]:
            raise UserError(f"{where}: dataset '{k}' has {sizes[k]} examples but {v.size} scores "
                            "(fix: recompute the scores on this store)")
        bad = np.flatnonzero(~np.isfinite(v))
        if bad.size:
            raise UserError(f"{where}: dataset '{k}' example {int(bad[0])}: score is {v[bad[0]]} "
                            "(fix: scores must be finite numbers)")
    return out


def load_task_order(source, units: Sequence[str], unit: str | None = None) -> list[str]:
    """A task order (list of unit names) from a list / array or a .json / .npy / .txt file; integers index
    ``units``. Every unit must appear exactly once. unit: the plan's ``curriculum.unit``; a JSON order that
    records another unit (``jaxembed curriculum`` writes ``{"order": [...], "unit": ...}``) is an error."""
    where = str(source) if isinstance(source, (str, os.PathLike)) else "task order"
    obj = _read_named_arrays(Path(source), "task order") if isinstance(source, (str, os.PathLike)) else source
    if isinstance(obj, Mapping):
        got = obj.get("unit")
        if unit is not None and got is not None and got != unit:
            raise UserError(f"{where}: field 'unit': the order is over {got}s, but the plan's curriculum.unit is "
                            f"{unit!r} (fix: set curriculum.unit={got!r}, or run `jaxembed score --unit {unit}` "
                            "and `jaxembed curriculum` again)")
        obj = obj.get("order", obj.get("task_order"))
        if obj is None:
            raise UserError(f"{where}: expected a list of task names or {{\"order\": [...]}}")
    items = list(np.asarray(obj).tolist()) if isinstance(obj, np.ndarray) else list(obj)
    names = []
    for it in items:
        if isinstance(it, (int, np.integer)) and not isinstance(it, bool):
            if not 0 <= it < len(units):
                raise UserError(f"{where}: task index {it} out of range [0, {len(units)}) "
                                f"(fix: indices refer to {list(units)})")
            names.append(units[it])
        else:
            names.append(str(it))
    unknown = [n for n in names if n not in units]
    if unknown:
        kind = {"dataset": "the dataset names", "task": "the data config's task names"}.get(unit or "", "")
        raise UserError(f"{where}: unknown names {unknown} (known: {list(units)}) (fix: "
                        + (f"curriculum.unit={unit!r} orders {kind}; " if kind else "")
                        + "name those, or set curriculum.unit)")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UserError(f"{where}: {dup} appear more than once (fix: each task once)")
    missing = [u for u in units if u not in names]
    if missing:
        raise UserError(f"{where}: the order lacks {missing} (fix: order every task of the plan)")
    return names


def load_instance_orders(source, datasets, units: Mapping[str, Sequence[int]]) -> dict[str, np.ndarray]:
    """Explicit per-unit instance orders -> {unit: int64 [n, 2] (dataset id, example id)}.

    source: a mapping or a file: .json {unit: [[dataset name or id, example index], ...]},
    .npz {unit: int64 [n, 2]}. Each unit's order must list each of its examples exactly once."""
    infos = _infos(datasets)
    where = str(source) if isinstance(source, (str, os.PathLike)) else "instance orders"
    obj = _read_named_arrays(Path(source), "instance orders") if isinstance(source, (str, os.PathLike)) else source
    if not isinstance(obj, Mapping):
        raise UserError(f"{where}: expected {{unit name: [[dataset, index], ...]}}")
    name_to_id = {i.name: k for k, i in enumerate(infos)}
    out = {}
    for unit, members in units.items():
        if unit not in obj:
            raise UserError(f"{where}: no order for '{unit}' (fix: give every unit an order)")
        rows = obj[unit]
        if isinstance(rows, np.ndarray):
            arr = rows.astype(np.int64).reshape(-1, 2)
        else:
            arr = np.array([[name_to_id[r[0]] if isinstance(r[0], str) and r[0] in name_to_id else r[0], r[1]]
                            for r in rows], dtype=np.int64).reshape(-1, 2)
        expect = sum(int(infos[d].size) for d in members)
        ok = arr.shape[0] == expect and np.isin(arr[:, 0], list(members)).all()
        if ok:
            ok = arr[:, 1].min(initial=0) >= 0 and np.all(
                arr[:, 1] < np.array([infos[d].size for d in range(len(infos))])[arr[:, 0]])
            ok = ok and np.unique(arr[:, 0] * (1 << 40) + arr[:, 1]).size == expect
        if not ok:
            raise UserError(f"{where}: the order of '{unit}' is not a permutation of its {expect} examples "
                            f"(datasets {[infos[d].name for d in members]}) (fix: list each example once)")
        out[unit] = arr
    return out


def instance_mask(scores: np.ndarray, delta: float | None, direction: str = "text") -> np.ndarray:
    """Data-CUBE Eq. 9 -> float32 alpha [n]. direction 'text': alpha = 0 where phi < delta, else 1 (too
    difficult instances are not learned); 'printed': alpha = 0 where phi >= delta (the printed cases).
    delta None: all ones."""
    scores = np.asarray(scores, np.float64)
    if delta is None:
        return np.ones(scores.shape, np.float32)
    if direction == "text":
        return (scores >= delta).astype(np.float32)
    if direction == "printed":
        return (scores < delta).astype(np.float32)
    raise UserError(f"mask.direction: unknown value {direction!r} (fix: 'text' or 'printed')")


# --------------------------------------------------------------------------------------------------- building

@dataclasses.dataclass
class _Unit:
    name: str
    strategy: str           # one of STRATEGIES or "curriculum"
    members: list[int]      # dataset ids


def _rng(seed: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), *[int(k) for k in keys]])


def _epochs_of(info) -> float:
    e = getattr(info, "epochs", 1)
    return 1.0 if e is None else float(e)


def _temperature_of(info) -> float:
    t = getattr(info, "temperature", None)
    try:
        t = float(t)
    except (TypeError, ValueError):
        return float("nan")
    return t if math.isfinite(t) and t > 0 else float("nan")


def _pass(rng: np.random.Generator, members: Sequence[int], sizes: np.ndarray, epochs: np.ndarray):
    """One pass over a unit: dataset d contributes epochs[d] copies of its examples (a fractional part: a random
    subset). Copy c of dataset d gets random keys in [c/E_d, (c+1)/E_d): sorting spreads every dataset evenly
    over the pass, and copies of one example never meet inside one copy. -> (ds int32 [n], ex int64 [n])."""
    keys, ds, ex = [], [], []
    for d in members:
        size, e = int(sizes[d]), float(epochs[d])
        if size == 0 or e <= 0:
            continue
        full = int(math.floor(e + 1e-9))
        frac = e - full
        for c in range(full):
            keys.append((c + rng.random(size)) / e)
            ex.append(np.arange(size, dtype=np.int64))
            ds.append(np.full(size, d, np.int32))
        extra = int(round(frac * size))
        if extra > 0:
            keys.append((full + rng.random(extra) * frac) / e)
            ex.append(np.sort(rng.permutation(size)[:extra]).astype(np.int64))
            ds.append(np.full(extra, d, np.int32))
    if not keys:
        return np.zeros(0, np.int32), np.zeros(0, np.int64)
    order = np.argsort(np.concatenate(keys), kind="stable")
    return np.concatenate(ds)[order], np.concatenate(ex)[order]


def _key(ds: np.ndarray, ex: np.ndarray) -> np.ndarray:
    return ds.astype(np.int64) * (1 << 40) + ex.astype(np.int64)


def _dedupe_batches(ds: np.ndarray, ex: np.ndarray, window: int = 64) -> int:
    """In place, on [n, G] arrays: swap a repeated example out of its batch with an example of a nearby batch
    (later first, then earlier) such that neither batch then holds a repeat. Keeps the multiset of examples.
    Returns the number of repeats that could not be resolved (tiny datasets)."""
    n, G = ds.shape
    if n == 0 or G < 2:
        return 0
    key = _key(ds, ex)
    srt = np.sort(key, axis=1)
    bad_rows = np.flatnonzero(np.any(srt[:, 1:] == srt[:, :-1], axis=1))
    unresolved = 0
    for i in bad_rows:
        seen: set[int] = set()
        dup_pos = []
        for p in range(G):
            k = int(key[i, p])
            if k in seen:
                dup_pos.append(p)
            else:
                seen.add(k)
        for p in dup_pos:
            k = int(key[i, p])
            done = False
            cands = list(range(i + 1, min(n, i + 1 + window))) + list(range(i - 1, max(-1, i - 1 - window), -1))
            for j in cands:
                row_j = key[j]
                if np.any(row_j == k):
                    continue
                ok = np.flatnonzero(~np.isin(row_j, list(seen)))
                if ok.size == 0:
                    continue
                q = int(ok[0])
                x = int(row_j[q])
                # swap (i, p) <-> (j, q)
                key[i, p], key[j, q] = x, k
                ds[i, p], ds[j, q] = ds[j, q], ds[i, p]
                ex[i, p], ex[j, q] = ex[j, q], ex[i, p]
                seen.add(x)
                done = True
                break
            if not done:
                unresolved += 1
    return unresolved


def _resolve_units(infos, cfg: dict, task_names: list[str], dataset_tasks: np.ndarray):
    """-> (strategy per task {name: strategy}, units)."""
    strategies: dict[str, str] = {}
    overrides = dict(cfg.get("task_strategies") or {})
    unknown = [t for t in overrides if t not in task_names]
    if unknown:
        raise _bad("task_strategies", f"unknown tasks {unknown} (tasks: {task_names})", "use the data config's "
                   "task names")
    for t, tname in enumerate(task_names):
        members = [d for d in range(len(infos)) if dataset_tasks[d] == t]
        if tname in overrides:
            strategies[tname] = overrides[tname]
        elif cfg.get("strategy"):
            strategies[tname] = cfg["strategy"]
        else:
            vals = {infos[d].name: (getattr(infos[d], "batching", None) or "random") for d in members}
            if len(set(vals.values())) > 1:
                raise UserError(f"task '{tname}': its datasets disagree on batching ({vals}) (fix: give every "
                                f"dataset of the task the same batching, or set plan task_strategies.{tname})")
            s = next(iter(vals.values()))
            if s not in STRATEGIES:
                raise UserError(f"dataset '{members and infos[members[0]].name}': unknown batching {s!r} "
                                f"(fix: one of {', '.join(STRATEGIES)})")
            strategies[tname] = s
    units: list[_Unit] = []
    mixed = None
    for t, tname in enumerate(task_names):
        members = [d for d in range(len(infos)) if dataset_tasks[d] == t]
        s = strategies[tname]
        if s == "random":
            if mixed is None:
                mixed = _Unit("mixed", "random", [])
                units.append(mixed)
            mixed.members.extend(members)
        elif s == "heterogeneous":
            units.append(_Unit(tname, s, members))
        else:
            units.extend(_Unit(infos[d].name, s, [d]) for d in members)
    return strategies, units


def _dataset_probs(n_d: np.ndarray, weights: np.ndarray, sampling: str, temp: float | None) -> np.ndarray:
    """Unnormalised dataset probabilities from example counts n_d: size (n_d), weights, temperature (q^(1/T),
    q = n_d / sum n_d)."""
    n_d = n_d.astype(np.float64)
    if sampling == "size":
        return n_d
    if sampling == "weights":
        return weights.astype(np.float64) * (n_d > 0)
    if temp is None:
        raise _bad("sampling_temperature", "sampling='temperature' needs a temperature",
                   "set plan sampling_temperature (or the data config's), e.g. 2.0")
    q = n_d / max(n_d.sum(), 1.0)
    return np.where(q > 0, q ** (1.0 / temp), 0.0)


def _sampled_epochs(sizes, epochs, explicit, weights, sampling: str, temp: float | None, plan_epochs: float):
    """Epoch mode with weights / temperature sampling: the datasets without an explicit ``epochs`` share the
    budget of one pass over them (x plan.epochs) in proportion to their sampling probability; their effective
    epochs follow (fractional: full passes + a random subset). Datasets with explicit epochs keep them."""
    out = epochs.copy()
    free = ~explicit & (sizes > 0)
    if sampling == "size" or not free.any():
        return out
    p = _dataset_probs(sizes[free], weights[free], sampling, temp)
    if p.sum() <= 0:
        raise UserError("every dataset without explicit epochs has sampling probability 0 (fix: positive weights)")
    budget = float(sizes[free].sum()) * plan_epochs
    out[free] = budget * (p / p.sum()) / sizes[free]
    return out


def _sampling_probs(units: list[_Unit], sizes, epochs, weights, sampling: str, temp: float | None, infos):
    p_d = _dataset_probs(sizes.astype(np.float64) * epochs, weights, sampling, temp)
    p_u = np.array([p_d[u.members].sum() for u in units])
    if p_u.sum() <= 0:
        raise UserError("every dataset has sampling probability 0 (fix: positive weights / epochs)")
    return p_u / p_u.sum(), p_d / p_d.sum()


def _batch_meta(ds: np.ndarray, dataset_tasks: np.ndarray, temps: np.ndarray, task_names, infos):
    """task_ids [S] (-1 mixed) and temperatures [S] (NaN when mixed or unset)."""
    rt = dataset_tasks[ds]
    single = np.all(rt == rt[:, :1], axis=1) if ds.size else np.zeros(0, bool)
    task_ids = np.where(single, rt[:, 0] if ds.size else 0, -1).astype(np.int32)
    rtemp = temps[ds]
    fin = np.isfinite(rtemp)
    tmin = np.where(fin, rtemp, np.inf).min(1) if ds.size else np.zeros(0, np.float32)
    tmax = np.where(fin, rtemp, -np.inf).max(1) if ds.size else np.zeros(0, np.float32)
    anyfin, allfin = fin.any(1), fin.all(1)
    clash = single & anyfin & ((tmin != tmax) | ~allfin)
    if clash.any():
        s = int(np.flatnonzero(clash)[0])
        names = sorted({infos[d].name for d in np.unique(ds[s])})
        raise UserError(f"task '{task_names[task_ids[s]]}': datasets {names} with different temperatures "
                        "share a batch (fix: give the task's datasets the same temperature, or use "
                        "homogeneous batching)")
    temp = np.where(single & anyfin, tmin, np.nan).astype(np.float32)
    return task_ids, temp


def build_plan(datasets, config=None, *, scores=None, task_order=None, instance_orders=None,
               data_config=None) -> Plan:
    """Build a plan. datasets: a Store or a list of DatasetInfo (name, task, size, batching, epochs, weight,
    temperature, ...). config: a plan config (ConfigDict or dict; missing fields take the defaults).
    scores / task_order / instance_orders override the files named in the config (arrays or mappings, see
    ``load_scores`` etc.). data_config: the data config, for the defaults of sampling, sampling_temperature and
    seed. Pure: the same inputs give the same plan."""
    cfg = _merged_config(config)
    # inputs given as arguments stand in for the config's file names (recorded as such in plan.config)
    if scores is not None:
        cfg["scores"] = "(given to build_plan)"
    if task_order is not None:
        cfg["curriculum"]["task_order"] = [str(t) for t in np.asarray(task_order).tolist()]
    if instance_orders is not None:
        cfg["curriculum"]["instance_orders"] = "(given to build_plan)"
    validate_plan_config(cfg)
    infos = _infos(datasets)
    if not infos:
        raise UserError("the store has no datasets (fix: add datasets to the data config)")
    if data_config is not None:
        dc = _config_dict(data_config)
        validate_data_defaults(dc, "the data config")
    else:  # a store remembers its data config's sampling and seed
        mf = getattr(datasets, "manifest", None) or {}
        dc = {k: mf[k] for k in ("sampling", "sampling_temperature", "seed") if k in mf}
        validate_data_defaults(dc, f"{getattr(datasets, 'path', 'the store')}/manifest.json")
    sampling = cfg["sampling"] or dc.get("sampling") or "size"
    if sampling not in SAMPLING:
        raise _bad("sampling", f"unknown value {sampling!r}", f"one of {', '.join(SAMPLING)}")
    temp = cfg["sampling_temperature"] if cfg["sampling_temperature"] is not None else dc.get("sampling_temperature")
    temp = float(temp) if temp not in (None, 0) else None
    seed = cfg["seed"] if cfg["seed"] is not None else int(dc.get("seed", 0) or 0)
    cfg.update(sampling=sampling, sampling_temperature=temp, seed=seed)
    G = int(cfg["global_batch_size"])

    names = [i.name for i in infos]
    if len(set(names)) != len(names):
        raise UserError(f"duplicate dataset names {sorted({n for n in names if names.count(n) > 1})} "
                        "(fix: give every dataset a unique name)")
    task_names: list[str] = []
    for i in infos:
        if i.task not in task_names:
            task_names.append(i.task)
    dataset_tasks = np.array([task_names.index(i.task) for i in infos], np.int32)
    sizes = np.array([int(i.size) for i in infos], np.int64)
    epochs = np.array([_epochs_of(i) for i in infos], np.float64) * float(cfg["epochs"])
    for i, e in zip(infos, epochs):
        if e < 0 or not math.isfinite(e):
            raise UserError(f"dataset '{i.name}': epochs must be >= 0, got {e} (fix: epochs >= 0; 0 excludes it)")
    dweights = np.array([float(getattr(i, "weight", 1.0) if getattr(i, "weight", None) is not None else 1.0)
                         for i in infos])
    temps = np.array([_temperature_of(i) for i in infos], np.float32)
    explicit = np.array([getattr(i, "epochs", None) is not None for i in infos])
    configured = epochs.copy()
    if not cfg["curriculum"]["enabled"] and int(cfg["steps"]) == 0:
        epochs = _sampled_epochs(sizes, epochs, explicit, dweights, sampling, temp, float(cfg["epochs"]))

    # scores & mask
    score_map = None
    if scores is not None or cfg["scores"]:
        score_map = load_scores(scores if scores is not None else cfg["scores"], infos)

    meta: dict[str, Any] = {"sampling": sampling, "sampling_temperature": temp,
                            "datasets": [{"name": i.name, "task": i.task, "size": int(s), "epochs": float(e),
                                          "epochs_from": "sampling" if e != c else "config",
                                          "weight": float(w), "temperature": float(t) if np.isfinite(t) else None,
                                          "batching": getattr(i, "batching", None)}
                                         for i, s, e, c, w, t in zip(infos, sizes, epochs, configured, dweights,
                                                                     temps)]}
    if cfg["curriculum"]["enabled"]:
        ds, ex, info = _build_curriculum(cfg, infos, task_names, dataset_tasks, sizes, epochs, score_map,
                                         task_order, instance_orders, seed, G)
    else:
        ds, ex, info = _build_sampled(cfg, infos, task_names, dataset_tasks, sizes, epochs, dweights, sampling,
                                      temp, seed, G)
    dropped = info.pop("_dropped")
    unit_ids = info.pop("_unit_ids")
    meta.update(info)

    weights = np.ones(ds.shape, np.float32)
    delta = cfg["mask"]["delta"]
    if delta is not None:
        missing = [n for n in names if n not in score_map]
        used = set(np.unique(ds).tolist())
        missing = [n for k, n in enumerate(names) if n in missing and k in used]
        if missing:
            raise UserError(f"the mask needs scores for datasets {missing} (fix: score every dataset, or set "
                            "mask.delta=None)")
        for d in np.unique(ds):
            sel = ds == d
            weights[sel] = instance_mask(score_map[names[d]], delta, cfg["mask"]["direction"])[ex[sel]]
        meta["masked_rows"] = int((weights == 0).sum())
    task_ids, temperatures = _batch_meta(ds, dataset_tasks, temps, task_names, infos)
    plan = Plan(ds.astype(np.int32), ex.astype(np.int64), task_ids, weights, temperatures, tuple(task_names),
                tuple(names), dataset_tasks, sizes, cfg, int(seed), meta, dropped.astype(np.int64).reshape(-1, 2),
                unit_ids.astype(np.int32))
    _validate_plan(plan, "built plan")
    return plan


def walk_order(batches: Sequence[int], walk: str = "cyclic") -> tuple[np.ndarray, np.ndarray]:
    """The order in which a curriculum takes its units' batches (DESIGN.md 2.2; Data-CUBE Algorithm 1, lines
    18-25). batches: int [U], n_k = the batches of the unit at position k of the task order (its instances already
    sorted, E2D etc.). -> (position int64 [N], batch int64 [N]), N = sum n_k: the t-th batch of the plan is batch
    ``batch[t]`` of the unit at ``position[t]``. Both walks go round the task order in cycles (Eq. 6 scores the
    order as a cycle), visit at most one batch of a unit per cycle, and take each unit's batches in their order.

    - ``cyclic`` (Algorithm 1): cycle c visits every unit in the order and takes its c-th batch; a unit that has
      run out is skipped. Sort key (j, k) for batch j of the unit at position k. With one unit much larger than
      the others, the last cycles visit that unit alone: it owns the end of training (its most difficult
      instances, while the learning rate decays).
    - ``balanced`` (jaxembed's extension, not the paper's): the same R = max_k n_k cycles, but unit k is visited in
      n_k of them spread evenly -- batch j in cycle floor(j R / n_k) -- and inside a cycle the units follow the
      task order: sort key (floor(j R / n_k), k). Unit k's last batch comes in cycle R - ceil(R / n_k): the
      largest unit is alone only in the last few cycles (R / n_2 - 1, n_2 the second-largest n_k).

    Properties (tests/test_plan.py): cycle 0 visits every unit with a batch, in the task order, so the first visits
    follow the task order in both walks; each unit's batches keep their order (R >= n_k, so the cycles of one unit
    strictly increase); equal n_k give R = n_k and identical walks. Balanced: over any m consecutive cycles unit k
    is visited floor or ceil of m n_k / R times; in any W consecutive batches its count c_k satisfies
    |c_k - W s_k| < 1 + U s_k + 2 n_k / R (s_k = n_k / N). Proof: the walk sorts by T = cycle + k / U, so a window
    is the batches with T in some [a, a + L) inside [0, R); unit k's cycles there form an integer range of length
    within 1 of L, so |c_k - L n_k / R| < 1 + n_k / R; summing, |W - L N / R| < U + N / R; combine the two."""
    n = np.asarray(batches, np.int64).reshape(-1)
    if walk not in WALKS:
        raise _bad("curriculum.walk", f"unknown value {walk!r}", "'cyclic' (Algorithm 1) or 'balanced'")
    if n.size == 0 or n.sum() == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    pos = np.repeat(np.arange(n.size, dtype=np.int64), n)
    j = np.concatenate([np.arange(x, dtype=np.int64) for x in n])
    cycle = j if walk == "cyclic" else (j * int(n.max())) // n[pos]
    o = np.lexsort((pos, cycle))  # the last key is the primary one: cycle, then the position in the order
    return pos[o], j[o]


def _compressed_batches(rows: np.ndarray, steps: int, G: int) -> np.ndarray | None:
    """Batches per curriculum unit when ``steps`` batches of G cover less than one pass of the units' ``rows``
    [U]: shares proportional to rows (largest remainders), at most rows // G each; sums to ``steps``. None when the
    steps cover a full pass (or the units cannot fill them with whole batches)."""
    rows = np.asarray(rows, np.int64)
    cap = rows // G
    if steps * G >= rows.sum() or cap.sum() < steps:
        return None
    q = steps * rows / rows.sum()
    n = np.minimum(np.floor(q).astype(np.int64), cap)
    while n.sum() < steps:  # at most ~2 rounds per unit: q_u - cap_u < 1
        gap = np.where(n < cap, q - n, -np.inf)
        n[int(np.argmax(gap))] += 1
    return n


def _check_unit_size(unit: _Unit, n: int, G: int, infos, what: str):
    if 0 < n < G:
        names = [infos[d].name for d in unit.members]
        raise UserError(f"{what} '{unit.name}' (datasets {names}) has {n} examples per pass, fewer than "
                        f"global_batch_size {G}: a batch would repeat examples or the unit would be dropped "
                        "(fix: a smaller global_batch_size, more epochs for it, or random / heterogeneous "
                        "batching)")


def _build_sampled(cfg, infos, task_names, dataset_tasks, sizes, epochs, dweights, sampling, temp, seed, G):
    strategies, units = _resolve_units(infos, cfg, task_names, dataset_tasks)
    n_pass = [int(sum(int(round((epochs[d] - math.floor(epochs[d] + 1e-9)) * sizes[d]))
                      + int(math.floor(epochs[d] + 1e-9)) * int(sizes[d]) for d in u.members)) for u in units]
    for u, n in zip(units, n_pass):
        _check_unit_size(u, n, G, infos, "unit")
    keep = [k for k, n in enumerate(n_pass) if n > 0]
    units = [units[k] for k in keep]
    n_pass = [n_pass[k] for k in keep]
    if not units:
        raise UserError("no examples to plan: every dataset has 0 epochs or 0 examples (fix: epochs > 0)")
    steps = int(cfg["steps"])
    if steps:
        p_u, p_d = _sampling_probs(units, sizes, epochs, dweights, sampling, temp, infos)
    else:  # the amounts are fixed (epochs); the batches of all units are interleaved evenly (below)
        p_u = np.array(n_pass, np.float64) / sum(n_pass)
    info: dict[str, Any] = {"mode": "steps" if steps else "epochs", "strategies": strategies,
                            "units": [{"name": u.name, "strategy": u.strategy,
                                       "datasets": [infos[d].name for d in u.members], "p": float(p)}
                                      for u, p in zip(units, p_u)]}
    unit_batches: list[tuple[np.ndarray, np.ndarray]] = []
    dropped, filled = [], np.zeros(len(infos), np.int64)
    unresolved = 0
    if steps == 0:
        for k, u in enumerate(units):
            ds, ex = _pass(_rng(seed, _R_POOL, k, 0), u.members, sizes, epochs)
            nb, r = divmod(ds.size, G)
            if r and not cfg["drop_remainder"]:
                # fill the last batch from the unit's next pass, skipping examples already in that batch
                ds2, ex2 = _pass(_rng(seed, _R_FILL, k, 1), u.members, sizes, epochs)
                have = set(_key(ds[nb * G:], ex[nb * G:]).tolist())
                ok = ~np.isin(_key(ds2, ex2), list(have))
                take = np.flatnonzero(ok)[:G - r]
                ds = np.concatenate([ds, ds2[take]])
                ex = np.concatenate([ex, ex2[take]])
                np.add.at(filled, ds2[take], 1)
                nb += 1
            elif r:
                dropped.append(np.stack([ds[nb * G:], ex[nb * G:]], 1))
            bd, be = ds[:nb * G].reshape(nb, G).copy(), ex[:nb * G].reshape(nb, G).copy()
            unresolved += _dedupe_batches(bd, be)
            unit_batches.append((bd, be))
        # order: an even interleave -- batch j of a unit with n batches sits at a random point of [j/n, (j+1)/n)
        times, owner, idx = [], [], []
        rng = _rng(seed, _R_ORDER)
        for k, (bd, _) in enumerate(unit_batches):
            n = bd.shape[0]
            times.append((np.arange(n) + rng.random(n)) / n)
            owner.append(np.full(n, k))
            idx.append(np.arange(n))
        times, owner, idx = np.concatenate(times), np.concatenate(owner), np.concatenate(idx)
        order = np.argsort(times, kind="stable")
        owner, idx = owner[order], idx[order]
    else:
        owner = _rng(seed, _R_STEPS).choice(len(units), size=steps, p=p_u)
        idx = np.zeros(steps, np.int64)
        for k, u in enumerate(units):
            sel = np.flatnonzero(owner == k)
            idx[sel] = np.arange(sel.size)
            need = sel.size * G
            parts_d, parts_e, have, p = [], [], 0, 0
            while have < need + G:  # one batch of slack for the de-duplication swaps
                d_, e_ = _pass(_rng(seed, _R_POOL, k, p), u.members, sizes, epochs)
                parts_d.append(d_)
                parts_e.append(e_)
                have += d_.size
                p += 1
            ds = np.concatenate(parts_d)[:need + G].reshape(-1, G).copy()
            ex = np.concatenate(parts_e)[:need + G].reshape(-1, G).copy()
            unresolved += _dedupe_batches(ds, ex)
            unit_batches.append((ds[:sel.size], ex[:sel.size]))
    S = owner.size
    DS = np.empty((S, G), np.int32)
    EX = np.empty((S, G), np.int64)
    for k, (bd, be) in enumerate(unit_batches):
        sel = owner == k
        DS[sel] = bd[idx[sel]]
        EX[sel] = be[idx[sel]]

    # semi-homogeneous: pull a proportion of every batch's rows, shuffle across batches, put back
    semi_units = [k for k, u in enumerate(units) if u.strategy == "semi_homogeneous"]
    if semi_units:
        prop = float(cfg["semi_homogeneous_proportion"])
        m = int(round(prop * G))
        rows = np.flatnonzero(np.isin(owner, semi_units))
        info["semi_homogeneous"] = {"proportion": prop, "rows_per_batch": m, "batches": int(rows.size)}
        if m and rows.size > 1:
            rng = _rng(seed, _R_SEMI)
            pos = np.argsort(rng.random((rows.size, G)), axis=1)[:, :m]  # m random positions per batch
            r_idx = np.repeat(rows, m)
            c_idx = pos.reshape(-1)
            perm = rng.permutation(r_idx.size)
            DS[r_idx, c_idx] = DS[r_idx, c_idx][perm]
            EX[r_idx, c_idx] = EX[r_idx, c_idx][perm]
            sd, se = DS[rows], EX[rows]
            unresolved += _dedupe_batches(sd, se)
            DS[rows], EX[rows] = sd, se
    info["batches_per_unit"] = {u.name: int((owner == k).sum()) for k, u in enumerate(units)}
    info["_unit_ids"] = owner
    info["filled"] = {infos[d].name: int(filled[d]) for d in range(len(infos)) if filled[d]}
    info["unresolved_in_batch_repeats"] = int(unresolved)
    info["_dropped"] = np.concatenate(dropped) if dropped else np.zeros((0, 2), np.int64)
    info["dropped"] = {infos[d].name: int((info["_dropped"][:, 0] == d).sum())
                       for d in np.unique(info["_dropped"][:, 0]).tolist()}
    return DS, EX, info


def _build_curriculum(cfg, infos, task_names, dataset_tasks, sizes, epochs, score_map, task_order,
                      instance_orders, seed, G):
    cur = cfg["curriculum"]
    if cur["unit"] == "task":
        units = {t: [d for d in range(len(infos)) if dataset_tasks[d] == k] for k, t in enumerate(task_names)}
    else:
        units = {infos[d].name: [d] for d in range(len(infos))}
    units = {u: m for u, m in units.items() if any(epochs[d] > 0 and sizes[d] > 0 for d in m)}
    unit_names = list(units)
    order = load_task_order(task_order if task_order is not None else cur["task_order"], unit_names, cur["unit"])
    walk = cur["walk"]
    io = cur["instance_order"]
    given = None
    if io == "given":
        given = load_instance_orders(instance_orders if instance_orders is not None else cur["instance_orders"],
                                     infos, units)
    elif io in ("e2d", "d2e"):
        missing = [infos[d].name for m in units.values() for d in m if infos[d].name not in score_map]
        if missing:
            raise UserError(f"the curriculum needs scores for datasets {missing} (fix: score every dataset, or "
                            "curriculum.instance_order='random')")

    def sorted_instances(u: str, members: list[int]) -> tuple[np.ndarray, np.ndarray]:
        if given is not None:
            a = given[u]
            return a[:, 0].astype(np.int32), a[:, 1]
        ds = np.concatenate([np.full(sizes[d], d, np.int32) for d in members])
        ex = np.concatenate([np.arange(sizes[d], dtype=np.int64) for d in members])
        if io == "random":
            perm = _rng(seed, _R_CURR, unit_names.index(u)).permutation(ds.size)
            return ds[perm], ex[perm]
        sc = np.concatenate([score_map[infos[d].name] for d in members])
        # E2D: phi descending; ties broken by (dataset, index) -- lexsort's last key is the primary one
        o = np.lexsort((ex, ds, -sc if io == "e2d" else sc))
        return ds[o], ex[o]

    base = {u: sorted_instances(u, m) for u, m in units.items()}
    rounds = int(math.ceil(max(epochs[d] for m in units.values() for d in m) - 1e-9))
    steps = int(cfg["steps"])

    def round_rows(u: str, r: int) -> tuple[np.ndarray, np.ndarray]:
        """The unit's rows of round r, in its instance order: every example of the datasets with a full epoch
        left, a random subset for a fractional epoch."""
        rr = r % max(rounds, 1)
        ds, ex = base[u]
        keep = np.zeros(ds.size, bool)
        for d in units[u]:
            sel = np.flatnonzero(ds == d)
            full = int(math.floor(epochs[d] + 1e-9))
            if rr < full:
                keep[sel] = True
            elif rr == full:
                extra = int(round((epochs[d] - full) * sizes[d]))
                keep[sel[np.sort(_rng(seed, _R_FRAC, d, r).permutation(sel.size)[:extra])]] = True
        return ds[keep], ex[keep]

    # step mode with fewer steps than the first pass: the whole curriculum, compressed. Unit u gets n_u batches
    # (its share of the pass), filled with a uniform random subset of its rows kept in the unit's instance order,
    # so a short run still goes easy -> difficult through every task instead of stopping after each one's
    # easiest batches. Exactly `steps` batches, nothing truncated.
    first = {u: round_rows(u, 0) for u in unit_names} if steps else {}
    quota = _compressed_batches(np.array([first[u][0].size for u in order]), steps, G) if steps else None
    fraction = 1.0 if quota is None else steps * G / sum(first[u][0].size for u in order)
    all_d, all_e, all_u, dropped = [], [], [], []
    filled = np.zeros(len(infos), np.int64)
    batches_per_unit = {u: 0 for u in unit_names}
    r = 0
    total = 0
    while True:
        per_unit = []
        for pos, u in enumerate(order):
            ds, ex = first[u] if r == 0 and steps else round_rows(u, r)
            if quota is not None:
                pick = np.sort(_rng(seed, _R_SHORT, unit_names.index(u)).permutation(ds.size)[:quota[pos] * G])
                ds, ex = ds[pick], ex[pick]
            elif r == 0:
                _check_unit_size(_Unit(u, "curriculum", units[u]), ds.size, G, infos, "curriculum unit")
            nb, rem = divmod(ds.size, G)
            if rem and not cfg["drop_remainder"]:
                # fill the last batch with the unit's first (easiest) instances not already in it
                have = set(_key(ds[nb * G:], ex[nb * G:]).tolist())
                d0, e0 = base[u]
                ok = np.flatnonzero(~np.isin(_key(d0, e0), list(have)))[:G - rem]
                np.add.at(filled, d0[ok], 1)
                ds, ex = np.concatenate([ds, d0[ok]]), np.concatenate([ex, e0[ok]])
                nb += 1
            elif rem:
                dropped.append(np.stack([ds[nb * G:], ex[nb * G:]], 1))
            per_unit.append((ds[:nb * G].reshape(nb, G), ex[:nb * G].reshape(nb, G)))
            batches_per_unit[u] += nb
        # the walk over the task order (Algorithm 1's cyclic walk, or the balanced one): see walk_order
        k_pos, j_idx = walk_order([b[0].shape[0] for b in per_unit], walk)
        start = np.concatenate([[0], np.cumsum([b[0].shape[0] for b in per_unit])]).astype(np.int64)
        o = start[k_pos] + j_idx
        bd = np.concatenate([b[0] for b in per_unit])[o]
        be = np.concatenate([b[1] for b in per_unit])[o]
        all_d.append(bd)
        all_e.append(be)
        all_u.append(np.array([unit_names.index(order[k]) for k in k_pos], np.int32))
        total += bd.shape[0]
        r += 1
        # an empty round ends an epoch-mode plan (no later round has more rows); in step mode it is a fractional
        # epoch's round with less than a batch in every unit, and the next round starts a new pass
        empty = bd.shape[0] == 0 and not (steps and total)
        if (steps == 0 and r >= rounds) or (steps and total >= steps) or empty or quota is not None:
            break
    DS, EX, UI = np.concatenate(all_d), np.concatenate(all_e), np.concatenate(all_u)
    truncated = 0
    if steps:
        truncated = max(0, DS.shape[0] - steps)
        DS, EX, UI = DS[:steps], EX[:steps], UI[:steps]
    d_all = np.concatenate(dropped) if dropped else np.zeros((0, 2), np.int64)
    info = {"mode": "curriculum", "strategies": {t: "curriculum" for t in task_names},
            "curriculum": {"unit": cur["unit"], "walk": walk, "order": order, "instance_order": io, "rounds": r,
                           "fraction_of_one_pass": fraction, "truncated_batches": int(truncated)},
            "units": [{"name": u, "strategy": "curriculum", "datasets": [infos[d].name for d in units[u]]}
                      for u in unit_names],
            "batches_per_unit": batches_per_unit, "_unit_ids": UI,
            "filled": {infos[d].name: int(filled[d]) for d in range(len(infos)) if filled[d]},
            "unresolved_in_batch_repeats": 0, "_dropped": d_all,
            "dropped": {infos[d].name: int((d_all[:, 0] == d).sum()) for d in np.unique(d_all[:, 0]).tolist()}}
    return DS, EX, info


# --------------------------------------------------------------------------------------------------- summary

def summarize(plan: Plan) -> dict:
    """Batches per task / dataset, epochs seen, repeats beyond the configured count, dropped and filled rows,
    masked rows, measured semi-homogeneous mixing."""
    S, G = plan.dataset_ids.shape
    meta = plan.meta
    cfg_epochs = {d["name"]: d["epochs"] for d in meta.get("datasets", [])}
    tasks = {}
    for t in [-1] + list(range(len(plan.task_names))):
        n = int((plan.task_ids == t).sum())
        if n:
            tasks["(mixed)" if t < 0 else plan.task_names[t]] = n
    pure = np.all(plan.dataset_ids == plan.dataset_ids[:, :1], axis=1) if S else np.zeros(0, bool)
    datasets = {}
    for d, name in enumerate(plan.dataset_names):
        sel = plan.dataset_ids == d
        rows = int(sel.sum())
        size = int(plan.dataset_sizes[d])
        counts = np.bincount(plan.example_ids[sel], minlength=size) if size else np.zeros(0, np.int64)
        e = cfg_epochs.get(name, 1.0)
        allowed = int(math.ceil(e - 1e-9))
        drop_n = int((plan.dropped[:, 0] == d).sum())
        datasets[name] = {
            "task": plan.task_names[plan.dataset_tasks[d]], "size": size, "rows": rows,
            "epochs_from": next((x.get("epochs_from", "config") for x in meta.get("datasets", [])
                                 if x["name"] == name), "config"),
            "batches_single_dataset": int((pure & (plan.dataset_ids[:, 0] == d)).sum()) if S else 0,
            "epochs_configured": e, "epochs_seen": rows / size if size else 0.0,
            "repeats_beyond_configured": (None if meta.get("mode") == "steps"
                                          else int(np.maximum(counts - allowed, 0).sum())),
            "never_seen": int((counts == 0).sum()) if e > 0 else 0,
            "dropped": drop_n, "filled": int(meta.get("filled", {}).get(name, 0)),
            "masked_rows": int((plan.weights[sel] == 0).sum()),
        }
    key = _key(plan.dataset_ids, plan.example_ids)
    srt = np.sort(key, axis=1)
    in_batch = int((srt[:, 1:] == srt[:, :-1]).sum()) if S else 0
    out = {"steps": S, "global_batch_size": G, "seed": plan.seed, "mode": meta.get("mode"),
           "sampling": meta.get("sampling"), "strategies": meta.get("strategies", {}), "batches_per_task": tasks,
           "datasets": datasets, "in_batch_repeats": in_batch,
           "dropped_total": int(plan.dropped.shape[0]), "filled_total": int(sum(meta.get("filled", {}).values())),
           "masked_rows": int((plan.weights == 0).sum()), "fingerprint": plan.fingerprint()}
    if "semi_homogeneous" in meta:
        out["semi_homogeneous"] = dict(meta["semi_homogeneous"],
                                       measured_foreign_share=mixing_share(plan, "semi_homogeneous"))
    if "curriculum" in meta:
        out["curriculum"] = meta["curriculum"]
    return out


def mixing_share(plan: Plan, strategy: str | None = None) -> float:
    """Share of rows whose dataset is not one of the datasets of the unit their batch was built from, over the
    batches of units with the given strategy (all batches when None): the measured mixing of semi-homogeneous
    batching (0 for homogeneous plans)."""
    units = plan.meta.get("units", [])
    if plan.steps == 0 or not units:
        return 0.0
    D = len(plan.dataset_names)
    member = np.zeros((len(units), D), bool)
    for k, u in enumerate(units):
        member[k, [plan.dataset_names.index(n) for n in u["datasets"]]] = True
    sel = np.ones(plan.steps, bool)
    if strategy is not None:
        sel = np.isin(plan.unit_ids, [k for k, u in enumerate(units) if u["strategy"] == strategy])
    if not sel.any():
        return 0.0
    home = member[plan.unit_ids[sel]]  # [n, D]
    inside = np.take_along_axis(home, plan.dataset_ids[sel].astype(np.int64), axis=1)
    return float(1.0 - inside.mean())


def format_summary(s: dict) -> str:
    """The summary as text (what `jaxembed plan show` prints)."""
    lines = [f"plan {s['fingerprint']}: {s['steps']} steps x {s['global_batch_size']} (mode {s['mode']}, "
             + ("datasets by size and the task order" if s["mode"] == "curriculum" else f"sampling {s['sampling']}")
             + f", seed {s['seed']})"]
    lines.append("strategies: " + ", ".join(f"{t}={v}" for t, v in s["strategies"].items()))
    lines.append("batches per task: " + ", ".join(f"{t} {n}" for t, n in s["batches_per_task"].items()))
    w = max([len(n) for n in s["datasets"]] + [7])
    lines.append(f"{'dataset':<{w}} {'task':<16} {'size':>8} {'rows':>9} {'epochs':>10} {'seen':>7} "
                 f"{'dropped':>8} {'filled':>7} {'repeats+':>8} {'masked':>7}")
    for n, d in s["datasets"].items():
        star = "*" if d.get("epochs_from") == "sampling" else ""
        lines.append(f"{n:<{w}} {d['task'][:16]:<16} {d['size']:>8} {d['rows']:>9} "
                     f"{format(d['epochs_configured'], '.3g') + star:>10} "
                     f"{d['epochs_seen']:>7.3f} {d['dropped']:>8} {d['filled']:>7} "
                     f"{'-' if d['repeats_beyond_configured'] is None else d['repeats_beyond_configured']:>8} "
                     f"{d['masked_rows']:>7}")
    if any(d.get("epochs_from") == "sampling" for d in s["datasets"].values()):
        lines.append(f"* epochs from {s['sampling']} sampling (the datasets without explicit epochs share one pass)")
    lines.append(f"dropped remainder: {s['dropped_total']} examples; filled: {s['filled_total']} rows; "
                 f"in-batch repeats: {s['in_batch_repeats']}; masked rows (weight 0): {s['masked_rows']}")
    if "semi_homogeneous" in s:
        sh = s["semi_homogeneous"]
        lines.append(f"semi-homogeneous: proportion {sh['proportion']} ({sh['rows_per_batch']} rows of each of "
                     f"{sh['batches']} batches shuffled); measured foreign share {sh['measured_foreign_share']:.3f}")
    if "curriculum" in s:
        c = s["curriculum"]
        short = c.get("fraction_of_one_pass", 1.0)
        lines.append(f"curriculum: unit {c['unit']}, walk {c.get('walk', 'cyclic')}, instance order "
                     f"{c['instance_order']}, rounds {c['rounds']}, "
                     + (f"{short:.1%} of one pass (a random subset of each unit, in curriculum order), "
                        if short < 1.0 else "")
                     + f"order {' -> '.join(c['order'][:12])}{' ...' if len(c['order']) > 12 else ''}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------- picture

# drawn with matplotlib in plan_viz.py (the optional viz extra); re-exported for existing callers
from jaxembed.data.plan_viz import render_png  # noqa: E402,F401
