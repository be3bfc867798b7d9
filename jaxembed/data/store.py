"""The dataset store: every dataset of a data config, validated and normalised, in random-access files.

``write_store(data_config, out_dir)`` (``jaxembed data prepare``) reads every record of every dataset, applies the
``on_error`` policy and writes::

    out_dir/manifest.json          format name and version, creation time, the data config, one entry per dataset
                                   (its DatasetInfo, file names and counts); written last
    out_dir/<name>.array_record    one record per example: the Example as UTF-8 JSON, in input order, in chunks of
                                   ``GROUP_SIZE`` records; ``grain.sources.ArrayRecordDataSource`` reads it at random
    out_dir/<name>.labels.json     classification / clustering: {"names": [...], "index": [label index per example]}
    out_dir/report.json, report.txt  records read / written / skipped per dataset, every skipped record with its
                                   file:line, field and reason

Size: one module because the store's file layout is written (``write_store``) and read (``Store``) in one place;
the report of what was written is ``jaxembed.data.prepare_report``; the file readers, the record parsers, the
on_error policy and the counts are in ``jaxembed.data.readers`` / ``parsers`` / ``tally``.

The store is written to a temporary folder beside ``out_dir`` (``.{name}.tmp-{host}-{pid}-{random}``) and renamed
into place, so a crash never leaves a folder that opens as a store; the folders that killed writers of this host
left behind are removed when the next store is written (``jaxembed.data.leftovers``). It replaces only a store
jaxembed wrote, unchanged since: the export's rule (``jaxembed.runs.atomic_files.atomic_dir``; ``jaxembed_export.json``
lists every file written), so a file a user added to the folder, or changed, is never deleted. On a pod, the
processes share the datasets: ``jaxembed.data.store_pod``. Writing streams: records go to
the ArrayRecord file as they are read; what is kept per record is a 4-byte label index, hashes for the duplicate-id
check (~40 bytes a record with an explicit id, a byte without) and the ArrayRecord writer's index (~5 bytes); the
content hashes of the identical-example check (8 bytes each) stay in memory up to ``hashindex.IN_MEMORY`` examples,
beyond which they are sorted in runs in the store's temporary folder and merged (bounded memory); skipped records
beyond the first thousand wait in a spool file until the report is written. No record, id or text is kept
(``benchmarks/prepare_memory.py`` measures it). ``Store.open(out_dir)`` reads it back: ``example(dataset, i)`` is
the normalised Example ``{"id", "query", "pos", "neg", "label"?}`` of record i.
"""

from __future__ import annotations

import datetime
import json
import sys
import threading
from array import array
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Sequence

from jaxembed.runs import atomic_files
from jaxembed.data import config as dc
from jaxembed.data import leftovers
from jaxembed.data.readers import ReadInfo, Tally, apply_policy, kalm_instruction, read_dataset, source_size
from jaxembed.data.formats import FORMAT_TABLE
from jaxembed.data.prepare_report import PrepareReport
from jaxembed.errors import UserError

STORE_FORMAT = "jaxembed-store"
STORE_VERSION = 1
#: records per ArrayRecord chunk. A random read decodes its chunk; the writer keeps ~80 bytes per chunk until it
#: closes (its index). 16 records: a sixteenth of the writer memory of 1 record per chunk (~5 bytes per record),
#: smaller files, and a somewhat slower random read that stays far above what the loader's tokenizer takes
#: (benchmarks/prepare_memory.py measures the writer's memory).
GROUP_SIZE = 16
_WRITER_OPTIONS = f"group_size:{GROUP_SIZE}"
#: the options of ``Store``'s readers (the loader's, in every process and loader worker): no readahead (reads are
#: random) and the chunk index in memory. The index grows with the file (opening one: 6.0 MiB at 1M records, 17.1
#: MiB at 10M, ~1.2 B a record: ~0.4 GiB a reader at 300M records in one file), but ArrayRecord's other choice,
#: ``index_storage_option:offloaded`` (the index left in the file), makes a random read cost more as the file
#: grows: 250 / 21 records per CPU-s at 1M / 10M records against 190,000 / 103,000 with the index in memory (17
#: against 48,000 for 10M triplets of ~1 KB; the loader reads thousands a step), for 0.3 / 4.6 MiB less
#: (``benchmarks/store_reader.py``).
READER_OPTIONS = "readahead_buffer_size:0,index_storage_option:in_memory"


@dataclass(frozen=True)
class DatasetInfo:
    """One dataset of a store, its config values resolved (instructions and batching are never None).

    size: examples written; temperature / weight / epochs / max lengths: None = the run's default;
    source: the input paths (or hf / tfds name)."""

    name: str
    task: str
    task_type: str
    size: int
    query_instruction: str
    doc_instruction: str
    temperature: float | None
    batching: str
    num_negatives: int
    weight: float | None
    epochs: float | None
    max_query_length: int | None
    max_doc_length: int | None
    source: tuple[str, ...]
    loss: str | None = None  # the dataset's loss (None: the run's loss.type)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["source"] = list(self.source)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "DatasetInfo":
        kw = {f.name: d[f.name] if f.default is MISSING else d.get(f.name, f.default) for f in fields(cls)}
        kw["source"] = tuple(kw["source"])
        return cls(**kw)


# ------------------------------------------------------------------------------------------------------ writing

def _no_task_type(ds, info: ReadInfo, where: str) -> UserError:
    """The error for a dataset whose config has no task_type and whose records give none, with the fix for the
    record format at hand (``RecordFormat.no_task_type``: BGE triplets take it from their 'type' field; the other
    formats have no such field). Nothing read yet (``info.format`` None): triplets, as ``read_records`` takes for a
    dataset without a valid record."""
    head = f"{where}.task_type: required (one of {', '.join(dc.TASK_TYPES)}): "
    fmt = FORMAT_TABLE[info.format or "triplets"]
    return UserError(head + fmt.no_task_type.format(src=_sources(ds)))


def _resolve_info(ds, info: ReadInfo, size: int, where: str) -> DatasetInfo:
    tt = ds.get("task_type") or info.task_type
    if tt is None:
        raise _no_task_type(ds, info, where)
    qi = ds.get("query_instruction")
    di = ds.get("doc_instruction")
    if qi is None:
        if info.prompt is not None:
            qi = kalm_instruction(info.prompt)
            if di is None and tt in dc.SYMMETRIC_TASK_TYPES:
                di = qi  # a symmetric task instructed by its data: the same instruction on both sides
        else:
            qi = dc.DEFAULT_QUERY_INSTRUCTIONS[tt]
    paths = dc.dataset_paths(ds)
    if ds.get("format") not in dc.SOURCE_FORMATS:
        paths = [str(Path(p).resolve()) for p in paths]
    return DatasetInfo(
        name=ds["name"], task=ds.get("task") or ds["name"], task_type=tt, size=size, query_instruction=qi,
        doc_instruction=di if di is not None else "", temperature=_float(ds.get("temperature")),
        batching=ds.get("batching") or dc.DEFAULT_BATCHING[tt], num_negatives=int(ds.get("num_negatives", 1)),
        weight=_float(ds.get("weight")), epochs=_float(ds.get("epochs")), max_query_length=ds.get("max_query_length"),
        max_doc_length=ds.get("max_doc_length"), source=tuple(paths), loss=ds.get("loss"))


def _float(v):
    return None if v is None else float(v)


def check_out_dir(out) -> Path:
    """The store folder ``out`` can be written (see ``jaxembed.runs.outputs.check_output``) and is new, empty or a store
    that jaxembed wrote, unchanged since (which is replaced: the export's rule, ``atomic_files.replace_refusal``);
    else a UserError naming it, the files that are not the store's, and the fix."""
    from jaxembed.runs.outputs import check_output

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: is a file (fix: give a folder for the store)")
    check_output(out, "folder", "--out")
    why = atomic_files.replace_refusal(out, "store")
    if why is not None:
        raise UserError(f"--out {out}: {why}; a store replaces only a store jaxembed prepared there, unchanged since, "
                        "so nothing there is touched (fix: choose a new or empty folder, or move those files "
                        "elsewhere first)")
    return out


def _sources(ds) -> str:
    """The input files of a dataset config, for error messages."""
    paths = dc.dataset_paths(ds)
    return ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


class Labels:
    """Per-example labels as 4-byte indices into the distinct labels (4 bytes an example, each label's text once)."""

    def __init__(self):
        self.index = array("i")
        self.names: dict[str, int] = {}
        self.missing = 0

    def add(self, label: str | None) -> None:
        if label is None:
            self.missing += 1
            self.index.append(-1)
            return
        k = self.names.get(label)
        if k is None:
            k = self.names[label] = len(self.names)
        self.index.append(k)

    def write(self, path: Path, order: list[str] | None) -> None:
        """``{"names": [...], "index": [...]}``: ``order`` first (a classification dataset's negatives order),
        then the other labels sorted; the index list is written in chunks."""
        names = list(order or sorted(self.names))
        names += sorted(set(self.names) - set(names))
        pos = {x: i for i, x in enumerate(names)}
        remap = [pos[x] for x in self.names]  # first-seen index -> position in names
        with open(path, "w", encoding="utf-8") as f:
            f.write('{"names": ' + json.dumps(names, ensure_ascii=False) + ', "index": [')
            for start in range(0, len(self.index), 65536):
                chunk = self.index[start:start + 65536]
                f.write(("" if start == 0 else ", ") + ", ".join(str(remap[k]) for k in chunk))
            f.write("]}")


def _progress(progress: bool | None, total: int | None, name: str):
    """A tqdm bar over a dataset's records (None: on when stderr is a terminal), or None."""
    if progress is None:
        progress = sys.stderr.isatty()
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=f"prepare {name}", unit=" records", unit_scale=True, mininterval=0.5,
                file=sys.stderr, leave=True, dynamic_ncols=True)


#: skipped records of a dataset kept in memory; the rest wait in a spool file in the store's temporary folder
SKIPPED_IN_MEMORY = 1000


@dataclass
class ExampleCounts:
    """What the manifest entry and the notes of a dataset need from its written examples, besides the Tally:
    their labels, negatives and positives per example (min / max), examples with fewer negatives than asked, with
    a pair score and with teacher scores."""

    labels: Labels = field(default_factory=Labels)
    neg_min: int | None = None
    neg_max: int = 0
    pos_max: int = 0
    few_neg: int = 0
    scores: int = 0
    teacher: int = 0

    def add(self, ex: dict, want_neg: int) -> None:
        self.labels.add(ex.get("label"))
        n = len(ex["neg"])
        self.neg_min = n if self.neg_min is None else min(self.neg_min, n)
        self.neg_max, self.pos_max = max(self.neg_max, n), max(self.pos_max, len(ex["pos"]))
        self.few_neg += n < want_neg
        self.scores += "score" in ex
        self.teacher += "pos_scores" in ex


def write_examples(ds, items, info: ReadInfo, writer, tally: Tally, where: str, bar=None, on_example=None
                   ) -> ExampleCounts:
    """Write the Examples of ``items`` (``apply_policy``'s, filling ``tally``) to an ArrayRecord ``writer``, each
    completed as the store keeps it; ``on_example(ex)`` sees each one written. The counts of what was written."""
    counts = ExampleCounts()
    want_neg = int(ds.get("num_negatives", 1))
    task_type_cfg = ds.get("task_type")
    for ex in items:
        tt = task_type_cfg or info.task_type
        if tt is None and not FORMAT_TABLE[info.format].task_type_in_records:  # BGE: in a later record
            raise _no_task_type(ds, info, where)
        if "label" not in ex and tt in ("classification", "clustering") and len(ex["pos"]) == 1:
            ex["label"] = ex["pos"][0]  # BGE classification: the positive is the label's description
        counts.add(ex, want_neg)
        writer.write(json.dumps(ex, ensure_ascii=False).encode("utf-8"))
        if on_example is not None:
            on_example(ex)
        if bar is not None and tally.read - bar.n >= 1000:
            bar.update(tally.read - bar.n)
    return counts


def _close_bar(bar, tally: Tally) -> None:
    if bar is not None:
        bar.update(tally.read - bar.n)
        bar.set_postfix_str(f"{tally.written} written, {tally.n_skipped} skipped", refresh=False)
        bar.close()


def no_examples(ds, tally: Tally, where: str) -> UserError | None:
    """The error for a dataset of which no example is left, or None."""
    if tally.written:
        return None
    reasons = "; ".join(f"{r}: {k}" for r, k in tally.reasons().items()) or "no records"
    return UserError(f"{_sources(ds)}: no examples left of {tally.read} records read ({reasons}) for {where} "
                     f"({ds['name']}) (fix: check the files, format, extra_fields and score_threshold)")


def _write_dataset(ds, tmp: Path, on_error: str, tally: Tally, where: str, progress: bool | None = None
                   ) -> tuple[DatasetInfo, dict, list[str]]:
    from array_record.python.array_record_module import ArrayRecordReader

    name = ds["name"]
    info = ReadInfo()
    bar = _progress(progress, source_size(ds) if progress is not False else None, name)
    path = tmp / f"{name}.array_record"
    writer = record_writer(path)
    try:
        counts = write_examples(ds, apply_policy(read_dataset(ds, info), on_error, tally), info, writer, tally,
                                where, bar)
    finally:
        writer.close()
        _close_bar(bar, tally)
    err = no_examples(ds, tally, where)
    if err is not None:
        raise err
    if tally.identical:  # name the first of each identical pair: read their ids back from the store
        reader = ArrayRecordReader(str(path), "readahead_buffer_size:0")
        try:
            tally.resolve_ids(lambda idx: [Store.decode(r)["id"] for r in reader.read(idx)])
        finally:
            reader.close()
    return dataset_entry(ds, tmp, info, tally, counts, where)


def record_writer(path: Path):
    """An ArrayRecord writer with the store's options."""
    from array_record.python.array_record_module import ArrayRecordWriter

    return ArrayRecordWriter(str(path), _WRITER_OPTIONS)


def dataset_entry(ds, tmp: Path, info: ReadInfo, tally: Tally, counts: ExampleCounts, where: str
                  ) -> tuple[DatasetInfo, dict, list[str]]:
    """A written dataset's DatasetInfo, manifest entry and notes; its labels file written into ``tmp``."""
    name = ds["name"]
    dinfo = _resolve_info(ds, info, tally.written, where)
    entry = {"file": f"{name}.array_record", "format": ds.get("format", "auto"), "record_format": info.format,
             "labels_file": None, "label_names": info.labels,
             "counts": {"read": tally.read, "written": tally.written, "invalid": tally.invalid,
                        "filtered": tally.filtered, "neg_min": counts.neg_min, "neg_max": counts.neg_max,
                        "pos_max": counts.pos_max, "scores": counts.scores, "teacher_scores": counts.teacher}}
    if counts.labels.names and not counts.labels.missing:
        counts.labels.write(tmp / f"{name}.labels.json", info.labels)
        entry["labels_file"] = f"{name}.labels.json"
    notes = []
    if tally.identical_note():
        notes.append(tally.identical_note())
    n_teacher, want_neg = counts.teacher, int(ds.get("num_negatives", 1))
    if n_teacher and n_teacher < tally.written:
        notes.append(f"{tally.written - n_teacher} of {tally.written} examples have no teacher scores (pos_scores): "
                     "distillation leaves them out")
    if counts.few_neg and want_neg > 0:
        notes.append(f"{counts.few_neg} of {tally.written} examples have fewer than num_negatives={want_neg} "
                     f"negatives (min {counts.neg_min})")
    return dinfo, entry, notes


def write_store(data_config, out_dir, where: str = "data", progress: bool | None = None) -> PrepareReport:
    """Validate the data config, read and check every record of every dataset, apply ``on_error`` and write the
    store to ``out_dir`` (replacing a store there). Raises UserError / InputError (on_error 'stop': the first bad
    record, naming file, line, field and fix); nothing is written then. ``where``: how errors name the data config
    (e.g. ``configs/x.py: data``). ``progress``: a progress bar per dataset (None: when stderr is a terminal).

    One process; on a pod, ``jaxembed.data.store_pod.prepare`` shares the datasets among the processes.

    Memory is bounded whatever the size of the data (see the module docstring)."""
    out = check_out_dir(out_dir)  # before any work
    dc.validate_data_config(data_config, where=where)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = PrepareReport(out_dir=str(out), on_error=data_config.get("on_error", "stop"))
    with store_folder(out) as tmp:
        done = []
        try:
            for i, ds in enumerate(data_config["datasets"]):
                done.append(write_one(ds, i, tmp, report.on_error, where, progress))
            finish(tmp, data_config, report, done, where)
        except BaseException:
            for t, *_ in done:
                t.close()  # the spool files (anonymous) are gone with their handles
            raise
    return report


def store_folder(out: Path):
    """The temporary folder a store is written in, as a context manager (``leftovers.atomic_dir``, the export's:
    renamed into place on success, replacing only a store jaxembed wrote, unchanged since; removed on an error;
    locked while written; the folders killed writers of this host left are removed first)."""
    return leftovers.atomic_dir(out, who="data prepare", kind="store")


def write_one(ds, i: int, tmp: Path, on_error: str, where: str, progress: bool | None
              ) -> tuple[Tally, DatasetInfo, dict, list[str]]:
    """Write dataset ``i`` of the config into ``tmp``: (its Tally, DatasetInfo, manifest entry, notes)."""
    tally = Tally(ds["name"], keep_ids=False, memory_limit=SKIPPED_IN_MEMORY, spool_dir=str(tmp))
    try:
        dinfo, entry, notes = _write_dataset(ds, tmp, on_error, tally, f"{where}.datasets[{i}]", progress)
    except BaseException:
        tally.close()
        raise
    return tally, dinfo, dict(dinfo.to_dict(), **entry), notes


def finish(tmp: Path, data_config, report: PrepareReport, done: list, where: str) -> None:
    """Check the datasets together, then write the report and ``manifest.json`` (last) into ``tmp``. ``done``:
    ``write_one``'s results, in the config's order."""
    infos = [d[1] for d in done]
    # task types taken from the records (BGE 'type') must agree within a task too
    dc.check_task_types([(f"{where}.datasets[{i}]", d.name, d.task, d.task_type) for i, d in enumerate(infos)])
    for tally, _, _, notes in done:
        report.datasets.append(tally)
        if notes:
            report.notes[tally.name] = notes
    report.write(tmp)
    from jaxembed import __version__

    manifest = {"format": STORE_FORMAT, "version": STORE_VERSION, "jaxembed_version": __version__,
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "on_error": report.on_error, "sampling": data_config.get("sampling", "size"),
                "sampling_temperature": data_config.get("sampling_temperature", 1.0),
                "seed": data_config.get("seed", 0), "datasets": [d[2] for d in done],
                "config": dc.to_plain(data_config)}
    (tmp / "manifest.json").write_text(json.dumps(manifest, ensure_ascii=False, indent=1), encoding="utf-8")


# ------------------------------------------------------------------------------------------------------ reading

class Store:
    """A dataset store written by ``write_store``; random access to every dataset's examples.

    Picklable (open readers are not carried over), so Grain worker processes can hold one."""

    def __init__(self, path: Path, manifest: dict):
        self.path = Path(path)
        self.manifest = manifest
        self.datasets: list[DatasetInfo] = [DatasetInfo.from_dict(d) for d in manifest["datasets"]]
        self._by_name = {d.name: i for i, d in enumerate(self.datasets)}
        self._readers: dict[int, object] = {}
        self._labels: dict[int, list[str] | None] = {}
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path) -> "Store":
        """Open a store folder; a UserError says what is wrong when it is not a (complete, current) store."""
        p = Path(path)
        if p.is_file():
            raise UserError(f"{p}: is a file, not a dataset store folder (fix: give the folder written by jaxembed "
                            "data prepare --out)")
        if not p.is_dir():
            raise UserError(f"{p}: no such dataset store (fix: run jaxembed data prepare --config ... --out {p})")
        mf = p / "manifest.json"
        if not mf.exists():
            raise UserError(f"{p}: not a dataset store (no manifest.json) (fix: run jaxembed data prepare "
                            f"--config ... --out {p})")
        try:
            manifest = json.loads(mf.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"{mf}: unreadable manifest ({e}) (fix: prepare the store again)") from None
        if not isinstance(manifest, dict) or manifest.get("format") != STORE_FORMAT:
            raise UserError(f"{mf}: not a jaxembed dataset store manifest (fix: prepare the store again)")
        if manifest.get("version") != STORE_VERSION:
            raise UserError(f"{p}: store version {manifest.get('version')}, this jaxembed reads version "
                            f"{STORE_VERSION} (fix: run jaxembed data prepare again)")
        try:
            store = cls(p, manifest)
        except (KeyError, TypeError) as e:
            raise UserError(f"{mf}: incomplete manifest ({e}) (fix: prepare the store again)") from None
        for d in manifest["datasets"]:
            f = p / d["file"]
            if not f.exists():
                raise UserError(f"{p}: dataset {d['name']!r}: {d['file']} is missing (fix: prepare the store again)")
        return store

    def __getstate__(self):
        return {"path": str(self.path), "manifest": self.manifest}

    def __setstate__(self, state):
        self.__init__(Path(state["path"]), state["manifest"])

    def __repr__(self) -> str:
        n = sum(d.size for d in self.datasets)
        return f"Store({str(self.path)!r}, {len(self.datasets)} datasets, {n} examples)"

    def index(self, name_or_index: int | str) -> int:
        """The position of a dataset given by name or position."""
        if isinstance(name_or_index, str):
            if name_or_index not in self._by_name:
                raise UserError(f"{self.path}: no dataset {name_or_index!r} (datasets: {', '.join(self._by_name)})")
            return self._by_name[name_or_index]
        i = int(name_or_index)
        if not 0 <= i < len(self.datasets):
            raise IndexError(f"dataset index {i} out of range (store has {len(self.datasets)} datasets)")
        return i

    def dataset(self, name_or_index: int | str) -> DatasetInfo:
        return self.datasets[self.index(name_or_index)]

    def size(self, name_or_index: int | str) -> int:
        return self.datasets[self.index(name_or_index)].size

    def record_path(self, dataset: int | str) -> Path:
        """The dataset's ArrayRecord file (for ``grain.sources.ArrayRecordDataSource``; decode with ``decode``)."""
        return self.path / self.manifest["datasets"][self.index(dataset)]["file"]

    @staticmethod
    def decode(record: bytes) -> dict:
        """One stored record (bytes) as its Example dict."""
        return json.loads(record.decode("utf-8"))

    def _reader(self, i: int):
        r = self._readers.get(i)
        if r is None:
            from array_record.python.array_record_module import ArrayRecordReader

            r = ArrayRecordReader(str(self.record_path(i)), READER_OPTIONS)
            if r.num_records() != self.datasets[i].size:
                raise UserError(f"{self.record_path(i)}: {r.num_records()} records, the manifest says "
                                f"{self.datasets[i].size} (fix: prepare the store again)")
            self._readers[i] = r
        return r

    def _check(self, i: int, indices: Sequence[int]) -> list[int]:
        n = self.datasets[i].size
        out = []
        for k in indices:
            k = int(k)
            if not 0 <= k < n:
                raise IndexError(f"example index {k} out of range for dataset {self.datasets[i].name!r} (size {n})")
            out.append(k)
        return out

    def example(self, dataset: int | str, index: int) -> dict:
        """The Example at ``index`` (0 <= index < size) of a dataset."""
        return self.examples(dataset, [index])[0]

    def examples(self, dataset: int | str, indices: Sequence[int]) -> list[dict]:
        """The Examples at ``indices`` (in that order; repeats allowed)."""
        i = self.index(dataset)
        idx = self._check(i, indices)
        if not idx:
            return []
        with self._lock:
            recs = self._reader(i).read(idx)
        return [self.decode(r) for r in recs]

    def labels(self, dataset: int | str) -> list[str] | None:
        """Per-example labels (``labels(d)[i] == example(d, i)["label"]``) of a dataset whose examples all have
        one (classification, clustering), else None."""
        i = self.index(dataset)
        if i not in self._labels:
            f = self.manifest["datasets"][i].get("labels_file")
            if not f:
                self._labels[i] = None
            else:
                d = json.loads((self.path / f).read_text(encoding="utf-8"))
                names = d["names"]
                self._labels[i] = [names[k] for k in d["index"]]
        return self._labels[i]

    def label_names(self, dataset: int | str) -> list[str] | None:
        """The distinct labels of a dataset (classification: in the order of its negatives), or None."""
        i = self.index(dataset)
        f = self.manifest["datasets"][i].get("labels_file")
        if not f:
            return None
        return json.loads((self.path / f).read_text(encoding="utf-8"))["names"]

    def close(self) -> None:
        with self._lock:
            for r in self._readers.values():
                r.close()
            self._readers.clear()
