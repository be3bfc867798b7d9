"""Input formats -> normalised examples, with every bad record named by file, line, field and fix.

An ``Example`` is a dict ``{"id": str, "query": str, "pos": list[str] (>= 1), "neg": list[str] (>= 0)}``, plus
``"label": str`` for classification and clustering data. Formats (one JSON object per line):

- ``triplets``: ``query``, ``pos`` (list), ``neg`` (list, optional); also the BGE / FlagEmbedding fine-tuning
  format, whose ``prompt`` is the query instruction and ``type`` the task type (``BGE_TYPES``); ``pos_scores``,
  ``neg_scores`` are ignored; ``category`` (BGE clustering) becomes the label.
- ``scored_pairs``: ``sentence1``, ``sentence2``, ``score``: a positive pair when score >= threshold, otherwise
  skipped with reason "score below threshold".
- ``labelled_pairs``: ``sentence1``, ``sentence2``, ``label`` (1 / 0, true / false, "1" / "0"): label 1 is a
  positive pair, label 0 is skipped with reason "negative pair".
- ``classification``: ``text``, ``label`` -> query = text, pos = [description of its label], neg = [descriptions of
  every other label] (KaLM); descriptions from the config, else the label itself.

An optional ``id`` field (string or integer) gives the example id, else ``"<dataset>:<line>"`` (with several files
``"<dataset>:<file index>:<line>"``). Sources: JSON Lines files, Hugging Face ``datasets`` (``hf``) and TFDS
(``tfds``) rows, which are parsed as one of the record formats above.

Readers are generators that yield, for each record read, either an ``Example`` or a ``Skip`` (file, line, field,
reason, fix). ``apply_policy`` is the one place that turns a ``Skip`` into an error (``on_error='stop'``) or counts
it (``'skip'``); valid records that a rule leaves out (``Skip.invalid`` False) are always counted, never errors.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Union

from jaxembed.data.config import RECORD_FORMATS, TASK_TYPES, KALM_TEMPLATE
from jaxembed.data.jsonl import BadLine, check_input_file, iter_text_lines, parse_object
from jaxembed.errors import InputError, UserError

Example = dict  # {"id": str, "query": str, "pos": list[str], "neg": list[str], "label"?: str}

#: BGE / FlagEmbedding ``type`` values -> our task types (our own task type names are accepted as well).
BGE_TYPES = {
    "normal": "retrieval",
    "only_1neg": "retrieval",
    "symmetric_sts": "sts",
    "symmetric_class": "classification",
    "symmetric_clustering": "clustering",
    **{t: t for t in TASK_TYPES},
}

#: the fields each record format reads (our names; ``fields`` maps them to the source keys). A record key that is
#: none of them (nor ``BGE_IGNORED`` for triplets, nor one of the dataset's ``extra_fields``) is an error.
FORMAT_FIELDS = {
    "triplets": ("id", "query", "pos", "neg", "prompt", "type", "category", "label"),
    "scored_pairs": ("id", "sentence1", "sentence2", "score"),
    "labelled_pairs": ("id", "sentence1", "sentence2", "label"),
    "classification": ("id", "text", "label"),
}
#: BGE / FlagEmbedding keys of triplets that are read and ignored (teacher scores for distillation).
BGE_IGNORED = ("pos_scores", "neg_scores")

#: our field name -> the default source key; ``columns`` / text_field / label_field override them.
DEFAULT_FIELDS = {
    "id": "id", "query": "query", "pos": "pos", "neg": "neg", "prompt": "prompt", "type": "type",
    "category": "category", "sentence1": "sentence1", "sentence2": "sentence2", "score": "score",
    "text": "text", "label": "label",
}


@dataclass(frozen=True)
class Skip:
    """A record that is not written: ``invalid`` (a bad record: an error under on_error='stop') or a valid record
    left out by a rule (``invalid=False``: score below threshold, negative pair)."""

    path: str
    line: int | None
    field: str | None
    reason: str
    fix: str | None = None
    invalid: bool = True
    detail: str | None = None  # e.g. the score of a pair below the threshold; not part of the reason counts

    def error(self) -> InputError:
        return InputError(self.path, self.line, self.reason, self.fix, field=self.field)

    def __str__(self) -> str:
        if self.invalid:
            return str(self.error())
        where = self.path + (f":{self.line}" if self.line is not None else "")
        what = f"field '{self.field}': " if self.field else ""
        return f"{where}: skipped: {what}{self.reason}" + (f" ({self.detail})" if self.detail else "")

    def to_dict(self) -> dict:
        return {"file": self.path, "line": self.line, "field": self.field, "reason": self.reason, "fix": self.fix,
                "invalid": self.invalid, "detail": self.detail}


Item = Union[Example, Skip]


class _Bad(Exception):
    """Raised by record parsers: the record is invalid (field, reason, fix)."""

    def __init__(self, field: str | None, reason: str, fix: str | None = None):
        super().__init__(reason)
        self.field, self.reason, self.fix = field, reason, fix


class _Filtered(Exception):
    """Raised by record parsers: a valid record that a rule leaves out."""

    def __init__(self, field: str | None, reason: str, detail: str | None = None):
        super().__init__(reason)
        self.field, self.reason, self.detail = field, reason, detail


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
        if isinstance(line, Skip):
            yield i, line
            continue
        obj = parse_object(line, i)
        if isinstance(obj, BadLine):
            fix = obj.fix
            if obj.reason.startswith("expected a JSON object"):
                fix = 'write one object per line, e.g. {"query": "...", "pos": ["..."]}'
            yield i, Skip(str(path), i, obj.field, obj.reason, fix)
            continue
        yield i, obj


# ------------------------------------------------------------------------------------------------ field checks

def _check_text(v: Any, key: str) -> str:
    if not isinstance(v, str):
        raise _Bad(key, f"expected a string, got {_type(v)}", "store the text as a JSON string")
    if not v.strip():
        raise _Bad(key, "empty text", "remove the record or give it text")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _Bad(key, f"contains an unpaired surrogate {v[e.start]!r} at character {e.start}",
                   "fix the text's encoding (a \\ud8xx escape without its pair)") from None
    return v


def _check_text_list(v: Any, key: str, min_len: int) -> list[str]:
    if not isinstance(v, list):
        raise _Bad(key, f"expected a list of strings, got {_type(v)}", f'write "{key}": ["text", ...]')
    if len(v) < min_len:
        raise _Bad(key, "empty list: at least one positive is needed", "give the query a positive or remove it")
    return [_check_text(x, f"{key}[{j}]") for j, x in enumerate(v)]


def _type(v: Any) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return f"{v!r} (a NaN / Infinity literal, which is not standard JSON)".replace("nan", "NaN").replace(
            "inf", "Infinity")
    return "null" if v is None else {"bool": "boolean", "dict": "object", "list": "list"}.get(type(v).__name__,
                                                                                             type(v).__name__)


def _is_number(s: str) -> bool:
    try:
        return math.isfinite(float(s))
    except ValueError:
        return False


def closest(key: str, known) -> str | None:
    """The known name closest to ``key`` (a likely typo), or None."""
    import difflib

    m = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    if not m and key.lower() in {k.lower() for k in known}:
        m = [k for k in known if k.lower() == key.lower()]
    return m[0] if m else None


def _get(obj: dict, key: str):
    if key not in obj:
        keys = ", ".join(sorted(obj)) or "none"
        typo = closest(key, obj)
        raise _Bad(key, f"missing (keys present: {keys})",
                   (f"rename '{typo}' to '{key}', or " if typo else "") +
                   "add the field, or map it with columns / text_field / label_field in the data config")
    return obj[key]


def _label_str(v: Any, key: str) -> str:
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise _Bad(key, f"expected a string (or an integer) label, got {_type(v)}", "write the label as a string")
    s = str(v)
    if not s.strip():
        raise _Bad(key, "empty label", "give the record its label")
    return s


# ---------------------------------------------------------------------------------------------- read options

@dataclass
class ReadOptions:
    """How to read one dataset.

    name: dataset name (default ids are ``<name>:<line>``); format: a record format or 'auto'; fields: our field
    name -> source key; score_threshold: scored pairs (None: every valid pair is a positive, for validation only);
    label_descriptions: classification, list of (label, description) or None (labels taken from the data, sorted);
    use_type: infer the task type from BGE ``type`` fields; use_prompt: take the query instruction from BGE
    ``prompt`` fields (each record must then agree with the first); extra_fields: record keys that are not
    fields of the format but are expected (read and ignored); any other unknown key is an error."""

    name: str = "data"
    format: str = "auto"
    fields: dict = field(default_factory=lambda: dict(DEFAULT_FIELDS))
    score_threshold: float | None = None
    label_descriptions: list | None = None
    use_type: bool = True
    use_prompt: bool = True
    extra_fields: frozenset = frozenset()


@dataclass
class ReadInfo:
    """What reading a dataset found out: the record format (when auto), the task type and prompt of BGE records,
    the labels of classification data (in negative order)."""

    format: str | None = None
    task_type: str | None = None
    task_type_line: str | None = None
    prompt: str | None = None
    prompt_line: str | None = None
    labels: list[str] | None = None


def detect_format(obj: dict, fields: dict) -> str | None:
    """The record format a JSON object's keys say it is, or None."""
    k = set(obj)
    f = fields
    if f["query"] in k and f["pos"] in k:
        return "triplets"
    if f["sentence1"] in k and f["sentence2"] in k:
        if f["score"] in k:
            return "scored_pairs"
        if f["label"] in k:
            return "labelled_pairs"
    if f["text"] in k and f["label"] in k:
        return "classification"
    return None


# ------------------------------------------------------------------------------------------------ record parsers

def _id(obj: dict, f: dict, default: str) -> str:
    key = f["id"]
    if key not in obj:
        return default
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise _Bad(key, f"expected a string or integer id, got {_type(v)}", "write the id as a string")
    v = str(v)
    if not v.strip():
        raise _Bad(key, "empty id", "give the record an id or remove the field")
    return v


def parse_triplet(obj: dict, f: dict, rid: str, opts: ReadOptions, info: ReadInfo, where: str) -> Example:
    """query / pos / neg (+ BGE prompt / type / category) -> Example."""
    ex = {"id": rid, "query": _check_text(_get(obj, f["query"]), f["query"]),
          "pos": _check_text_list(_get(obj, f["pos"]), f["pos"], 1),
          "neg": _check_text_list(obj[f["neg"]], f["neg"], 0) if f["neg"] in obj else []}
    if opts.use_type and f["type"] in obj:
        t = obj[f["type"]]
        if not isinstance(t, str) or t not in BGE_TYPES:
            raise _Bad(f["type"], f"{t!r} is not a known type (BGE: {', '.join(list(BGE_TYPES)[:5])}; or one of "
                                  f"{', '.join(TASK_TYPES)})", "fix the type or set task_type in the data config")
        tt = BGE_TYPES[t]
        if info.task_type is None:
            info.task_type, info.task_type_line = tt, where
        elif tt != info.task_type:
            raise _Bad(f["type"], f"{t!r} means task type {tt}, but {info.task_type_line} set {info.task_type}",
                       "one task type per dataset: split the file, or set task_type in the data config")
    if opts.use_prompt and f["prompt"] in obj:
        p = obj[f["prompt"]]
        if p is not None:
            if not isinstance(p, str):
                raise _Bad(f["prompt"], f"expected a string, got {_type(p)}", "write the prompt as a string")
            if info.prompt is None:
                info.prompt, info.prompt_line = p, where
            elif p != info.prompt:
                raise _Bad(f["prompt"], f"{_short(p)} differs from the prompt {_short(info.prompt)} of "
                                        f"{info.prompt_line}",
                           "one prompt per dataset: split the file, or set query_instruction in the data config")
    for key in (f["label"], f["category"]):
        if key in obj:
            ex["label"] = _label_str(obj[key], key)
            break
    return ex


def _short(s: str, n: int = 40) -> str:
    return repr(s if len(s) <= n else s[: n - 3] + "...")


def parse_scored_pair(obj: dict, f: dict, rid: str, opts: ReadOptions) -> Example:
    """sentence1 / sentence2 / score -> Example when score >= threshold (else _Filtered)."""
    s1 = _check_text(_get(obj, f["sentence1"]), f["sentence1"])
    s2 = _check_text(_get(obj, f["sentence2"]), f["sentence2"])
    sc = _get(obj, f["score"])
    if isinstance(sc, bool) or not isinstance(sc, (int, float)):
        eg = f" ({sc}, not {json.dumps(sc)})" if isinstance(sc, str) and _is_number(sc) else ""
        raise _Bad(f["score"], f"expected a number, got {_type(sc)}", f"write the score as a JSON number{eg}")
    if not math.isfinite(sc):
        raise _Bad(f["score"], f"{_type(sc)} is not a finite number", "give the pair a real score")
    if opts.score_threshold is not None and sc < opts.score_threshold:
        raise _Filtered(f["score"], f"score below threshold {opts.score_threshold:g}", f"score {sc:g}")
    return {"id": rid, "query": s1, "pos": [s2], "neg": []}


_POSITIVE_LABELS = {1: True, 0: False, "1": True, "0": False}


def parse_labelled_pair(obj: dict, f: dict, rid: str, opts: ReadOptions) -> Example:
    """sentence1 / sentence2 / label -> Example for label 1 (label 0: _Filtered 'negative pair')."""
    s1 = _check_text(_get(obj, f["sentence1"]), f["sentence1"])
    s2 = _check_text(_get(obj, f["sentence2"]), f["sentence2"])
    lab = _get(obj, f["label"])
    pos = lab if isinstance(lab, bool) else _POSITIVE_LABELS.get(lab) if isinstance(lab, (int, str)) else None
    if pos is None:
        raise _Bad(f["label"], f"{lab!r} is not a pair label (1 = positive, 0 = negative)", "write 1 or 0")
    if not pos:
        raise _Filtered(f["label"], "negative pair", f"label {lab!r}")
    return {"id": rid, "query": s1, "pos": [s2], "neg": []}


def parse_classification(obj: dict, f: dict, rid: str, desc: dict[str, str], order: list[str]) -> Example:
    """text / label -> Example(query=text, pos=[desc(label)], neg=[desc(other labels)], label)."""
    text = _check_text(_get(obj, f["text"]), f["text"])
    lab = _label_str(_get(obj, f["label"]), f["label"])
    if lab not in desc:
        known = ", ".join(repr(x) for x in order[:20]) + (", ..." if len(order) > 20 else "")
        raise _Bad(f["label"], f"{lab!r} is not in label_descriptions (known: {known})",
                   "add the label to label_descriptions in the data config, or fix the record")
    return {"id": rid, "query": text, "pos": [desc[lab]], "neg": [desc[x] for x in order if x != lab],
            "label": lab}


def known_keys(fmt: str, opts: ReadOptions) -> frozenset:
    """The record keys a dataset of record format ``fmt`` may have."""
    keys = {opts.fields[k] for k in FORMAT_FIELDS[fmt]} | set(opts.extra_fields)
    if fmt == "triplets":
        keys |= set(BGE_IGNORED)
    return frozenset(keys)


def check_unknown_keys(obj: dict, known: frozenset, fmt: str) -> None:
    """_Bad naming the first unknown key of ``obj`` (with the closest known key, a likely typo)."""
    unknown = [k for k in obj if k not in known]
    if not unknown:
        return
    key = sorted(unknown)[0]
    typo = closest(key, known)
    also = f"; also unknown: {', '.join(repr(k) for k in sorted(unknown)[1:])}" if len(unknown) > 1 else ""
    reads = ", ".join(sorted(known))
    if typo:
        raise _Bad(key, f"unknown key (did you mean '{typo}'?{also})",
                   f"rename it to '{typo}', or list it in extra_fields of the dataset config to ignore it "
                   f"(data validate: --extra-field {key})")
    raise _Bad(key, f"unknown key (a {fmt} record has: {reads}{also})",
               f"list it in extra_fields of the dataset config to ignore it (data validate: --extra-field {key}), "
               "map it with columns, or remove it")


# ------------------------------------------------------------------------------------------------ readers

def _records_jsonl(paths: list[str]) -> Iterator[tuple[str, int, str, dict | Skip]]:
    """(path, line, default-id suffix, object or Skip) over several JSON Lines files; an empty file (no line at
    all) is an InputError."""
    multi = len(paths) > 1
    for k, p in enumerate(paths):
        i = 0
        for i, obj in iter_json_objects(p):
            yield str(p), i, (f"{k}:{i}" if multi else str(i)), obj
        if i == 0:
            raise InputError(p, None, "empty file: no records",
                             "check the file (an interrupted download or export?), or remove it from the dataset")


def read_records(records_fn, opts: ReadOptions, info: ReadInfo | None = None) -> Iterator[Item]:
    """Parse the records of ``records_fn()`` (a callable returning an iterator of ``(path, line, id suffix,
    dict or Skip)``; called twice for classification without label descriptions) into Examples and Skips, one
    item per record read. ``info`` is filled while reading (format, task type, prompt, labels)."""
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
                    raise InputError(path, line, f"cannot tell the format from the keys ({keys})",
                                     "set format in the data config (or --format): triplets (query, pos, neg), "
                                     "scored_pairs (sentence1, sentence2, score), labelled_pairs (sentence1, "
                                     "sentence2, label), classification (text, label)")
                break
        if fmt is None:
            fmt = "triplets"  # no valid JSON object at all: every record is a Skip anyway
    info.format = fmt
    desc: dict[str, str] = {}
    order: list[str] = []
    if fmt == "classification":
        if opts.label_descriptions:
            order = [k for k, _ in opts.label_descriptions]
            desc = dict(opts.label_descriptions)
        else:  # first pass: the labels present in the data
            seen = set()
            for _, _, _, obj in records_fn():
                if isinstance(obj, dict) and f["label"] in obj:
                    try:
                        seen.add(_label_str(obj[f["label"]], f["label"]))
                    except _Bad:
                        pass
            order = sorted(seen)
            desc = {x: x for x in order}
        info.labels = order
    ids: dict[str, str] = {}
    known = known_keys(fmt, opts)
    for path, line, suffix, obj in records_fn():
        if isinstance(obj, Skip):
            yield obj
            continue
        where = f"{os.path.basename(path)}:{line}"
        try:
            rid = _id(obj, f, f"{opts.name}:{suffix}")
            if fmt == "triplets":
                ex = parse_triplet(obj, f, rid, opts, info, where)
            elif fmt == "scored_pairs":
                ex = parse_scored_pair(obj, f, rid, opts)
            elif fmt == "labelled_pairs":
                ex = parse_labelled_pair(obj, f, rid, opts)
            else:
                ex = parse_classification(obj, f, rid, desc, order)
            check_unknown_keys(obj, known, fmt)
            if rid in ids:
                raise _Bad(f["id"], f"duplicate id {rid!r} (first at {ids[rid]})", "give every record its own id")
        except _Bad as e:
            yield Skip(path, line, e.field, e.reason, e.fix, invalid=True)
            continue
        except _Filtered as e:
            yield Skip(path, line, e.field, e.reason, None, invalid=False, detail=e.detail)
            continue
        ids[rid] = where
        yield ex


def read_jsonl(paths: str | list[str], opts: ReadOptions | None = None, info: ReadInfo | None = None
               ) -> Iterator[Item]:
    """Examples and Skips of one dataset stored in one or more JSON Lines files (see ``read_records``)."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    paths = [str(p) for p in paths]
    for p in paths:  # missing files are a usage error before anything is read
        check_input_file(p)
    return read_records(lambda: _records_jsonl(paths), opts or ReadOptions(), info)


# ---------------------------------------------------------------------------------- Hugging Face datasets / TFDS

def _plain(v):
    """numpy / bytes values of a dataset row as JSON-like Python values."""
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            return v  # reported as a wrong type by the parser
    if hasattr(v, "tolist"):  # numpy scalars and arrays
        return _plain(v.tolist())
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def load_hf(source, split: str = "train"):
    """A ``datasets.Dataset`` from a Dataset / DatasetDict object, a ``save_to_disk`` folder or a hub name."""
    try:
        import datasets
    except ImportError:
        raise UserError("format hf needs the Hugging Face datasets package: pip install datasets") from None
    ds = source
    if isinstance(source, (str, Path)):
        try:
            if Path(source).is_dir():
                ds = datasets.load_from_disk(str(source))
            else:
                ds = datasets.load_dataset(str(source), split=split)
        except Exception as e:  # noqa: BLE001 -- any loading failure is the user's path / name / network
            raise UserError(f"{source}: cannot load the Hugging Face dataset ({type(e).__name__}: {e})") from None
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise UserError(f"{source}: no split {split!r} (splits: {', '.join(ds)}); set split in the data config")
        ds = ds[split]
    if not isinstance(ds, datasets.Dataset):
        raise UserError(f"{source}: expected a datasets.Dataset, got {type(ds).__name__}")
    return ds


def _records_rows(rows: Iterable, where: str) -> Iterator[tuple[str, int, str, dict | Skip]]:
    for i, row in enumerate(rows, 1):
        obj = _plain(dict(row)) if not isinstance(row, dict) else _plain(row)
        yield where, i, str(i), obj


def read_hf(source, opts: ReadOptions | None = None, info: ReadInfo | None = None, split: str = "train"
            ) -> Iterator[Item]:
    """Examples and Skips from a Hugging Face dataset (object, DatasetDict, save_to_disk folder or hub name);
    rows are numbered from 1 and named ``<source>[<split>]``."""
    ds = load_hf(source, split)
    where = f"{source if isinstance(source, (str, Path)) else 'dataset'}[{split}]"
    return read_records(lambda: _records_rows(ds, where), opts or ReadOptions(), info)


def read_tfds(name: str, opts: ReadOptions | None = None, info: ReadInfo | None = None, split: str = "train",
              data_dir: str | None = None) -> Iterator[Item]:
    """Examples and Skips from a TFDS dataset (``tensorflow_datasets`` is optional: ``pip install jaxembed[tfds]``);
    byte strings are decoded as UTF-8, rows numbered from 1."""
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise UserError(f"format tfds ({name}) needs TensorFlow Datasets: pip install jaxembed[tfds] "
                        "(or pip install tensorflow-datasets)") from None
    try:
        src = tfds.data_source(name, split=split, data_dir=data_dir)
    except Exception as e:  # noqa: BLE001
        raise UserError(f"tfds {name}[{split}]: cannot open the data source ({type(e).__name__}: {e})") from None
    where = f"tfds:{name}[{split}]"
    return read_records(lambda: _records_rows(src, where), opts or ReadOptions(), info)


# ---------------------------------------------------------------------------------------------------- policy

@dataclass
class Tally:
    """Counts of one dataset's reading: records read, examples written, skipped (invalid / left out by a rule),
    with every skipped record; ``identical``: written examples equal to an earlier one of the dataset (same query,
    positives, negatives and label; ids aside), which are kept and counted, with the first few pairs of ids."""

    name: str
    read: int = 0
    written: int = 0
    skipped: list[Skip] = field(default_factory=list)
    identical: int = 0
    identical_examples: list[tuple[str, str]] = field(default_factory=list)
    _seen: dict = field(default_factory=dict, repr=False, compare=False)

    def count_identical(self, ex: Example) -> None:
        """Count ``ex`` if an earlier example of the dataset has the same content (a 64-bit hash of it: a false
        match has probability ~n^2 / 2^64)."""
        key = hash((ex["query"], tuple(ex["pos"]), tuple(ex["neg"]), ex.get("label")))
        first = self._seen.get(key)
        if first is None:
            self._seen[key] = ex["id"]
        else:
            self.identical += 1
            if len(self.identical_examples) < 5:
                self.identical_examples.append((ex["id"], first))

    def identical_note(self) -> str | None:
        """One line on the identical examples, or None."""
        if not self.identical:
            return None
        eg = ", ".join(f"{a} = {b}" for a, b in self.identical_examples)
        return (f"{self.identical} of {self.written} examples are identical to an earlier one (same query, positives, "
                f"negatives, label; kept, so they weigh more), e.g. {eg}")

    @property
    def invalid(self) -> int:
        return sum(s.invalid for s in self.skipped)

    @property
    def filtered(self) -> int:
        return sum(not s.invalid for s in self.skipped)

    def reasons(self) -> dict[str, int]:
        """reason -> count (invalid records by their reason, with the field when there is one; the details in
        parentheses, such as a JSON error's column, are left out so that one kind of problem is one count)."""
        c = Counter((f"field '{s.field}': " if s.field and s.invalid else "") + s.reason.split(" (")[0]
                    for s in self.skipped)
        return dict(c.most_common())

    def to_dict(self) -> dict:
        return {"name": self.name, "read": self.read, "written": self.written, "invalid": self.invalid,
                "filtered": self.filtered, "reasons": self.reasons(), "identical": self.identical,
                "identical_examples": [list(p) for p in self.identical_examples],
                "skipped": [s.to_dict() for s in self.skipped]}


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
            tally.skipped.append(it)
            continue
        tally.written += 1
        tally.count_identical(it)
        yield it


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
    return ReadOptions(name=ds["name"], format=effective_record_format(ds), fields=fields,
                       score_threshold=ds.get("score_threshold"),
                       label_descriptions=pairs_of(ld, "label_descriptions") if ld is not None else None,
                       use_type=ds.get("task_type") is None, use_prompt=ds.get("query_instruction") is None,
                       extra_fields=frozenset(ds.get("extra_fields") or ()))


def read_dataset(ds, info: ReadInfo | None = None) -> Iterator[Item]:
    """Examples and Skips of one dataset config, whatever its source (JSON Lines, hf, tfds)."""
    from jaxembed.data.config import dataset_paths

    opts = read_options(ds)
    fmt = ds.get("format", "auto")
    if fmt == "hf":
        return read_hf(dataset_paths(ds)[0], opts, info, split=ds.get("split", "train"))
    if fmt == "tfds":
        return read_tfds(dataset_paths(ds)[0], opts, info, split=ds.get("split", "train"))
    return read_jsonl(dataset_paths(ds), opts, info)


def kalm_instruction(prompt: str) -> str:
    """A BGE prompt as a KaLM-style query prefix (empty prompt: no instruction)."""
    return KALM_TEMPLATE.format(prompt.strip()) if prompt.strip() else ""
