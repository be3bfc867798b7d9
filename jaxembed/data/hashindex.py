"""Compact hash structures for checks over millions of records in bounded memory, instead of Python dicts of
strings (~250 bytes per record):

- ``HashIndex``: a set of 96-bit string hashes with one integer each (duplicate ids, with where the first one was):
  20 bytes per slot in flat arrays, at most 3/4 full (27-53 bytes per entry). A key is Python's 64-bit SipHash of
  the string plus 32 bits of the SipHash of a salted copy: a false "duplicate" needs both to collide (~n^2 / 2^97).
- ``HashLog``: 64-bit hashes in reading order (the content of each example; 8 bytes per entry); duplicates are
  found once, at the end, by sorting (``duplicates``). Up to ``IN_MEMORY`` entries are held and sorted in memory
  (16 bytes per entry at the sort); beyond, every ``IN_MEMORY`` entries are sorted in runs of ``RUN``
  (hash, index) pairs written to an anonymous file in ``spill_dir`` (the store's temporary folder, 16 bytes per
  entry on disk, more while runs are merged ``FAN_IN`` at a time) and merged: an external sort whose memory does
  not grow with the number of entries (~8 MiB held, ~20 MiB at the sort of a run or a merge's round), and that
  finds exactly what the in-memory sort finds.

Python's string hash is randomised per process: the hashes are only compared within one process.
"""

from __future__ import annotations

from array import array
from typing import Iterable, Iterator

import numpy as np

_MASK = (1 << 64) - 1
_EMPTY = 0
_MAX_LOAD = 0.75
#: HashLog entries held (and sorted) in memory; beyond, they go to disk in sorted runs (tests lower it)
IN_MEMORY = 1 << 20
#: entries of a sorted run, and of what a merge holds of all its runs together
RUN = 1 << 18
#: runs merged at once; more are merged in groups first (a longer run each), so memory stays bounded
FAN_IN = 64


def key_of(value: str) -> tuple[int, int]:
    """(64-bit hash, 32-bit check) of a string: SipHash of it and of a salted copy; the first never 0 (0 marks an
    empty slot)."""
    return (hash(value) & _MASK) or 1, hash(value + "\x1f") & 0xFFFFFFFF


def example_hash(query: str, pos, neg, label: str | None) -> int:
    """The 64-bit hash of an example's content (query, positives, negatives, label; the id aside)."""
    return hash((query, tuple(pos), tuple(neg), label)) & _MASK


class HashIndex:
    """Open addressing with linear probing over three flat arrays: hash (8 bytes), check (4), value (8)."""

    def __init__(self, capacity: int = 1024):
        cap = 16
        while cap * _MAX_LOAD < capacity:
            cap *= 2
        self._alloc(cap)
        self.size = 0

    def _alloc(self, cap: int) -> None:
        self._cap = cap
        self._limit = int(cap * _MAX_LOAD)
        self._k = array("Q", bytes(8 * cap))
        self._c = array("I", bytes(4 * cap))
        self._v = array("q", bytes(8 * cap))

    def __len__(self) -> int:
        return self.size

    @property
    def nbytes(self) -> int:
        return 20 * self._cap

    def get_or_put(self, key: tuple[int, int], value: int) -> int | None:
        """The value stored under ``key`` if it is there; else store ``value`` under it and return None."""
        k, c = key
        mask = self._cap - 1
        i = k & mask
        ks = self._k
        while True:
            a = ks[i]
            if a == _EMPTY:
                break
            if a == k and self._c[i] == c:
                return self._v[i]
            i = (i + 1) & mask
        ks[i], self._c[i], self._v[i] = k, c, value
        self.size += 1
        if self.size > self._limit:
            self._grow()
        return None

    def _grow(self) -> None:
        old_k, old_c, old_v = self._k, self._c, self._v
        self._alloc(self._cap * 2)
        mask = self._cap - 1
        ks, cs, vs = self._k, self._c, self._v
        for j, a in enumerate(old_k):
            if a == _EMPTY:
                continue
            i = a & mask
            while ks[i] != _EMPTY:
                i = (i + 1) & mask
            ks[i], cs[i], vs[i] = a, old_c[j], old_v[j]


class HashLog:
    """64-bit hashes in order (8 bytes each, spilled to sorted runs on disk beyond ``IN_MEMORY``); ``duplicates``
    counts the entries equal to an earlier one."""

    def __init__(self, spill_dir: str | None = None):
        self._h = array("Q")
        self.spill_dir = spill_dir
        self._file = None
        self._runs: list[tuple[int, int]] = []  # (byte offset, entries) of each sorted run in the file
        self._spilled = 0

    def __len__(self) -> int:
        return self._spilled + len(self._h)

    def append(self, h: int) -> None:
        self._h.append(h)
        if len(self._h) >= IN_MEMORY:
            self._spill()

    def extend(self, data: bytes) -> None:
        """Append the hashes packed in ``data`` (native uint64s, as ``array('Q').tobytes()`` writes them)."""
        view = memoryview(data).cast("B")
        while len(view):
            take = min(len(view), 8 * max(IN_MEMORY - len(self._h), 1))
            self._h.frombytes(view[:take])
            view = view[take:]
            if len(self._h) >= IN_MEMORY:
                self._spill()

    def close(self) -> None:
        """Drop the spilled runs (the file is anonymous: gone once closed)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def _spill(self) -> None:
        """Sort the entries held by (hash, index) and write them as runs of ``RUN`` (at most ``IN_MEMORY``)."""
        n = len(self._h)
        if not n:
            return
        if self._file is None:
            import tempfile

            self._file = tempfile.TemporaryFile(dir=self.spill_dir)
        size = max(1, min(RUN, IN_MEMORY))
        held = np.frombuffer(self._h, dtype=np.uint64)
        for a in range(0, n, size):
            h = held[a:a + size]
            order = np.argsort(h, kind="stable")
            run = np.empty(len(h), dtype=_PAIR)
            run["h"] = h[order]
            run["i"] = order + (self._spilled + a)
            del order
            self._runs.append(_append(self._file, run))
        del held, h
        self._spilled += n
        self._h = array("Q")

    def sorted_chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(hashes, indices) in consecutive chunks that, put together, are every entry sorted by (hash, index)."""
        if not self._runs:
            h = np.frombuffer(self._h, dtype=np.uint64)
            order = np.argsort(h, kind="stable")
            if len(order):
                yield h[order], order.astype(np.uint64)
            return
        self._spill()
        while len(self._runs) > FAN_IN:  # merge groups of runs into longer runs, until one merge takes them all
            groups = [self._runs[a:a + FAN_IN] for a in range(0, len(self._runs), FAN_IN)]
            self._runs = [self._merged_run(g) for g in groups]
        yield from _merge_runs(self._file, self._runs, _block(len(self._runs)))

    def _merged_run(self, runs: list[tuple[int, int]]) -> tuple[int, int]:
        """Merge ``runs`` into one new run at the end of the file."""
        if len(runs) == 1:
            return runs[0]
        start, total = None, 0
        for h, i in _merge_runs(self._file, runs, _block(len(runs))):  # appended one after the other: one run
            run = np.empty(len(h), dtype=_PAIR)
            run["h"], run["i"] = h, i
            at, n = _append(self._file, run)
            start = at if start is None else start
            total += n
        return start, total

    def duplicates(self, examples: int = 5) -> tuple[int, list[tuple[int, int]]]:
        """(number of entries equal to an earlier entry, the first ``examples`` of them as (index, index of the
        first equal entry)). In memory: ~8 bytes per entry more while it runs; spilled: bounded."""
        if self._runs:
            return _duplicates_sorted(self.sorted_chunks(), examples)
        n = len(self._h)
        if n < 2:
            return 0, []
        h = np.frombuffer(self._h, dtype=np.uint64)
        s = np.sort(h)
        same = s[1:] == s[:-1]
        count = int(same.sum())
        if not count:
            return 0, []
        repeated = np.unique(s[1:][same])
        del s, same
        first: dict[int, int] = {}
        pairs: list[tuple[int, int]] = []
        for i in np.flatnonzero(np.isin(h, repeated)):
            v = int(h[i])
            if v in first:
                pairs.append((int(i), first[v]))
                if len(pairs) == examples:
                    break
            else:
                first[v] = int(i)
        return count, pairs

    def in_two_segments(self, starts: list[int]) -> bool:
        """Whether a hash is at two entries of different segments (segment k: the entries from ``starts[k]`` to
        the next start), a hash repeated within one segment aside."""
        bounds = np.asarray(starts[1:], dtype=np.uint64)
        last = None  # (hash, segment) of the entry before the chunk
        for h, i in self.sorted_chunks():
            seg = np.searchsorted(bounds, i, side="right")
            if last is not None and h[0] == last[0] and seg[0] != last[1]:
                return True
            if np.any((h[1:] == h[:-1]) & (seg[1:] != seg[:-1])):
                return True
            last = (h[-1], seg[-1])
        return False


_PAIR = np.dtype([("h", "<u8"), ("i", "<u8")])


def _block(runs: int) -> int:
    """Entries read of each run at a time in a merge of ``runs``: ``RUN`` in all."""
    return max(RUN // runs, 1)


def _append(f, run: np.ndarray) -> tuple[int, int]:
    """Write ``run`` at the end of ``f``: its (byte offset, entries)."""
    f.seek(0, 2)
    at = f.tell()
    f.write(run.tobytes())
    return at, len(run)


def _read_block(f, offset: int, start: int, count: int) -> np.ndarray:
    f.seek(offset + start * _PAIR.itemsize)
    return np.frombuffer(f.read(count * _PAIR.itemsize), dtype=_PAIR)


def _merge_runs(f, runs: list[tuple[int, int]], block: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Merge sorted runs in ``block`` entries of each at a time: each round gives out every loaded entry up to the
    smallest (hash, index) last loaded of a run not yet all read (what is left unread is all above it), sorted."""
    pos = [0] * len(runs)
    held = [np.zeros(0, dtype=_PAIR) for _ in runs]
    while True:
        for j, (off, n) in enumerate(runs):
            if not len(held[j]) and pos[j] < n:
                held[j] = _read_block(f, off, pos[j], min(block, n - pos[j]))
                pos[j] += len(held[j])
        ends = [(int(held[j]["h"][-1]), int(held[j]["i"][-1])) for j in range(len(runs))
                if len(held[j]) and pos[j] < runs[j][1]]
        bound = min(ends) if ends else None
        out = []
        for j, b in enumerate(held):
            if not len(b):
                continue
            cut = len(b) if bound is None else _count_upto(b, bound)
            out.append(b[:cut])
            held[j] = b[cut:]
        if not out:
            return
        chunk = np.concatenate(out)
        del out
        if len(chunk):
            order = np.lexsort((chunk["i"], chunk["h"]))
            yield chunk["h"][order], chunk["i"][order]


def _count_upto(b: np.ndarray, bound: tuple[int, int]) -> int:
    """Entries of the sorted block ``b`` at or below (hash, index) ``bound``."""
    h = b["h"]
    lo = int(np.searchsorted(h, np.uint64(bound[0]), side="left"))
    hi = int(np.searchsorted(h, np.uint64(bound[0]), side="right"))
    return lo + int(np.searchsorted(b["i"][lo:hi], np.uint64(bound[1]), side="right"))


def _duplicates_sorted(chunks: Iterable[tuple[np.ndarray, np.ndarray]], examples: int
                       ) -> tuple[int, list[tuple[int, int]]]:
    """``HashLog.duplicates`` over (hash, index) chunks sorted by (hash, index): an entry after the first of its
    hash is a duplicate of that first; the first ``examples`` pairs are those of the smallest indices."""
    count, best = 0, np.zeros((0, 2), dtype=np.uint64)
    last = None  # (hash, index of the first of that hash) of the entry before the chunk
    for h, i in chunks:
        start = np.empty(len(h), dtype=bool)
        start[0] = last is None or h[0] != last[0]
        start[1:] = h[1:] != h[:-1]
        firsts = i[start] if start[0] else np.concatenate([[last[1]], i[start]]).astype(np.uint64)
        first_of = firsts[np.cumsum(start) - (1 if start[0] else 0)]
        dup = ~start
        count += int(dup.sum())
        if examples and dup.any():
            cand = np.concatenate([best, np.stack([i[dup], first_of[dup]], axis=1)])
            best = cand[np.argsort(cand[:, 0], kind="stable")[:examples]]
        last = (h[-1], first_of[-1])
    return count, [(int(a), int(b)) for a, b in best]
