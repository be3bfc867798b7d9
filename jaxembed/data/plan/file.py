"""The ``Plan``: the arrays of a batch plan (see ``jaxembed.data.plan``), its checks, and its file: ``plan.npz``
(the arrays) + ``plan.json`` (names, config, seed, meta, fingerprint), written atomically, read back with every
array's dtype and shape checked.

The per-example arrays (dataset_ids, example_ids, weights: 16 B a row) are memory-mapped and checked lazily, so
that a host's start-up does not read the whole plan: ``save`` writes, as it writes them, a digest of every block
of steps of each (``block_digests``) and the datasets the rows use (``used_dataset_ids``); ``plan.json`` holds
``checks``: the block size and one digest of those tables, the small arrays, the names and the fingerprint.
``load`` compares that digest with the file's tables and small arrays (the two files of one build: else the one-line
"do not match" error); each block of steps is then compared with its digest, and its ids checked
against the dataset sizes, the first time this process reads from it (``read_steps``), before its rows are used.
A plan file without ``checks`` (written by an earlier jaxembed) is checked whole when loaded (its fingerprint and every row)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import mmap
import os
import zipfile
from typing import Sequence
from pathlib import Path

import numpy as np

from jaxembed.data.plan.inputs import dataset_infos
from jaxembed.data.plan.npz import mapped_npz, write_npz
from jaxembed.errors import UserError

FORMAT = "jaxembed-plan"
VERSION = 1


@dataclasses.dataclass(eq=False)
class Plan:
    """A batch plan (see ``jaxembed.data.plan`` for the arrays). ``meta`` holds what the summary needs: mode,
    strategy per task, configured epochs, units, dropped / filled counts; ``dropped`` int64 [n, 2] lists the
    (dataset id, example id) pairs of dropped remainders; ``unit_ids`` int32 [S] says which unit (a dataset, a
    task, or the pool of the random tasks; ``meta["units"]``) each batch was built from."""

    dataset_ids: np.ndarray
    example_ids: np.ndarray
    task_ids: np.ndarray
    weights: np.ndarray
    temperatures: np.ndarray
    task_names: tuple[str, ...]
    dataset_names: tuple[str, ...]
    dataset_tasks: np.ndarray   # int32 [D]: task id of each dataset
    dataset_sizes: np.ndarray   # int64 [D]
    config: dict
    seed: int
    meta: dict
    dropped: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 2), np.int64))
    unit_ids: np.ndarray | None = None  # int32 [S]: the unit (meta["units"]) each batch was built from

    def __post_init__(self):
        if self.unit_ids is None:
            self.unit_ids = np.full(self.dataset_ids.shape[0], -1, np.int32)

    @property
    def steps(self) -> int:
        return int(self.dataset_ids.shape[0])

    @property
    def global_batch_size(self) -> int:
        return int(self.dataset_ids.shape[1])

    def __len__(self) -> int:
        return self.steps

    def used_dataset_ids(self) -> list[int]:
        """The dataset ids the plan's rows use, ascending (counted over blocks of steps: no copy of the plan; a
        loaded plan's from its file, where ``save`` stored them)."""
        if getattr(self, "_used", None) is not None:
            return list(self._used)
        D = len(self.dataset_names)
        seen = np.zeros(D, bool)
        n = block_of(self.dataset_ids)
        for s0 in range(0, self.steps, n):
            seen |= np.bincount(read_steps(self.dataset_ids, s0, s0 + n).reshape(-1), minlength=D) > 0
        return np.flatnonzero(seen).tolist()

    def row_task_ids(self) -> np.ndarray:
        """int32 [S, G]: the task of every row."""
        return self.dataset_tasks[read_steps(self.dataset_ids, 0, self.steps)]

    def step(self, i: int) -> dict[str, np.ndarray]:
        """The global batch of step i: dataset_ids [G], example_ids [G], weights [G], task_id, temperature."""
        if not 0 <= i < self.steps:
            raise UserError(f"step {i} is outside the plan (0..{self.steps - 1})")
        ds, ex, w = (read_steps(a, i, i + 1)[0] for a in (self.dataset_ids, self.example_ids, self.weights))
        return {"dataset_ids": ds, "example_ids": ex, "weights": w,
                "task_id": int(self.task_ids[i]), "temperature": float(self.temperatures[i])}

    def fingerprint(self) -> str:
        """sha256 (hex, 16 chars) of the arrays and the name tables: equal plans have equal fingerprints."""
        if getattr(self, "_fingerprint", None) and isinstance(self.dataset_ids, np.memmap):
            return self._fingerprint  # read-only arrays of a loaded plan, checked when loaded
        h = hashlib.sha256()
        for a in (self.dataset_ids, self.example_ids, self.task_ids, self.weights, self.temperatures,
                  self.dataset_tasks, self.dataset_sizes, self.unit_ids):
            h.update(str((a.dtype.str, a.shape)).encode())
            n = block_of(a)
            for s0 in range(0, max(len(a), 1), n):  # blocks of steps: a memory-mapped plan stays so
                h.update(read_steps(a, s0, s0 + n).tobytes())
        h.update(json.dumps([list(self.task_names), list(self.dataset_names)]).encode())
        return h.hexdigest()[:16]

    def check_datasets(self, datasets, where: str = "the store") -> None:
        """Raise UserError unless ``datasets`` (a store or a list of DatasetInfo) has this plan's names and sizes."""
        infos = dataset_infos(datasets)
        names = tuple(i.name for i in infos)
        if names != self.dataset_names:
            raise UserError(f"the plan was built for datasets {list(self.dataset_names)}, but {where} has "
                            f"{list(names)} (fix: rebuild the plan with `jaxembed plan build` on this store)")
        sizes = np.array([int(i.size) for i in infos], np.int64)
        if not np.array_equal(sizes, self.dataset_sizes):
            bad = [f"{n} ({a} vs {b})" for n, a, b in zip(names, self.dataset_sizes, sizes) if a != b]
            raise UserError(f"dataset sizes differ between the plan and {where}: {', '.join(bad)} "
                            "(fix: rebuild the plan on this store)")

    # ---- files
    def save(self, path: str | os.PathLike, sidecar: dict | None = None) -> Path:
        """Write ``path`` (.npz, the arrays, uncompressed, as ``np.savez`` writes them) and ``path`` with suffix .json
        (names, config, seed, meta; ``sidecar``: extra fields). Atomic. The arrays are written in blocks of steps,
        so a plan whose arrays are files stays out of memory."""
        path = Path(path)
        if path.suffix != ".npz":
            raise UserError(f"{path}: a plan file must end in .npz")
        from jaxembed.runs import atomic_files

        fingerprint = self.fingerprint()
        side = {"format": FORMAT, "version": VERSION, "fingerprint": fingerprint, "steps": self.steps,
                "global_batch_size": self.global_batch_size, "seed": self.seed,
                "task_names": list(self.task_names), "dataset_names": list(self.dataset_names),
                "config": self.config, "meta": self.meta, **(sidecar or {})}
        tables = _Tables(block_of(self.dataset_ids), len(self.dataset_names))
        arrays = dict(dataset_ids=self.dataset_ids, example_ids=self.example_ids, task_ids=self.task_ids,
                      weights=self.weights, temperatures=self.temperatures, dataset_tasks=self.dataset_tasks,
                      dataset_sizes=self.dataset_sizes, dropped=self.dropped, unit_ids=self.unit_ids,
                      block_digests=tables.digests, used_dataset_ids=tables.used)
        # each file through its own unique temporary name (host, pid, random), renamed into place: concurrent
        # savers never share a temporary file; a reader between the two renames sees a pair whose digests
        # differ, which ``load`` reports
        atomic_files.write_with(path, lambda t: write_npz(t, arrays, read_steps, block_of, tables.add),
                                suffix=".npz")
        small = {k: (a() if callable(a) else a) for k, a in arrays.items() if k not in _MAPPED}
        shapes = [getattr(self, k).shape for k in _MAPPED]
        names = [list(self.task_names), list(self.dataset_names)]
        side["checks"] = {"block_steps": tables.n,
                          "digest": _tables_digest(small, fingerprint, tables.n, shapes, names)}
        atomic_files.write_text(path.with_suffix(".json"), json.dumps(side, indent=1, default=_json_default) + "\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Plan":
        """Read and validate a plan written by ``save``; errors name the file and the fix."""
        path = Path(path)
        side_path = path.with_suffix(".json")
        if not path.is_file():
            raise UserError(f"{path}: no such plan file (fix: build one with `jaxembed plan build`)")
        if not side_path.is_file():
            raise UserError(f"{side_path}: the plan's sidecar is missing (fix: keep {path.name} and "
                            f"{side_path.name} together, or rebuild the plan)")
        try:
            side = json.loads(side_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise UserError(f"{side_path}:{e.lineno}: invalid JSON ({e.msg}) (fix: rebuild the plan)") from None
        if not isinstance(side, dict) or side.get("format") != FORMAT:
            raise UserError(f"{side_path}: not a jaxembed plan sidecar (fix: rebuild the plan)")
        if side.get("version") != VERSION:
            raise UserError(f"{side_path}: plan format version {side.get('version')} is not supported (this "
                            f"jaxembed reads version {VERSION}; fix: rebuild the plan)")
        try:
            arrays = mapped_npz(path, _MAPPED)
        except (ValueError, OSError, zipfile.BadZipFile) as e:
            raise UserError(f"{path}: unreadable plan arrays ({e}) (fix: rebuild the plan)") from None
        need = {"dataset_ids": (np.int32, 2), "example_ids": (np.int64, 2), "task_ids": (np.int32, 1),
                "weights": (np.float32, 2), "temperatures": (np.float32, 1), "dataset_tasks": (np.int32, 1),
                "dataset_sizes": (np.int64, 1), "dropped": (np.int64, 2), "unit_ids": (np.int32, 1)}
        for k, (dt, nd) in need.items():
            if k not in arrays:
                raise UserError(f"{path}: array '{k}' is missing (fix: rebuild the plan)")
            if arrays[k].dtype != dt or arrays[k].ndim != nd:
                raise UserError(f"{path}: array '{k}' is {arrays[k].dtype}{list(arrays[k].shape)}, expected "
                                f"{np.dtype(dt)} with {nd} dims (fix: rebuild the plan)")
        plan = cls(arrays["dataset_ids"], arrays["example_ids"], arrays["task_ids"], arrays["weights"],
                   arrays["temperatures"], tuple(side["task_names"]), tuple(side["dataset_names"]),
                   arrays["dataset_tasks"], arrays["dataset_sizes"], side.get("config", {}), int(side["seed"]),
                   side.get("meta", {}), arrays["dropped"], arrays["unit_ids"])
        plan.source = path
        if "checks" in side:
            _check_tables(plan, arrays, side, side_path)
        else:  # written before the stored checks: every row read now
            validate_plan(plan, str(path))
            fingerprint = plan.fingerprint()
            if side.get("fingerprint") != fingerprint:
                raise mismatch(path, side_path, f"fingerprint {fingerprint} vs {side.get('fingerprint')}")
            plan._fingerprint = fingerprint
        return plan


    def __getstate__(self):
        """A plan read from its file travels (to a loader's worker processes) as the file's name: each process
        maps the file again instead of receiving a copy of its arrays."""
        state = dict(self.__dict__)
        if getattr(self, "source", None) is not None and isinstance(self.dataset_ids, np.memmap):
            for k in _MAPPED:
                state[k] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        if state.get("dataset_ids") is None:
            arrays = mapped_npz(state["source"], _MAPPED)
            for k in _MAPPED:
                setattr(self, k, arrays[k])
            if getattr(self, "_blocks", None) is not None:
                self._blocks.bind(self)


def read_steps(a: np.ndarray, s0: int, s1: int) -> np.ndarray:
    """Steps [s0, s1) of a plan array, as a new array. A memory-mapped one is read from its file (a positioned
    read, not through the mapping), so reading every step of a plan leaves no pages of it in the process's
    resident memory; the blocks of a loaded plan's array are checked the first time they are read."""
    s0, s1 = max(int(s0), 0), min(int(s1), len(a))
    blocks = getattr(a, "plan_blocks", None)
    if blocks is not None and s1 > s0:
        blocks.check(s0, s1)
    return _read_rows(a, s0, s1)


def _read_rows(a: np.ndarray, s0: int, s1: int) -> np.ndarray:
    s0, s1 = max(int(s0), 0), min(int(s1), len(a))
    if not isinstance(a, np.memmap) or not isinstance(a.base, mmap.mmap) or a.filename is None or s1 <= s0:
        return np.array(a[s0:s1])
    row = int(np.prod(a.shape[1:], dtype=np.int64)) if a.ndim > 1 else 1
    out = np.fromfile(a.filename, dtype=a.dtype, count=(s1 - s0) * row, offset=a.offset + s0 * row * a.itemsize)
    return out.reshape((s1 - s0, *a.shape[1:]))


#: the per-example arrays that a plan read from its file keeps memory-mapped
_MAPPED = ("dataset_ids", "example_ids", "weights")
#: steps per block when a whole plan is read (fingerprint, checks), at most, and examples per block: bounded
#: memory for any plan size and batch size
_BLOCK_STEPS = 1024
_BLOCK_EXAMPLES = 1 << 18


def block_of(a: np.ndarray) -> int:
    """Steps per block of the plan array ``a``: at most ``_BLOCK_STEPS``, and at most ``_BLOCK_EXAMPLES`` rows."""
    row = int(np.prod(a.shape[1:], dtype=np.int64)) if a.ndim > 1 else 1
    return max(1, min(_BLOCK_STEPS, _BLOCK_EXAMPLES // max(row, 1)))


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(type(o).__name__)


def validate_plan(plan: Plan, where: str) -> None:
    """Raise UserError unless the plan's shapes, tables and every row's ids are in range (in blocks of steps)."""
    validate_tables(plan, where)
    n = block_of(plan.dataset_ids)
    for s0 in range(0, plan.steps, n):  # in blocks of steps: bounded memory for any plan size
        ds = read_steps(plan.dataset_ids, s0, s0 + n)
        ex = read_steps(plan.example_ids, s0, s0 + n)
        check_rows(plan, ds, ex, where)


def check_rows(plan: Plan, ds: np.ndarray, ex: np.ndarray, where: str) -> None:
    """Raise UserError unless the rows' dataset ids and example ids are in range."""
    D = len(plan.dataset_names)
    if ds.size and (ds.min() < 0 or ds.max() >= D):
        raise UserError(f"{where}: dataset id out of range [0, {D})")
    if ex.size and (ex.min() < 0 or np.any(ex >= plan.dataset_sizes[ds])):
        raise UserError(f"{where}: an example id is out of range of its dataset's size")


def validate_tables(plan: Plan, where: str) -> None:
    """Raise UserError unless the plan's shapes and its per-step and per-dataset tables are in range."""
    S, G = plan.dataset_ids.shape
    D, T = len(plan.dataset_names), len(plan.task_names)
    if plan.example_ids.shape != (S, G) or plan.weights.shape != (S, G):
        raise UserError(f"{where}: example_ids / weights shapes differ from dataset_ids [{S}, {G}]")
    if plan.task_ids.shape != (S,) or plan.temperatures.shape != (S,) or plan.unit_ids.shape != (S,):
        raise UserError(f"{where}: task_ids / temperatures / unit_ids must have shape [{S}]")
    if plan.dataset_tasks.shape != (D,) or plan.dataset_sizes.shape != (D,):
        raise UserError(f"{where}: the dataset tables must have {D} entries")
    if S and (plan.task_ids.min() < -1 or plan.task_ids.max() >= T):
        raise UserError(f"{where}: task id out of range [-1, {T})")
    if D and (plan.dataset_tasks.min() < 0 or plan.dataset_tasks.max() >= T):
        raise UserError(f"{where}: dataset_tasks out of range [0, {T})")


# ---- the stored checks (module docstring)

def mismatch(path, side_path: Path, detail: str) -> UserError:
    return UserError(f"{path}: the arrays do not match {side_path.name} ({detail}); the two files come from "
                     "different builds, or were changed since (fix: rebuild the plan)")


def _digest(rows: np.ndarray) -> int:
    return int.from_bytes(hashlib.sha256(np.ascontiguousarray(rows).tobytes()).digest()[:8], "little")


def _tables_digest(small: dict, fingerprint, n: int, shapes: Sequence, names: list) -> str:
    """One digest of the plan's in-memory arrays (its block digests and used datasets among them), the block size,
    the per-example arrays' shapes, the task and dataset names and the fingerprint (what the fingerprint covers):
    ``plan.json`` pairs with ``plan.npz`` through it."""
    head = [fingerprint, int(n), [list(s) for s in shapes], sorted(small), names]
    h = hashlib.sha256(json.dumps(head).encode())
    for k in sorted(small):
        a = np.ascontiguousarray(small[k])
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


class _Tables:
    """What ``save`` computes as it writes the per-example arrays: each block's digest, the datasets used."""

    def __init__(self, n: int, D: int):
        self.n, self.D = n, D
        self._digests: dict[str, list[int]] = {k: [] for k in _MAPPED}
        self._seen = np.zeros(D, bool)

    def add(self, name: str, r0: int, rows: np.ndarray) -> None:
        if name in self._digests:
            self._digests[name].append(_digest(rows))
        if name == "dataset_ids":
            ok = rows[(rows >= 0) & (rows < self.D)]
            self._seen |= np.bincount(ok.reshape(-1), minlength=self.D) > 0

    def digests(self) -> np.ndarray:
        return np.array([self._digests[k] for k in _MAPPED], np.uint64).reshape(len(_MAPPED), -1)

    def used(self) -> np.ndarray:
        return np.flatnonzero(self._seen).astype(np.int32)


def _check_tables(plan: Plan, arrays: dict, side: dict, side_path: Path) -> None:
    """``load``'s check of a plan file with stored checks: the tables against ``plan.json``, the per-step and
    per-dataset arrays in range; the blocks of steps are checked as they are read (``_Blocks``)."""
    path, checks = plan.source, side["checks"]
    small = {k: a for k, a in arrays.items() if k not in _MAPPED}
    n = checks.get("block_steps") if isinstance(checks, dict) else None
    if not isinstance(n, int) or n < 1 or "block_digests" not in small or "used_dataset_ids" not in small:
        raise mismatch(path, side_path, "the block digests are missing")
    got = _tables_digest(small, side.get("fingerprint"), n, [arrays[k].shape for k in _MAPPED],
                         [list(plan.task_names), list(plan.dataset_names)])
    if got != checks.get("digest") or not isinstance(side.get("fingerprint"), str):
        raise mismatch(path, side_path, f"digest {got} vs {checks.get('digest')}")
    validate_tables(plan, str(path))
    digests = small["block_digests"]
    if digests.dtype != np.uint64 or digests.shape != (len(_MAPPED), -(-plan.steps // n)):
        raise mismatch(path, side_path, f"block digests {digests.dtype}{list(digests.shape)}")
    plan._used = small["used_dataset_ids"].tolist()
    plan._fingerprint = side["fingerprint"]
    plan._blocks = _Blocks(str(path), side_path, n, digests)
    plan._blocks.bind(plan)


class _Blocks:
    """The stored digests of a loaded plan's blocks of steps: a block is read and checked (each array's digest,
    then its ids in range) the first time this process reads from it, before its rows are returned."""

    def __init__(self, where: str, side_path: Path, n: int, digests: np.ndarray):
        self.where, self.side_path, self.n, self.digests = where, side_path, n, digests
        self.done = np.zeros(digests.shape[1], bool)
        self.plan = None

    def __getstate__(self):
        return dict(self.__dict__, plan=None)  # the plan binds its copy again (``Plan.__setstate__``)

    def bind(self, plan: Plan) -> None:
        self.plan = plan
        arrays = [getattr(plan, k) for k in _MAPPED]
        for a in arrays:
            if isinstance(a, np.memmap):
                a.plan_blocks = self
        if not all(isinstance(a, np.memmap) for a in arrays):  # read whole already (not stored plainly)
            self.check(0, plan.steps)

    def check(self, s0: int, s1: int) -> None:
        for b in range(s0 // self.n, (s1 - 1) // self.n + 1):
            if not self.done[b]:
                self._check(b)

    def _check(self, b: int) -> None:
        s0, s1 = b * self.n, min((b + 1) * self.n, self.plan.steps)
        rows = [_read_rows(getattr(self.plan, k), s0, s1) for k in _MAPPED]
        for k, r, want in zip(_MAPPED, rows, self.digests[:, b]):
            if _digest(r) != int(want):
                raise mismatch(self.where, self.side_path, f"{k} of steps {s0}..{s1 - 1} differ from their digest")
        check_rows(self.plan, rows[0], rows[1], self.where)
        self.done[b] = True
