"""``build_plan``: the entry point. Merges and checks the config, takes the sampling defaults from the data config
or the store, reads the scores, builds the batches (``sampling`` or ``curriculum``), applies the Eq. 9 mask and
sets every batch's task and temperature; a pure function of its inputs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from jaxembed.data.plan import blocks
from jaxembed.data.plan.config import (
    SAMPLING, config_error, as_plain_dict, merged_config, validate_data_defaults, validate_plan_config,
)
from jaxembed.data.plan.curriculum import build_curriculum
from jaxembed.data.plan.file import Plan, validate_plan
from jaxembed.data.plan.inputs import dataset_infos, instance_mask, load_scores
from jaxembed.data.plan.sampling import build_sampled, dedupe_batches, sampled_epochs
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
    """Build a plan in memory. datasets: a Store or a list of DatasetInfo (name, task, size, batching, epochs,
    weight, temperature, ...). config: a plan config (ConfigDict or dict; missing fields take the defaults).
    scores / task_order / instance_orders override the files named in the config (arrays or mappings, see
    ``load_scores`` etc.). data_config: the data config, for the defaults of sampling, sampling_temperature and
    seed. Pure: the same inputs give the same plan."""
    plan = _build(datasets, config, scores, task_order, instance_orders, data_config, None)
    validate_plan(plan, "built plan")
    return plan


def build_plan_file(path, datasets, config=None, *, scores=None, task_order=None, instance_orders=None,
                    data_config=None, sidecar: dict | None = None) -> Plan:
    """``build_plan``, written to ``path`` (``plan.npz`` + ``plan.json``, as ``Plan.save``) in blocks of steps:
    the units' passes (``passes``: bucket files), batches and the plan's rows go through a scratch folder beside
    ``path``, so the process holds a bucket of a unit's pass or curriculum order and one block of steps
    at a time, never the whole plan. The file equals
    ``build_plan(...).save(path)``. ``sidecar``: extra fields for plan.json. Returns the saved plan, mapped."""
    path = Path(path)
    folder = blocks.scratch_folder(path)
    try:
        plan = _build(datasets, config, scores, task_order, instance_orders, data_config, folder)
        plan.save(path, sidecar=sidecar)  # its block digests: Plan.load checks them, each block when first read
        del plan
    finally:
        blocks.remove_scratch(folder)
    return Plan.load(path)


def _inputs(datasets, config, scores, task_order, instance_orders, data_config) -> dict:
    """The checked config and the tables the builders read (everything but the batches)."""
    cfg = merged_config(config)
    # inputs given as arguments stand in for the config's file names (recorded as such in plan.config)
    if scores is not None:
        cfg["scores"] = "(given to build_plan)"
    if task_order is not None:
        cfg["curriculum"]["task_order"] = [str(t) for t in np.asarray(task_order).tolist()]
    if instance_orders is not None:
        cfg["curriculum"]["instance_orders"] = "(given to build_plan)"
    validate_plan_config(cfg)
    infos = dataset_infos(datasets)
    if not infos:
        raise UserError("the store has no datasets (fix: add datasets to the data config)")
    if data_config is not None:
        dc = as_plain_dict(data_config)
        validate_data_defaults(dc, "the data config")
    else:  # a store remembers its data config's sampling and seed
        mf = getattr(datasets, "manifest", None) or {}
        dc = {k: mf[k] for k in ("sampling", "sampling_temperature", "seed") if k in mf}
        validate_data_defaults(dc, f"{getattr(datasets, 'path', 'the store')}/manifest.json")
    sampling = cfg["sampling"] or dc.get("sampling") or "size"
    if sampling not in SAMPLING:
        raise config_error("sampling", f"unknown value {sampling!r}", f"one of {', '.join(SAMPLING)}")
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
        epochs = sampled_epochs(sizes, epochs, explicit, dweights, sampling, temp, float(cfg["epochs"]))

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
    return dict(cfg=cfg, infos=infos, names=names, task_names=task_names, dataset_tasks=dataset_tasks, sizes=sizes,
                epochs=epochs, dweights=dweights, temps=temps, score_map=score_map, meta=meta, sampling=sampling,
                temp=temp, seed=seed, G=G)


def _build(datasets, config, scores, task_order, instance_orders, data_config, folder) -> Plan:
    """The plan, its rows in memory (``folder`` None) or in raw files of ``folder`` (``blocks.Rows``)."""
    x = _inputs(datasets, config, scores, task_order, instance_orders, data_config)
    cfg, infos, G, seed, meta = x["cfg"], x["infos"], x["G"], x["seed"], x["meta"]
    parts = blocks.Parts(G, folder)
    try:
        if cfg["curriculum"]["enabled"]:
            owner, idx, info = build_curriculum(cfg, infos, x["task_names"], x["dataset_tasks"], x["sizes"],
                                                 x["epochs"], x["score_map"], task_order, instance_orders, seed, G,
                                                 parts)
        else:
            owner, idx, info = build_sampled(cfg, infos, x["task_names"], x["dataset_tasks"], x["sizes"],
                                              x["epochs"], x["dweights"], x["sampling"], x["temp"], seed, G, parts)
        S = int(owner.size)
        block = blocks.block_steps(G) if folder is not None else max(S, 1)
        rows = blocks.Rows(S, G, folder)
        for s0 in range(0, S, block):
            ds, ex = blocks.assemble(parts, owner, idx, s0, s0 + block)
            rows.write("dataset_ids", s0, ds)
            rows.write("example_ids", s0, ex)
    finally:
        parts.close()
    try:
        dropped = info.pop("_dropped")
        unit_ids = info.pop("_unit_ids")
        semi = info.pop("_semi", None)
        if semi is not None:
            info["unresolved_in_batch_repeats"] += blocks.semi_swap(rows, owner, semi[0], semi[1], seed, block,
                                                                    dedupe_batches)
        meta.update(info)
        task_ids, temperatures, masked = _weights_and_meta(rows, x, block)
    finally:
        rows.close()
    if cfg["mask"]["delta"] is not None:
        meta["masked_rows"] = masked
    return Plan(rows.array("dataset_ids"), rows.array("example_ids"), task_ids, rows.array("weights"), temperatures,
                tuple(x["task_names"]), tuple(x["names"]), x["dataset_tasks"], x["sizes"], cfg, int(seed), meta,
                dropped.astype(np.int64).reshape(-1, 2), unit_ids.astype(np.int32))


def _weights_and_meta(rows, x: dict, block: int):
    """Per block of steps: the rows' weights (Eq. 9 mask), each batch's task and temperature.
    -> (task_ids int32 [S], temperatures float32 [S], masked rows)."""
    cfg, names, S = x["cfg"], x["names"], rows.S
    delta = cfg["mask"]["delta"]
    alpha = {}
    if delta is not None:
        used = np.zeros(len(names), bool)
        for s0 in range(0, S, block):
            used[np.unique(rows.read("dataset_ids", s0, s0 + block))] = True
        missing = [n for k, n in enumerate(names) if n not in x["score_map"] and used[k]]
        if missing:
            raise UserError(f"the mask needs scores for datasets {missing} (fix: score every dataset, or set "
                            "mask.delta=None)")
        alpha = {d: instance_mask(x["score_map"][names[d]], delta, cfg["mask"]["direction"])
                 for d in np.flatnonzero(used).tolist()}
    task_ids, temps = np.empty(S, np.int32), np.empty(S, np.float32)
    masked = 0
    for s0 in range(0, S, block):
        ds, ex = rows.read("dataset_ids", s0, s0 + block), rows.read("example_ids", s0, s0 + block)
        w = np.ones(ds.shape, np.float32)
        for d, a in alpha.items():
            sel = ds == d
            w[sel] = a[ex[sel]]
        masked += int((w == 0).sum())
        rows.write("weights", s0, w)
        task_ids[s0:s0 + ds.shape[0]], temps[s0:s0 + ds.shape[0]] = _batch_meta(
            ds, x["dataset_tasks"], x["temps"], x["task_names"], x["infos"])
    return task_ids, temps, masked
