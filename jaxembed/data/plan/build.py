"""``build_plan``: the entry point. Merges and checks the config, takes the sampling defaults from the data config
or the store, reads the scores, builds the batches (``sampling`` or ``curriculum``), applies the Eq. 9 mask and
sets every batch's task and temperature; a pure function of its inputs."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from jaxembed.data.plan.config import (
    SAMPLING, _bad, _config_dict, _merged_config, validate_data_defaults, validate_plan_config,
)
from jaxembed.data.plan.curriculum import _build_curriculum
from jaxembed.data.plan.file import Plan, _validate_plan
from jaxembed.data.plan.inputs import _infos, instance_mask, load_scores
from jaxembed.data.plan.sampling import _build_sampled, _sampled_epochs
from jaxembed.errors import UserError


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
