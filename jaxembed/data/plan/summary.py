"""What a plan holds, counted (``summarize``: batches per task and dataset, epochs seen, repeats, dropped / filled /
masked rows, the measured semi-homogeneous mixing) and printed (``format_summary``, what ``jaxembed plan show``
prints)."""

from __future__ import annotations

import math

import numpy as np

from jaxembed.data.plan.file import Plan
from jaxembed.data.plan.units import pair_key


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
    key = pair_key(plan.dataset_ids, plan.example_ids)
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
