"""Sampled plans: the ``random``, ``homogeneous``, ``heterogeneous`` and ``semi_homogeneous`` strategies in epoch
mode (every unit's batches spread evenly over the plan; remainders dropped or filled) and step mode (units drawn by
their sampling probability, streaming through shuffled passes), with in-batch repeats swapped out. The strategies
and the two modes are described in ``jaxembed.data.plan``."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from jaxembed.data.plan.config import STRATEGIES, config_error
from jaxembed.data.plan.units import (
    R_FILL, R_ORDER, R_POOL, R_SEMI, R_STEPS, Unit, check_unit_size, pair_key, seeded_rng,
)
from jaxembed.errors import UserError


def _pass(rng: np.random.Generator, members: Sequence[int], sizes: np.ndarray, epochs: np.ndarray):
    """One pass over a unit: dataset d contributes epochs[d] copies of its examples (a fractional part: a random
    subset). Copy c of dataset d gets random keys in [c/E_d, (c+1)/E_d): sorting spreads every dataset evenly
    over the pass, and copies of one example never meet inside one copy. -> (ds int32 [n], ex int64 [n])."""
    if len(members) == 1:
        return _pass_one(rng, int(members[0]), int(sizes[members[0]]), float(epochs[members[0]]))
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


def _pass_one(rng: np.random.Generator, d: int, size: int, e: float):
    """``_pass`` over one dataset, sorted one copy at a time: copy c's keys all lie in [c/E, (c+1)/E] (a key that
    rounds up to (c+1)/E is still the last of its copy under the stable sort), so the stable sort of all the keys
    is the copies' own sorts one after the other. The same draws in the same order, the same result, with one
    copy's keys in memory instead of every copy's."""
    if size == 0 or e <= 0:
        return np.zeros(0, np.int32), np.zeros(0, np.int64)
    full = int(math.floor(e + 1e-9))
    frac = e - full
    extra = int(round(frac * size))
    ex = np.empty(full * size + max(extra, 0), np.int64)
    for c in range(full):
        ex[c * size:(c + 1) * size] = np.argsort((c + rng.random(size)) / e, kind="stable")
    if extra > 0:
        keys = (full + rng.random(extra) * frac) / e
        sub = np.sort(rng.permutation(size)[:extra]).astype(np.int64)
        ex[full * size:] = sub[np.argsort(keys, kind="stable")]
    return np.full(ex.size, d, np.int32), ex


def _first_not_in(row: np.ndarray, held: np.ndarray, added: set[int], block: int = 256) -> int:
    """The first position of ``row`` whose value is neither in ``held`` (sorted) nor in ``added``, or -1. Looked
    up a block of the row at a time (binary search), stopping at the first block that has one: a repeat's swap
    costs O(block log G), not an array of every value the batch holds (O(G) per repeat, O(G^2) for a batch at an
    epoch's seam, where thousands of repeats meet)."""
    for s in range(0, row.size, block):
        blk = row[s:s + block]
        pos = np.minimum(np.searchsorted(held, blk), held.size - 1)
        for q in np.flatnonzero(held[pos] != blk).tolist():
            if int(blk[q]) not in added:
                return s + q
    return -1


def dedupe_batches(ds: np.ndarray, ex: np.ndarray, window: int = 64, start: int = 0, stop: int | None = None) -> int:
    """In place, on [n, G] arrays: swap a repeated example out of its batch with an example of a nearby batch
    (later first, then earlier) such that neither batch then holds a repeat. Keeps the multiset of examples.
    Returns the number of repeats that could not be resolved (tiny datasets). Only the batches [start, stop) are
    examined (their swaps reach ``window`` batches either side): a swap never makes a repeat, so going through
    the rows in blocks, in order, gives the same result as all at once."""
    n, G = ds.shape
    if n == 0 or G < 2:
        return 0
    stop = n if stop is None else stop
    key = pair_key(ds, ex)
    bad_rows = []
    chunk = max(1, (1 << 16) // G)
    for r0 in range(start, stop, chunk):  # sorted a chunk of rows at a time
        srt = np.sort(key[r0:min(stop, r0 + chunk)], axis=1)
        bad_rows.extend((r0 + np.flatnonzero(np.any(srt[:, 1:] == srt[:, :-1], axis=1))).tolist())
    unresolved = 0
    for i in bad_rows:
        held = np.unique(key[i])  # the examples batch i holds, sorted; swapped-in ones go to `seen` too
        seen: set[int] = set()
        dup_pos = []
        for p in range(G):
            k = int(key[i, p])
            if k in seen:
                dup_pos.append(p)
            else:
                seen.add(k)
        added: set[int] = set()
        for p in dup_pos:
            k = int(key[i, p])
            done = False
            cands = list(range(i + 1, min(n, i + 1 + window))) + list(range(i - 1, max(-1, i - 1 - window), -1))
            for j in cands:
                row_j = key[j]
                if np.any(row_j == k):
                    continue
                q = _first_not_in(row_j, held, added)  # the first example of batch j that batch i does not hold
                if q < 0:
                    continue
                x = int(row_j[q])
                # swap (i, p) <-> (j, q)
                key[i, p], key[j, q] = x, k
                ds[i, p], ds[j, q] = ds[j, q], ds[i, p]
                ex[i, p], ex[j, q] = ex[j, q], ex[i, p]
                seen.add(x)
                added.add(x)
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
        raise config_error("task_strategies", f"unknown tasks {unknown} (tasks: {task_names})", "use the data config's "
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
    units: list[Unit] = []
    mixed = None
    for t, tname in enumerate(task_names):
        members = [d for d in range(len(infos)) if dataset_tasks[d] == t]
        s = strategies[tname]
        if s == "random":
            if mixed is None:
                mixed = Unit("mixed", "random", [])
                units.append(mixed)
            mixed.members.extend(members)
        elif s == "heterogeneous":
            units.append(Unit(tname, s, members))
        else:
            units.extend(Unit(infos[d].name, s, [d]) for d in members)
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
        raise config_error("sampling_temperature", "sampling='temperature' needs a temperature",
                   "set plan sampling_temperature (or the data config's), e.g. 2.0")
    q = n_d / max(n_d.sum(), 1.0)
    return np.where(q > 0, q ** (1.0 / temp), 0.0)


def sampled_epochs(sizes, epochs, explicit, weights, sampling: str, temp: float | None, plan_epochs: float):
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


def _sampling_probs(units: list[Unit], sizes, epochs, weights, sampling: str, temp: float | None, infos):
    p_d = _dataset_probs(sizes.astype(np.float64) * epochs, weights, sampling, temp)
    p_u = np.array([p_d[u.members].sum() for u in units])
    if p_u.sum() <= 0:
        raise UserError("every dataset has sampling probability 0 (fix: positive weights / epochs)")
    return p_u / p_u.sum(), p_d / p_d.sum()


def build_sampled(cfg, infos, task_names, dataset_tasks, sizes, epochs, dweights, sampling, temp, seed, G, parts):
    """-> (owner, idx, info): step s is batch idx[s] of unit owner[s], whose batches are part owner[s] of
    ``parts`` (a ``blocks.Parts``). The semi-homogeneous mixing is left to the caller (info["_semi"])."""
    strategies, units = _resolve_units(infos, cfg, task_names, dataset_tasks)
    n_pass = [int(sum(int(round((epochs[d] - math.floor(epochs[d] + 1e-9)) * sizes[d]))
                      + int(math.floor(epochs[d] + 1e-9)) * int(sizes[d]) for d in u.members)) for u in units]
    for u, n in zip(units, n_pass):
        check_unit_size(u, n, G, infos, "unit")
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
    dropped, filled = [], np.zeros(len(infos), np.int64)
    unresolved = 0
    if steps == 0:
        for k, u in enumerate(units):
            ds, ex = _pass(seeded_rng(seed, R_POOL, k, 0), u.members, sizes, epochs)
            nb, r = divmod(ds.size, G)
            if r and not cfg["drop_remainder"]:
                # fill the last batch from the unit's next pass, skipping examples already in that batch
                ds2, ex2 = _pass(seeded_rng(seed, R_FILL, k, 1), u.members, sizes, epochs)
                have = set(pair_key(ds[nb * G:], ex[nb * G:]).tolist())
                ok = ~np.isin(pair_key(ds2, ex2), list(have))
                take = np.flatnonzero(ok)[:G - r]
                ds = np.concatenate([ds, ds2[take]])
                ex = np.concatenate([ex, ex2[take]])
                np.add.at(filled, ds2[take], 1)
                nb += 1
            elif r:
                dropped.append(np.stack([ds[nb * G:], ex[nb * G:]], 1))
            # views of the pass (changed in place by the de-duplication; the dropped rows were copied out)
            bd, be = ds[:nb * G].reshape(nb, G), ex[:nb * G].reshape(nb, G)
            unresolved += dedupe_batches(bd, be)
            parts.add(bd, be)
            del bd, be, ds, ex
        # order: an even interleave -- batch j of a unit with n batches sits at a random point of [j/n, (j+1)/n)
        times, owner, idx = [], [], []
        rng = seeded_rng(seed, R_ORDER)
        for k in range(len(units)):
            n = parts.batches(k)
            times.append((np.arange(n) + rng.random(n)) / n)
            owner.append(np.full(n, k))
            idx.append(np.arange(n))
        times, owner, idx = np.concatenate(times), np.concatenate(owner), np.concatenate(idx)
        order = np.argsort(times, kind="stable")
        owner, idx = owner[order], idx[order]
    else:
        owner = seeded_rng(seed, R_STEPS).choice(len(units), size=steps, p=p_u)
        idx = np.zeros(steps, np.int64)
        for k, u in enumerate(units):
            sel = np.flatnonzero(owner == k)
            idx[sel] = np.arange(sel.size)
            need = sel.size * G
            parts_d, parts_e, have, p = [], [], 0, 0
            while have < need + G:  # one batch of slack for the de-duplication swaps
                d_, e_ = _pass(seeded_rng(seed, R_POOL, k, p), u.members, sizes, epochs)
                parts_d.append(d_)
                parts_e.append(e_)
                have += d_.size
                p += 1
            ds = np.concatenate(parts_d)[:need + G].reshape(-1, G).copy()
            ex = np.concatenate(parts_e)[:need + G].reshape(-1, G).copy()
            unresolved += dedupe_batches(ds, ex)
            parts.add(ds[:sel.size], ex[:sel.size])
            del ds, ex, parts_d, parts_e

    # semi-homogeneous: a proportion of every batch's rows is pulled, shuffled across batches and put back, on
    # the assembled plan (``blocks.semi_swap``)
    semi_units = [k for k, u in enumerate(units) if u.strategy == "semi_homogeneous"]
    if semi_units:
        prop = float(cfg["semi_homogeneous_proportion"])
        m = int(round(prop * G))
        info["semi_homogeneous"] = {"proportion": prop, "rows_per_batch": m,
                                    "batches": int(np.isin(owner, semi_units).sum())}
        info["_semi"] = (semi_units, m)
    info["batches_per_unit"] = {u.name: int((owner == k).sum()) for k, u in enumerate(units)}
    info["_unit_ids"] = owner
    info["filled"] = {infos[d].name: int(filled[d]) for d in range(len(infos)) if filled[d]}
    info["unresolved_in_batch_repeats"] = int(unresolved)
    info["_dropped"] = np.concatenate(dropped) if dropped else np.zeros((0, 2), np.int64)
    info["dropped"] = {infos[d].name: int((info["_dropped"][:, 0] == d).sum())
                       for d in np.unique(info["_dropped"][:, 0]).tolist()}
    return owner, idx, info
