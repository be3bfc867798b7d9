"""The on_error policy of the readers (``apply_policy``): the one place where a ``Skip`` becomes an error
(``on_error='stop'``) or is counted (``'skip'``), and the counts of a dataset (``Tally``: records read, written,
invalid, left out by a rule, duplicate ids, identical examples; the skipped records themselves, spooled to disk
beyond ``memory_limit``)."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from jaxembed.data.hashindex import HashLog, example_hash
from jaxembed.data.parsers import Example, Item, Skip
from jaxembed.errors import UserError

# ---------------------------------------------------------------------------------------------------- policy

def _reason_key(s: Skip) -> str:
    """How a skipped record is counted: the reason without its details in parentheses (one kind of problem is one
    count), led by the field for invalid records."""
    return (f"field '{s.field}': " if s.field and s.invalid else "") + s.reason.split(" (")[0]


@dataclass
class Tally:
    """Counts of one dataset's reading: records read, examples written, skipped (invalid / left out by a rule),
    with every skipped record; ``identical``: written examples equal to an earlier one of the dataset (same query,
    positives, negatives and label; ids aside), which are kept and counted, with the first few pairs of ids.

    Memory: a 64-bit content hash per written example (``HashLog``: held in memory up to
    ``hashindex.IN_MEMORY``, beyond that sorted in runs in an anonymous file in ``spool_dir``, so bounded).
    ``keep_ids`` (default) also keeps every written id, to name the first of an identical pair at once; without it
    the pairs hold example indices until ``resolve_ids`` (the store writer reads the ids back from the store).
    ``memory_limit``: skipped records kept in memory; the others go to a JSON Lines spool file in ``spool_dir``
    (``iter_skipped`` reads both)."""

    name: str
    read: int = 0
    written: int = 0
    invalid: int = 0
    filtered: int = 0
    keep_ids: bool = True
    memory_limit: int | None = None
    spool_dir: str | None = None
    _mem: list = field(default_factory=list, repr=False, compare=False)
    _spilled: int = field(default=0, repr=False, compare=False)
    _spool: Any = field(default=None, repr=False, compare=False)
    _reasons: Counter = field(default_factory=Counter, repr=False, compare=False)
    _reasons_by: Counter = field(default_factory=Counter, repr=False, compare=False)
    _hashes: HashLog = field(default_factory=HashLog, repr=False, compare=False)
    _found: tuple = field(default=(-1, 0, ()), repr=False, compare=False)  # (examples hashed, count, pairs)
    _ids: list = field(default_factory=list, repr=False, compare=False)
    _resolved: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._hashes.spill_dir = self.spool_dir  # the content hashes beyond hashindex.IN_MEMORY go there too

    # ------------------------------------------------------------------------------------------ skipped records

    def add_skip(self, s: Skip) -> None:
        """Count a skipped record and keep it (in memory up to ``memory_limit``, then in the spool file)."""
        if s.invalid:
            self.invalid += 1
        else:
            self.filtered += 1
        key = _reason_key(s)
        self._reasons[key] += 1
        self._reasons_by[(s.invalid, key)] += 1
        self._keep(s)

    def _keep(self, s: Skip) -> None:
        if self.memory_limit is None or len(self._mem) < self.memory_limit:
            self._mem.append(s)
            return
        if self._spool is None:  # an anonymous file: gone when closed or collected, whatever happens
            import tempfile

            self._spool = tempfile.TemporaryFile("w+", encoding="utf-8", dir=self.spool_dir)
        self._spool.write(json.dumps(s.to_dict(), ensure_ascii=False) + "\n")
        self._spilled += 1

    @property
    def skipped(self) -> list[Skip]:
        """Every skipped record, in reading order (read back from the spool file when some were spilled)."""
        return list(self.iter_skipped())

    def iter_skipped(self) -> Iterator[Skip]:
        yield from self._mem
        if self._spool is not None:
            f = self._spool
            f.flush()
            f.seek(0)
            try:
                for _ in range(self._spilled):
                    d = json.loads(f.readline())
                    yield Skip(d["file"], d["line"], d["field"], d["reason"], d["fix"], d["invalid"], d["detail"])
            finally:
                f.seek(0, os.SEEK_END)

    @property
    def n_skipped(self) -> int:
        return self.invalid + self.filtered

    def close(self) -> None:
        """Drop the spool files (the skipped records beyond ``memory_limit``, the content hashes beyond
        ``hashindex.IN_MEMORY``; the counts stay)."""
        self._hashes.close()
        if self._spool is not None:
            self._spool.close()
            self._spool = None
            self._spilled = 0

    # --------------------------------------------------------------------------------------- identical examples

    def count_identical(self, ex: Example) -> None:
        """Note ``ex`` (the ``written``-th example) for the identical-content count (its 64-bit content hash)."""
        if self.keep_ids:
            self._ids.append(ex["id"])
        self._hashes.append(example_hash(ex["query"], ex["pos"], ex["neg"], ex.get("label")))

    def _identical(self) -> tuple[int, tuple]:
        n = len(self._hashes)
        if self._found[0] != n:  # found once the examples are all in (a sort of the hashes)
            count, pairs = self._hashes.duplicates(5)
            self._found = (n, count, tuple(pairs))
        return self._found[1], self._found[2]

    @property
    def identical(self) -> int:
        """Written examples whose content (query, positives, negatives, label) equals an earlier one's."""
        return self._identical()[0]

    def identical_indices(self) -> list[int]:
        """The example indices of both sides of the pairs named in ``identical_examples``."""
        return sorted({k for pair in self._identical()[1] for k in pair})

    def resolve_ids(self, id_of: Callable[[list[int]], list[str]]) -> None:
        """Name the examples of the identical pairs: ``id_of(indices)`` -> their ids (read back from the store)."""
        idx = self.identical_indices()
        if idx:
            self._resolved.update(zip(idx, id_of(idx)))

    def _id(self, k: int) -> str:
        return self._ids[k] if self.keep_ids else self._resolved.get(k, f"example #{k}")

    @property
    def identical_examples(self) -> list[tuple[str, str]]:
        """(id, id of the earlier identical example) for the first few identical examples."""
        return [(self._id(later), self._id(first)) for later, first in self._identical()[1]]

    def identical_note(self) -> str | None:
        """One line on the identical examples, or None."""
        if not self.identical:
            return None
        eg = ", ".join(f"{a} = {b}" for a, b in self.identical_examples)
        return (f"{self.identical} of {self.written} examples are identical to an earlier one (same query, positives, "
                f"negatives, label; kept, so they weigh more), e.g. {eg}")

    # ------------------------------------------------------------------------------------------------- reporting

    def reasons(self, invalid: bool | None = None) -> dict[str, int]:
        """reason -> count (invalid records by their reason, with the field when there is one; the details in
        parentheses, such as a JSON error's column, are left out so that one kind of problem is one count).
        ``invalid``: only the invalid (True) or the left-out (False) records."""
        if invalid is None:
            return dict(self._reasons.most_common())
        c = Counter({k: n for (inv, k), n in self._reasons_by.items() if inv == invalid})
        return dict(c.most_common())

    def summary_dict(self) -> dict:
        """``to_dict`` without the skipped records."""
        return {"name": self.name, "read": self.read, "written": self.written, "invalid": self.invalid,
                "filtered": self.filtered, "reasons": self.reasons(), "identical": self.identical,
                "identical_examples": [list(p) for p in self.identical_examples]}

    def to_dict(self) -> dict:
        return dict(self.summary_dict(), skipped=[s.to_dict() for s in self.iter_skipped()])

    def state(self) -> dict:
        """The counts (``summary_dict``, with the reasons split by kind) without the skipped records: what
        ``restored`` needs to rebuild this Tally in another process (the processes of a pod that prepare a store)."""
        return dict(self.summary_dict(), reasons_by=[[inv, k, n] for (inv, k), n in self._reasons_by.items()])

    @classmethod
    def restored(cls, state: dict, skipped: Iterable[Skip] = (), **kw: Any) -> "Tally":
        """The Tally whose ``state()`` is ``state``, holding the skipped records ``skipped`` (kept as they come, not
        counted again; ``kw``: ``memory_limit``, ``spool_dir``). Its counts, reasons and identical examples read
        as the original's."""
        t = cls(state["name"], read=state["read"], written=state["written"], invalid=state["invalid"],
                filtered=state["filtered"], keep_ids=False, **kw)
        t._reasons = Counter(state["reasons"])
        t._reasons_by = Counter({(bool(inv), k): n for inv, k, n in state["reasons_by"]})
        pairs = [tuple(p) for p in state["identical_examples"]]
        t._found = (0, state["identical"], tuple((2 * j, 2 * j + 1) for j in range(len(pairs))))
        t._resolved = {k: name for j, pair in enumerate(pairs) for k, name in zip((2 * j, 2 * j + 1), pair)}
        for s in skipped:
            t._keep(s)
        return t


def apply_policy(items: Iterable[Item], on_error: str, tally: Tally) -> Iterator[Example]:
    """Examples of ``items``; a bad record raises its InputError when ``on_error == 'stop'``, else is counted in
    ``tally`` (as every record left out by a rule is, under either policy). Identical examples are counted."""
    if on_error not in ("stop", "skip"):
        raise UserError(f"on_error: {on_error!r} is not one of stop, skip")
    for it in items:
        tally.read += 1
        if isinstance(it, Skip):
            if it.invalid and on_error == "stop":
                raise it.error()
            tally.add_skip(it)
            continue
        tally.written += 1
        tally.count_identical(it)
        yield it
