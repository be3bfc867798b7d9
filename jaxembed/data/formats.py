"""Input formats -> normalised examples, with every bad record named by file, line, field and fix.

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

Memory: every reader streams. What is kept per record is hashes (duplicate ids: ~40 bytes, identical examples: 8
bytes; ``jaxembed.data.hashindex``), never the records or their ids; skipped records beyond ``Tally.memory_limit``
go to an anonymous spool file.

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
from typing import Any, Callable, Iterable, Iterator, Union

from jaxembed.data import sources
from jaxembed.data.config import KALM_TEMPLATE, RECORD_FORMATS, SCORED_LOSSES, TASK_TYPES
from jaxembed.data.hashindex import HashIndex, HashLog, example_hash, key_of
from jaxembed.data.jsonl import BadLine, check_input_file, iter_text_lines, parse_object
from jaxembed.errors import InputError, UserError

Example = dict  # {"id", "query", "pos": list[str], "neg": list[str], "label"?, "score"?, "pos_scores"?, "neg_scores"?}

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
    "st": ("id", "label", "score"),  # and every other column, as a text in column order
}
#: BGE / FlagEmbedding keys of triplets beyond the text fields: a teacher's scores of the positives / negatives, kept
#: in the Example for distillation.
TEACHER_FIELDS = ("pos_scores", "neg_scores")
BGE_IGNORED = TEACHER_FIELDS  # the former name

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


class _Config(_Bad):
    """Raised by record parsers: the dataset config cannot read this data (an error for the whole dataset, under
    either on_error policy)."""


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


def _check_text_list(v: Any, key: str, min_len: int, one_text: bool = False) -> list[str]:
    """A list of non-empty texts; ``one_text``: a single string is accepted as a list of one (a renamed column of a
    sentence-transformers / Hugging Face dataset holds one text per row)."""
    if one_text and isinstance(v, str):
        v = [v]
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
    need_threshold: bool = False  # scored pairs (also st score columns) without score_threshold are an error
    keep_scores: bool = False  # a scored-pair loss: every pair is kept, with its score (no threshold)


def _renamed(f: dict, key: str) -> bool:
    """Whether our field ``key`` is read from another source key (``columns``): then pos / neg may be one text."""
    return f[key] != DEFAULT_FIELDS[key]


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
    if "anchor" in k and "positive" in k:
        return "st"
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
          "pos": _check_text_list(_get(obj, f["pos"]), f["pos"], 1, one_text=_renamed(f, "pos")),
          "neg": _check_text_list(obj[f["neg"]], f["neg"], 0, one_text=_renamed(f, "neg")) if f["neg"] in obj
          else []}
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
    for key, texts in (("pos_scores", "pos"), ("neg_scores", "neg")):
        if key in obj and obj[key] is not None:
            ex[key] = _teacher_scores(obj[key], key, len(ex[texts]), texts)
    return ex


def _teacher_scores(v: Any, key: str, n: int, texts: str) -> list[float]:
    """A list of ``n`` finite numbers (one teacher score per text of ``texts``); a single number for one text."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and n == 1:
        v = [v]
    if not isinstance(v, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        raise _Bad(key, f"expected a list of numbers, got {_type(v)}", f'write "{key}": [0.9, ...], one score per '
                                                                      f"text of {texts}")
    if len(v) != n:
        raise _Bad(key, f"{len(v)} scores for {n} {texts} texts", f"one teacher score per text of {texts}, in "
                                                                  "order (jaxembed teacher-score writes them)")
    if not all(math.isfinite(x) for x in v):
        raise _Bad(key, "a score is not a finite number", "give every text a real score")
    return [float(x) for x in v]


def _short(s: str, n: int = 40) -> str:
    return repr(s if len(s) <= n else s[: n - 3] + "...")


def parse_scored_pair(obj: dict, f: dict, rid: str, opts: ReadOptions) -> Example:
    """sentence1 / sentence2 / score -> Example when score >= threshold (else _Filtered)."""
    s1 = _check_text(_get(obj, f["sentence1"]), f["sentence1"])
    s2 = _check_text(_get(obj, f["sentence2"]), f["sentence2"])
    sc = _get(obj, f["score"])
    _keep_by_score(sc, f["score"], opts)
    ex = {"id": rid, "query": s1, "pos": [s2], "neg": []}
    if opts.keep_scores:
        ex["score"] = float(sc)
    return ex


def _keep_by_score(sc: Any, key: str, opts: ReadOptions) -> None:
    """A pair's score: a finite number (else _Bad); below ``score_threshold``: _Filtered."""
    if isinstance(sc, bool) or not isinstance(sc, (int, float)):
        eg = f" ({sc}, not {json.dumps(sc)})" if isinstance(sc, str) and _is_number(sc) else ""
        raise _Bad(key, f"expected a number, got {_type(sc)}", f"write the score as a JSON number{eg}")
    if not math.isfinite(sc):
        raise _Bad(key, f"{_type(sc)} is not a finite number", "give the pair a real score")
    if opts.score_threshold is not None and sc < opts.score_threshold:
        raise _Filtered(key, f"score below threshold {opts.score_threshold:g}", f"score {sc:g}")


_POSITIVE_LABELS = {1: True, 0: False, "1": True, "0": False}


def parse_labelled_pair(obj: dict, f: dict, rid: str, opts: ReadOptions) -> Example:
    """sentence1 / sentence2 / label -> Example for label 1 (label 0: _Filtered 'negative pair')."""
    s1 = _check_text(_get(obj, f["sentence1"]), f["sentence1"])
    s2 = _check_text(_get(obj, f["sentence2"]), f["sentence2"])
    _keep_by_label(_get(obj, f["label"]), f["label"])
    return {"id": rid, "query": s1, "pos": [s2], "neg": []}


def _keep_by_label(lab: Any, key: str, st: bool = False) -> None:
    """A pair's label: 1 (kept) or 0 (_Filtered 'negative pair'); anything else is _Bad."""
    if isinstance(lab, float) and lab in (0.0, 1.0):
        lab = int(lab)
    pos = lab if isinstance(lab, bool) else _POSITIVE_LABELS.get(lab) if isinstance(lab, (int, str)) else None
    if pos is None:
        fix = "write 1 or 0"
        if st:
            fix += ("; a similarity score: set score_threshold in the dataset config (pairs with label >= it are "
                    "positives); 3-way NLI labels: use the (anchor, positive, negative) triplets instead")
        raise _Bad(key, f"{lab!r} is not a pair label (1 = positive, 0 = negative)", fix)
    if not pos:
        raise _Filtered(key, "negative pair", f"label {lab!r}")


def parse_st(obj: dict, f: dict, rid: str, opts: ReadOptions) -> Example:
    """A sentence-transformers row -> Example. Texts are the columns in order (the id column, the label / score
    column and ``extra_fields`` aside); sentence-transformers reads them by position, whatever their names.

    No label column: (anchor, positive, negative_1, ..., negative_n) -> query, [positive], [negatives]. A label
    column (``label`` or ``score``, or what ``columns`` maps them to) with two texts: a pair, positive by its
    score (``score`` column, or any label column with ``score_threshold``) or by its 1 / 0 label."""
    label_keys = [k for k in (f["label"], f["score"]) if k in obj]
    if len(label_keys) > 1:
        raise _Bad(label_keys[1], f"both a {label_keys[0]!r} and a {label_keys[1]!r} column (sentence-transformers "
                                  "reads one label column)",
                   f"ignore one of them: extra_fields=[{label_keys[1]!r}] in the dataset config")
    skip = {f["id"], *label_keys, *opts.extra_fields}
    texts = [(k, v) for k, v in obj.items() if k not in skip]
    for k, v in texts:
        _check_text(v, k)
    if not label_keys:
        if opts.keep_scores:
            raise _Config(None, "a scored-pair loss (CoSENT / AnglE) needs a score column, these rows have none",
                          "give the dataset a score / label column, or train it with loss='infonce'")
        if len(texts) < 2:
            raise _Bad(texts[0][0] if texts else None,
                       f"{len(texts)} text column{'s' if len(texts) != 1 else ''}: an (anchor, positive, "
                       "negatives...) row needs at least two",
                       "give each row an anchor and a positive (single-sentence data such as denoising "
                       "auto-encoder sets is not contrastive training data)")
        return {"id": rid, "query": texts[0][1], "pos": [texts[1][1]], "neg": [v for _, v in texts[2:]]}
    key = label_keys[0]
    if len(texts) != 2:
        names = ", ".join(k for k, _ in texts)
        raise _Bad(key, f"a {key!r} column with {len(texts)} text columns ({names}): a labelled row is a pair "
                        f"(sentence1, sentence2, {key})",
                   f"for (anchor, positive, negatives) rows, ignore the column: extra_fields=[{key!r}]")
    if key == f["score"] or opts.score_threshold is not None or opts.keep_scores:
        if opts.score_threshold is None and opts.need_threshold and not opts.keep_scores:
            raise _Config(key, f"scored pairs need score_threshold (pairs with {key} >= threshold are positives)",
                          "set score_threshold in the dataset config, e.g. 0.8 for scores in [0, 1]")
        _keep_by_score(obj[key], key, opts)
        ex = {"id": rid, "query": texts[0][1], "pos": [texts[1][1]], "neg": []}
        if opts.keep_scores:
            ex["score"] = float(obj[key])
        return ex
    _keep_by_label(obj[key], key, st=True)
    return {"id": rid, "query": texts[0][1], "pos": [texts[1][1]], "neg": []}


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
        keys |= set(TEACHER_FIELDS)
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

def _empty(path) -> InputError:
    return InputError(path, None, "empty file: no records",
                      "check the file (an interrupted download or export?), or remove it from the dataset")


def _file_rows(path: str, kind: str, fields: dict, split: str = "train") -> Iterator[tuple[int, dict | Skip]]:
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
        for i, obj in _file_rows(p, kind, fields, split):
            yield str(p), i, (f"{k}:{i}" if multi else str(i)), obj
        if i == 0:
            raise _empty(p)


def _records_jsonl(paths: list[str]) -> Iterator[tuple[str, int, str, dict | Skip]]:
    """(path, line, default-id suffix, object or Skip) over several JSON Lines files."""
    return _records_files(paths, ["jsonl"] * len(paths), DEFAULT_FIELDS)


_FORMAT_HELP = ("set format in the data config (or --format): triplets (query, pos, neg), scored_pairs (sentence1, "
                "sentence2, score), labelled_pairs (sentence1, sentence2, label), classification (text, label), st "
                "(sentence-transformers columns in order: anchor, positive, negatives..., or a pair + label / "
                "score)")


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
                if opts.keep_scores and fmt not in ("scored_pairs", "st"):
                    raise InputError(path, line, f"a scored-pair loss (CoSENT / AnglE) trains on scored pairs "
                                                 f"(sentence1, sentence2, score) but the records are {fmt}",
                                     "train this dataset with loss='infonce', or give it scored pairs")
                if (fmt == "scored_pairs" and opts.need_threshold and opts.score_threshold is None
                        and not opts.keep_scores):
                    raise InputError(path, line, "the records are scored pairs (sentence1, sentence2, score), which "
                                                 "need score_threshold", "set score_threshold in the dataset config: "
                                                                         "pairs with score >= it are positives")
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
    ids = _IdCheck(opts.name)
    known = known_keys(fmt, opts) if fmt != "st" else frozenset()
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
            rid = _id(obj, f, f"{opts.name}:{suffix}")
            if fmt == "triplets":
                ex = parse_triplet(obj, f, rid, opts, info, where)
            elif fmt == "scored_pairs":
                ex = parse_scored_pair(obj, f, rid, opts)
            elif fmt == "labelled_pairs":
                ex = parse_labelled_pair(obj, f, rid, opts)
            elif fmt == "st":
                ex = parse_st(obj, f, rid, opts)
            else:
                ex = parse_classification(obj, f, rid, desc, order)
            if fmt != "st":
                check_unknown_keys(obj, known, fmt)
            first = ids.check(rid, explicit, suffix, name, line)
            if first is not None:
                raise _Bad(f["id"], f"duplicate id {rid!r} (first at {first})", "give every record its own id")
        except _Config as e:
            raise InputError(path, line, e.reason, e.fix, field=e.field) from None
        except _Bad as e:
            yield Skip(path, line, e.field, e.reason, e.fix, invalid=True)
            continue
        except _Filtered as e:
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

    Memory: a 128-bit hash per written example (``HashIndex``). ``keep_ids`` (default) also keeps every written
    id, to name the first of an identical pair at once; without it the pairs hold example indices until
    ``resolve_ids`` (the store writer reads the ids back from the store). ``memory_limit``: skipped records kept in
    memory; the others go to a JSON Lines spool file in ``spool_dir`` (``iter_skipped`` reads both)."""

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
        """Drop the spool file (the skipped records beyond ``memory_limit``; the counts stay)."""
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


def kalm_instruction(prompt: str) -> str:
    """A BGE prompt as a KaLM-style query prefix (empty prompt: no instruction)."""
    return KALM_TEMPLATE.format(prompt.strip()) if prompt.strip() else ""
