"""Task representations and task similarity (Data-CUBE 4.2.1, Eq. 4 and 5), and their heat map.

- Eq. 4: the representation of a task is the mean of the embeddings of n_t of its instructed queries
  ``[I(q); q]``, sampled with a seed, from a reference model. Each query embedding is L2-normalised first, so that
  every query weighs the same (the reference models of the paper normalise anyway).
- Eq. 5: task similarity = cosine of two task representations (the interference risk is its negative).

A "task" is a unit of the curriculum: a single dataset (``unit='dataset'``, the default: Data-CUBE's task is a MEDI
dataset) or a task of the data config (``unit='task'``, its datasets pooled), matching ``plan.curriculum.unit``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from jaxembed.runs import atomic_files
from jaxembed.errors import UserError


def curriculum_units(infos, unit: str = "dataset") -> dict[str, list[int]]:
    """{unit name: dataset ids (store order)}: every dataset (``unit='dataset'``), or the tasks of the data config
    in order of first appearance (``unit='task'``) -- the units ``jaxembed.data.plan`` orders."""
    if unit not in ("task", "dataset"):
        raise UserError(f"--unit {unit!r}: 'task' or 'dataset'")
    out: dict[str, list[int]] = {}
    for d, info in enumerate(infos):
        out.setdefault(info.task if unit == "task" else info.name, []).append(d)
    return out


def sample_queries(units: Mapping[str, Sequence[int]], sizes: Sequence[int], n: int,
                   seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded sample of at most n examples per unit, drawn uniformly without replacement from the pooled examples
    of its datasets. -> {unit: int64 [k, 2] (dataset id, example index), sorted}."""
    if n < 1:
        raise UserError(f"--n-task-queries must be >= 1, got {n}")
    out = {}
    for k, (u, members) in enumerate(units.items()):
        pool = np.concatenate([np.stack([np.full(int(sizes[d]), d, np.int64), np.arange(int(sizes[d]))], 1)
                               for d in members]) if members else np.zeros((0, 2), np.int64)
        rng = np.random.default_rng([int(seed), k])
        pick = np.sort(rng.choice(pool.shape[0], min(n, pool.shape[0]), replace=False))
        out[u] = pool[pick]
    return out


def task_representation(query_emb: np.ndarray) -> np.ndarray:
    """Eq. 4: [n_t, D] query embeddings -> [D], the mean of the L2-normalised rows."""
    q = np.asarray(query_emb, np.float64)
    if q.ndim != 2 or q.shape[0] == 0:
        raise UserError("a task representation needs at least one query embedding")
    q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
    return q.mean(0)


def task_similarity(reps: np.ndarray) -> np.ndarray:
    """Eq. 5: task representations [U, D] -> cosine similarity [U, U] (float64, symmetric, unit diagonal)."""
    r = np.asarray(reps, np.float64)
    r = r / np.maximum(np.linalg.norm(r, axis=1, keepdims=True), 1e-12)
    S = r @ r.T
    S = (S + S.T) / 2
    np.fill_diagonal(S, 1.0)
    return S


def save_similarity(path: str | os.PathLike, S: np.ndarray, names: Sequence[str], unit: str,
                    queries: Sequence[int], meta: dict | None = None) -> Path:
    """task_similarity.npz: matrix float64 [U, U], names [U], unit, queries int64 [U] (n_t used per unit), meta
    (JSON: model, seed, ...)."""
    p = Path(path)
    arrays = dict(matrix=np.asarray(S, np.float64), names=np.array(list(names), dtype=str), unit=np.array(unit),
                  queries=np.asarray(queries, np.int64), meta=np.array(json.dumps(meta or {})))
    return atomic_files.write_with(p, lambda t: np.savez(t, **arrays), suffix=".npz")


def load_similarity(path: str | os.PathLike) -> tuple[np.ndarray, list[str], str, dict]:
    """(matrix [U, U], names, unit, meta) from a task_similarity.npz written by ``save_similarity``."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p}: no task similarity file (fix: run jaxembed score --out {p.parent})")
    try:
        with np.load(p, allow_pickle=False) as z:
            S, names, unit = z["matrix"], [str(x) for x in z["names"]], str(z["unit"])
            meta = json.loads(str(z["meta"])) if "meta" in z.files else {}
    except (KeyError, ValueError, OSError) as e:
        raise UserError(f"{p}: not a task similarity file ({e}) (fix: run jaxembed score again)") from None
    if S.shape != (len(names), len(names)):
        raise UserError(f"{p}: matrix {S.shape} does not match its {len(names)} names (fix: run jaxembed score "
                        "again)")
    return S, names, unit, meta


def render_heatmap(S: np.ndarray, names: Sequence[str], path: str | os.PathLike, title: str = "") -> str:
    """Write the similarity matrix as a PNG heat map with matplotlib (the optional viz extra). -> "matplotlib", or
    why there is no heat map (matplotlib is not installed; the rest of the job does not need it)."""
    S = np.asarray(S, np.float64)
    off = S[~np.eye(len(S), dtype=bool)] if len(S) > 1 else S.reshape(-1)
    lo, hi = (float(off.min()), float(off.max())) if off.size else (0.0, 1.0)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        Path(path).unlink(missing_ok=True)  # no stale picture of an earlier matrix
        return "skipped: matplotlib is not installed (fix: pip install 'jaxembed[viz]')"
    n = len(names)
    size = max(4.0, min(40.0, 0.25 * n + 3))
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    im = ax.imshow(S, cmap="RdBu_r", vmin=lo, vmax=hi)
    if n <= 80:
        ax.set_xticks(range(n), names, rotation=90, fontsize=7)
        ax.set_yticks(range(n), names, fontsize=7)
    ax.set_title(title or "task similarity (Data-CUBE Eq. 5)")
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return "matplotlib"
