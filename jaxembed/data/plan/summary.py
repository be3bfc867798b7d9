"""What a plan holds, counted (``summarize``: batches per task and dataset, epochs seen, repeats, dropped / filled /
masked rows, the measured semi-homogeneous mixing) and printed (``format_summary``, what ``jaxembed plan show``
prints)."""

from __future__ import annotations

import math

import numpy as np

from jaxembed.data.plan.file import Plan, block_of, read_steps
from jaxembed.data.plan.units import pair_key


def _counts_dtype(allowed: int):
    """Per-example counts of a dataset: 2 bytes an example (saturating) while an example's count that matters stays
    far below 65,535."""
    return np.uint16 if allowed < 60_000 else np.int64


class _Tally:
    """What ``summarize`` counts, accumulated over blocks of steps of the plan's per-example arrays (a plan read
    from its file stays memory-mapped: at most a block of it is in memory)."""

    def __init__(self, plan: Plan, allowed: list[int]):
        D = len(plan.dataset_names)
        self.rows, self.single, self.masked = (np.zeros(D, np.int64) for _ in range(3))
        self.counts = [np.zeros(int(n), _counts_dtype(a)) for n, a in zip(plan.dataset_sizes, allowed)]
        self.in_batch = 0

    def add(self, ds: np.ndarray, ex: np.ndarray, w: np.ndarray) -> None:
        D = self.rows.size
        self.rows += np.bincount(ds.reshape(-1), minlength=D)[:D]
        pure = np.all(ds == ds[:, :1], axis=1)
        self.single += np.bincount(ds[pure, 0], minlength=D)[:D]
        self.masked += np.bincount(ds[w == 0], minlength=D)[:D]
        for d in np.unique(ds).tolist():
            u, c = np.unique(ex[ds == d], return_counts=True)
            cnt = self.counts[d]
            top = np.iinfo(cnt.dtype).max
            cnt[u] = np.minimum(cnt[u].astype(np.int64) + c, top).astype(cnt.dtype)
        srt = np.sort(pair_key(ds, ex), axis=1)
        self.in_batch += int((srt[:, 1:] == srt[:, :-1]).sum())


def summarize(plan: Plan) -> dict:
    """Batches per task / dataset, epochs seen, repeats beyond the configured count, dropped and filled rows,
    masked rows, measured semi-homogeneous mixing. Reads the per-example arrays a block of steps at a time."""
    S, G = plan.dataset_ids.shape
    meta = plan.meta
    cfg_epochs = {d["name"]: d["epochs"] for d in meta.get("datasets", [])}
    tasks = {}
    for t in [-1] + list(range(len(plan.task_names))):
        n = int((plan.task_ids == t).sum())
        if n:
            tasks["(mixed)" if t < 0 else plan.task_names[t]] = n
    epochs = [cfg_epochs.get(name, 1.0) for name in plan.dataset_names]
    tally = _Tally(plan, [int(math.ceil(e - 1e-9)) for e in epochs])
    blk = block_of(plan.dataset_ids)
    for s0 in range(0, S, blk):
        tally.add(*(read_steps(a, s0, s0 + blk) for a in (plan.dataset_ids, plan.example_ids, plan.weights)))
    datasets = {}
    for d, name in enumerate(plan.dataset_names):
        rows, size, e, counts = int(tally.rows[d]), int(plan.dataset_sizes[d]), epochs[d], tally.counts[d]
        allowed = int(math.ceil(e - 1e-9))
        datasets[name] = {
            "task": plan.task_names[plan.dataset_tasks[d]], "size": size, "rows": rows,
            "epochs_from": next((x.get("epochs_from", "config") for x in meta.get("datasets", [])
                                 if x["name"] == name), "config"),
            "batches_single_dataset": int(tally.single[d]),
            "epochs_configured": e, "epochs_seen": rows / size if size else 0.0,
            "repeats_beyond_configured": (None if meta.get("mode") == "steps"
                                          else int((counts[counts > allowed].astype(np.int64) - allowed).sum())),
            "never_seen": int((counts == 0).sum()) if e > 0 else 0,
            "dropped": int((plan.dropped[:, 0] == d).sum()), "filled": int(meta.get("filled", {}).get(name, 0)),
            "masked_rows": int(tally.masked[d]),
        }
    out = {"steps": S, "global_batch_size": G, "seed": plan.seed, "mode": meta.get("mode"),
           "sampling": meta.get("sampling"), "strategies": meta.get("strategies", {}), "batches_per_task": tasks,
           "datasets": datasets, "in_batch_repeats": tally.in_batch,
           "dropped_total": int(plan.dropped.shape[0]), "filled_total": int(sum(meta.get("filled", {}).values())),
           "masked_rows": int(tally.masked.sum()), "fingerprint": plan.fingerprint()}
    if "semi_homogeneous" in meta:
        out["semi_homogeneous"] = dict(meta["semi_homogeneous"],
                                       measured_foreign_share=mixing_share(plan, "semi_homogeneous"))
    if "curriculum" in meta:
        out["curriculum"] = meta["curriculum"]
    return out


def mixing_share(plan: Plan, strategy: str | None = None) -> float:
    """Share of rows whose dataset is not one of the datasets of the unit their batch was built from, over the
    batches of units with the given strategy (all batches when None): the measured mixing of semi-homogeneous
    batching (0 for homogeneous plans). Reads the dataset ids a block of steps at a time."""
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
    inside, total = 0, 0
    blk = block_of(plan.dataset_ids)
    for s0 in range(0, plan.steps, blk):
        m = sel[s0:s0 + blk]
        if not m.any():
            continue
        ds = read_steps(plan.dataset_ids, s0, s0 + blk)[m]
        home = member[plan.unit_ids[s0:s0 + blk][m]]  # [n, D]
        inside += int(np.take_along_axis(home, ds.astype(np.int64), axis=1).sum())
        total += ds.size
    return float(1.0 - inside / total)


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
