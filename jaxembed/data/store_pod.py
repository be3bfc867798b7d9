"""One dataset store written by every process of a pod (``prepare``: ``jaxembed data prepare`` and a training
run's store preparation, started on every host; in one process it is ``store.write_store``).

The unit of work is a dataset, or a part of one: a dataset of ``JAXEMBED_SPLIT_MIN_BYTES`` or more (default
16 MiB) that is larger than its share of the input (the total bytes over the processes), or any such dataset when
there are fewer datasets than processes, is read in parts, one per process (byte ranges of JSON Lines or CSV
files, runs of Parquet row groups, rows of a saved Hugging Face dataset; whole files: one per file at most), and
merged by the process of its first part into exactly what one process writes (``jaxembed.data.store_split``:
which datasets can be split, and how the checks that span a dataset stay exact). Every other dataset is read,
checked and written whole by one process, into the store's one temporary folder, exactly as one process writes
it. ``plan`` deals the datasets and parts out by the size of their input (the largest first, each to the process
with the least so far), the same on every process. The steps, through the
coordinator (``jaxembed.pod``):

1. process 0 checks the output and makes the temporary folder (``store.store_folder``), whose name the others
   receive;
2. each process writes its datasets and parts in config order, stopping at its first error in a whole dataset (a
   part keeps its error for the merge), and leaves beside each dataset a part file (``.part-{i}.json``: the counts
   and the manifest entry; ``.part-{i}.skipped.jsonl``: the skipped records);
3. all wait for all (``pod.gather``); the process of each split dataset's first part merges its parts into its
   part files (or, where the parts cannot tell what one process finds, reads it again whole), and all wait again;
   if any dataset failed, every process raises the error of the first dataset in config order that failed, the
   one a single process would have stopped at, with the same line;
4. every process reads the part files (the report's counts); process 0 writes the report and the manifest, removes
   the part files and renames the folder into place; the others wait for that and return the same report (without
   the skipped records, which process 0 wrote to report.txt).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

from jaxembed import pod
from jaxembed.data import config as dc
from jaxembed.data import leftovers, store_split
from jaxembed.data.parsers import Skip
from jaxembed.data.prepare_report import PrepareReport
from jaxembed.data.store import (SKIPPED_IN_MEMORY, DatasetInfo, check_out_dir, finish,
                                 store_folder, write_one, write_store)
from jaxembed.data.store_split import Part
from jaxembed.data.tally import Tally
from jaxembed.errors import UserError


def _input_bytes(ds) -> int:
    """The bytes of a dataset's input files (a folder: its files; a hub name or a missing path: 0)."""
    total = 0
    for p in dc.dataset_paths(ds):
        try:
            if os.path.isdir(p):
                total += sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(p) for f in fs)
            else:
                total += os.path.getsize(p)
        except OSError:
            pass
    return total


def plan(datasets, n: int) -> list[list[Part]]:
    """What each of ``n`` processes writes, in config order: whole datasets (``Part(i, 0, 1)``) and the parts of
    the split ones (see the module docstring); the largest input first, each to the process with the fewest bytes
    so far (ties: the lower index). The same on every process."""
    sizes = [_input_bytes(ds) for ds in datasets]
    floor, total = store_split.min_bytes(), sum(sizes)
    units: list[tuple[int, Part]] = []
    for i, ds in enumerate(datasets):
        fmt = None
        if n > 1 and sizes[i] >= floor and (sizes[i] > total / n or len(datasets) < n):
            try:
                fmt = store_split.split_format(ds)[0]
            except (UserError, OSError):  # the whole read reports it
                fmt = None
        if fmt is None:
            units.append((sizes[i], Part(i, 0, 1)))
        else:
            units += [(p.size, p) for p in store_split.parts(ds, i, n, fmt)]
    load, out = [0] * n, [[] for _ in range(n)]
    for size, part in sorted(units, key=lambda u: (-u[0], u[1].dataset, u[1].index)):
        p = min(range(n), key=lambda k: (load[k], k))
        out[p].append(part)
        load[p] += max(size, 1)
    return [sorted(x, key=lambda u: (u.dataset, u.index)) for x in out]


def shares(datasets, n: int) -> list[list[int]]:
    """The dataset indices each of ``n`` processes writes (a split dataset under each process with a part of it)."""
    return [[u.dataset for u in x] for x in plan(datasets, n)]


def _part(tmp: Path, i: int, suffix: str = ".json") -> Path:
    return tmp / f".part-{i}{suffix}"


def _write_mine(data_config, mine: list[Part], tmp: Path, on_error: str, where: str, progress
                ) -> tuple[int, BaseException] | None:
    """Write this process's datasets and parts (each dataset's part files; ``store_split.write_part``), in config
    order; stop at the first error of a whole dataset: (its dataset index, the error), or None."""
    lock = leftovers.hold(tmp)  # this process writes in the folder: it is never taken for a leftover
    try:
        for u in mine:
            ds = data_config["datasets"][u.dataset]
            try:
                if u.count > 1:
                    store_split.write_part(ds, u, tmp, on_error, where)
                    continue
                tally, _, entry, notes = write_one(ds, u.dataset, tmp, on_error, where, progress)
                try:
                    store_split.save_result(tmp, u.dataset, tally, entry, notes)
                finally:
                    tally.close()
            except Exception as e:
                return u.dataset, e
    finally:
        leftovers.release(lock)
    return None


def _settle_mine(data_config, work: list[list[Part]], first_failed: int, tmp: Path, on_error: str, where: str,
                 progress) -> tuple[int, BaseException] | None:
    """Merge the split datasets whose first part this process wrote (before ``first_failed``, the first dataset
    known to have failed), in config order; stop at the first error: (its dataset index, the error), or None."""
    me = pod.process_index()
    mine = [u for u in work[me] if u.count > 1 and u.index == 0 and u.dataset < first_failed]
    lock = leftovers.hold(tmp)
    try:
        for u in mine:
            try:
                store_split.settle(data_config["datasets"][u.dataset], u.dataset, u.count, tmp, on_error, where,
                                   progress)
            except Exception as e:
                return u.dataset, e
    finally:
        leftovers.release(lock)
    return None


def _status(failed: tuple[int, BaseException] | None) -> str:
    return json.dumps(None if failed is None else {"dataset": failed[0], "error": pod.error_text(failed[1])})


def _raise_first(statuses: list[str], failed: tuple[int, BaseException] | None) -> None:
    """Raise the error of the first dataset (in config order) that failed on any process: this process's own
    exception when it is the one, else a UserError with its line."""
    errors = [json.loads(s) for s in statuses]
    errors = [e for e in errors if e is not None]
    if not errors:
        return
    index, text = min((e["dataset"], e["error"]) for e in errors)
    if failed is not None and failed[0] == index:
        raise failed[1]
    raise UserError(text)


def _skips(path: Path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            yield Skip(d["file"], d["line"], d["field"], d["reason"], d["fix"], d["invalid"], d["detail"])


def _read_parts(tmp: Path, n_datasets: int, with_skipped: bool) -> list:
    """``write_one``'s results of every dataset, rebuilt from the part files (``with_skipped``: each Tally also
    holds the skipped records)."""
    done = []
    for i in range(n_datasets):
        part = json.loads(_part(tmp, i).read_text(encoding="utf-8"))
        skipped = _skips(_part(tmp, i, ".skipped.jsonl")) if with_skipped else ()
        tally = Tally.restored(part["tally"], skipped, memory_limit=SKIPPED_IN_MEMORY, spool_dir=str(tmp))
        done.append((tally, DatasetInfo.from_dict(part["entry"]), part["entry"], part["notes"]))
    return done


def prepare(data_config, out_dir, where: str = "data", progress: bool | None = None) -> PrepareReport:
    """``store.write_store`` in one process; on a pod, called by every process, the datasets shared among them
    (see the module docstring): the same store, the same report on every process (process 0's with the skipped
    records), the same error line."""
    if pod.process_count() == 1:
        return write_store(data_config, out_dir, where, progress)
    out = pod.all_agree("store-check", lambda: check_out_dir(out_dir))  # before any work
    dc.validate_data_config(data_config, where=where)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = PrepareReport(out_dir=str(out), on_error=data_config.get("on_error", "stop"))
    return _write_shared(data_config, out, report, where, progress)


def _write_shared(data_config, out: Path, report: PrepareReport, where: str, progress) -> PrepareReport:
    n, me = pod.process_count(), pod.process_index()
    datasets = list(data_config["datasets"])
    with contextlib.ExitStack() as stack:
        tmp = pod.main_first("store-start", lambda: stack.enter_context(store_folder(out)))
        tmp = Path(pod.broadcast("store-folder", str(tmp) if me == 0 else None))
        work = plan(datasets, n)
        mine = work[me]
        names = ", ".join(datasets[u.dataset]["name"] + (f" ({u.name})" if u.count > 1 else "") for u in mine)
        print(f"jaxembed: process {me} of {n} prepares {len(mine)} of {len(datasets)} datasets ({names or 'none'})",
              file=sys.stderr, flush=True)
        failed = _write_mine(data_config, mine, tmp, report.on_error, where, progress)
        statuses = pod.gather("store-write", _status(failed))
        if any(u.count > 1 for x in work for u in x):  # the split datasets are merged
            known = [json.loads(s) for s in statuses]
            first = min([e["dataset"] for e in known if e is not None], default=len(datasets))
            merged = _settle_mine(data_config, work, first, tmp, report.on_error, where, progress)
            statuses += pod.gather("store-merge", _status(merged))
            if merged is not None and (failed is None or merged[0] < failed[0]):
                failed = merged
        _raise_first(statuses, failed)
        done = pod.all_agree("store-read", lambda: _read_parts(tmp, len(datasets), with_skipped=me == 0))

        def complete():
            try:
                finish(tmp, data_config, report, done, where)
            finally:
                for t, *_ in done:
                    t.close()
            for i in range(len(datasets)):
                _part(tmp, i).unlink()
                _part(tmp, i, ".skipped.jsonl").unlink()
            stack.close()  # the manifest of what was written, then the rename into place

        pod.main_first("store-finish", complete)  # process 0 completes the store; the others wait for it
        if me != 0:
            for tally, _, _, notes in done:
                report.datasets.append(tally)
                if notes:
                    report.notes[tally.name] = notes
    return report
