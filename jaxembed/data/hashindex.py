"""Compact hash structures for checks over millions of records in bounded memory, instead of Python dicts of
strings (~250 bytes per record):

- ``HashIndex``: a set of 96-bit string hashes with one integer each (duplicate ids, with where the first one was):
  20 bytes per slot in flat arrays, at most 3/4 full (27-53 bytes per entry). A key is Python's 64-bit SipHash of
  the string plus 32 bits of the SipHash of a salted copy: a false "duplicate" needs both to collide (~n^2 / 2^97).
- ``HashLog``: the 64-bit hash of each example's content in reading order (8 bytes per example); duplicates are
  found once, at the end, by sorting (``duplicates``).

Python's string hash is randomised per process: the hashes are only compared within one process.
"""

from __future__ import annotations

from array import array

import numpy as np

_MASK = (1 << 64) - 1
_EMPTY = 0
_MAX_LOAD = 0.75


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
    """64-bit hashes in order (8 bytes each); ``duplicates`` counts the entries equal to an earlier one."""

    def __init__(self):
        self._h = array("Q")

    def __len__(self) -> int:
        return len(self._h)

    def append(self, h: int) -> None:
        self._h.append(h)

    def duplicates(self, examples: int = 5) -> tuple[int, list[tuple[int, int]]]:
        """(number of entries equal to an earlier entry, the first ``examples`` of them as (index, index of the
        first equal entry)). Sorting: ~8 bytes per entry more while it runs."""
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
