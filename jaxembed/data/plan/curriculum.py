"""Curriculum plans (Data-CUBE Algorithm 1, lines 18-25): every unit's instances sorted by difficulty, the walk
over the task order (``walk_order``: Algorithm 1's cyclic walk or jaxembed's balanced one), rounds for several or
fractional epochs, and a step mode shorter than one pass compressed to a random subset of every unit.

A unit's instance order is kept in ``blocks.Parts`` (with a scratch folder: in its files) and every round reads it
back a chunk at a time (``passes.CHUNK``): the score orders are a keyed sort (``passes.keyed_sort``: bucket files
over ``passes.BUCKET`` rows), the random order, a fractional epoch's subset and a short run's pick are numpy's
permutation up to ``PERMUTATION_MAX`` rows and bounded draws above, so process 0 holds a bucket and a chunk of a
unit, not the unit."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from jaxembed.data.plan import passes
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


#: a unit's random instance order, a fractional epoch's subset and a short run's pick over at most this many rows
#: are numpy's permutation of them (held whole, 8 B a row, as jaxembed has always drawn them); over more rows the
#: order is a keyed sort on random keys (``passes.sorted_pass``) and a subset is drawn range by range
#: (``passes.subset``). A part of what the plan is, not a tuning knob.
PERMUTATION_MAX = 1 << 20


def _unit_order(io: str, members: list[int], sizes, names, score_map, rng, folder):
    """A unit's instances in its order (``random``, ``e2d``: phi descending, ``d2e``), as (dataset ids int32,
    example ids int64) chunks; score ties keep (dataset, index) order."""
    members = sorted(members)
    n = int(sum(int(sizes[d]) for d in members))
    if io == "random":
        if n > PERMUTATION_MAX:
            yield from passes.sorted_pass(rng, members, sizes, np.ones(len(sizes)), folder)
            return
        ds = np.concatenate([np.full(sizes[d], d, np.int32) for d in members])
        ex = np.concatenate([np.arange(sizes[d], dtype=np.int64) for d in members])
        perm = rng.permutation(n)
        yield ds[perm], ex[perm]
        return
    sign = -1.0 if io == "e2d" else 1.0

    def rows():
        for d in members:
            sc, size = score_map[names[d]], int(sizes[d])
            for a in range(0, size, passes.CHUNK):
                b = min(size, a + passes.CHUNK)
                yield sign * np.asarray(sc[a:b], np.float64), d, np.arange(a, b, dtype=np.int64)

    yield from passes.keyed_sort(rows, n, folder)


def _pick(rng, n: int, k: int):
    """A uniform k-subset of range(n), ascending, in pieces: ``sort(permutation(n)[:k])`` up to PERMUTATION_MAX,
    ``passes.subset`` above."""
    if n > PERMUTATION_MAX:
        yield from passes.subset(rng, n, k)
    elif k > 0:
        yield np.sort(rng.permutation(n)[:k])


class _Ranks:
    """The picked indices of ``_pick``'s pieces, asked for by ascending ranges."""

    def __init__(self, pieces):
        self._it, self._buf = pieces, np.zeros(0, np.int64)

    def within(self, lo: int, hi: int) -> np.ndarray:
        """The picked indices in [lo, hi), less lo."""
        while self._buf.size == 0 or self._buf[-1] < hi:
            nxt = next(self._it, None)
            if nxt is None:
                break
            self._buf = np.concatenate([self._buf, nxt])
        cut = int(np.searchsorted(self._buf, hi))
        got, self._buf = self._buf[:cut], self._buf[cut:]
        return got[got >= lo] - lo


def _read(parts, handle, n: int):
    for lo in range(0, n, passes.CHUNK):
        yield parts.load(handle, lo, min(n, lo + passes.CHUNK))


def _round_chunks(parts, handle, n: int, whole: np.ndarray, partial: dict):
    """The unit's rows of a round, in its instance order: every row of a dataset with ``whole[d]``, the rows whose
    rank among their dataset's rows ``partial[d]`` (a ``_Ranks``) picks."""
    seen = dict.fromkeys(partial, 0)
    for ds, ex in _read(parts, handle, n):
        keep = whole[ds]
        for d, ranks in partial.items():
            sel = np.flatnonzero(ds == d)
            keep[sel[ranks.within(seen[d], seen[d] + sel.size)]] = True
            seen[d] += sel.size
        yield ds[keep], ex[keep]


def _picked(chunks, ranks: _Ranks):
    """The rows of ``chunks`` whose rank among all of them ``ranks`` picks."""
    at = 0
    for ds, ex in chunks:
        i = ranks.within(at, at + ds.size)
        at += ds.size
        yield ds[i], ex[i]


def _batches(parts, chunks, G: int):
    """Begin a part and extend it with the rows' full batches of G; -> (part, the rows left, fewer than G). The
    caller ends the part."""
    k = parts.begin()
    bd, be, have = [], [], 0
    for ds, ex in chunks:
        bd.append(ds)
        be.append(ex)
        have += ds.size
        if have >= G:
            d, e = np.concatenate(bd), np.concatenate(be)
            m = (d.size // G) * G
            parts.extend(d[:m].reshape(-1, G), e[:m].reshape(-1, G))
            bd, be, have = [d[m:]], [e[m:]], d.size - m
    d = np.concatenate(bd) if bd else np.zeros(0, np.int32)
    e = np.concatenate(be) if be else np.zeros(0, np.int64)
    return k, d.astype(np.int32, copy=False), e.astype(np.int64, copy=False)


def _fill(parts, handle, n: int, ds: np.ndarray, ex: np.ndarray, want: int):
    """The unit's first ``want`` instances in its order that are not among (ds, ex)."""
    have = pair_key(ds, ex)
    fd, fe, got = [], [], 0
    for d0, e0 in _read(parts, handle, n):
        ok = np.flatnonzero(~np.isin(pair_key(d0, e0), have))[:want - got]
        fd.append(d0[ok])
        fe.append(e0[ok])
        got += ok.size
        if got >= want:
            break
    return (np.concatenate(fd) if fd else np.zeros(0, np.int32)), (np.concatenate(fe) if fe else np.zeros(0, np.int64))


def build_curriculum(cfg, infos, task_names, dataset_tasks, sizes, epochs, score_map, task_order,
                      instance_orders, seed, G, parts):
    """-> (owner, idx, info): step s is batch idx[s] of part owner[s] of ``parts`` (a ``blocks.Parts``: one part
    per unit and round; the units' instance orders are kept there too and read back a chunk at a time)."""
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
    names = [i.name for i in infos]
    base, size = {}, {}
    for k, (u, m) in enumerate(units.items()):
        size[u] = int(sum(int(sizes[d]) for d in m))
        if given is not None:
            base[u] = parts.keep(f"unit{k}", given[u][:, 0].astype(np.int32), given[u][:, 1])
        else:
            rng = seeded_rng(seed, R_CURR, k)
            base[u] = parts.keep_chunks(_unit_order(io, m, sizes, names, score_map, rng, parts.folder))
    rounds = int(math.ceil(max(epochs[d] for m in units.values() for d in m) - 1e-9))
    steps = int(cfg["steps"])

    def round_rule(u: str, r: int):
        """(rows of round r, whole [D] bool, partial {d: _Ranks}): every example of the datasets with a full
        epoch left, a random subset for a fractional epoch."""
        rr = r % max(rounds, 1)
        whole, partial, n = np.zeros(len(infos), bool), {}, 0
        for d in units[u]:
            full = int(math.floor(epochs[d] + 1e-9))
            if rr < full:
                whole[d], n = True, n + int(sizes[d])
            elif rr == full:
                extra = int(round((epochs[d] - full) * sizes[d]))
                if extra > 0:
                    partial[d] = _Ranks(_pick(seeded_rng(seed, R_FRAC, d, r), int(sizes[d]), extra))
                    n += extra
        return n, whole, partial

    # step mode with fewer steps than the first pass: the whole curriculum, compressed. Unit u gets n_u batches
    # (its share of the pass), filled with a uniform random subset of its rows kept in the unit's instance order,
    # so a short run still goes easy -> difficult through every task instead of stopping after each one's
    # easiest batches. Exactly `steps` batches, nothing truncated.
    first = {u: round_rule(u, 0)[0] for u in unit_names} if steps else {}
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
            n_r, whole, partial = round_rule(u, r)
            chunks = _round_chunks(parts, base[u], size[u], whole, partial)
            if quota is not None:
                pick = _pick(seeded_rng(seed, R_SHORT, unit_names.index(u)), n_r, int(quota[pos]) * G)
                chunks = _picked(chunks, _Ranks(pick))
            elif r == 0:
                check_unit_size(Unit(u, "curriculum", units[u]), n_r, G, infos, "curriculum unit")
            k, ds, ex = _batches(parts, chunks, G)
            if ds.size and not cfg["drop_remainder"]:
                # fill the last batch with the unit's first (easiest) instances not already in it
                d0, e0 = _fill(parts, base[u], size[u], ds, ex, G - ds.size)
                np.add.at(filled, d0, 1)
                parts.extend(np.concatenate([ds, d0]).reshape(1, G), np.concatenate([ex, e0]).reshape(1, G))
            elif ds.size:
                dropped.append(np.stack([ds, ex], 1))
            parts.end()
            per_unit.append(k)
            batches_per_unit[u] += parts.batches(k)
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
