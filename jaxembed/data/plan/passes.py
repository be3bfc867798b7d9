"""A unit's shuffled pass in bounded memory. A pass gives every example of dataset d ``epochs[d]`` times (a
fractional part: an exact-size uniform subset, ``subset``); copy c of d gets random keys in [c/E_d, (c+1)/E_d), and the pass is
the stable sort of all the keys (``draws`` lists them in the order they are drawn). ``sorted_pass`` sorts them in
memory, or, given a scratch folder and a pass over ``BUCKET`` examples, by an external bucket sort: the keys are
drawn ``CHUNK`` at a time (a generator drawn in chunks gives the stream of one call), each chunk's (key, dataset,
example) rows go to the bucket files of their key range, in the order drawn, and each bucket is then sorted
stably on its own. The bucket is a function of the key, so equal keys share one, and the buckets one after the
other are the stable sort of the whole pass: the same pass either way.

``keyed_sort`` sorts any stream of keyed rows the same way (a curriculum unit's score order), its buckets cut at
sampled (key, position) pairs. ``Feed`` hands a pass out n examples at a time; ``dedupe_stream`` runs the in-batch de-duplication over rows pulled
a block at a time (a row's swaps reach ``window`` rows either side)."""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from jaxembed.errors import UserError


#: keys drawn at a time
CHUNK = 1 << 18
#: examples per bucket of the external sort (~20 bytes each in memory while it is sorted)
BUCKET = 1 << 18
#: the ranges a fractional epoch's subset is drawn in at the end (a part of what the plan is, not a tuning knob)
SUBSET_LEAF = 1 << 16
#: most bucket files of one pass, all open while its keys are drawn (a pass over 512 x BUCKET examples, 134M, gets
#: larger buckets: 300M, ~590,000 examples a bucket)
MAX_BUCKETS = 512

#: numpy's hypergeometric takes fewer than 10**9 good and 10**9 bad items
_HYPER_MAX = 10 ** 9 - 1

_REC = np.dtype([("k", "<f8"), ("d", "<i4"), ("e", "<i8")])


def _copies(e: float) -> tuple[int, float]:
    full = int(math.floor(e + 1e-9))
    return full, e - full


def pass_size(members: Sequence[int], sizes: np.ndarray, epochs: np.ndarray) -> int:
    """The examples of one pass over a unit."""
    n = 0
    for d in members:
        full, frac = _copies(float(epochs[d]))
        if int(sizes[d]) and float(epochs[d]) > 0:
            n += full * int(sizes[d]) + int(round(frac * int(sizes[d])))
    return n


def subset(rng: np.random.Generator, n: int, k: int, lo: int = 0) -> Iterator[np.ndarray]:
    """A uniform random k-subset of range(lo, lo + n), ascending, in pieces of at most ``SUBSET_LEAF`` indices of
    the range: the range is halved, the left half's share drawn (hypergeometric), each half done the same way,
    left first, down to ranges of ``SUBSET_LEAF`` (a choice without replacement)."""
    if k <= 0:
        return
    if k >= n:
        for a in range(lo, lo + n, SUBSET_LEAF):
            yield np.arange(a, min(lo + n, a + SUBSET_LEAF), dtype=np.int64)
        return
    if n <= SUBSET_LEAF:
        yield lo + np.sort(rng.choice(n, k, replace=False)).astype(np.int64)
        return
    left = n // 2
    if max(left, n - left) > _HYPER_MAX:
        raise UserError(f"a fractional epoch of a dataset of {n} examples: at most {2 * _HYPER_MAX} (fix: whole "
                        "epochs for it, or split it into datasets)")
    x = int(rng.hypergeometric(left, n - left, k))
    yield from subset(rng, left, x, lo)
    yield from subset(rng, n - left, k - x, lo + left)


def draws(rng: np.random.Generator, members: Sequence[int], sizes: np.ndarray, epochs: np.ndarray):
    """The pass's (keys float64, dataset, examples int64) in the order drawn, ``CHUNK`` at a time: per dataset its
    full copies (example order, key (c + u) / E), then its fractional part (a ``subset`` drawn by a generator
    seeded from the pass's stream, the i-th example of the subset with the i-th key in [full / E, 1])."""
    for d in members:
        size, e = int(sizes[d]), float(epochs[d])
        if size == 0 or e <= 0:
            continue
        full, frac = _copies(e)
        for c in range(full):
            for a in range(0, size, CHUNK):
                b = min(size, a + CHUNK)
                yield (c + rng.random(b - a)) / e, d, np.arange(a, b, dtype=np.int64)
        extra = int(round(frac * size))
        if extra > 0:
            sub = np.random.default_rng(int(rng.integers(1 << 63)))
            for idx in subset(sub, size, extra):
                yield (full + rng.random(idx.size) * frac) / e, d, idx


def sorted_pass(rng: np.random.Generator, members: Sequence[int], sizes: np.ndarray, epochs: np.ndarray,
                folder: Path | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One pass over a unit in its order, as (dataset ids int32, example ids int64) chunks: sorted in memory, or,
    with ``folder`` and over ``BUCKET`` examples, bucket by bucket through files in a new folder inside it."""
    n = pass_size(members, sizes, epochs)
    if folder is None or n <= BUCKET:
        yield from _sorted_in_memory(draws(rng, members, sizes, epochs))
        return
    yield from _bucket_sorted(draws(rng, members, sizes, epochs), n, Path(folder))


def _sorted_in_memory(rows) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``rows`` (keys float64, dataset, example ids int64) sorted stably by key, as one (dataset ids int32,
    example ids int64) chunk (none for no rows)."""
    keys, ds, ex = [], [], []
    for k, d, e in rows:
        keys.append(k)
        ds.append(np.full(k.size, d, np.int32))
        ex.append(e)
    if keys:
        order = np.argsort(np.concatenate(keys), kind="stable")
        del keys
        yield np.concatenate(ds)[order], np.concatenate(ex)[order]


def keyed_sort(rows: Callable[[], Iterator[tuple[np.ndarray, int, np.ndarray]]], n: int,
               folder: Path | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The ``n`` rows (keys float64, dataset, example ids int64) that ``rows()`` streams, sorted stably by key (equal
    keys keep the stream's order), as (dataset ids int32, example ids int64) chunks: in memory, or, with ``folder``
    and over ``BUCKET`` rows, through bucket files. A bucket is cut at (key, position in the stream) pairs sampled
    by a first pass over the rows, so equal keys spread over buckets in stream order and any key distribution gives
    buckets of about n / B rows; the buckets one after the other are the stable sort."""
    if folder is None or n <= BUCKET:
        yield from _sorted_in_memory(rows())
        return
    ek, ep = _edges(rows(), n, _bucket_count(n))

    def bucket_of(keys: np.ndarray, at: int) -> np.ndarray:
        """The edges (key, position) below each row's: a function of the pair, rising with it."""
        below = np.searchsorted(ek, keys, "left")
        hi = np.searchsorted(ek, keys, "right")
        b = below.copy()
        tied = np.flatnonzero(hi > below)  # rows whose key equals an edge's: its position decides
        for lo in np.unique(below[tied]).tolist():
            t = tied[below[tied] == lo]
            b[t] = lo + np.searchsorted(ep[lo:int(hi[t[0]])], at + t, "left")
        return b

    yield from _bucket_sorted(rows(), n, Path(folder), bucket_of)


def _edges(rows, n: int, B: int) -> tuple[np.ndarray, np.ndarray]:
    """B - 1 (key, position) pairs cutting ``rows`` into B ranges of about n / B rows: quantiles of every s-th row
    (about 64 a bucket), in (key, position) order."""
    s = max(1, n // (B * 64))
    ks, ps, at = [], [], 0
    for k, _, _ in rows:
        local = np.arange((-at) % s, k.size, s)
        ks.append(k[local])
        ps.append(at + local)
        at += k.size
    k, p = np.concatenate(ks), np.concatenate(ps)
    o = np.lexsort((p, k))
    cut = o[(np.arange(1, B) * o.size) // B]
    return k[cut], p[cut]


def _bucket_count(n: int) -> int:
    return min(MAX_BUCKETS, -(-n // BUCKET))


def _bucket_sorted(chunks, n: int, folder: Path, bucket_of: Callable | None = None):
    """``chunks`` (keys, dataset, example ids) through bucket files: bucket ``bucket_of(keys, position of the
    chunk's first row)`` (by default the key's range of [0, 1)), each bucket then sorted stably by key."""
    B = _bucket_count(n)
    at = 0
    where = Path(tempfile.mkdtemp(prefix="pass.", dir=folder))
    files = [where / f"b{b}" for b in range(B)]
    fds: dict[int, int] = {}  # bucket -> its file, open for appending while the keys are drawn
    try:
        for keys, d, ex in chunks:
            # the bucket of a key (a function of the key alone: equal keys share a bucket, order kept)
            b = np.minimum((keys * B).astype(np.int64), B - 1) if bucket_of is None else bucket_of(keys, at)
            at += keys.size
            order = np.argsort(b, kind="stable")
            rec = np.empty(keys.size, _REC)
            rec["k"], rec["d"], rec["e"] = keys[order], d, ex[order]
            bounds = np.searchsorted(b[order], np.arange(B + 1))
            for j in np.flatnonzero(np.diff(bounds)).tolist():
                if j not in fds:
                    fds[j] = os.open(files[j], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                _write_all(fds[j], memoryview(rec[bounds[j]:bounds[j + 1]]).cast("B"))
            del rec, order, b
        for fd in fds.values():
            os.close(fd)
        fds.clear()
        for f in files:
            if not f.exists():
                continue
            rec = np.fromfile(f, _REC)
            f.unlink()
            order = np.argsort(rec["k"], kind="stable")
            yield rec["d"][order].astype(np.int32, copy=False), rec["e"][order].astype(np.int64, copy=False)
            del rec, order
    finally:
        for fd in fds.values():
            os.close(fd)
        shutil.rmtree(where, ignore_errors=True)


def _write_all(fd: int, data: memoryview) -> None:
    done = 0
    while done < len(data):
        done += os.write(fd, data[done:])


class Feed:
    """Examples from a stream of (dataset ids, example ids) chunks, handed out n at a time."""

    def __init__(self, chunks: Iterator[tuple[np.ndarray, np.ndarray]]):
        self._chunks = chunks
        self._d: list[np.ndarray] = []
        self._e: list[np.ndarray] = []
        self._have = 0

    def take(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The next n examples (fewer when the stream ends)."""
        while self._have < n:
            nxt = next(self._chunks, None)
            if nxt is None:
                break
            self._d.append(nxt[0])
            self._e.append(nxt[1])
            self._have += nxt[0].size
        if not self._d:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        d = np.concatenate(self._d) if len(self._d) > 1 else self._d[0]
        e = np.concatenate(self._e) if len(self._e) > 1 else self._e[0]
        n = min(n, d.size)
        self._d, self._e = ([d[n:]], [e[n:]]) if d.size > n else ([], [])
        self._have = d.size - n
        return d[:n], e[:n]

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()


def dedupe_stream(pull: Callable[[int], tuple[np.ndarray, np.ndarray]], R: int, emit: Callable, block: int,
                  dedupe: Callable, window: int = 64) -> int:
    """``dedupe`` (``sampling.dedupe_batches``) over R rows [., G] that ``pull(k)`` hands out k at a time, in
    order, a block of rows at a time: the buffer holds the block with ``window`` rows before and after it, and
    ``emit(ds, ex)`` gets each row once no later row can reach it. Equals the de-duplication of all R rows at
    once. Returns the repeats left."""
    if R <= 0:
        return 0
    block = max(1, int(block))
    bd, be = pull(min(R, block + window))
    lo, hi = 0, bd.shape[0]
    unresolved = 0
    for c0 in range(0, R, block):
        c1 = min(R, c0 + block)
        need = min(R, c1 + window)
        if need > hi:
            d, e = pull(need - hi)
            bd, be, hi = np.concatenate([bd, d]), np.concatenate([be, e]), need
        unresolved += dedupe(bd, be, window, c0 - lo, c1 - lo)
        done = hi if c1 == R else max(lo, c1 - window)
        if done > lo:
            emit(bd[:done - lo], be[:done - lo])
            bd, be, lo = bd[done - lo:], be[done - lo:], done
    return unresolved

