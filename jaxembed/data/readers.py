"""The file readers: input files of every format -> normalised examples, every bad record named by file, line,
field and fix.

An ``Example`` is a dict ``{"id": str, "query": str, "pos": list[str] (>= 1), "neg": list[str] (>= 0)}``, plus
``"label": str`` for classification and clustering data. Formats (one JSON object per line):

- ``triplets``: ``query``, ``pos`` (list), ``neg`` (list, optional); also the BGE / FlagEmbedding fine-tuning
  format, whose ``prompt`` is the query instruction and ``type`` the task type (``BGE_TYPES``); ``pos_scores``,
  ``neg_scores`` (a teacher's score of each positive / negative, for distillation) are kept in the Example when
  present (numbers, one per text); ``category`` (BGE clustering) becomes the label.
- ``scored_pairs``: ``sentence1``, ``sentence2``, ``score``: a positive pair when score >= threshold, otherwise
  skipped with reason "score below threshold". A dataset trained by a scored-pair loss (``ReadOptions.keep_scores``:
  CoSENT, AnglE) keeps every pair, with its ``score`` in the Example, and has no threshold.
- ``labelled_pairs``: ``sentence1``, ``sentence2``, ``label`` (1 / 0, true / false, "1" / "0"): label 1 is a
  positive pair, label 0 is skipped with reason "negative pair".
- ``classification``: ``text``, ``label`` -> query = text, pos = [description of its label], neg = [descriptions of
  every other label] (KaLM); descriptions from the config, else the label itself.
- ``st`` (sentence-transformers / Hugging Face ``datasets`` rows): the columns in order, as sentence-transformers
  reads them -- column names do not matter, except ``label`` / ``score``, the label column. Without one: (anchor,
  positive, negative_1, ..., negative_n) -> query, pos = [positive], neg = [negatives]. With one: (sentence1,
  sentence2, label / score) -> a pair, positive when label is 1 (0: skipped, "negative pair") or, with
  ``score_threshold``, when the value is >= the threshold. ``auto`` picks it for rows with ``anchor`` + ``positive``.

An optional ``id`` field (string or integer) gives the example id, else ``"<dataset>:<line>"`` (with several files
``"<dataset>:<file index>:<line>"``). Sources (``jaxembed.data.sources``): JSON Lines, Parquet and CSV / TSV files,
Hugging Face ``datasets`` (``save_to_disk`` folders, ``hf``: hub names, optionally streamed) and TFDS (``tfds``)
rows, which are parsed as one of the record formats above; Parquet and ``datasets`` rows are numbered from 1, CSV
rows by the line they start on.

Memory: every reader streams. What is kept per record is hashes (duplicate ids: ~40 bytes; identical examples: 8
bytes, in memory up to ``hashindex.IN_MEMORY`` examples, then in sorted runs on disk; ``jaxembed.data.hashindex``),
never the records or their ids; skipped records beyond ``Tally.memory_limit`` go to an anonymous spool file.

Readers are generators that yield, for each record read, either an ``Example`` or a ``Skip`` (file, line, field,
reason, fix). ``apply_policy`` is the one place that turns a ``Skip`` into an error (``on_error='stop'``) or counts
it (``'skip'``); valid records that a rule leaves out (``Skip.invalid`` False) are always counted, never errors.

The record level (checks, parsers, ``Skip``) is ``jaxembed.data.parsers``; the table of the formats (each one's
fields, parser, detection and help) ``jaxembed.data.formats``; the on_error policy and the counts
(``apply_policy``, ``Tally``) ``jaxembed.data.tally``. This module reads files and sources with them, and
re-exports their names (``from jaxembed.data.readers import Skip, Tally, ...``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterable, Iterator

from jaxembed.data import sources
from jaxembed.data.config import SCORED_LOSSES
from jaxembed.data.hashindex import HashIndex, key_of
from jaxembed.data.jsonl import BadLine, check_input_file, iter_text_lines, parse_object
from jaxembed.data.formats import (FORMAT_TABLE, RECORD_FORMATS, detect_format,  # noqa: F401 (re-exported)
                                          format_help)
from jaxembed.data.parsers import (BGE_IGNORED, BGE_TYPES, DEFAULT_FIELDS,  # noqa: F401 (re-exported)
                                   TEACHER_FIELDS, BadConfig, BadRecord, Example, FilteredRecord, Item, ReadInfo,
                                   ReadOptions, RecordContext, Skip, check_unknown_keys, closest, kalm_instruction,
                                   label_str, parse_classification, parse_labelled_pair, parse_scored_pair, parse_st,
                                   parse_triplet, record_id)
from jaxembed.data.tally import Tally, apply_policy  # noqa: F401 (re-exported)
from jaxembed.errors import InputError, UserError
from jaxembed.losses.table import titles

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------------------ line reading

def iter_raw_lines(path: str) -> Iterator[tuple[int, str | Skip]]:
    """(line number from 1, decoded line without its line end, or a Skip for a line that is not valid UTF-8 or is
    longer than ``jaxembed.data.jsonl.MAX_LINE_BYTES``).

    Lines are decoded one by one, so a bad byte costs one record, not the file. A UTF-8 byte-order mark at the
    start of the file is removed; gzip / bzip2 / xz files are decompressed (see ``jaxembed.data.jsonl``). A final
    newline does not start another record."""
    for i, line in iter_text_lines(path):
        yield i, (Skip(str(path), i, line.field, line.reason, line.fix) if isinstance(line, BadLine) else line)


def iter_json_objects(path: str) -> Iterator[tuple[int, dict | Skip]]:
    """(line number, JSON object or Skip) for each line of a JSON Lines file; every way a line can fail to be one
    JSON object (bad bytes, too long, invalid or too deeply nested JSON, huge integers, a key twice, not an
    object) is a Skip naming the line."""
    for i, line in iter_raw_lines(path):
        yield i, (line if isinstance(line, Skip) else object_or_skip(str(path), i, line))


def object_or_skip(path: str, i: int, line) -> dict | Skip:
    """Line ``i`` of a JSON Lines file -> its JSON object, or the Skip that names the line and the fix."""
    obj = parse_object(line, i)
    if not isinstance(obj, BadLine):
        return obj
    fix = obj.fix
    if obj.reason.startswith("expected a JSON object"):
        fix = 'write one object per line, e.g. {"query": "...", "pos": ["..."]}'
    return Skip(path, i, obj.field, obj.reason, fix)


# ------------------------------------------------------------------------------------------------ readers

def empty_file(path) -> InputError:
    """The error of a data file without any record (also raised by a pod's part of whole files,
    ``jaxembed.data.split_plan``)."""
    return InputError(path, None, "empty file: no records",
                      "check the file (an interrupted download or export?), or remove it from the dataset")


def file_rows(path: str, kind: str, fields: dict, split: str = "train") -> Iterator[tuple[int, dict | Skip]]:
    """(line / row number, object or Skip) of one file of any kind (``jaxembed.data.sources.source_kind``);
    ``split``: the split of a save_to_disk DatasetDict."""
    if kind == "jsonl":
        yield from iter_json_objects(path)
        return
    if kind == "parquet":
        rows = sources.iter_parquet(path)
    elif kind in ("csv", "tsv"):
        rows = sources.iter_csv(path, "\t" if kind == "tsv" else ",", numeric=(fields["score"], fields["label"]))
    elif kind == "hf_disk":
        rows = sources.iter_hf(sources.load_hf(path, split))
    else:
        raise UserError(f"{path}: cannot read a {kind} source here")
    for i, obj in rows:
        yield i, (Skip(str(path), i, obj.field, obj.reason, obj.fix) if isinstance(obj, BadLine) else obj)


def _records_files(paths: list[str], kinds: list[str], fields: dict, split: str = "train"
                   ) -> Iterator[tuple[str, int, str, dict | Skip]]:
    """(path, line, default-id suffix, object or Skip) over several files (JSON Lines, Parquet, CSV / TSV,
    save_to_disk folders); a file without any record is an InputError."""
    multi = len(paths) > 1
    for k, (p, kind) in enumerate(zip(paths, kinds)):
        i = 0
        for i, obj in file_rows(p, kind, fields, split):
            yield str(p), i, (f"{k}:{i}" if multi else str(i)), obj
        if i == 0:
            raise empty_file(p)


def _records_jsonl(paths: list[str]) -> Iterator[tuple[str, int, str, dict | Skip]]:
    """(path, line, default-id suffix, object or Skip) over several JSON Lines files."""
    return _records_files(paths, ["jsonl"] * len(paths), DEFAULT_FIELDS)


_FORMAT_HELP = "set format in the data config (or --format): " + format_help()


def read_records(records_fn, opts: ReadOptions, info: ReadInfo | None = None) -> Iterator[Item]:
    """Parse the records of ``records_fn()`` (a callable returning an iterator of ``(path, line, id suffix,
    dict or Skip)``; called twice for classification without label descriptions) into Examples and Skips, one
    item per record read. ``info`` is filled while reading (format, task type, prompt, labels).

    Memory: duplicate ids are found through 96-bit hashes of the ids (``HashIndex``, ~40 bytes per record), not a
    table of the ids themselves."""
    info = info if info is not None else ReadInfo()
    f = opts.fields
    fmt = opts.format if opts.format != "auto" else None
    if fmt is not None and fmt not in RECORD_FORMATS:
        raise UserError(f"unknown record format {fmt!r} (one of auto, {', '.join(RECORD_FORMATS)})")
    if fmt is None:  # auto: the first JSON object decides
        for path, line, _, obj in records_fn():
            if isinstance(obj, dict):
                fmt = detect_format(obj, f)
                if fmt is None:
                    keys = ", ".join(sorted(obj)) or "none"
                    raise InputError(path, line, f"cannot tell the format from the keys ({keys})", _FORMAT_HELP)
                if opts.keep_scores and not FORMAT_TABLE[fmt].scored:
                    raise InputError(path, line, f"a scored-pair loss ({titles(SCORED_LOSSES)}) trains on scored pairs "
                                                 f"(sentence1, sentence2, score) but the records are {fmt}",
                                     "train this dataset with loss='infonce', or give it scored pairs")
                if (FORMAT_TABLE[fmt].threshold_required and opts.need_threshold and opts.score_threshold is None
                        and not opts.keep_scores):
                    raise InputError(path, line, "the records are scored pairs (sentence1, sentence2, score), which "
                                                 "need score_threshold", "set score_threshold in the dataset config: "
                                                                         "pairs with score >= it are positives")
                break
        if fmt is None:
            fmt = "triplets"  # no valid JSON object at all: every record is a Skip anyway
    info.format = fmt
    spec = FORMAT_TABLE[fmt]
    desc: dict[str, str] = {}
    order: list[str] = []
    if spec.label_descriptions:
        if opts.label_descriptions:
            order = [k for k, _ in opts.label_descriptions]
            desc = dict(opts.label_descriptions)
        else:  # first pass: the labels present in the data
            seen = set()
            for _, _, _, obj in records_fn():
                if isinstance(obj, dict) and f["label"] in obj:
                    try:
                        seen.add(label_str(obj[f["label"]], f["label"]))
                    except BadRecord:
                        pass
            order = sorted(seen)
            desc = {x: x for x in order}
        info.labels = order
    ids = _IdCheck(opts.name)
    known = spec.known_keys(opts) if not spec.texts_by_position else frozenset()
    ctx = RecordContext(opts, info, desc=desc, order=order)
    base: dict[str, str] = {}
    for path, line, suffix, obj in records_fn():
        if isinstance(obj, Skip):
            yield obj
            continue
        name = base.get(path)
        if name is None:
            name = base[path] = os.path.basename(path)
        where = f"{name}:{line}"
        try:
            explicit = f["id"] in obj
            rid = record_id(obj, f, f"{opts.name}:{suffix}")
            ctx.where = where
            ex = spec.parse(obj, f, rid, ctx)
            if not spec.texts_by_position:
                check_unknown_keys(obj, known, fmt)
            first = ids.check(rid, explicit, suffix, name, line)
            if first is not None:
                raise BadRecord(f["id"], f"duplicate id {rid!r} (first at {first})", "give every record its own id")
        except BadConfig as e:
            raise InputError(path, line, e.reason, e.fix, field=e.field) from None
        except BadRecord as e:
            yield Skip(path, line, e.field, e.reason, e.fix, invalid=True)
            continue
        except FilteredRecord as e:
            yield Skip(path, line, e.field, e.reason, None, invalid=False, detail=e.detail)
            continue
        yield ex


class _IdCheck:
    """Duplicate ids in bounded memory. Default ids (``<name>:<suffix>``, the suffix from the file and line) are
    unique among themselves, so only explicit ids are hashed (``HashIndex``, ~40 bytes each); a byte per line marks
    the lines whose example took its default id, for the rare explicit id written like a default one. A record
    without an id costs one byte."""

    def __init__(self, name: str):
        self.prefix = name + ":"
        self.index = HashIndex()
        self.took_default: dict[int, bytearray] = {}  # file index -> 1 at the lines whose example has its default id
        self.claimed: dict[tuple[int, int], str] = {}  # explicit ids shaped like a default id -> where they were
        self.names: dict[int, str] = {}  # file index -> file name
        self.files: dict[str, int] = {}  # file name -> the index packed into HashIndex values
        self.where: list[str] = []

    @staticmethod
    def _slot(suffix: str) -> tuple[int, int] | None:
        """(file index, line) of a default-id suffix ``line`` or ``file:line``; None if it is not one."""
        a, sep, b = suffix.partition(":")
        if not sep:
            return (0, int(a)) if a.isdigit() else None
        return (int(a), int(b)) if a.isdigit() and b.isdigit() else None

    def check(self, rid: str, explicit: bool, suffix: str, name: str, line: int) -> str | None:
        """Where the first record with id ``rid`` was, when this one repeats it; else None (and it is noted)."""
        slot = self._slot(suffix)
        k = slot[0] if slot is not None else 0
        self.names.setdefault(k, name)
        if not explicit and slot is not None:
            first = self.claimed.get(slot) if self.claimed else None
            if first is not None:
                return first
            marks = self.took_default.setdefault(k, bytearray())
            if slot[1] >= len(marks):
                marks.extend(bytes(slot[1] + 1 - len(marks) + 4096))
            marks[slot[1]] = 1
            return None
        other = self._slot(rid[len(self.prefix):]) if rid.startswith(self.prefix) else None
        if other is not None:  # shaped like a default id: the record of that line may have taken it
            marks = self.took_default.get(other[0])
            if marks is not None and other[1] < len(marks) and marks[other[1]]:
                return f"{self.names.get(other[0], '?')}:{other[1]}"
        w = self.files.get(name)
        if w is None:
            w = self.files[name] = len(self.where)
            self.where.append(name)
        first = self.index.get_or_put(key_of(rid), (w << 40) | line)
        if first is not None:
            return f"{self.where[first >> 40]}:{first & ((1 << 40) - 1)}"
        if other is not None:
            self.claimed.setdefault(other, f"{name}:{line}")
        return None


def file_kinds(paths: list[str]) -> list[str]:
    """``jaxembed.data.sources.source_kind`` of each path; a folder that is not a save_to_disk folder is an
    InputError."""
    kinds = []
    for p in paths:
        kind = sources.source_kind(p)
        if kind == "folder":
            raise InputError(p, None, "is a folder, not a data file nor a datasets.save_to_disk folder (no "
                                      "dataset_info.json / dataset_dict.json)",
                             "give the data files, or format='hf' to read the folder with datasets.load_dataset")
        if kind != "hf_disk":
            check_input_file(p)
        sources.require(kind, p)  # the optional package a kind needs, before anything is read
        kinds.append(kind)
    return kinds


def read_files(paths: str | list[str], opts: ReadOptions | None = None, info: ReadInfo | None = None,
               split: str = "train") -> Iterator[Item]:
    """Examples and Skips of one dataset stored in one or more files: JSON Lines, Parquet, CSV / TSV (by suffix)
    or ``datasets.save_to_disk`` folders (``split``: of a saved DatasetDict) (see ``read_records``)."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    paths = [str(p) for p in paths]
    kinds = file_kinds(paths)  # missing files are a usage error before anything is read
    opts = opts or ReadOptions()
    return read_records(lambda: _records_files(paths, kinds, opts.fields, split), opts, info)


def read_jsonl(paths: str | list[str], opts: ReadOptions | None = None, info: ReadInfo | None = None
               ) -> Iterator[Item]:
    """Examples and Skips of one dataset stored in one or more JSON Lines files (see ``read_records``)."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    paths = [str(p) for p in paths]
    for p in paths:  # missing files are a usage error before anything is read
        check_input_file(p)
    return read_records(lambda: _records_jsonl(paths), opts or ReadOptions(), info)


# ---------------------------------------------------------------------------------- Hugging Face datasets / TFDS

_plain = sources.plain


def load_hf(source, split: str = "train", subset: str | None = None, streaming: bool = False):
    """A ``datasets.Dataset`` (``IterableDataset`` when streaming) from a Dataset / DatasetDict object, a
    ``save_to_disk`` folder or a ``datasets.load_dataset`` name (see ``jaxembed.data.sources.load_hf``)."""
    return sources.load_hf(source, split, subset, streaming)


def _records_rows(rows: Iterable[tuple[int, dict]], where: str) -> Iterator[tuple[str, int, str, dict | Skip]]:
    for i, row in rows:
        yield where, i, str(i), row


def read_hf(source, opts: ReadOptions | None = None, info: ReadInfo | None = None, split: str = "train",
            subset: str | None = None, streaming: bool = False) -> Iterator[Item]:
    """Examples and Skips from a Hugging Face dataset (object, DatasetDict, save_to_disk folder, or a
    ``load_dataset`` name: a hub dataset or a local folder of data files; ``streaming``: read as an
    IterableDataset, never materialised); rows are numbered from 1 and named ``<source>[<split>]``."""
    ds = load_hf(source, split, subset, streaming)
    name = str(source) if isinstance(source, (str, Path)) else "dataset"
    where = f"{name}{'/' + subset if subset else ''}[{split}]"
    return read_records(lambda: _records_rows(sources.iter_hf(ds), where), opts or ReadOptions(), info)


def read_tfds(name: str, opts: ReadOptions | None = None, info: ReadInfo | None = None, split: str = "train",
              data_dir: str | None = None) -> Iterator[Item]:
    """Examples and Skips from a TFDS dataset (``tensorflow_datasets`` is optional: ``pip install jaxembed[tfds]``);
    byte strings are decoded as UTF-8, rows numbered from 1."""
    src = sources.open_tfds(name, split, data_dir)  # a missing package or dataset is an error before reading
    where = f"tfds:{name}[{split}]"
    return read_records(lambda: _records_rows(((i, sources.plain(dict(r))) for i, r in enumerate(src, 1)), where),
                        opts or ReadOptions(), info)


# ------------------------------------------------------------------------------------------ from a dataset config

def read_options(ds) -> ReadOptions:
    """ReadOptions of one dataset config (see jaxembed.data.config)."""
    from jaxembed.data.config import effective_record_format, pairs_of

    fields = dict(DEFAULT_FIELDS)
    if ds.get("text_field"):
        fields["text"] = ds["text_field"]
    if ds.get("label_field"):
        fields["label"] = ds["label_field"]
    if ds.get("columns") is not None:
        fields.update(dict(pairs_of(ds["columns"], "columns")))
    ld = ds.get("label_descriptions")
    scored = ds.get("loss") in SCORED_LOSSES  # every pair with its score (config.data_section resolves loss None)
    return ReadOptions(name=ds["name"], format=effective_record_format(ds), fields=fields,
                       score_threshold=ds.get("score_threshold"),
                       label_descriptions=pairs_of(ld, "label_descriptions") if ld is not None else None,
                       use_type=ds.get("task_type") is None, use_prompt=ds.get("query_instruction") is None,
                       extra_fields=frozenset(ds.get("extra_fields") or ()), need_threshold=not scored,
                       keep_scores=scored)


def read_dataset(ds, info: ReadInfo | None = None) -> Iterator[Item]:
    """Examples and Skips of one dataset config, whatever its source (JSON Lines / Parquet / CSV files,
    save_to_disk folders, hf, tfds)."""
    from jaxembed.data.config import dataset_paths

    opts = read_options(ds)
    fmt = ds.get("format", "auto")
    marked = [p for p in dataset_paths(ds) if "no_in_batch_neg" in str(p)]
    if marked:  # FlagEmbedding's mark, in a data folder's name, for no in-batch negatives: said, not ignored
        log.warning("%s: 'no_in_batch_neg' in the path turns off in-batch negatives in FlagEmbedding; jaxembed keeps "
                    "them (every query is contrasted with all the candidates of its batch), so dataset '%s' trains "
                    "with them", marked[0], ds["name"])
    if fmt == "hf":
        return read_hf(dataset_paths(ds)[0], opts, info, split=ds.get("split", "train"), subset=ds.get("subset"),
                       streaming=bool(ds.get("streaming")))
    if fmt == "tfds":
        return read_tfds(dataset_paths(ds)[0], opts, info, split=ds.get("split", "train"))
    return read_files(dataset_paths(ds), opts, info, split=ds.get("split", "train"))


def source_size(ds) -> int | None:
    """The number of records of a dataset config when its source says so cheaply (Parquet footers, a
    save_to_disk Dataset), else None -- for progress bars."""
    from jaxembed.data.config import dataset_paths

    fmt = ds.get("format", "auto")
    if fmt == "tfds" or (fmt == "hf" and ds.get("streaming")):
        return None
    total = 0
    try:
        for p in dataset_paths(ds):
            kind = sources.source_kind(p, fmt)
            if kind == "parquet":
                n = sources.parquet_rows(p)
            elif kind == "hf_disk":
                n = sources.hf_rows(sources.load_hf(p, ds.get("split", "train")))
            else:
                return None
            if n is None:
                return None
            total += n
    except UserError:
        return None
    return total
