"""Sampled plans: the ``random``, ``homogeneous``, ``heterogeneous`` and ``semi_homogeneous`` strategies in epoch
mode (every unit's batches spread evenly over the plan; remainders dropped or filled) and step mode (units drawn by
their sampling probability, streaming through shuffled passes), with in-batch repeats swapped out. The strategies
and the two modes are described in ``jaxembed.data.plan``."""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxembed.data.plan import blocks
from jaxembed.data.plan.config import STRATEGIES, config_error
from jaxembed.data.plan.passes import Feed, dedupe_stream, pass_size, sorted_pass
from jaxembed.data.plan.units import (
    R_FILL, R_ORDER, R_POOL, R_STEPS, Unit, check_unit_size, pair_key, seeded_rng,
)
from jaxembed.errors import UserError


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


def _rows_block(parts, G: int, R: int) -> int:
    """Rows de-duplicated at a time: all of them in memory, a block of steps with a scratch folder."""
    return R if parts.folder is None else blocks.block_steps(G)


def _epoch_unit(k, members, n, seed, sizes, epochs, G, drop_remainder, parts, filled, dropped) -> int:
    """Epoch mode, unit k: its pass (``R_POOL``) in batches; the remainder dropped (its rows to ``dropped``) or
    the last batch filled from the unit's next pass (``R_FILL``), skipping examples already in that batch; then
    de-duplicated and stored as one part. Returns the repeats left."""
    folder = parts.folder
    feed = Feed(sorted_pass(seeded_rng(seed, R_POOL, k, 0), members, sizes, epochs, folder))
    nb, r = divmod(n, G)
    fill = bool(r) and not drop_remainder
    given = [0]

    def pull(m):
        a = min(m, nb - given[0])
        d, e = feed.take(a * G)
        given[0] += a
        d, e = d.reshape(a, G), e.reshape(a, G)
        if m > a:  # the filled last batch
            rd, re_ = feed.take(r)
            fd, fe = _fill(k, members, rd, re_, G - r, seed, sizes, epochs, folder, filled)
            d = np.concatenate([d, np.concatenate([rd, fd])[None]])
            e = np.concatenate([e, np.concatenate([re_, fe])[None]])
        return d, e

    parts.begin()
    R = nb + fill
    left = dedupe_stream(pull, R, parts.extend, _rows_block(parts, G, R), dedupe_batches)
    parts.end()
    if r and not fill:
        rd, re_ = feed.take(r)
        dropped.append(np.stack([rd.astype(np.int64), re_], 1))
    feed.close()
    return left


def _fill(k, members, rd, re_, need, seed, sizes, epochs, folder, filled):
    """The first ``need`` examples of unit k's next pass that the last batch (rows rd, re_) does not hold."""
    have = list(set(pair_key(rd, re_).tolist()))
    feed = Feed(sorted_pass(seeded_rng(seed, R_FILL, k, 1), members, sizes, epochs, folder))
    got_d, got_e = [], []
    while need > 0:
        d2, e2 = feed.take(max(need, 1 << 16))
        if d2.size == 0:
            break
        take = np.flatnonzero(~np.isin(pair_key(d2, e2), have))[:need]
        got_d.append(d2[take])
        got_e.append(e2[take])
        need -= take.size
    feed.close()
    d, e = np.concatenate(got_d), np.concatenate(got_e)
    np.add.at(filled, d, 1)
    return d, e


def _step_unit(k, members, nsel, seed, sizes, epochs, G, parts) -> int:
    """Step mode, unit k: its passes (``R_POOL``, pass p) one after the other, cut into nsel batches and one of
    slack for the de-duplication's swaps; the nsel batches stored as one part. Returns the repeats left."""
    folder = parts.folder

    def passes():
        p = 0
        while True:
            yield from sorted_pass(seeded_rng(seed, R_POOL, k, p), members, sizes, epochs, folder)
            p += 1

    feed = Feed(passes())
    kept = [0]

    def pull(m):
        d, e = feed.take(m * G)
        return d.reshape(m, G), e.reshape(m, G)

    def emit(d, e):
        m = max(0, min(d.shape[0], nsel - kept[0]))
        if m:
            parts.extend(d[:m], e[:m])
        kept[0] += m

    parts.begin()
    R = nsel + 1
    left = dedupe_stream(pull, R, emit, _rows_block(parts, G, R), dedupe_batches)
    parts.end()
    feed.close()
    return left


def build_sampled(cfg, infos, task_names, dataset_tasks, sizes, epochs, dweights, sampling, temp, seed, G, parts):
    """-> (owner, idx, info): step s is batch idx[s] of unit owner[s], whose batches are part owner[s] of
    ``parts`` (a ``blocks.Parts``). The semi-homogeneous mixing is left to the caller (info["_semi"])."""
    strategies, units = _resolve_units(infos, cfg, task_names, dataset_tasks)
    n_pass = [pass_size(u.members, sizes, epochs) for u in units]
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
            unresolved += _epoch_unit(k, u.members, n_pass[k], seed, sizes, epochs, G, cfg["drop_remainder"],
                                      parts, filled, dropped)
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
            unresolved += _step_unit(k, u.members, sel.size, seed, sizes, epochs, G, parts)

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
