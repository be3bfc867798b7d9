"""A plan built in blocks of steps. The builders (``sampling``, ``curriculum``) put each unit's batches into
``Parts`` one unit at a time (the sampled units' in pieces, as ``passes`` sorts and de-duplicates them) and
return, per step, which part and which of its batches the step takes; ``Rows`` holds the plan's per-example
arrays. With a scratch folder both live in files (written and read by positioned I/O, not through a mapping), so
a process building a plan holds a piece of a unit (a bucket of its pass or order, a chunk of its rounds) and one
block of steps at a time, not the plan; without one they are arrays in memory. Either way the plan is the same, block for block."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

import numpy as np

from jaxembed.data.plan.units import R_SEMI, seeded_rng

#: examples per block of steps when a plan is built in blocks (~4 MB of dataset and example ids)
BLOCK_EXAMPLES = 1 << 18


def block_steps(G: int) -> int:
    return max(1, BLOCK_EXAMPLES // max(int(G), 1))


def _pread(fd: int, dtype, count: int, offset: int) -> np.ndarray:
    """``count`` items of ``dtype`` at byte ``offset`` of an open file (one positioned read)."""
    dt = np.dtype(dtype)
    buf = bytearray(count * dt.itemsize)
    view, done = memoryview(buf), 0
    while done < len(buf):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise OSError(f"short read at byte {offset + done}")
        done += n
    return np.frombuffer(buf, dt)


def _pwrite(fd: int, a: np.ndarray, offset: int) -> None:
    data, done = memoryview(np.ascontiguousarray(a)).cast("B"), 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], offset + done)


class Parts:
    """Numbered [n, G] batch arrays (dataset ids int32, example ids int64), and named (dataset, example) row lists:
    kept in memory, or, with ``folder``, appended to two files there (one for the dataset ids, one for the example
    ids) and read back by range."""

    def __init__(self, G: int, folder: Path | None = None):
        self.G, self.folder = int(G), folder
        self._mem: list = []
        self._n: list[int] = []
        self._at: list[int] = []  # first row of each part (and each kept list) in the files
        self._rows = 0
        self._named: dict = {}
        if folder is not None:
            self._fd = {k: os.open(folder / f"parts.{k}", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                        for k in ("ds", "ex")}

    def close(self) -> None:
        for fd in getattr(self, "_fd", {}).values():
            os.close(fd)
        self._fd = {}

    def _append(self, ds: np.ndarray, ex: np.ndarray) -> int:
        at = self._rows
        _pwrite(self._fd["ds"], np.asarray(ds, np.int32).reshape(-1), at * 4)
        _pwrite(self._fd["ex"], np.asarray(ex, np.int64).reshape(-1), at * 8)
        self._rows += int(np.asarray(ds).size)
        return at

    def add(self, ds: np.ndarray, ex: np.ndarray) -> int:
        """Store a part's batches [n, G]; returns its number."""
        k = len(self._n)
        self._n.append(int(ds.shape[0]))
        if self.folder is None:
            self._mem.append((ds, ex))
        else:
            self._at.append(self._append(ds, ex))
        return k

    def begin(self) -> int:
        """Start a part whose batches come in pieces (``extend``, then ``end``); returns its number."""
        k = len(self._n)
        self._n.append(0)
        if self.folder is None:
            self._mem.append(([], []))
        else:
            self._at.append(self._rows)
        return k

    def extend(self, ds: np.ndarray, ex: np.ndarray) -> None:
        """Append batches [n, G] to the part begun last (nothing else is stored between ``begin`` and ``end``)."""
        self._n[-1] += int(ds.shape[0])
        if self.folder is None:
            self._mem[-1][0].append(ds)
            self._mem[-1][1].append(ex)
        else:
            self._append(ds, ex)

    def end(self) -> None:
        if self.folder is None:
            d, e = self._mem[-1]
            G = self.G
            self._mem[-1] = (np.concatenate(d) if d else np.zeros((0, G), np.int32),
                             np.concatenate(e) if e else np.zeros((0, G), np.int64))

    def batches(self, k: int) -> int:
        return self._n[k]

    def read(self, k: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Batches [lo, hi) of part k."""
        if self.folder is None:
            ds, ex = self._mem[k]
            return ds[lo:hi], ex[lo:hi]
        G, at = self.G, self._at[k] + lo * self.G
        n = (hi - lo) * G
        return (_pread(self._fd["ds"], np.int32, n, at * 4).reshape(-1, G),
                _pread(self._fd["ex"], np.int64, n, at * 8).reshape(-1, G))

    def keep(self, name: str, ds: np.ndarray, ex: np.ndarray):
        """Keep a list of rows (a curriculum unit's instance order) until ``load``; returns its handle."""
        if self.folder is None:
            return ds, ex
        return self._append(ds, ex), int(np.asarray(ds).size)

    def keep_chunks(self, chunks):
        """``keep`` for rows that come in (dataset ids, example ids) chunks, one after the other."""
        if self.folder is None:
            got = list(chunks)
            return (np.concatenate([d for d, _ in got]) if got else np.zeros(0, np.int32),
                    np.concatenate([e for _, e in got]) if got else np.zeros(0, np.int64))
        at, n = self._rows, 0
        for d, e in chunks:
            self._append(d, e)
            n += int(np.asarray(d).size)
        return at, n

    def load(self, handle, lo: int = 0, hi: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Rows [lo, hi) of a kept list (all of it by default)."""
        if self.folder is None:
            return handle[0][lo:hi], handle[1][lo:hi]
        at, n = handle
        hi = n if hi is None else min(hi, n)
        n, at = max(hi - lo, 0), at + lo
        return _pread(self._fd["ds"], np.int32, n, at * 4), _pread(self._fd["ex"], np.int64, n, at * 8)


def assemble(parts: Parts, owner: np.ndarray, idx: np.ndarray, s0: int, s1: int):
    """Steps [s0, s1): step s is batch idx[s] of part owner[s]. A part's batches are taken in order, so a block
    reads one range of each part it uses. -> (dataset ids int32 [n, G], example ids int64 [n, G])."""
    o, j = owner[s0:s1], idx[s0:s1]
    ds = np.empty((o.size, parts.G), np.int32)
    ex = np.empty((o.size, parts.G), np.int64)
    order = np.argsort(o, kind="stable")  # the block's steps grouped by part, each group in step order
    bounds = [0, *(np.flatnonzero(np.diff(o[order])) + 1).tolist(), o.size]
    for a, b in zip(bounds[:-1], bounds[1:]):
        if a == b:
            continue
        sel, k = order[a:b], int(o[order[a]])
        lo, hi = int(j[sel].min()), int(j[sel].max()) + 1
        d, e = parts.read(k, lo, hi)
        ds[sel], ex[sel] = d[j[sel] - lo], e[j[sel] - lo]
    return ds, ex


class Rows:
    """The plan's per-example arrays [S, G] (dataset_ids, example_ids, weights) as they are written, block by
    block: arrays in memory, or raw files in ``folder`` (positioned writes and reads)."""

    DTYPES = {"dataset_ids": np.int32, "example_ids": np.int64, "weights": np.float32}

    def __init__(self, S: int, G: int, folder: Path | None = None):
        self.S, self.G, self.folder = int(S), int(G), folder
        self._mem, self._fd = {}, {}
        for k, dt in self.DTYPES.items():
            if folder is None:
                self._mem[k] = np.empty((self.S, self.G), dt)
            else:
                self._fd[k] = os.open(folder / f"{k}.raw", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                os.ftruncate(self._fd[k], self.S * self.G * np.dtype(dt).itemsize)

    def close(self) -> None:
        for fd in self._fd.values():
            os.close(fd)
        self._fd = {}

    def write(self, name: str, s0: int, block: np.ndarray) -> None:
        if self.folder is None:
            self._mem[name][s0:s0 + block.shape[0]] = block
            return
        dt = np.dtype(self.DTYPES[name])
        _pwrite(self._fd[name], np.asarray(block, dt), s0 * self.G * dt.itemsize)

    def read(self, name: str, s0: int, s1: int) -> np.ndarray:
        """Steps [s0, s1), a new (writable) array."""
        s0, s1 = max(s0, 0), min(s1, self.S)
        if self.folder is None:
            return self._mem[name][s0:s1].copy()
        dt = np.dtype(self.DTYPES[name])
        out = _pread(self._fd[name], dt, max(s1 - s0, 0) * self.G, s0 * self.G * dt.itemsize)
        return out.reshape(-1, self.G)

    def array(self, name: str) -> np.ndarray:
        """The whole array: in memory, or its file mapped read-only (read by ``read_steps``, in blocks)."""
        if self.folder is None:
            return self._mem[name]
        if self.S * self.G == 0:
            return np.zeros((self.S, self.G), self.DTYPES[name])
        return np.memmap(self.folder / f"{name}.raw", self.DTYPES[name], mode="r", shape=(self.S, self.G))


def semi_swap(rows: Rows, owner: np.ndarray, semi_units: list[int], m: int, seed: int, step_block: int,
              dedupe: Callable) -> int:
    """KaLM's semi-homogeneous mixing on the written rows: m random positions of every semi-homogeneous batch
    are pulled out, shuffled across all those batches and put back; then in-batch repeats are swapped out
    (``dedupe``: ``sampling.dedupe_batches``) along the semi-homogeneous batches, a window at a time. The random
    streams are drawn in the order of the in-memory build, so the result is the same. Holds the pulled rows (m of
    G per batch: dataset and example ids, their shuffle and positions, ~30 bytes each). Returns the repeats left."""
    steps = np.flatnonzero(np.isin(owner, semi_units))
    R, G = steps.size, rows.G
    if not (m and R > 1):
        return 0
    rng = seeded_rng(seed, R_SEMI)
    pos = np.empty((R, m), np.int32)  # the pulled positions of each semi-homogeneous batch
    for r0 in range(0, R, step_block):  # the stream of one rng.random((R, G)), drawn a block at a time
        r1 = min(R, r0 + step_block)
        pos[r0:r1] = np.argsort(rng.random((r1 - r0, G)), axis=1)[:, :m]
    perm = rng.permutation(R * m)
    pulled_d = np.empty(R * m, np.int32)
    pulled_e = np.empty(R * m, np.int64)

    def pull(r0, r1, d, e):
        pulled_d[r0 * m:r1 * m] = np.take_along_axis(d, pos[r0:r1], 1).reshape(-1)
        pulled_e[r0 * m:r1 * m] = np.take_along_axis(e, pos[r0:r1], 1).reshape(-1)

    _semi_pass(rows, steps, step_block, pull, False)
    new_d = pulled_d[perm]
    del pulled_d
    new_e = pulled_e[perm]
    del pulled_e, perm

    def put(r0, r1, d, e):
        np.put_along_axis(d, pos[r0:r1], new_d[r0 * m:r1 * m].reshape(-1, m), 1)
        np.put_along_axis(e, pos[r0:r1], new_e[r0 * m:r1 * m].reshape(-1, m), 1)

    _semi_pass(rows, steps, step_block, put, True)
    return _sliding_dedupe(rows, steps, step_block, dedupe)


def _runs(steps: np.ndarray, gap: int = 8):
    """(start, stop) positions in ``steps`` (ascending) of groups read as one range of the plan: consecutive
    steps less than ``gap`` apart, so sparse steps never make a range that spans the plan."""
    cuts = np.flatnonzero(np.diff(steps) >= gap) + 1
    bounds = np.concatenate([[0], cuts, [steps.size]]).tolist()
    return list(zip(bounds[:-1], bounds[1:]))


def _read_steps_of(rows: Rows, steps: np.ndarray):
    """The rows of the given (ascending) steps."""
    d, e = [], []
    for a, b in _runs(steps):
        lo, hi = int(steps[a]), int(steps[b - 1]) + 1
        d.append(rows.read("dataset_ids", lo, hi)[steps[a:b] - lo])
        e.append(rows.read("example_ids", lo, hi)[steps[a:b] - lo])
    return np.concatenate(d), np.concatenate(e)


def _write_steps_of(rows: Rows, steps: np.ndarray, d: np.ndarray, e: np.ndarray) -> None:
    for a, b in _runs(steps):
        lo, hi = int(steps[a]), int(steps[b - 1]) + 1
        bd, be = rows.read("dataset_ids", lo, hi), rows.read("example_ids", lo, hi)
        bd[steps[a:b] - lo], be[steps[a:b] - lo] = d[a:b], e[a:b]
        rows.write("dataset_ids", lo, bd)
        rows.write("example_ids", lo, be)


def _semi_pass(rows: Rows, steps: np.ndarray, block: int, fn: Callable, write: bool) -> None:
    for r0 in range(0, steps.size, block):
        r1 = min(steps.size, r0 + block)
        d, e = _read_steps_of(rows, steps[r0:r1])
        fn(r0, r1, d, e)
        if write:
            _write_steps_of(rows, steps[r0:r1], d, e)


def _sliding_dedupe(rows: Rows, steps: np.ndarray, block: int, dedupe: Callable, window: int = 64) -> int:
    """``dedupe`` over the rows of ``steps`` in order, a block at a time: a row's swaps reach ``window`` rows either
    side, so the buffer holds the block with ``window`` rows before and after it, and a row is written back once
    no later row can reach it."""
    R = steps.size
    lo, hi = 0, min(R, block + window)
    bd, be = _read_steps_of(rows, steps[lo:hi])
    unresolved = 0
    for c0 in range(0, R, block):
        c1 = min(R, c0 + block)
        need = min(R, c1 + window)
        if need > hi:
            d, e = _read_steps_of(rows, steps[hi:need])
            bd, be, hi = np.concatenate([bd, d]), np.concatenate([be, e]), need
        unresolved += dedupe(bd, be, window, c0 - lo, c1 - lo)
        done = hi if c1 == R else max(lo, c1 - window)
        if done > lo:
            _write_steps_of(rows, steps[lo:done], bd[:done - lo], be[:done - lo])
            bd, be, lo = bd[done - lo:], be[done - lo:], done
    return unresolved


def scratch_folder(path: Path) -> Path:
    """A new scratch folder beside ``path`` (on the same disk as the plan it builds)."""
    from jaxembed.runs import atomic_files

    folder = atomic_files.unique_tmp(path, ".blocks")
    folder.mkdir(parents=True)
    return folder


def remove_scratch(folder: Path | None) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
