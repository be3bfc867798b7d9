"""The inputs a plan reads besides the store: per-example scores (Data-CUBE phi), the curriculum's task order and
explicit instance orders (arrays, mappings or .npz / .npy / .json / .txt files, each checked against the datasets),
and the Data-CUBE Eq. 9 mask computed from the scores."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from jaxembed.errors import UserError


def _infos(datasets) -> list:
    return list(datasets.datasets) if hasattr(datasets, "datasets") else list(datasets)


def _read_named_arrays(path: Path, what: str) -> dict[str, np.ndarray] | np.ndarray:
    if not path.is_file():
        raise UserError(f"{path}: no such {what} file (fix: check the path in the plan config)")
    suf = path.suffix.lower()
    try:
        if suf == ".npz":
            with np.load(path, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        if suf == ".npy":
            return np.load(path, allow_pickle=False)
        if suf == ".json":
            obj = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(obj, dict):
                return {str(k): v for k, v in obj.items()}
            return obj
        if suf == ".txt":
            return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: invalid JSON ({e.msg}) (fix: write valid JSON)") from None
    except ValueError as e:
        raise UserError(f"{path}: unreadable {what} file ({e}) (fix: write it with numpy.save / savez)") from None
    raise UserError(f"{path}: unsupported {what} file type '{suf}' (fix: use .npz, .npy or .json)")


def load_scores(source, datasets) -> dict[str, np.ndarray]:
    """Per-example scores (Data-CUBE phi, Eq. 8) -> {dataset name: float64 [size]}.

    source: a mapping {dataset name: array}, a flat array (all datasets concatenated in store order), or a file:
    .npz (one array per dataset name), .json ({name: [..]} or a flat list), .npy (flat, store order).
    Datasets may be missing from a mapping; sizes and finiteness are checked."""
    infos = _infos(datasets)
    where = str(source) if isinstance(source, (str, os.PathLike)) else "scores"
    obj = _read_named_arrays(Path(source), "scores") if isinstance(source, (str, os.PathLike)) else source
    sizes = {i.name: int(i.size) for i in infos}
    out: dict[str, np.ndarray] = {}
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            if k not in sizes:
                raise UserError(f"{where}: scores for unknown dataset '{k}' (datasets: {', '.join(sizes)}) "
                                "(fix: key the scores by dataset name)")
            out[k] = np.asarray(v, np.float64).reshape(-1)
    else:
        flat = np.asarray(obj, np.float64).reshape(-1)
        total = sum(sizes.values())
        if flat.size != total:
            raise UserError(f"{where}: {flat.size} scores for {total} examples (fix: a flat scores array holds "
                            "one score per example of every dataset, in store order)")
        off = 0
        for n, s in sizes.items():
            out[n] = flat[off:off + s]
            off += s
    for k, v in out.items():
        if v.size != sizes[k]:
            raise UserError(f"{where}: dataset '{k}' has {sizes[k]} examples but {v.size} scores "
                            "(fix: recompute the scores on this store)")
        bad = np.flatnonzero(~np.isfinite(v))
        if bad.size:
            raise UserError(f"{where}: dataset '{k}' example {int(bad[0])}: score is {v[bad[0]]} "
                            "(fix: scores must be finite numbers)")
    return out


def load_task_order(source, units: Sequence[str], unit: str | None = None) -> list[str]:
    """A task order (list of unit names) from a list / array or a .json / .npy / .txt file; integers index
    ``units``. Every unit must appear exactly once. unit: the plan's ``curriculum.unit``; a JSON order that
    records another unit (``jaxembed curriculum`` writes ``{"order": [...], "unit": ...}``) is an error."""
    where = str(source) if isinstance(source, (str, os.PathLike)) else "task order"
    obj = _read_named_arrays(Path(source), "task order") if isinstance(source, (str, os.PathLike)) else source
    if isinstance(obj, Mapping):
        got = obj.get("unit")
        if unit is not None and got is not None and got != unit:
            raise UserError(f"{where}: field 'unit': the order is over {got}s, but the plan's curriculum.unit is "
                            f"{unit!r} (fix: set curriculum.unit={got!r}, or run `jaxembed score --unit {unit}` "
                            "and `jaxembed curriculum` again)")
        obj = obj.get("order", obj.get("task_order"))
        if obj is None:
            raise UserError(f"{where}: expected a list of task names or {{\"order\": [...]}}")
    items = list(np.asarray(obj).tolist()) if isinstance(obj, np.ndarray) else list(obj)
    names = []
    for it in items:
        if isinstance(it, (int, np.integer)) and not isinstance(it, bool):
            if not 0 <= it < len(units):
                raise UserError(f"{where}: task index {it} out of range [0, {len(units)}) "
                                f"(fix: indices refer to {list(units)})")
            names.append(units[it])
        else:
            names.append(str(it))
    unknown = [n for n in names if n not in units]
    if unknown:
        kind = {"dataset": "the dataset names", "task": "the data config's task names"}.get(unit or "", "")
        raise UserError(f"{where}: unknown names {unknown} (known: {list(units)}) (fix: "
                        + (f"curriculum.unit={unit!r} orders {kind}; " if kind else "")
                        + "name those, or set curriculum.unit)")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UserError(f"{where}: {dup} appear more than once (fix: each task once)")
    missing = [u for u in units if u not in names]
    if missing:
        raise UserError(f"{where}: the order lacks {missing} (fix: order every task of the plan)")
    return names


def load_instance_orders(source, datasets, units: Mapping[str, Sequence[int]]) -> dict[str, np.ndarray]:
    """Explicit per-unit instance orders -> {unit: int64 [n, 2] (dataset id, example id)}.

    source: a mapping or a file: .json {unit: [[dataset name or id, example index], ...]},
    .npz {unit: int64 [n, 2]}. Each unit's order must list each of its examples exactly once."""
    infos = _infos(datasets)
    where = str(source) if isinstance(source, (str, os.PathLike)) else "instance orders"
    obj = _read_named_arrays(Path(source), "instance orders") if isinstance(source, (str, os.PathLike)) else source
    if not isinstance(obj, Mapping):
        raise UserError(f"{where}: expected {{unit name: [[dataset, index], ...]}}")
    name_to_id = {i.name: k for k, i in enumerate(infos)}
    out = {}
    for unit, members in units.items():
        if unit not in obj:
            raise UserError(f"{where}: no order for '{unit}' (fix: give every unit an order)")
        rows = obj[unit]
        if isinstance(rows, np.ndarray):
            arr = rows.astype(np.int64).reshape(-1, 2)
        else:
            arr = np.array([[name_to_id[r[0]] if isinstance(r[0], str) and r[0] in name_to_id else r[0], r[1]]
                            for r in rows], dtype=np.int64).reshape(-1, 2)
        expect = sum(int(infos[d].size) for d in members)
        ok = arr.shape[0] == expect and np.isin(arr[:, 0], list(members)).all()
        if ok:
            ok = arr[:, 1].min(initial=0) >= 0 and np.all(
                arr[:, 1] < np.array([infos[d].size for d in range(len(infos))])[arr[:, 0]])
            ok = ok and np.unique(arr[:, 0] * (1 << 40) + arr[:, 1]).size == expect
        if not ok:
            raise UserError(f"{where}: the order of '{unit}' is not a permutation of its {expect} examples "
                            f"(datasets {[infos[d].name for d in members]}) (fix: list each example once)")
        out[unit] = arr
    return out


def instance_mask(scores: np.ndarray, delta: float | None, direction: str = "text") -> np.ndarray:
    """Data-CUBE Eq. 9 -> float32 alpha [n]. direction 'text': alpha = 0 where phi < delta, else 1 (too
    difficult instances are not learned); 'printed': alpha = 0 where phi >= delta (the printed cases).
    delta None: all ones."""
    scores = np.asarray(scores, np.float64)
    if delta is None:
        return np.ones(scores.shape, np.float32)
    if direction == "text":
        return (scores >= delta).astype(np.float32)
    if direction == "printed":
        return (scores < delta).astype(np.float32)
    raise UserError(f"mask.direction: unknown value {direction!r} (fix: 'text' or 'printed')")
