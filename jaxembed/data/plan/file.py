"""The ``Plan``: the arrays of a batch plan (see ``jaxembed.data.plan``), its checks, and its file: ``plan.npz``
(the arrays) + ``plan.json`` (names, config, seed, meta, fingerprint), written atomically, read back with every
array's dtype and shape and the fingerprint checked."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import mmap
import os
import zipfile
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
        """The dataset ids the plan's rows use, ascending (counted over blocks of steps: no copy of the plan)."""
        D = len(self.dataset_names)
        seen = np.zeros(D, bool)
        n = block_of(self.dataset_ids)
        for s0 in range(0, self.steps, n):
            seen |= np.bincount(read_steps(self.dataset_ids, s0, s0 + n).reshape(-1), minlength=D) > 0
        return np.flatnonzero(seen).tolist()

    def row_task_ids(self) -> np.ndarray:
        """int32 [S, G]: the task of every row."""
        return self.dataset_tasks[self.dataset_ids]

    def step(self, i: int) -> dict[str, np.ndarray]:
        """The global batch of step i: dataset_ids [G], example_ids [G], weights [G], task_id, temperature."""
        if not 0 <= i < self.steps:
            raise UserError(f"step {i} is outside the plan (0..{self.steps - 1})")
        return {"dataset_ids": self.dataset_ids[i], "example_ids": self.example_ids[i], "weights": self.weights[i],
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

        side = {"format": FORMAT, "version": VERSION, "fingerprint": self.fingerprint(), "steps": self.steps,
                "global_batch_size": self.global_batch_size, "seed": self.seed,
                "task_names": list(self.task_names), "dataset_names": list(self.dataset_names),
                "config": self.config, "meta": self.meta, **(sidecar or {})}
        arrays = dict(dataset_ids=self.dataset_ids, example_ids=self.example_ids, task_ids=self.task_ids,
                      weights=self.weights, temperatures=self.temperatures, dataset_tasks=self.dataset_tasks,
                      dataset_sizes=self.dataset_sizes, dropped=self.dropped, unit_ids=self.unit_ids)
        # each file through its own unique temporary name (host, pid, random), renamed into place: concurrent
        # savers never share a temporary file; a reader between the two renames sees a pair whose fingerprints
        # differ, which ``load`` reports
        atomic_files.write_with(path, lambda t: write_npz(t, arrays, read_steps, block_of), suffix=".npz")
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
        validate_plan(plan, str(path))
        fingerprint = plan.fingerprint()
        if side.get("fingerprint") != fingerprint:
            raise UserError(f"{path}: the arrays do not match {side_path.name} (fingerprint "
                            f"{fingerprint} vs {side.get('fingerprint')}); the two files come from "
                            "different builds (fix: rebuild the plan)")
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


def read_steps(a: np.ndarray, s0: int, s1: int) -> np.ndarray:
    """Steps [s0, s1) of a plan array, as a new array. A memory-mapped one is read from its file (a positioned
    read, not through the mapping), so reading every step of a plan leaves no pages of it in the process's
    resident memory."""
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
    S, G = plan.dataset_ids.shape
    D, T = len(plan.dataset_names), len(plan.task_names)
    if plan.example_ids.shape != (S, G) or plan.weights.shape != (S, G):
        raise UserError(f"{where}: example_ids / weights shapes differ from dataset_ids [{S}, {G}]")
    if plan.task_ids.shape != (S,) or plan.temperatures.shape != (S,) or plan.unit_ids.shape != (S,):
        raise UserError(f"{where}: task_ids / temperatures / unit_ids must have shape [{S}]")
    if plan.dataset_tasks.shape != (D,) or plan.dataset_sizes.shape != (D,):
        raise UserError(f"{where}: the dataset tables must have {D} entries")
    n = block_of(plan.dataset_ids)
    for s0 in range(0, S, n):  # in blocks of steps: bounded memory for any plan size
        ds = read_steps(plan.dataset_ids, s0, s0 + n)
        ex = read_steps(plan.example_ids, s0, s0 + n)
        if ds.min() < 0 or ds.max() >= D:
            raise UserError(f"{where}: dataset id out of range [0, {D})")
        if ex.min() < 0 or np.any(ex >= plan.dataset_sizes[ds]):
            raise UserError(f"{where}: an example id is out of range of its dataset's size")
    if S and (plan.task_ids.min() < -1 or plan.task_ids.max() >= T):
        raise UserError(f"{where}: task id out of range [-1, {T})")
    if D and (plan.dataset_tasks.min() < 0 or plan.dataset_tasks.max() >= T):
        raise UserError(f"{where}: dataset_tasks out of range [0, {T})")
