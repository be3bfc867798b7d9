"""A compact set of 128-bit hashes with one integer per entry, for checks over millions of records in bounded
memory (duplicate ids, identical examples): 24 bytes per slot in flat arrays, at most half full, instead of a
Python dict of strings (~150-300 bytes per record).

A key is two independent 64-bit hashes of the value (``key_of``): a false match needs both to collide,
probability ~n^2 / 2^129, so a "duplicate" reported from this index is a duplicate.
"""

from __future__ import annotations

from array import array

_MASK = (1 << 64) - 1
_EMPTY = 0


def key_of(value: str) -> tuple[int, int]:
    """Two 64-bit hashes of a string: Python's SipHash of it and of a salted copy (two independent hashes), both
    in [1, 2^64) (0 marks an empty slot). Stable within one process only."""
    h1 = hash(value) & _MASK
    h2 = hash(value + "\x1f") & _MASK
    return h1 or 1, h2 or 1


def example_key(query: str, pos, neg, label: str | None) -> tuple[int, int]:
    """``key_of`` of an example's content (query, positives, negatives, label; the id aside), its parts joined
    with control characters that texts do not hold."""
    return key_of("\x1e".join([query, "\x1d", *pos, "\x1d", *neg, "\x1d", label or ""]))


class HashIndex:
    """Open addressing (linear probing) over three flat arrays: hash 1, hash 2, value (int64)."""

    def __init__(self, capacity: int = 1024):
        cap = 16
        while cap < 2 * capacity:
            cap *= 2
        self._alloc(cap)
        self.size = 0

    def _alloc(self, cap: int) -> None:
        self._cap = cap
        self._k1 = array("Q", bytes(8 * cap))
        self._k2 = array("Q", bytes(8 * cap))
        self._v = array("q", bytes(8 * cap))

    def __len__(self) -> int:
        return self.size

    @property
    def nbytes(self) -> int:
        return 24 * self._cap

    def get_or_put(self, key: tuple[int, int], value: int) -> int | None:
        """The value stored under ``key`` if it is there; else store ``value`` under it and return None."""
        k1, k2 = key
        mask = self._cap - 1
        i = k1 & mask
        k1s, k2s = self._k1, self._k2
        while True:
            a = k1s[i]
            if a == _EMPTY:
                break
            if a == k1 and k2s[i] == k2:
                return self._v[i]
            i = (i + 1) & mask
        k1s[i], k2s[i], self._v[i] = k1, k2, value
        self.size += 1
        if 2 * self.size > self._cap:
            self._grow()
        return None

    def _grow(self) -> None:
        old = (self._k1, self._k2, self._v)
        self._alloc(self._cap * 2)
        mask = self._cap - 1
        k1s, k2s, vs = self._k1, self._k2, self._v
        for a, b, v in zip(*old):
            if a == _EMPTY:
                continue
            i = a & mask
            while k1s[i] != _EMPTY:
                i = (i + 1) & mask
            k1s[i], k2s[i], vs[i] = a, b, v
