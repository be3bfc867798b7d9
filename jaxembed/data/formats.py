"""The table of record formats, one entry each (``FORMAT_TABLE``): what a record of the format holds, its parser, how
``auto`` recognises it and what the checks around it need to know. The readers (``jaxembed.data.readers``), the data
config's checks (``jaxembed.data.config``, ``jaxembed.data.loss_checks``), the store's messages
(``jaxembed.data.store``) and the command line (``data validate --format``, ``mine --format``: ``FORMAT_CHOICES``,
``format_help``) read it; none of them names a format of their own.

Adding a format: its parser (``parse_<name>(obj, fields, id, RecordContext) -> Example``, with the public checks of
``jaxembed.data.parsers``, raising ``BadRecord`` / ``FilteredRecord`` / ``BadConfig``) in ``jaxembed.data.parsers``
and one ``RecordFormat`` entry here (``register`` adds one at run time); docs/architecture.md walks through an
example.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

from jaxembed.choices import LiveNames
from jaxembed.data import parsers
from jaxembed.data.parsers import TEACHER_FIELDS, ReadOptions
from jaxembed.data.task_types import TASK_TYPES

#: the task types for sentence-transformers data, which has none (the fix of a dataset without task_type)
ST_TASK_TYPE_FIX = "nli or sts for symmetric pairs, without instruction; retrieval for query -> passage, with one"


@dataclass(frozen=True)
class RecordFormat:
    """One record format.

    keys: what a record holds, for help texts; fields: our field names a record may have (mapped through the
    dataset's ``columns``), any other key being an unknown key -- except with ``texts_by_position``, where every
    other column is a text read in column order and ``columns`` may only rename these fields; parse: the record
    parser (``jaxembed.data.parsers``); detect: ``auto`` takes a first record holding all these keys (our field
    names mapped through ``columns``, other names as they are) for this format, trying the formats by ascending
    ``detect_rank``; no_task_type: the error text, ``{src}`` the dataset's source, when a dataset of this format
    has no task type; pair_score: whether a record carries a pair score (``score_threshold`` applies, a scored-pair
    loss can train it), None for a format without pair scores; threshold_required: ``score_threshold`` is required
    (unless a scored-pair loss keeps every pair); task_type_in_records: its records may give the task type (BGE
    ``type``); label_descriptions: classification data (``text_field`` / ``label_field`` / ``label_descriptions``
    apply; the labels are read in a first pass); teacher_scores: its records may carry ``pos_scores`` /
    ``neg_scores`` (distillation)."""

    name: str
    keys: str
    fields: tuple[str, ...]
    parse: Callable[[dict, dict, str, parsers.RecordContext], parsers.Example]
    detect: tuple[str, ...]
    detect_rank: int
    no_task_type: str
    texts_by_position: bool = False
    pair_score: Callable[[dict, dict], bool] | None = None
    threshold_required: bool = False
    task_type_in_records: bool = False
    label_descriptions: bool = False
    teacher_scores: bool = False

    @property
    def scored(self) -> bool:
        """Its pairs may carry a score: ``score_threshold`` applies, and a scored-pair loss can train it."""
        return self.pair_score is not None

    def known_keys(self, opts: ReadOptions) -> frozenset:
        """The record keys a dataset of this format may have."""
        keys = {opts.fields[k] for k in self.fields} | set(opts.extra_fields)
        if self.teacher_scores:
            keys |= set(TEACHER_FIELDS)
        return frozenset(keys)


FORMAT_TABLE: dict[str, RecordFormat] = {f.name: f for f in (
    RecordFormat(
        "triplets", "query, pos, neg", ("id", "query", "pos", "neg", "prompt", "type", "category", "label"),
        parsers.parse_triplet, detect=("query", "pos"), detect_rank=0,
        no_task_type="the records of {src} have no BGE 'type' field to take it from (fix: set task_type, or give "
                     "every record a 'type': "
                     + ", ".join(t for t in parsers.BGE_TYPES if t not in TASK_TYPES) + " or a task type)",
        task_type_in_records=True, teacher_scores=True),
    RecordFormat(
        "scored_pairs", "sentence1, sentence2, score", ("id", "sentence1", "sentence2", "score"),
        parsers.parse_scored_pair, detect=("sentence1", "sentence2", "score"), detect_rank=2,
        no_task_type="scored_pairs records ({src}) have no task type (fix: set task_type, e.g. sts)",
        pair_score=lambda obj, fields: True, threshold_required=True),
    RecordFormat(
        "labelled_pairs", "sentence1, sentence2, label", ("id", "sentence1", "sentence2", "label"),
        parsers.parse_labelled_pair, detect=("sentence1", "sentence2", "label"), detect_rank=3,
        no_task_type="labelled_pairs records ({src}) have no task type (fix: set task_type, e.g. "
                     "pair_classification)"),
    RecordFormat(
        "classification", "text, label", ("id", "text", "label"), parsers.parse_classification,
        detect=("text", "label"), detect_rank=4,
        no_task_type="classification records ({src}) have no task type (fix: set task_type, e.g. classification)",
        label_descriptions=True),
    RecordFormat(
        "st", "sentence-transformers columns in order: anchor, positive, negatives..., or a pair + label / score",
        ("id", "label", "score"), parsers.parse_st, detect=("anchor", "positive"), detect_rank=1,
        no_task_type="{src} holds sentence-transformers rows, which have no task type (fix: set task_type: "
                     + ST_TASK_TYPE_FIX + ")",
        texts_by_position=True, pair_score=lambda obj, fields: fields["score"] in obj or fields["label"] in obj),
)}

#: the fields that ``register`` added to ``parsers.DEFAULT_FIELDS`` for a format (taken out again by ``unregister``)
_ADDED_FIELDS: dict[str, tuple[str, ...]] = {}


def register(fmt: RecordFormat) -> None:
    """Add a record format after the others: its fields that no format had yet join ``parsers.DEFAULT_FIELDS``
    (read under their own names unless a dataset's ``columns`` maps them)."""
    if fmt.name in FORMAT_TABLE:
        raise ValueError(f"a record format named {fmt.name!r} is already registered")
    if any(f.detect_rank == fmt.detect_rank for f in FORMAT_TABLE.values()):
        raise ValueError(f"{fmt.name}: detect_rank {fmt.detect_rank} is another format's (use {len(FORMAT_TABLE)})")
    added = tuple(k for k in fmt.fields if k not in parsers.DEFAULT_FIELDS)
    parsers.DEFAULT_FIELDS.update((k, k) for k in added)
    _ADDED_FIELDS[fmt.name] = added
    FORMAT_TABLE[fmt.name] = fmt


def unregister(name: str) -> None:
    FORMAT_TABLE.pop(name, None)
    for k in _ADDED_FIELDS.pop(name, ()):
        parsers.DEFAULT_FIELDS.pop(k, None)


def format_names() -> tuple[str, ...]:
    """The record formats' names, as FORMAT_TABLE holds them now."""
    return tuple(FORMAT_TABLE)


#: the record formats' names, and what ``--format`` / ``format`` accept for a file (``auto``: from the first record)
RECORD_FORMATS: Sequence[str] = LiveNames(format_names)
FORMAT_CHOICES: Sequence[str] = ("auto",) + RECORD_FORMATS


def format_help() -> str:
    """Each format with what its records hold: ``triplets (query, pos, neg), scored_pairs (...), ...``."""
    return ", ".join(f"{f.name} ({f.keys})" for f in FORMAT_TABLE.values())


def names_where(prop: Callable[[RecordFormat], bool]) -> tuple[str, ...]:
    """The names of the formats with ``prop``, in table order (for checks and their messages)."""
    return tuple(f.name for f in FORMAT_TABLE.values() if prop(f))


def detect_format(obj: dict, fields: dict) -> str | None:
    """The record format a JSON object's keys say it is, or None."""
    for f in sorted(FORMAT_TABLE.values(), key=lambda f: f.detect_rank):
        if all(fields.get(k, k) in obj for k in f.detect):
            return f.name
    return None
