"""The inputs a plan reads besides the store: per-example scores (Data-CUBE phi), the curriculum's task order and
explicit instance orders (arrays, mappings or .npz / .npy / .json / .txt files, each checked against the datasets),
and the Data-CUBE Eq. 9 mask computed from the scores."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from jaxembed.errors import UserError


def dataset_infos(datasets) -> list:
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
    infos = dataset_infos(datasets)
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
        for a in range(0, v.size, 1 << 20):  # a range at a time: no mask of the whole dataset (1 B an example)
            bad = np.flatnonzero(~np.isfinite(v[a:a + (1 << 20)]))
            if bad.size:
                raise UserError(f"{where}: dataset '{k}' example {a + int(bad[0])}: score is {v[a + bad[0]]} "
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


#: the arrays of an instance orders file (``save_instance_orders``)
_ORDER_ARRAYS = ("units", "offsets", "dataset_names", "dataset_ids", "example_ids")


def save_instance_orders(path, orders: Mapping[str, np.ndarray], dataset_names: Sequence[str]) -> Path:
    """Write per-unit instance orders ({unit: [n, 2] (dataset id, example index)}, ids in ``dataset_names``'
    order) to ``path`` (.npz, atomic): ``units`` [U] and ``offsets`` int64 [U + 1] (unit k's rows are
    offsets[k]:offsets[k + 1]), ``dataset_names`` [D], ``dataset_ids`` int32 [N], ``example_ids`` int64 [N].
    Stored uncompressed: ``load_instance_orders`` maps the two long arrays and reads one unit's rows at a time."""
    from jaxembed.runs import atomic_files

    units = list(orders)
    sizes = [int(np.asarray(orders[u]).shape[0]) for u in units]
    arrays = {"units": np.array(units, dtype=str), "offsets": np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
              "dataset_names": np.array(list(dataset_names), dtype=str),
              "dataset_ids": np.concatenate([np.asarray(orders[u])[:, 0] for u in units] or [[]]).astype(np.int32),
              "example_ids": np.concatenate([np.asarray(orders[u])[:, 1] for u in units] or [[]]).astype(np.int64)}
    return atomic_files.write_with(path, lambda t: np.savez(t, **arrays), suffix=".npz")


class _OrdersFile(Mapping):
    """The units of an instance orders file (``save_instance_orders``): the dataset and example ids memory-mapped,
    one unit's rows read (and its dataset ids mapped to the store's by name) when it is asked for."""

    def __init__(self, path: Path, arrays: dict, datasets):
        self.path, self.a = path, arrays
        self.units = [str(u) for u in arrays["units"].tolist()]
        store_ids = {i.name: k for k, i in enumerate(datasets)}
        names = [str(n) for n in arrays["dataset_names"].tolist()]
        unknown = [n for n in names if n not in store_ids]
        if unknown:
            raise UserError(f"{path}: field 'dataset_names': datasets {unknown} are not in the store (fix: write "
                            "the orders again on this store with `jaxembed curriculum`)")
        self.to_store = np.array([store_ids[n] for n in names] or [0], np.int64)
        off = arrays["offsets"]
        if off.shape != (len(self.units) + 1,) or off[0] != 0 or np.any(np.diff(off) < 0) or \
                off[-1] != arrays["dataset_ids"].shape[0] or arrays["example_ids"].shape != arrays["dataset_ids"].shape:
            raise UserError(f"{path}: field 'offsets' does not match the {arrays['dataset_ids'].shape[0]} rows "
                            "(fix: write the orders again with `jaxembed curriculum`)")

    def __getitem__(self, unit: str) -> np.ndarray:
        if unit not in self.units:
            raise KeyError(unit)
        k = self.units.index(unit)
        lo, hi = int(self.a["offsets"][k]), int(self.a["offsets"][k + 1])
        ds = np.asarray(self.a["dataset_ids"][lo:hi], np.int64)
        if ds.size and (ds.min() < 0 or ds.max() >= len(self.a["dataset_names"])):
            raise UserError(f"{self.path}: unit '{unit}': a dataset id is out of range of 'dataset_names' (fix: "
                            "write the orders again with `jaxembed curriculum`)")
        return np.stack([self.to_store[ds], np.asarray(self.a["example_ids"][lo:hi], np.int64)], 1)

    def __contains__(self, unit) -> bool:
        return unit in self.units

    def __iter__(self):
        return iter(self.units)

    def __len__(self) -> int:
        return len(self.units)


class _CheckedOrders(Mapping):
    """{unit: int64 [n, 2]} for the plan's ``units``: each unit's order read from ``source`` and checked when it
    is asked for (a unit of a mapped file is then in memory alone)."""

    def __init__(self, source: Mapping, units: list[str], check):
        self.source, self.units, self.check = source, units, check

    def __getitem__(self, unit):
        if unit not in self.units:
            raise KeyError(unit)
        return self.check(unit, self.source[unit])

    def __iter__(self):
        return iter(self.units)

    def __len__(self) -> int:
        return len(self.units)


def _orders_source(source, infos, where: str):
    if isinstance(source, (str, os.PathLike)) and Path(source).suffix.lower() == ".npz" and Path(source).is_file():
        from jaxembed.data.plan.npz import mapped_npz

        try:
            arrays = mapped_npz(source, ("dataset_ids", "example_ids"))
        except (ValueError, OSError, zipfile.BadZipFile) as e:
            raise UserError(f"{where}: unreadable instance orders file ({e}) (fix: write it again with "
                            "`jaxembed curriculum`)") from None
        if set(_ORDER_ARRAYS) <= set(arrays):
            return _OrdersFile(Path(source), arrays, infos)
        return arrays  # the older layout: one [n, 2] array per unit
    return _read_named_arrays(Path(source), "instance orders") if isinstance(source, (str, os.PathLike)) else source


def load_instance_orders(source, datasets, units: Mapping[str, Sequence[int]]) -> Mapping[str, np.ndarray]:
    """Explicit per-unit instance orders -> {unit: int64 [n, 2] (dataset id, example id)}.

    source: a mapping or a file: .npz as ``save_instance_orders`` writes it (read a unit at a time, memory-mapped),
    .npz {unit: int64 [n, 2]} or .json {unit: [[dataset name or id, example index], ...]}. Each unit's order must
    list each of its examples exactly once; every unit must have one (checked here), and each unit's order is
    checked when it is read."""
    infos = dataset_infos(datasets)
    where = str(source) if isinstance(source, (str, os.PathLike)) else "instance orders"
    obj = _orders_source(source, infos, where)
    if not isinstance(obj, Mapping):
        raise UserError(f"{where}: expected {{unit name: [[dataset, index], ...]}}")
    name_to_id = {i.name: k for k, i in enumerate(infos)}
    all_sizes = np.array([int(i.size) for i in infos], np.int64)
    for unit in units:
        if unit not in obj:
            raise UserError(f"{where}: no order for '{unit}' (fix: give every unit an order)")

    def check(unit: str, rows) -> np.ndarray:
        members = units[unit]
        if isinstance(rows, np.ndarray):
            arr = rows.astype(np.int64).reshape(-1, 2)
        else:
            arr = np.array([[name_to_id[r[0]] if isinstance(r[0], str) and r[0] in name_to_id else r[0], r[1]]
                            for r in rows], dtype=np.int64).reshape(-1, 2)
        expect = sum(int(infos[d].size) for d in members)
        ok = arr.shape[0] == expect and np.isin(arr[:, 0], list(members)).all()
        if ok:
            ok = arr[:, 1].min(initial=0) >= 0 and np.all(arr[:, 1] < all_sizes[arr[:, 0]])
            ok = ok and np.unique(arr[:, 0] * (1 << 40) + arr[:, 1]).size == expect
        if not ok:
            raise UserError(f"{where}: the order of '{unit}' is not a permutation of its {expect} examples "
                            f"(datasets {[infos[d].name for d in members]}) (fix: list each example once)")
        return arr

    if isinstance(obj, _OrdersFile):
        return _CheckedOrders(obj, list(units), check)
    return {unit: check(unit, obj[unit]) for unit in units}


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
