"""Instance difficulty (Data-CUBE 4.3.1, Eq. 8), instance orders (4.3.2, Table 7) and the mask counts (Eq. 9).

- Eq. 8: phi(q, p, n) = sim(q, p) - sim(q, n), cosine similarities from a reference model, on the instructed texts
  exactly as training sees them (query instruction + query, document instruction + document). Small phi = hard.
  With several positives the positive term is their mean; with several negatives the negative term is reduced by
  ``min`` (phi against the hardest negative: sim(q, p) - max_n sim(q, n)) or ``mean``. An example without
  negatives (pairs: STS, paraphrase) is scored against positives of other examples of its dataset, sampled with a
  seed -- the in-batch negatives it meets in training.
- Instance orders per unit: ``e2d`` (phi descending, the paper's), ``d2e`` (ascending), ``random`` (seeded); ties
  are broken by (dataset id, example index) exactly as ``jaxembed.data.plan`` sorts.
- The mask itself (alpha = 0 where phi < delta) is ``jaxembed.data.plan.instance_mask``, applied by the plan as a
  per-example loss weight; ``mask_counts`` says how many examples a delta removes.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from jaxembed.errors import UserError

REDUCE = ("min", "mean")
INSTANCE_ORDERS = ("e2d", "d2e", "random")


def pair_similarity(a: np.ndarray, b: np.ndarray, rows_a: np.ndarray, rows_b: np.ndarray,
                    chunk: int = 65536) -> np.ndarray:
    """Cosine similarity of pairs (a[rows_a[k]], b[rows_b[k]]): a [Na, D], b [Nb, D] (L2-normalised rows),
    rows int [M] -> float64 [M]."""
    out = np.empty(len(rows_a), np.float64)
    for s in range(0, len(rows_a), chunk):
        x = a[rows_a[s:s + chunk]].astype(np.float64)
        y = b[rows_b[s:s + chunk]].astype(np.float64)
        out[s:s + chunk] = np.einsum("md,md->m", x, y)
    return out


def segment_reduce(values: np.ndarray, offsets: np.ndarray, how: str) -> np.ndarray:
    """Reduce consecutive segments values[offsets[i]:offsets[i+1]] by 'mean', 'max' or 'min' -> [len(offsets)-1]
    (NaN for an empty segment)."""
    offsets = np.asarray(offsets, np.int64)
    n = len(offsets) - 1
    counts = np.diff(offsets)
    out = np.full(n, np.nan)
    nz = counts > 0
    if not nz.any():
        return out
    starts = offsets[:-1][nz]
    if how == "mean":
        out[nz] = np.add.reduceat(values, starts) / counts[nz] if len(values) else np.nan
    elif how == "max":
        out[nz] = np.maximum.reduceat(values, starts)
    elif how == "min":
        out[nz] = np.minimum.reduceat(values, starts)
    else:
        raise ValueError(how)
    return out


def phi(pos_sim: np.ndarray, pos_offsets: np.ndarray, neg_sim: np.ndarray, neg_offsets: np.ndarray,
        reduce: str = "min") -> np.ndarray:
    """Eq. 8 per example. pos_sim [Mp] / neg_sim [Mn]: sim(q, p) of every (example, positive) / (example, negative)
    pair, grouped by example (example i owns pos_sim[pos_offsets[i]:pos_offsets[i+1]]); every example needs at
    least one of each. reduce: 'min' (hardest negative) | 'mean'. -> float64 [N]."""
    if reduce not in REDUCE:
        raise UserError(f"--negatives {reduce!r}: one of {', '.join(REDUCE)}")
    p = segment_reduce(np.asarray(pos_sim, np.float64), pos_offsets, "mean")
    n = segment_reduce(np.asarray(neg_sim, np.float64), neg_offsets, "max" if reduce == "min" else "mean")
    if np.isnan(p).any() or np.isnan(n).any():
        raise ValueError("phi: every example needs at least one positive and one negative similarity")
    return p - n


def sampled_negatives(pos_ids: Sequence[Sequence[int]], k: int, seed: int) -> list[list[int]]:
    """For examples without negatives: up to k document ids drawn (seeded, without replacement when possible) from
    the first positives of other examples of the dataset, never one of the example's own positives.
    pos_ids: each example's positive document ids. -> each example's sampled document ids."""
    n = len(pos_ids)
    first = np.array([p[0] for p in pos_ids], np.int64)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        if n < 2:
            out.append([])
            continue
        m = min(k, n - 1)
        others = rng.choice(n - 1, m, replace=False)
        others = others + (others >= i)
        own = set(pos_ids[i])
        out.append([int(d) for d in dict.fromkeys(first[others].tolist()) if d not in own])
    return out


def instance_orders(units: Mapping[str, Sequence[int]], sizes: Sequence[int], names: Sequence[str],
                    order: str = "e2d", scores: Mapping[str, np.ndarray] | None = None,
                    seed: int = 0) -> dict[str, np.ndarray]:
    """Per-unit instance orders. units: {unit: dataset ids}; sizes / names: by dataset id (store order); scores:
    {dataset name: phi [size]} (needed by e2d / d2e). -> {unit: int64 [n, 2] (dataset id, example index)}, the
    order ``plan`` takes with instance_order e2d / d2e (ties by dataset id, then index) or a seeded permutation."""
    if order not in INSTANCE_ORDERS:
        raise UserError(f"--instance-order {order!r}: one of {', '.join(INSTANCE_ORDERS)}")
    out = {}
    for k, (u, members) in enumerate(units.items()):
        ds = np.concatenate([np.full(int(sizes[d]), d, np.int64) for d in members])
        ex = np.concatenate([np.arange(int(sizes[d]), dtype=np.int64) for d in members])
        if order == "random":
            o = np.random.default_rng([int(seed), k]).permutation(ds.size)
        else:
            missing = [names[d] for d in members if scores is None or names[d] not in scores]
            if missing:
                raise UserError(f"no scores for datasets {missing} (fix: run jaxembed score on this store, or "
                                "--instance-order random)")
            sc = np.concatenate([np.asarray(scores[names[d]], np.float64) for d in members])
            if sc.size != ds.size:
                raise UserError(f"unit {u!r}: {sc.size} scores for {ds.size} examples (fix: score this store "
                                "again)")
            o = np.lexsort((ex, ds, -sc if order == "e2d" else sc))
        out[u] = np.stack([ds[o], ex[o]], 1)
    return out


def mask_counts(scores: Mapping[str, np.ndarray], delta: float, direction: str = "text") -> dict[str, int]:
    """How many examples of each dataset the Eq. 9 mask (``plan.instance_mask``) zeroes at ``delta``."""
    from jaxembed.data.plan import instance_mask

    return {k: int((instance_mask(v, delta, direction) == 0).sum()) for k, v in scores.items()}


def phi_stats(v: np.ndarray) -> dict:
    """Summary statistics of one dataset's phi."""
    v = np.asarray(v, np.float64)
    if v.size == 0:
        return {}
    q = np.quantile(v, [0.1, 0.5, 0.9])
    return {"mean": round(float(v.mean()), 4), "std": round(float(v.std()), 4), "min": round(float(v.min()), 4),
            "p10": round(float(q[0]), 4), "median": round(float(q[1]), 4), "p90": round(float(q[2]), 4),
            "max": round(float(v.max()), 4), "share_below_0": round(float((v < 0).mean()), 4)}
