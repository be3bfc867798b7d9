"""One dataset store written by every process of a pod (``prepare``: ``jaxembed data prepare`` and a training
run's store preparation, started on every host; in one process it is ``store.write_store``).

The unit of work is a dataset: each is read, checked and written whole by one process, into the store's one
temporary folder, exactly as one process writes it, so every check that spans a dataset's records (duplicate ids,
identical examples, the record format, the labels, a task type from the records) is the same as in one process,
and so is the store's content. ``shares`` deals the datasets out by the size of their input (the largest first,
each to the process with the least so far), the same on every process. The steps, through the coordinator
(``jaxembed.pod``):

1. process 0 checks the output and makes the temporary folder (``store.store_folder``), whose name the others
   receive;
2. each process writes its datasets in config order, stopping at its first error, and leaves beside each a part
   file (``.part-{i}.json``: the counts and the manifest entry; ``.part-{i}.skipped.jsonl``: the skipped
   records);
3. all wait for all (``pod.gather``); if any failed, every process raises the error of the first dataset in
   config order that failed, the one a single process would have stopped at, with the same line;
4. every process reads the part files (the report's counts); process 0 writes the report and the manifest, removes
   the part files and renames the folder into place; the others wait for that and return the same report (without
   the skipped records, which process 0 wrote to report.txt).

A dataset larger than the others is not split: a pod prepares at most as fast as its largest dataset
(docs/data.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

from jaxembed import pod
from jaxembed.data import config as dc
from jaxembed.data import leftovers
from jaxembed.data.records import Skip
from jaxembed.data.store import (SKIPPED_IN_MEMORY, DatasetInfo, PrepareReport, check_out_dir, finish,
                                 store_folder, write_one, write_store)
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


def shares(datasets, n: int) -> list[list[int]]:
    """The dataset indices each of ``n`` processes writes (each list in config order): the largest input first,
    each to the process with the fewest bytes so far (ties: the lower index)."""
    sizes = [_input_bytes(ds) for ds in datasets]
    load, out = [0] * n, [[] for _ in range(n)]
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        p = min(range(n), key=lambda k: (load[k], k))
        out[p].append(i)
        load[p] += max(sizes[i], 1)
    return [sorted(x) for x in out]


def _part(tmp: Path, i: int, suffix: str = ".json") -> Path:
    return tmp / f".part-{i}{suffix}"


def _write_mine(data_config, mine: list[int], tmp: Path, on_error: str, where: str, progress
                ) -> tuple[int, BaseException] | None:
    """Write this process's datasets and their part files, in config order; stop at the first error:
    (its dataset index, the error), or None."""
    lock = leftovers.hold(tmp)  # this process writes in the folder: it is never taken for a leftover
    try:
        for i in mine:
            try:
                tally, _, entry, notes = write_one(data_config["datasets"][i], i, tmp, on_error, where, progress)
                try:
                    with open(_part(tmp, i, ".skipped.jsonl"), "w", encoding="utf-8") as f:
                        for s in tally.iter_skipped():
                            f.write(json.dumps(s.to_dict(), ensure_ascii=False) + "\n")
                    _part(tmp, i).write_text(json.dumps({"tally": tally.state(), "entry": entry, "notes": notes},
                                                        ensure_ascii=False), encoding="utf-8")
                finally:
                    tally.close()
            except Exception as e:
                return i, e
    finally:
        leftovers.release(lock)
    return None


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
        mine = shares(datasets, n)[me]
        names = ", ".join(datasets[i]["name"] for i in mine) or "none"
        print(f"jaxembed: process {me} of {n} prepares {len(mine)} of {len(datasets)} datasets ({names})",
              file=sys.stderr, flush=True)
        failed = _write_mine(data_config, mine, tmp, report.on_error, where, progress)
        status = None if failed is None else {"dataset": failed[0], "error": pod.error_text(failed[1])}
        _raise_first(pod.gather("store-write", json.dumps(status)), failed)
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
