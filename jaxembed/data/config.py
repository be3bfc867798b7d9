"""The data config: which datasets to train on, how to read them and how to batch and sample them.

A data config is an ``ml_collections.ConfigDict`` (the ``data`` field of a run config)::

    data = default_data_config()
    data.datasets = [
        dataset_config(name="snli", path="train/snli_triplets.jsonl", task_type="nli", num_negatives=1),
        dataset_config(name="trec", path="train/trec_cls.jsonl", format="classification",
                       task_type="classification",
                       query_instruction="Instruct: Classify the type of the question \\n Query: "),
    ]
    validate_data_config(data, where="data")   # every bad value is a UserError naming its key path

Per-dataset fields (``dataset_config``), ``None`` meaning "the default" throughout:

=================== ==================================================================================
name                identifier, also the store's file name: letters, digits, ``_ . -``; unique
path                a file (str) or several (list of str; glob patterns such as ``data/*.parquet``):
                    JSON Lines, Parquet (``.parquet``), CSV / TSV (``.csv`` / ``.tsv``) by suffix, or a
                    ``datasets.save_to_disk`` folder; ``hf``: a ``save_to_disk`` folder, a hub dataset
                    name or a folder of data files (``datasets.load_dataset``); ``tfds``: a TFDS dataset
                    name (``glue/sst2``)
format              the record format of files: auto | triplets | scored_pairs | labelled_pairs |
                    classification | st (sentence-transformers columns in order); or a source: hf | tfds
record_format       for hf / tfds: the shape of a row (auto | triplets | scored_pairs | ... | st)
split               for hf / tfds / save_to_disk folders: the split to read (default ``train``)
subset              for hf: the dataset's configuration (``load_dataset(path, subset)``, e.g. ``triplet``)
streaming           for hf: read rows as they stream (``load_dataset(..., streaming=True)``), nothing
                    materialised on disk or in memory
loss                the loss of this dataset's rows (``None``: the run's ``loss.type``); one of
                    ``LOSSES`` (infonce, peg, cosent, angle). Datasets of one run may differ:
                    each batch row follows its dataset's loss (docs/losses.md). cosent / angle keep every
                    scored pair with its score (no ``score_threshold``)
task                task name (default: ``name``); datasets with the same task form one task
task_type           retrieval | reranking | sts | pair_classification | classification | clustering | nli;
                    ``None`` only for triplets in the BGE format, whose ``type`` field then decides
query_instruction   prefix of every query (``None``: the BGE ``prompt`` in KaLM style if the records
                    have one, else the task type's default below; ``""``: no instruction)
doc_instruction     prefix of every positive and negative (``None`` = ``""``)
temperature         InfoNCE temperature of this dataset's batches (``None``: the run's default)
batching            random | homogeneous | heterogeneous | semi_homogeneous (``None``: homogeneous for
                    retrieval, reranking, sts, pair_classification and nli; heterogeneous for
                    classification and clustering, as MoTE's task-aware batching)
num_negatives       hard negatives per query used in a batch (int >= 0)
weight, epochs      sampling weight, or passes over the dataset (at most one of the two)
max_query_length,   token limits (``None``: the run's default)
max_doc_length
score_threshold     scored pairs: a pair with score >= threshold is a positive, the others are skipped
                    (counted, reason "score below threshold"); not with a scored-pair loss
text_field,         classification: the fields holding the text and the label (default text / label)
label_field
columns             mapping our field name -> the source's field name (e.g. {"query": "question"})
label_descriptions  classification: mapping label -> description text (a mapping, or a list of
                    [label, description] pairs for labels that contain dots); default: the label itself
extra_fields        record keys that are not fields of the format but are expected in the files (read
                    and ignored, e.g. ``["fine_label"]``); any other unknown record key is an error
=================== ==================================================================================

Size: one module because it is the schema of a dataset entry (the field table above, its defaults, constructors
and the check of every field, read together); the shared training data written in it is
``jaxembed.data.shared_train``, the checks that read records are ``jaxembed.data.loss_checks``.

Top level: ``datasets`` (list), ``on_error`` (``stop`` at the first bad record, or ``skip`` and count),
``sampling`` (``size``: proportional to dataset size, ``weights``: to ``weight`` (``None`` = 1.0),
``temperature``: to size ** (1 / sampling_temperature)), ``sampling_temperature`` (> 0), ``seed`` (integer >= 0).

Datasets of one task (same ``task``) must share one ``task_type``: the task's type picks its MoTE experts and its
default batching.
"""

from __future__ import annotations

import glob
import math
import os
import re
from pathlib import Path
from typing import Any, Iterable

import ml_collections

from jaxembed.data.formats import FORMAT_TABLE, RECORD_FORMATS, ST_TASK_TYPE_FIX, names_where
from jaxembed.data.task_types import KALM_TEMPLATE, SYMMETRIC_TASK_TYPES, TASK_TYPES  # noqa: F401 (re-exported)
from jaxembed.errors import UserError
from jaxembed.losses.table import CONTRASTIVE_LOSSES, LOSSES, SCORED_LOSSES  # noqa: F401 (a dataset's loss)

SOURCE_FORMATS = ("hf", "tfds")
FORMATS = ("auto",) + RECORD_FORMATS + SOURCE_FORMATS
BATCHING = ("random", "homogeneous", "heterogeneous", "semi_homogeneous")
ON_ERROR = ("stop", "skip")
SAMPLING = ("size", "weights", "temperature")

#: query instruction of a dataset whose ``query_instruction`` is None (and whose records carry no BGE prompt).
DEFAULT_QUERY_INSTRUCTIONS = {
    "retrieval": KALM_TEMPLATE.format("Given a query, retrieve documents that answer the query."),
    "reranking": KALM_TEMPLATE.format("Given a query, retrieve documents that answer the query."),
    "classification": KALM_TEMPLATE.format("Classify the given text into its category."),
    "clustering": KALM_TEMPLATE.format("Identify the topic or theme of the given text."),
    "sts": "",
    "pair_classification": "",
    "nli": "",
}

#: batching of a dataset whose ``batching`` is None (MoTE TA-CL: retrieval homogeneous, cls/clustering heterogeneous).
DEFAULT_BATCHING = {
    "retrieval": "homogeneous", "reranking": "homogeneous", "sts": "homogeneous",
    "pair_classification": "homogeneous", "nli": "homogeneous",
    "classification": "heterogeneous", "clustering": "heterogeneous",
}

_DATASET_DEFAULTS: dict[str, Any] = dict(
    name="",
    path="",
    format="auto",
    record_format="auto",
    split="train",
    subset=None,
    streaming=False,
    task=None,
    task_type=None,
    query_instruction=None,
    doc_instruction=None,
    temperature=None,
    batching=None,
    num_negatives=1,
    weight=None,
    epochs=None,
    max_query_length=None,
    max_doc_length=None,
    score_threshold=None,
    text_field=None,
    label_field=None,
    columns=None,
    label_descriptions=None,
    extra_fields=None,
    loss=None,
)
DATASET_KEYS = tuple(_DATASET_DEFAULTS)
TOP_KEYS = ("datasets", "on_error", "sampling", "sampling_temperature", "seed")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_RESERVED_NAMES = ("manifest", "report")


def _did_you_mean(key: str, known) -> str:
    import difflib

    m = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f" (did you mean {m[0]}?)" if m else ""


def dataset_config(**kw) -> ml_collections.ConfigDict:
    """One dataset's config: the defaults above updated with ``kw`` (unknown keys are a UserError)."""
    unknown = sorted(set(kw) - set(_DATASET_DEFAULTS))
    if unknown:
        raise UserError(f"dataset_config: unknown key(s) {', '.join(unknown)}{_did_you_mean(unknown[0], DATASET_KEYS)}"
                        f" (known: {', '.join(DATASET_KEYS)})")
    d = dict(_DATASET_DEFAULTS)
    d.update(kw)
    if isinstance(d["path"], tuple):
        d["path"] = list(d["path"])
    return ml_collections.ConfigDict(d)


def datasets_from_dict(datasets, **defaults) -> list[ml_collections.ConfigDict]:
    """The sentence-transformers form of several datasets -- a mapping name -> dataset, as
    ``SentenceTransformerTrainer(train_dataset={...}, loss={...})`` takes it -- as jaxembed's list of dataset
    configs, each named by its key (its task is its name unless it says otherwise, so each dataset keeps its own
    temperature, task type and ``loss``).

    A value is a ``dataset_config(...)`` (taken as it is; its ``name``, when set, must equal the key), a mapping of
    dataset_config fields, or a path (str). ``defaults``: fields for the mapping and path values, under the
    fields they give themselves::

        c.data.datasets = datasets_from_dict({
            "nli": "data/nli_triplets.parquet",
            "stsb": dict(path="data/stsb", format="hf", score_threshold=0.8, task_type="sts", loss="infonce"),
        }, task_type="nli", format="st")
    """
    if not _is_mapping(datasets):
        raise UserError(f"datasets_from_dict: expected a mapping name -> dataset, got {type(datasets).__name__}")
    unknown = sorted(set(defaults) - set(_DATASET_DEFAULTS) | ({"name"} & set(defaults)))
    if unknown:
        raise UserError(f"datasets_from_dict: default key(s) {', '.join(unknown)} are not dataset fields (or are "
                        f"per dataset){_did_you_mean(unknown[0], DATASET_KEYS)}")
    out = []
    for name, v in datasets.items():
        w = f"datasets_from_dict[{name!r}]"
        if isinstance(v, str):
            v = {"path": v}
        if not _is_mapping(v):
            raise UserError(f"{w}: expected a dataset_config(...), a mapping of its fields or a path, got "
                            f"{type(v).__name__}")
        given = dict(v.items())
        if given.get("name") not in (None, "", name):
            raise UserError(f"{w}.name: {given['name']!r} differs from its key {name!r} (fix: drop name=, the key "
                            "names the dataset)")
        given.pop("name", None)
        base = {} if isinstance(v, ml_collections.ConfigDict) else defaults  # a dataset_config is complete
        try:
            out.append(dataset_config(**{**base, **given, "name": name}))
        except UserError as e:
            raise UserError(f"{w}: {e}") from None
    return out


def default_data_config() -> ml_collections.ConfigDict:
    """The top-level data config with no datasets: on_error 'stop', sampling by size, seed 0."""
    return ml_collections.ConfigDict(dict(datasets=[], on_error="stop", sampling="size",
                                          sampling_temperature=1.0, seed=0))


# ----------------------------------------------------------------------------------------------- validation

def config_get(c, key, default=None):
    try:
        return c[key]
    except (KeyError, AttributeError):
        return default


def _keys(c) -> list[str]:
    return list(c.keys())


def _is_mapping(v) -> bool:
    return isinstance(v, (dict, ml_collections.ConfigDict))


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _one_of(where: str, v, choices: Iterable[str]) -> None:
    choices = tuple(choices)
    if v not in choices:
        raise UserError(f"{where}: {v!r} is not one of {', '.join(choices)}")


def pairs_of(v, where: str) -> list[tuple[str, str]]:
    """A mapping or a list of [key, value] pairs (both strings) as a list of pairs; UserError otherwise."""
    if _is_mapping(v):
        items = list(v.items())
    elif isinstance(v, (list, tuple)):
        items = []
        for i, p in enumerate(v):
            if not (isinstance(p, (list, tuple)) and len(p) == 2):
                raise UserError(f"{where}[{i}]: expected a [key, value] pair, got {p!r}")
            items.append((p[0], p[1]))
    else:
        raise UserError(f"{where}: expected a mapping (or a list of [key, value] pairs), got {type(v).__name__}")
    seen = set()
    for k, val in items:
        if not isinstance(k, str) or not k.strip():
            raise UserError(f"{where}: key {k!r} must be a non-empty string")
        if not isinstance(val, str) or not val.strip():
            raise UserError(f"{where}[{k!r}]: value {val!r} must be a non-empty string")
        if k in seen:
            raise UserError(f"{where}: key {k!r} appears twice")
        seen.add(k)
    return items


_GLOB = re.compile(r"[*?\[]")


def dataset_paths(ds) -> list[str]:
    """``path`` as a list of strings (a single string becomes a one-element list); for files, a glob pattern
    (``data/train-*.parquet``) becomes the sorted files it matches (none: the pattern itself, which then does not
    exist)."""
    p = config_get(ds, "path")
    paths = [p] if isinstance(p, str) else list(p)
    if config_get(ds, "format", "auto") in SOURCE_FORMATS:
        return paths
    out = []
    for x in paths:
        hits = sorted(glob.glob(os.path.expanduser(x))) if isinstance(x, str) and _GLOB.search(x) else []
        out.extend(hits or [x])
    return out


def effective_record_format(ds) -> str:
    """The record format of a dataset: ``format``, or ``record_format`` for hf / tfds sources."""
    fmt = config_get(ds, "format", "auto")
    return config_get(ds, "record_format", "auto") if fmt in SOURCE_FORMATS else fmt


def _validate_dataset(ds, w: str, names: set[str]) -> None:
    if not _is_mapping(ds):
        raise UserError(f"{w}: expected a dataset config (dataset_config(...)), got {type(ds).__name__}")
    unknown = [k for k in _keys(ds) if k not in _DATASET_DEFAULTS]
    if unknown:
        raise UserError(f"{w}.{unknown[0]}: unknown key{_did_you_mean(unknown[0], DATASET_KEYS)} "
                        f"(known: {', '.join(DATASET_KEYS)})")
    name = config_get(ds, "name")
    if not isinstance(name, str) or not name:
        raise UserError(f"{w}.name: required, a non-empty string")
    if not _NAME_RE.match(name) or name in _RESERVED_NAMES:
        raise UserError(f"{w}.name: {name!r} is not a valid name (letters, digits, '_', '.', '-'; "
                        f"not {' or '.join(_RESERVED_NAMES)})")
    if name in names:
        raise UserError(f"{w}.name: {name!r} is used by another dataset (names must be unique)")
    names.add(name)
    fmt = config_get(ds, "format", "auto")
    _one_of(f"{w}.format", fmt, FORMATS)
    rfmt = config_get(ds, "record_format", "auto")
    _one_of(f"{w}.record_format", rfmt, ("auto",) + RECORD_FORMATS)
    if rfmt != "auto" and fmt not in SOURCE_FORMATS:
        raise UserError(f"{w}.record_format: only used with format hf or tfds (format is {fmt!r}); "
                        "set format to the record format instead")
    split = config_get(ds, "split", "train")
    if not isinstance(split, str) or not split:
        raise UserError(f"{w}.split: expected a non-empty string, got {split!r}")
    subset = config_get(ds, "subset")
    if subset is not None and (not isinstance(subset, str) or not subset):
        raise UserError(f"{w}.subset: expected a non-empty string (or None), got {subset!r}")
    streaming = config_get(ds, "streaming", False)
    if not isinstance(streaming, bool):
        raise UserError(f"{w}.streaming: expected True or False, got {streaming!r}")
    if (subset is not None or streaming) and fmt != "hf":
        raise UserError(f"{w}.{'subset' if subset is not None else 'streaming'}: only used with format hf "
                        f"(datasets.load_dataset), format is {fmt!r} (fix: format='hf', record_format={fmt!r})")
    # paths
    p = config_get(ds, "path")
    if isinstance(p, str):
        paths = [p]
    elif isinstance(p, (list, tuple)) and p and all(isinstance(x, str) for x in p):
        paths = list(p)
    else:
        raise UserError(f"{w}.path: expected a path or a non-empty list of paths, got {p!r}")
    for i, x in enumerate(paths):
        wp = f"{w}.path" + (f"[{i}]" if not isinstance(p, str) else "")
        if not x:
            raise UserError(f"{wp}: empty path")
        if fmt == "tfds":
            continue
        if fmt == "hf":
            from jaxembed.data.sources import require

            try:
                require("hf", x)
            except UserError as e:
                raise UserError(f"{wp}: {e}") from None
            if Path(x).exists() and not Path(x).is_dir():
                raise UserError(f"{wp}: {x} is a file; format hf reads a save_to_disk folder, a folder of data "
                                "files or a hub dataset name (fix: for one file, drop format='hf' and set format "
                                "to its record format)")
            continue
        if _GLOB.search(x) and not glob.glob(os.path.expanduser(x)):
            raise UserError(f"{wp}: the pattern {x} matches no file")
        for y in dataset_paths({"path": x, "format": fmt}):
            _check_data_path(y, wp)
    if fmt in SOURCE_FORMATS and len(paths) != 1:
        raise UserError(f"{w}.path: format {fmt} reads one dataset, got {len(paths)} paths")
    # task
    task = config_get(ds, "task")
    if task is not None and (not isinstance(task, str) or not task.strip()):
        raise UserError(f"{w}.task: expected a non-empty string (or None = the dataset name), got {task!r}")
    tt = config_get(ds, "task_type")
    rec = effective_record_format(ds)
    if tt is None:
        if rec != "auto" and not FORMAT_TABLE[rec].task_type_in_records:
            hint = f" (fix: sentence-transformers data has no task type: {ST_TASK_TYPE_FIX})" if rec == "st" else ""
            raise UserError(f"{w}.task_type: required (one of {', '.join(TASK_TYPES)}){hint}")
    else:
        _one_of(f"{w}.task_type", tt, TASK_TYPES)
    for k in ("query_instruction", "doc_instruction"):
        v = config_get(ds, k)
        if v is not None and not isinstance(v, str):
            raise UserError(f"{w}.{k}: expected a string (or None for the default), got {type(v).__name__}")
    t = config_get(ds, "temperature")
    if t is not None and (not _is_num(t) or t <= 0):
        raise UserError(f"{w}.temperature: {t!r} must be a number > 0 (or None for the run's default)")
    b = config_get(ds, "batching")
    if b is not None:
        _one_of(f"{w}.batching", b, BATCHING)
    n = config_get(ds, "num_negatives", 1)
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise UserError(f"{w}.num_negatives: {n!r} must be an integer >= 0")
    for k in ("weight", "epochs"):
        v = config_get(ds, k)
        if v is not None and (not _is_num(v) or v <= 0):
            raise UserError(f"{w}.{k}: {v!r} must be a number > 0 (or None)")
    if config_get(ds, "weight") is not None and config_get(ds, "epochs") is not None:
        raise UserError(f"{w}: set weight or epochs, not both")
    for k in ("max_query_length", "max_doc_length"):
        v = config_get(ds, k)
        if v is not None:
            # the rule of every max length (at least the special tokens); training adds the model's position table
            # as its upper bound. Imported here: jaxembed.loading brings jax, which a data config check needs not.
            from jaxembed.loading import check_max_length

            check_max_length(v, f"{w}.{k}", None, "")
    thr = config_get(ds, "score_threshold")
    if thr is not None:
        if not _is_num(thr):
            raise UserError(f"{w}.score_threshold: {thr!r} must be a number")
        if rec != "auto" and not FORMAT_TABLE[rec].scored:
            raise UserError(f"{w}.score_threshold: only used by {' and '.join(names_where(lambda f: f.scored))} "
                            f"pairs (this dataset is {rec})")
    elif rec != "auto" and FORMAT_TABLE[rec].threshold_required and config_get(ds, "loss") not in SCORED_LOSSES:
        raise UserError(f"{w}.score_threshold: required for scored_pairs (pairs with score >= threshold "
                        "become positives)")
    for k in ("text_field", "label_field"):
        v = config_get(ds, k)
        if v is not None and (not isinstance(v, str) or not v):
            raise UserError(f"{w}.{k}: expected a non-empty string (or None), got {v!r}")
        if v is not None and rec != "auto" and not FORMAT_TABLE[rec].label_descriptions:
            raise UserError(f"{w}.{k}: only used by {_labelled()} (this dataset is {rec}); use columns")
    cols = config_get(ds, "columns")
    if cols is not None:
        for k, _ in pairs_of(cols, f"{w}.columns"):
            if k not in _FIELD_NAMES:
                raise UserError(f"{w}.columns: {k!r} is not a field name (one of {', '.join(_FIELD_NAMES)})")
            by_position = rec != "auto" and FORMAT_TABLE[rec].texts_by_position
            if by_position and k not in FORMAT_TABLE[rec].fields:
                raise UserError(f"{w}.columns: {k!r}: format {rec} reads the texts by column order, whatever their "
                                f"names; columns can only name its {', '.join(FORMAT_TABLE[rec].fields)} columns "
                                "(fix: reorder the columns, or use format triplets with columns={'query': ..., "
                                "'pos': ...})")
    loss = config_get(ds, "loss")
    if loss is not None:
        _one_of(f"{w}.loss", loss, LOSSES)
    ld = config_get(ds, "label_descriptions")
    if ld is not None:
        if rec != "auto" and not FORMAT_TABLE[rec].label_descriptions:
            raise UserError(f"{w}.label_descriptions: only used by {_labelled()} (this dataset is {rec})")
        if len(pairs_of(ld, f"{w}.label_descriptions")) < 2:
            raise UserError(f"{w}.label_descriptions: needs at least 2 labels (the others are the negatives)")
    ef = config_get(ds, "extra_fields")
    if ef is not None:
        if isinstance(ef, str) or not isinstance(ef, (list, tuple)) or not all(
                isinstance(x, str) and x for x in ef):
            raise UserError(f"{w}.extra_fields: expected a list of record keys (non-empty strings), got {ef!r} "
                            "(fix: e.g. extra_fields=['fine_label'])")


_FIELD_NAMES = ("id", "query", "pos", "neg", "prompt", "type", "sentence1", "sentence2", "score", "text", "label")


def _labelled() -> str:
    """The formats whose labels are described (text_field / label_field / label_descriptions), for messages."""
    return " and ".join(names_where(lambda f: f.label_descriptions))


def _check_data_path(x: str, wp: str) -> None:
    """A data file (JSON Lines / Parquet / CSV / TSV) or a ``datasets.save_to_disk`` folder that exists."""
    from jaxembed.data.sources import is_saved_dataset

    from jaxembed.data.sources import require, source_kind

    q = Path(os.path.expanduser(x))
    if not q.exists():
        raise UserError(f"{wp}: {x} does not exist")
    if q.is_dir() and not is_saved_dataset(q):
        raise UserError(f"{wp}: {x} is a folder, neither a data file nor a datasets.save_to_disk folder (fix: give "
                        "the .jsonl / .parquet / .csv files (a glob such as dir/*.parquet works), or format='hf' "
                        "with record_format=... to read the folder with datasets.load_dataset)")
    if not q.is_dir():  # a device, a named pipe or a socket is named as what it is
        from jaxembed.data.jsonl import check_input_file

        try:
            check_input_file(q)
        except UserError as e:
            raise UserError(f"{wp}: {e}") from None
    try:
        require(source_kind(q), x)
    except UserError as e:
        raise UserError(f"{wp}: {e}") from None


def validate_data_config(cfg, where: str = "config") -> None:
    """Check every value of a data config before any work starts; the first problem is a UserError naming its key
    path, e.g. ``data.datasets[2].task_type: 'retreival' is not one of retrieval, reranking, ...``.

    Checks: known keys, enums, positive numbers, paths that exist (files for JSON Lines formats), unique names,
    the fields each format needs (score_threshold for scored pairs, ...)."""
    if not _is_mapping(cfg):
        raise UserError(f"{where}: expected a data config (ConfigDict), got {type(cfg).__name__}")
    unknown = [k for k in _keys(cfg) if k not in TOP_KEYS]
    if unknown:
        raise UserError(f"{where}.{unknown[0]}: unknown key{_did_you_mean(unknown[0], TOP_KEYS)} "
                        f"(known: {', '.join(TOP_KEYS)})")
    dss = config_get(cfg, "datasets")
    if _is_mapping(dss):
        raise UserError(f"{where}.datasets: a mapping name -> dataset (the sentence-transformers form) goes through "
                        "datasets_from_dict (fix: data.datasets = jaxembed.data.config.datasets_from_dict({...}))")
    if not isinstance(dss, (list, tuple)) or not dss:
        raise UserError(f"{where}.datasets: expected a non-empty list of dataset configs")
    names: set[str] = set()
    for i, ds in enumerate(dss):
        _validate_dataset(ds, f"{where}.datasets[{i}]", names)
    _one_of(f"{where}.on_error", config_get(cfg, "on_error", "stop"), ON_ERROR)
    _one_of(f"{where}.sampling", config_get(cfg, "sampling", "size"), SAMPLING)
    st = config_get(cfg, "sampling_temperature", 1.0)
    if not _is_num(st) or st <= 0:
        raise UserError(f"{where}.sampling_temperature: {st!r} must be a number > 0")
    seed = config_get(cfg, "seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise UserError(f"{where}.seed: {seed!r} must be an integer >= 0 (fix: e.g. seed=0)")
    check_task_types([(f"{where}.datasets[{i}]", config_get(ds, "name"),
                       config_get(ds, "task") or config_get(ds, "name"), config_get(ds, "task_type"))
                      for i, ds in enumerate(dss)])


def check_task_types(entries) -> None:
    """``entries``: (where, dataset name, task, task type or None) per dataset. Datasets of one task with different
    task types are a UserError naming both (MoTE routes a task by one type; its default batching follows it)."""
    first: dict[str, tuple[str, str, str]] = {}
    for w, name, task, tt in entries:
        if tt is None:
            continue
        if task not in first:
            first[task] = (w, name, tt)
            continue
        w0, name0, tt0 = first[task]
        if tt != tt0:
            raise UserError(f"{w}.task_type: dataset {name!r} is {tt!r} but dataset {name0!r} ({w0}) of the same "
                            f"task {task!r} is {tt0!r}; a task has one type (its MoTE experts and default batching "
                            f"follow it) (fix: give {name!r} its own task name, e.g. task={name!r}, or the same "
                            "task_type)")


def to_plain(v):
    """A ConfigDict (also inside lists) as plain JSON-able Python values."""
    if _is_mapping(v):
        return {k: to_plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [to_plain(x) for x in v]
    return v
