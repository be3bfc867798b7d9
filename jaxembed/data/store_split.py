"""One dataset read in parts by several processes of a pod and merged into what one process writes
(``jaxembed.data.store_pod`` splits a dataset larger than the others' share, or every one when there are fewer
datasets than processes).

What can be split, and where the parts are cut, is ``jaxembed.data.split_plan`` (re-exported here:
``split_format``, ``parts``, ``Part``): JSON Lines and CSV / TSV files as they are (byte ranges cut at line
starts), Parquet files and local folders of Parquet files read with ``format='hf'`` (runs of row groups),
``datasets.save_to_disk`` folders (ranges of rows) and datasets of several files of any kind (whole files),
``JAXEMBED_SPLIT_MIN_BYTES`` or more in all (default 16 MiB), whose record format is known before reading (set, or
told by the first record), and not classification records whose labels are first collected from the whole dataset
(no ``label_descriptions``). A part numbers every record,
skipped record and error as one process numbers it (its line in the file, or its row).

Each part is written into the store's temporary folder (``.part-{i}-{k}.*``: its ArrayRecord file, counts,
skipped records, labels, and hashes of its ids and of its examples' content; ``write_part``). The process that
wrote part 0 merges them (``settle``) into exactly what one process writes:

- the records, in order, into the dataset's one ArrayRecord file; the counts; the reasons, in the order one
  process meets them; the skipped records; the labels, numbered as one process numbers them;
- identical examples: found over the whole dataset's content hashes, the first five pairs named as one process
  names them;
- what a part cannot tell alone is checked: an id written by two parts (a duplicate that one process skips or stops
  at), a BGE ``type`` / ``prompt`` that a later part met first or found differing (one process names the
  dataset's first record), and CSV parts that do not meet (a quoted field holding a line end across a cut: the
  part before it read its row past the cut; or a line over the limit, after which a part cannot tell where it
  stopped). When any happens, the dataset is read again whole by the merging
  process: the store and the error are one process's, only later;
- an error (``on_error='stop'``) is that of the first part that failed, once the parts before it are checked as
  above: the line one process stops at.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from jaxembed import pod
from jaxembed.data import split_plan
from jaxembed.data.readers import ReadInfo, Tally, apply_policy, read_options, read_records
from jaxembed.data.hashindex import HashLog
from jaxembed.data.split_plan import Part, parts, split_format  # noqa: F401 (re-exported)
from jaxembed.data.store import (SKIPPED_IN_MEMORY, ExampleCounts, Store, Labels, dataset_entry, no_examples,
                                 record_writer, write_examples, write_one)
from jaxembed.errors import UserError

#: the smallest dataset (bytes of input) that is split; every process of a pod must see the same value
MIN_BYTES_VAR = "JAXEMBED_SPLIT_MIN_BYTES"
DEFAULT_MIN_BYTES = 16 << 20
#: the phrases of the errors that compare a BGE record with the dataset's first (``jaxembed.data.parsers``)
_TYPE_PHRASE, _PROMPT_PHRASE = " means task type ", " differs from the prompt "


def min_bytes() -> int:
    text = os.environ.get(MIN_BYTES_VAR, "").strip()
    if not text:
        return DEFAULT_MIN_BYTES
    try:
        return int(text)
    except ValueError:
        raise UserError(f"{MIN_BYTES_VAR}={text!r}: not a number of bytes (fix: e.g. {DEFAULT_MIN_BYTES})") from None


def _hash(text: str) -> bytes:
    """A 64-bit hash that is the same in every process (Python's ``hash`` of a string is not)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()


def _stem(tmp: Path, i: int, k: int) -> str:
    return str(tmp / f".part-{i}-{k}")


def _suffixes() -> tuple[str, ...]:
    return (".json", ".array_record", ".skipped.jsonl", ".labels", ".ids", ".content")


def write_part(ds, part: Part, tmp: Path, on_error: str, where: str) -> str | None:
    """Read and write one part into ``tmp`` (``.part-{i}-{k}.*``); an error stops it and is kept in its ``.json``
    for ``settle``. Returns the error's line, or None."""
    stem = _stem(tmp, part.dataset, part.index)
    tally = Tally(ds["name"], keep_ids=False, memory_limit=SKIPPED_IN_MEMORY, spool_dir=str(tmp))
    info = ReadInfo()
    bounds: list = []
    ids, content = open(stem + ".ids", "wb"), open(stem + ".content", "wb")  # streamed: nothing kept per record

    def records():
        bounds.clear()
        return split_plan.part_records(ds, part, bounds)

    def note(ex):
        ids.write(_hash(ex["id"]))
        content.write(_hash(repr((ex["query"], ex["pos"], ex["neg"], ex.get("label")))))  # repr: one text per content

    counts, error = ExampleCounts(), None
    writer = record_writer(Path(stem + ".array_record"))
    try:
        items = apply_policy(read_records(records, replace(read_options(ds), format=part.record_format), info),
                             on_error, tally)
        counts = write_examples(ds, items, info, writer, tally, f"{where}.datasets[{part.dataset}]", None, note)
    except Exception as e:  # noqa: BLE001 -- kept for settle, which decides whether it is the dataset's error
        error = pod.error_text(e)
    finally:
        writer.close()
        ids.close()
        content.close()
    try:
        _save_part(stem, tally, counts, info, error, bounds)
    finally:
        tally.close()
    return error


def _save_part(stem: str, tally: Tally, counts: ExampleCounts, info: ReadInfo, error, bounds: list) -> None:
    with open(stem + ".skipped.jsonl", "w", encoding="utf-8") as f:
        for s in tally.iter_skipped():
            f.write(json.dumps(s.to_dict(), ensure_ascii=False) + "\n")
    Path(stem + ".labels").write_bytes(counts.labels.index.tobytes())
    reasons = [k for _, k, _ in tally.state()["reasons_by"]] + [error or ""]
    meta = {"tally": tally.state(), "error": error,
            "counts": {k: getattr(counts, k) for k in ("neg_min", "neg_max", "pos_max", "few_neg", "scores",
                                                       "teacher")},
            "labels": list(counts.labels.names), "labels_missing": counts.labels.missing,
            "info": {"format": info.format, "task_type": info.task_type, "prompt": info.prompt,
                     "labels": info.labels},
            "bounds": bounds, "mismatch": {"task_type": any(_TYPE_PHRASE in r for r in reasons),
                         "prompt": any(_PROMPT_PHRASE in r for r in reasons)}}
    Path(stem + ".json").write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")


# ------------------------------------------------------------------------------------------------ merging

def save_result(tmp: Path, i: int, tally: Tally, entry: dict, notes: list[str], skipped=None) -> None:
    """A dataset's outcome as ``jaxembed.data.store_pod`` reads it back: ``.part-{i}.json`` (the counts, manifest
    entry and notes) and ``.part-{i}.skipped.jsonl`` (the skipped records: ``skipped``, files to concatenate, or
    the Tally's)."""
    with open(tmp / f".part-{i}.skipped.jsonl", "wb") as f:
        if skipped is None:
            for s in tally.iter_skipped():
                f.write((json.dumps(s.to_dict(), ensure_ascii=False) + "\n").encode("utf-8"))
        else:
            for path in skipped:
                with open(path, "rb") as src:
                    while chunk := src.read(1 << 20):
                        f.write(chunk)
    (tmp / f".part-{i}.json").write_text(json.dumps({"tally": tally.state(), "entry": entry, "notes": notes},
                                                    ensure_ascii=False), encoding="utf-8")


def settle(ds, i: int, count: int, tmp: Path, on_error: str, where: str, progress) -> None:
    """Merge the ``count`` parts of dataset ``i`` (``save_result``), or read it again whole when the parts cannot
    tell what one process finds (see the module docstring); raise the dataset's error, as one process raises it."""
    stems = [_stem(tmp, i, k) for k in range(count)]
    metas = [json.loads(Path(s + ".json").read_text(encoding="utf-8")) for s in stems]
    failed = next((k for k, m in enumerate(metas) if m["error"] is not None), None)
    upto = count if failed is None else failed + 1
    why = _inexact(metas[:upto], stems[:upto])
    if why is not None:
        print(f"jaxembed: dataset {ds['name']}: {why}: read again whole, as one process reads it", file=sys.stderr,
              flush=True)
        _remove(stems)
        tally, _, entry, notes = write_one(ds, i, tmp, on_error, where, progress)
        try:
            save_result(tmp, i, tally, entry, notes)
        finally:
            tally.close()
        return
    if failed is not None:
        _remove(stems)
        raise UserError(metas[failed]["error"])
    try:
        _merge(ds, i, tmp, metas, stems, f"{where}.datasets[{i}]")
    finally:
        _remove(stems)


def _inexact(metas: list[dict], stems: list[str]) -> str | None:
    """Why the parts do not read as one process reads them, or None when they do: no id written by two parts, and
    a BGE type / prompt met first by the first part that met one, with no record of a later part compared against
    another first."""
    for key, what in (("task_type", "a BGE type"), ("prompt", "a BGE prompt")):
        first = next((k for k, m in enumerate(metas) if m["info"][key] is not None), None)
        if first is None:
            continue
        value = metas[first]["info"][key]
        for m in metas[first + 1:]:
            if m["info"][key] not in (None, value) or m["mismatch"][key]:
                return f"{what} that a later part compared with its own first record"
    if not _parts_meet(metas):
        return ("CSV parts that do not meet at their cut (a quoted field holding a line end, or a line over the "
                "limit)")
    if _in_two_parts(stems, ".ids"):
        return "an id in two parts"
    return None


def _logged(stems: list[str], suffix: str, tmp: str) -> tuple[HashLog, list[int]]:
    """The parts' hashes (files ``stem + suffix``) in order as one HashLog (spilled into ``tmp`` beyond
    ``hashindex.IN_MEMORY``: bounded memory), and where each part's begin in it."""
    log, starts = HashLog(spill_dir=tmp), []
    for s in stems:
        starts.append(len(log))
        with open(s + suffix, "rb") as f:
            while block := f.read(1 << 23):
                log.extend(block)
    return log, starts


def _in_two_parts(stems: list[str], suffix: str) -> bool:
    """Whether a hash is in the files of two parts (``stem + suffix``), in bounded memory."""
    log, starts = _logged(stems, suffix, str(Path(stems[0]).parent) if stems else None)
    try:
        return log.in_two_segments(starts)
    finally:
        log.close()


def _parts_meet(metas: list[dict]) -> bool:
    """Whether each CSV part read its files to the end of its bytes (a line over the limit, whose length is not
    kept, leaves that unknown) and stopped where the next part of that file starts: a row that ends after the cut
    began inside a quoted field, which the next part read as rows of its own."""
    segs = []
    for m in metas:
        for f, start, end, b in m.get("bounds", []):
            stop = b.get("stop")
            if stop is None or (m["error"] is None and stop < end):
                return False
            segs.append((f, start, stop))
    segs.sort()
    return all(f != f2 or stop == start2 for (f, _, stop), (f2, start2, _) in zip(segs, segs[1:]))


def _remove(stems: list[str]) -> None:
    for s in stems:
        for suffix in _suffixes():
            try:
                os.unlink(s + suffix)
            except FileNotFoundError:
                pass


def _merge(ds, i: int, tmp: Path, metas: list[dict], stems: list[str], where: str) -> None:
    from array_record.python.array_record_module import ArrayRecordReader

    path = tmp / f"{ds['name']}.array_record"
    writer = record_writer(path)
    try:
        for s in stems:
            reader = ArrayRecordReader(s + ".array_record")
            try:
                n = reader.num_records()
                for b in range(0, n, 4096):
                    for rec in reader.read(b, min(n, b + 4096)):
                        writer.write(rec)
            finally:
                reader.close()
    finally:
        writer.close()
    state = _merged_state(ds["name"], metas, stems, path)
    tally = Tally.restored(state, memory_limit=0, spool_dir=str(tmp))
    err = no_examples(ds, tally, where)
    if err is not None:
        raise err
    info = ReadInfo(format=metas[0]["info"]["format"], labels=metas[0]["info"]["labels"])
    info.task_type = next((m["info"]["task_type"] for m in metas if m["info"]["task_type"] is not None), None)
    info.prompt = next((m["info"]["prompt"] for m in metas if m["info"]["prompt"] is not None), None)
    dinfo, entry, notes = dataset_entry(ds, tmp, info, tally, _merged_counts(metas, stems), where)
    save_result(tmp, i, tally, dict(dinfo.to_dict(), **entry), notes, skipped=[s + ".skipped.jsonl" for s in stems])


def _merged_state(name: str, metas: list[dict], stems: list[str], path: Path) -> dict:
    """The Tally state of the whole dataset: the parts' counts added, the reasons in the order first met, the
    identical examples over all of them (``path``: the merged records, to name them)."""
    by: dict[tuple, int] = {}
    reasons: dict[str, int] = {}
    for m in metas:
        for inv, k, n in m["tally"]["reasons_by"]:
            by[(inv, k)] = by.get((inv, k), 0) + n
            reasons[k] = reasons.get(k, 0) + n
    state = {k: sum(m["tally"][k] for m in metas) for k in ("read", "written", "invalid", "filtered")}
    count, names = _identical(stems, path)
    return dict(state, name=name, reasons=reasons, reasons_by=[[inv, k, n] for (inv, k), n in by.items()],
                identical=count, identical_examples=names)


def _identical(stems: list[str], path: Path) -> tuple[int, list[list[str]]]:
    """The identical examples of the whole dataset (``HashLog.duplicates`` over the parts' content hashes, in
    order; bounded memory): their count, and the first pairs named by their ids."""
    from array_record.python.array_record_module import ArrayRecordReader

    log, _ = _logged(stems, ".content", str(path.parent))  # in reading order, as one process logs them
    try:
        count, pairs = log.duplicates(5)
    finally:
        log.close()
    names: list[list[str]] = []
    if pairs:
        reader = ArrayRecordReader(str(path), "readahead_buffer_size:0")
        try:
            for later, first in pairs:
                names.append([Store.decode(r)["id"] for r in reader.read([later, first])])
        finally:
            reader.close()
    return count, names


def _merged_counts(metas: list[dict], stems: list[str]) -> ExampleCounts:
    """The parts' example counts added; their labels numbered in the order first met."""
    c = ExampleCounts()
    mins = [m["counts"]["neg_min"] for m in metas if m["counts"]["neg_min"] is not None]
    c.neg_min = min(mins) if mins else None
    c.neg_max = max(m["counts"]["neg_max"] for m in metas)
    c.pos_max = max(m["counts"]["pos_max"] for m in metas)
    for k in ("few_neg", "scores", "teacher"):
        setattr(c, k, sum(m["counts"][k] for m in metas))
    labels = Labels()
    for m, s in zip(metas, stems):
        remap = np.array([labels.names.setdefault(x, len(labels.names)) for x in m["labels"]] + [-1], np.int32)
        local = np.fromfile(s + ".labels", dtype=np.int32)
        labels.index.frombytes(remap[local].astype(np.int32).tobytes())
        labels.missing += m["labels_missing"]
    c.labels = labels
    return c
