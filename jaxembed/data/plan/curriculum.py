"""Curriculum plans (Data-CUBE Algorithm 1, lines 18-25): every unit's instances sorted by difficulty, the walk
over the task order (``walk_order``: Algorithm 1's cyclic walk or jaxembed's balanced one), rounds for several or
fractional epochs, and a step mode shorter than one pass compressed to a random subset of every unit."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from jaxembed.data.plan.config import WALKS, config_error
from jaxembed.data.plan.inputs import load_instance_orders, load_task_order
from jaxembed.data.plan.units import R_CURR, R_FRAC, R_SHORT, Unit, check_unit_size, pair_key, seeded_rng
from jaxembed.errors import UserError


def walk_order(batches: Sequence[int], walk: str = "cyclic") -> tuple[np.ndarray, np.ndarray]:
    """The order in which a curriculum takes its units' batches (docs/design.md, Data-CUBE: Algorithm 1, lines
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
        raise config_error("curriculum.walk", f"unknown value {walk!r}", "'cyclic' (Algorithm 1) or 'balanced'")
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


def build_curriculum(cfg, infos, task_names, dataset_tasks, sizes, epochs, score_map, task_order,
                      instance_orders, seed, G, parts):
    """-> (owner, idx, info): step s is batch idx[s] of part owner[s] of ``parts`` (a ``blocks.Parts``: one part
    per unit and round; the units' instance orders are kept there too, one unit in memory at a time)."""
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
            perm = seeded_rng(seed, R_CURR, unit_names.index(u)).permutation(ds.size)
            return ds[perm], ex[perm]
        sc = np.concatenate([score_map[infos[d].name] for d in members])
        # E2D: phi descending; ties broken by (dataset, index) -- lexsort's last key is the primary one
        o = np.lexsort((ex, ds, -sc if io == "e2d" else sc))
        return ds[o], ex[o]

    base = {u: parts.keep(f"unit{k}", *sorted_instances(u, m)) for k, (u, m) in enumerate(units.items())}
    rounds = int(math.ceil(max(epochs[d] for m in units.values() for d in m) - 1e-9))
    steps = int(cfg["steps"])

    def round_rows(u: str, r: int) -> tuple[np.ndarray, np.ndarray]:
        """The unit's rows of round r, in its instance order: every example of the datasets with a full epoch
        left, a random subset for a fractional epoch."""
        rr = r % max(rounds, 1)
        ds, ex = parts.load(base[u])
        keep = np.zeros(ds.size, bool)
        for d in units[u]:
            sel = np.flatnonzero(ds == d)
            full = int(math.floor(epochs[d] + 1e-9))
            if rr < full:
                keep[sel] = True
            elif rr == full:
                extra = int(round((epochs[d] - full) * sizes[d]))
                keep[sel[np.sort(seeded_rng(seed, R_FRAC, d, r).permutation(sel.size)[:extra])]] = True
        return ds[keep], ex[keep]

    # step mode with fewer steps than the first pass: the whole curriculum, compressed. Unit u gets n_u batches
    # (its share of the pass), filled with a uniform random subset of its rows kept in the unit's instance order,
    # so a short run still goes easy -> difficult through every task instead of stopping after each one's
    # easiest batches. Exactly `steps` batches, nothing truncated.
    first = {u: round_rows(u, 0)[0].size for u in unit_names} if steps else {}
    quota = _compressed_batches(np.array([first[u] for u in order]), steps, G) if steps else None
    fraction = 1.0 if quota is None else steps * G / sum(first[u] for u in order)
    all_o, all_j, all_u, dropped = [], [], [], []
    filled = np.zeros(len(infos), np.int64)
    batches_per_unit = {u: 0 for u in unit_names}
    r = 0
    total = 0
    while True:
        per_unit = []
        for pos, u in enumerate(order):
            ds, ex = round_rows(u, r)
            if quota is not None:
                pick = np.sort(seeded_rng(seed, R_SHORT, unit_names.index(u)).permutation(ds.size)[:quota[pos] * G])
                ds, ex = ds[pick], ex[pick]
            elif r == 0:
                check_unit_size(Unit(u, "curriculum", units[u]), ds.size, G, infos, "curriculum unit")
            nb, rem = divmod(ds.size, G)
            if rem and not cfg["drop_remainder"]:
                # fill the last batch with the unit's first (easiest) instances not already in it
                have = set(pair_key(ds[nb * G:], ex[nb * G:]).tolist())
                d0, e0 = parts.load(base[u])
                ok = np.flatnonzero(~np.isin(pair_key(d0, e0), list(have)))[:G - rem]
                np.add.at(filled, d0[ok], 1)
                ds, ex = np.concatenate([ds, d0[ok]]), np.concatenate([ex, e0[ok]])
                nb += 1
            elif rem:
                dropped.append(np.stack([ds[nb * G:], ex[nb * G:]], 1))
            per_unit.append(parts.add(ds[:nb * G].reshape(nb, G), ex[:nb * G].reshape(nb, G)))
            del ds, ex
            batches_per_unit[u] += nb
        # the walk over the task order (Algorithm 1's cyclic walk, or the balanced one): see walk_order
        k_pos, j_idx = walk_order([parts.batches(k) for k in per_unit], walk)
        all_o.append(np.asarray(per_unit, np.int64)[k_pos] if k_pos.size else np.zeros(0, np.int64))
        all_j.append(j_idx)
        all_u.append(np.array([unit_names.index(order[k]) for k in k_pos], np.int32))
        total += k_pos.size
        r += 1
        # an empty round ends an epoch-mode plan (no later round has more rows); in step mode it is a fractional
        # epoch's round with less than a batch in every unit, and the next round starts a new pass
        empty = k_pos.size == 0 and not (steps and total)
        if (steps == 0 and r >= rounds) or (steps and total >= steps) or empty or quota is not None:
            break
    OW, IX, UI = np.concatenate(all_o), np.concatenate(all_j), np.concatenate(all_u)
    truncated = 0
    if steps:
        truncated = max(0, OW.shape[0] - steps)
        OW, IX, UI = OW[:steps], IX[:steps], UI[:steps]
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
    return OW, IX, info
