"""The ``jaxembed curriculum`` job (Data-CUBE 3.1, 3.2): from the scores of ``jaxembed score``, solve the task order
(Eq. 6 / 7, ``jaxembed.curriculum.order``), order each unit's instances by phi and count the Eq. 9 mask, then write
the files ``jaxembed plan build`` reads (``run_curriculum``); the summary's terminal lines (``format_curriculum``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jaxembed.curriculum.score import write_json
from jaxembed.errors import UserError


def _plan_units(store, unit: str) -> dict[str, list[int]]:
    """The units ``plan`` orders: those with a dataset of epochs > 0 and size > 0."""
    from jaxembed.curriculum.similarity import curriculum_units

    units = curriculum_units(store.datasets, unit)
    ok = lambda d: store.datasets[d].size > 0 and (store.datasets[d].epochs is None or store.datasets[d].epochs > 0)
    return {u: m for u, m in units.items() if any(ok(d) for d in m)}



def run_curriculum(scores_dir, out, *, store=None, objective: str = "max", solver: str = "anneal",
                   iterations: int = 2_000_000, tau0: float | None = None, cooling: float | None = None,
                   patience: int = 0, kicks: int = 200, seed: int = 0, instance_order: str = "e2d",
                   delta: float | None = None, mask_direction: str = "text", walk: str = "cyclic") -> dict:
    """The ``jaxembed curriculum`` job: reads ``scores_dir`` (jaxembed score), writes task_order.json,
    instance_orders.npz, plan_curriculum.json and curriculum_summary.json into ``out``. -> the summary."""
    from jaxembed.curriculum import difficulty as dif
    from jaxembed.curriculum import order as O
    from jaxembed.curriculum.similarity import load_similarity
    from jaxembed.data.plan import load_scores, save_instance_orders
    from jaxembed.data.store import Store

    from jaxembed.data.plan import WALKS

    if walk not in WALKS:
        raise UserError(f"--walk {walk!r}: one of {', '.join(WALKS)}")
    scores_dir, out = Path(scores_dir), Path(out)
    S, names, unit, meta = load_similarity(scores_dir / "task_similarity.npz")
    if store is None:
        sp = meta.get("store")
        if not sp:
            raise UserError(f"{scores_dir}: the scores name no store (fix: pass --store DIR)")
        store = Store.open(sp)
    elif not hasattr(store, "datasets"):
        store = Store.open(store)
    units = _plan_units(store, unit)
    missing = [u for u in units if u not in names]
    if missing:
        raise UserError(f"{scores_dir / 'task_similarity.npz'}: no similarity for {unit}s {missing} of the store "
                        f"{store.path} (fix: run jaxembed score on this store)")
    keep = [names.index(u) for u in units]
    dropped_units = [n for n in names if n not in units]
    S = S[np.ix_(keep, keep)]
    names = list(units)
    res = O.solve(S, objective=objective, solver=solver, iterations=iterations, tau0=tau0, cooling=cooling,
                  patience=patience, seed=seed, kicks=kicks)
    order = [names[i] for i in res.order]
    rand_mean, rand_std = O.random_baseline(S, 1000, seed)
    values = {"chosen": res.value, "store_order": O.cyclic_objective(S, np.arange(len(names))),
              "random_mean": rand_mean, "random_std": rand_std}

    scores_path = scores_dir / "scores.npz"
    scores = load_scores(scores_path, store) if scores_path.exists() else None
    if scores is None and (instance_order != "random" or delta is not None):
        raise UserError(f"{scores_path}: no per-example scores (jaxembed score --similarity-only?) but "
                        f"--instance-order {instance_order} / --delta need them (fix: run jaxembed score without "
                        "--similarity-only, or --instance-order random and no --delta)")
    ds_names = [i.name for i in store.datasets]
    sizes = [i.size for i in store.datasets]
    orders = dif.instance_orders(units, sizes, ds_names, instance_order, scores, seed)
    out.mkdir(parents=True, exist_ok=True)
    task_order_path, io_path = out / "task_order.json", out / "instance_orders.npz"
    write_json(task_order_path, {"order": order, "unit": unit, "objective": objective, "solver": res.solver,
                                  "value": res.value, "values": values, "params": res.params,
                                  "similarity": str((scores_dir / "task_similarity.npz").resolve())})
    save_instance_orders(io_path, orders, ds_names)  # binary: the plan maps it and reads one unit at a time
    mask = None
    if scores is not None:
        deltas = sorted({-0.1, 0.0, 0.05, 0.1} | ({float(delta)} if delta is not None else set()))
        total = sum(len(v) for v in scores.values())
        mask = {f"{x:g}": {"masked": sum(dif.mask_counts(scores, x, mask_direction).values()), "of": total}
                for x in deltas}
    snippet = {"scores": str(scores_path.resolve()) if scores is not None else "",
               "mask": {"delta": delta, "direction": mask_direction},
               "curriculum": {"enabled": True, "unit": unit, "walk": walk,
                              "task_order": str(task_order_path.resolve()),
                              "instance_order": "given", "instance_orders": str(io_path.resolve())}}
    write_json(out / "plan_curriculum.json", snippet)
    summary = {"unit": unit, "units": len(names), "order": order, "objective": objective, "solver": res.solver,
               "values": values, "seconds_solver": round(res.seconds, 3), "iterations": res.iterations,
               "accepted": res.accepted, "params": res.params, "instance_order": instance_order,
               "delta": delta, "mask_direction": mask_direction,
               "masked_at_delta": dif.mask_counts(scores, delta, mask_direction) if (
                   scores is not None and delta is not None) else None,
               "mask_counts": mask, "units_without_data": dropped_units, "plan_config": snippet,
               "set_args": plan_set_args(snippet)}
    write_json(out / "curriculum_summary.json", summary)
    return summary


def plan_set_args(snippet: dict) -> list[str]:
    """``--set KEY=VALUE`` arguments of ``jaxembed plan build`` equal to the snippet."""
    def flat(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from flat(v, prefix + k + ".")
            else:
                yield f"{prefix}{k}={'none' if v is None else (str(v).lower() if isinstance(v, bool) else v)}"

    return [a for a in flat(snippet) if a != "scores="]



def format_curriculum(s: dict, out) -> str:
    """The terminal lines of a curriculum summary: the order, its objective against the baselines, the mask, the
    files and the next command."""
    v = s["values"]
    out = Path(out)
    lines = [f"task order ({s['units']} {s['unit']}s, objective {s['objective']}, solver {s['solver']}, "
             f"{s['seconds_solver']:.2f}s" + (f", {s['iterations']} iterations" if s["iterations"] else "") + "):",
             "  " + " -> ".join(s["order"]) + " -> (back to the first)",
             f"Eq. 6 cyclic similarity: {v['chosen']:.4f} (store order {v['store_order']:.4f}, random orders "
             f"{v['random_mean']:.4f} +- {v['random_std']:.4f})"]
    if s["mask_counts"]:
        of = next(iter(s["mask_counts"].values()))["of"]
        lines.append("Eq. 9 mask (" + s["mask_direction"] + "): examples with weight 0 at delta " + ", ".join(
            f"{k}: {c['masked']}" for k, c in s["mask_counts"].items()) + f" (of {of})")
    if s["units_without_data"]:
        lines.append(f"note: {s['units_without_data']} have no data to train (epochs 0) and are not ordered")
    lines.append(f"wrote {out / 'task_order.json'}, {out / 'instance_orders.npz'}, {out / 'plan_curriculum.json'}")
    lines.append(f"next: jaxembed plan build --store STORE --config {out / 'plan_curriculum.json'} "
                 "--set global_batch_size=64 --out PLAN.npz")
    lines.append("  (or add to your plan config: " + " ".join(f"--set {a}" for a in s["set_args"]) + ")")
    return "\n".join(lines)
