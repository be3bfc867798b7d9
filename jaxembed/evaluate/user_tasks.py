"""A user's own dev sets as evaluation tasks: a spec (a dict in ``eval.tasks``) -> a ``Task`` scored by the same
local evaluators (MTEB's protocols) as the registry's tasks.

::

    c.eval.tasks = (
        "STSBenchmark-dev",                                                  # a registered task
        dict(name="my-sts", type="sts", path="dev/sts.csv"),                 # sentence1, sentence2, score
        dict(name="my-pairs", type="pair_classification", path="dev/p.parquet"),  # sentence1, sentence2, label 1/0
        dict(name="my-ir", type="retrieval", path="dev/beir_folder", split="dev"),  # corpus, queries, qrels/dev.tsv
        dict(name="my-cls", type="classification", path="dev/cls.jsonl", train="train/cls.jsonl"),  # text, label
        dict(name="my-clu", type="clustering", path="dev/clusters.jsonl"),  # text, label
        dict(name="my-rr", type="reranking", path="dev/rerank.jsonl"),       # query, pos [...], neg [...]
        dict(name="my-st", type="reranking", path="dev/st.parquet"),  # anchor, positive, negative (one text each)
        "mteb:Banking77Classification",                                      # an MTEB task available offline
    )

Spec keys: ``name`` (the metric prefix: ``eval.best_metric = "my-sts/main_score"``), ``type`` (ours, as in the data
config, or MTEB's: ``STS``, ``PairClassification``, ...), ``path`` (a ``.jsonl`` / ``.parquet`` / ``.csv`` /
``.tsv`` file; retrieval: a BEIR folder), ``train`` (classification: the labelled texts the logistic regression is
fitted on), ``split`` (retrieval: which ``qrels/<split>.tsv``; default: the only one), ``columns`` (our field ->
the file's, e.g. ``{"score": "similarity"}``), ``query_instruction`` / ``document_instruction`` (prompt strings,
used as they are), ``main_score`` (one of the type's metrics), ``score_range`` (STS: the gold scale, for mteb).

Reranking rows are read as training reads them: a ``pos`` / ``neg`` column that ``columns`` renames may hold one
text instead of a list, and a file without a ``query`` field may be a sentence-transformers one (anchor, positive,
negatives...: the text columns in order).

``user_task(spec)`` checks everything that can be checked without reading the data (keys, type, files and folder
layout, columns, the main score) and reads the first row of each file (its fields): a bad spec or file is a
one-line UserError naming the key or the file, line and field, before any work starts. The whole files are read
by ``load_task_data``: the trainer's config check (``jaxembed.evaluate.dev.validate_eval``) reads them before any
work, so a bad row deep in a file is refused before the run directory is touched.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from jaxembed.errors import InputError, UserError
from jaxembed.evaluate.tasks import CLASSIFICATION_DEFAULTS, CLUSTERING_DEFAULTS, TASKS, Task, iter_rows, rerank_row

#: our task-type names (the data config's) -> MTEB's; MTEB's names are accepted as they are
TYPE_NAMES = {"sts": "STS", "pair_classification": "PairClassification", "classification": "Classification",
              "clustering": "Clustering", "retrieval": "Retrieval", "reranking": "Reranking"}

#: every metric a local evaluator reports, per task type (``main_score`` is one of them)
METRICS = {
    "STS": ("cosine_spearman", "cosine_pearson"),
    "PairClassification": ("cosine_ap", "cosine_accuracy", "cosine_f1", "cosine_precision", "cosine_recall"),
    "Reranking": ("map_at_1000", "mrr_at_10", "ndcg_at_10"),
    "Retrieval": ("ndcg_at_10", "ndcg_at_100", "recall_at_10", "recall_at_100", "mrr_at_10", "map_at_100"),
    "Classification": ("accuracy", "f1", "f1_weighted"),
    "Clustering": ("v_measure", "v_measure_std"),
}
MAIN_SCORES = {"STS": "cosine_spearman", "PairClassification": "cosine_ap", "Reranking": "map_at_1000",
               "Retrieval": "ndcg_at_10", "Classification": "accuracy", "Clustering": "v_measure"}

#: the fields of each type's rows (``columns`` maps them); retrieval reads BEIR files
FIELDS = {
    "STS": ("sentence1", "sentence2", "score"),
    "PairClassification": ("sentence1", "sentence2", "label"),
    "Reranking": ("query", "pos", "neg"),
    "Classification": ("text", "label"),
    "Clustering": ("text", "label"),
    "Retrieval": (),
}
SPEC_KEYS = ("name", "type", "path", "train", "split", "columns", "query_instruction", "document_instruction",
             "main_score", "score_range")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


def _did_you_mean(key: str, known) -> str:
    import difflib

    m = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f" (did you mean {m[0]!r}?)" if m else ""


def is_spec(entry: Any) -> bool:
    """Whether an ``eval.tasks`` entry is a user task spec (a mapping) rather than a task name."""
    return hasattr(entry, "keys") and hasattr(entry, "get")


def user_task(spec, where: str = "eval.tasks[0]") -> Task:
    """A user task spec -> a Task (paths made absolute); every problem is a UserError naming ``where`` and the key,
    or the file, line and field of a bad first row."""
    if not is_spec(spec):
        raise UserError(f"{where}: expected a task name or a dict(name=..., type=..., path=...), got "
                        f"{type(spec).__name__}")
    spec = dict(spec.items())
    unknown = [k for k in spec if k not in SPEC_KEYS]
    if unknown:
        raise UserError(f"{where}.{unknown[0]}: unknown key{_did_you_mean(unknown[0], SPEC_KEYS)} (keys: "
                        f"{', '.join(SPEC_KEYS)})")
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise UserError(f"{where}.name: {name!r} is not a task name (fix: letters, digits, '_ . + -', e.g. "
                        "name='my-sts-dev'; it prefixes the metrics: 'my-sts-dev/main_score')")
    if name in TASKS:
        raise UserError(f"{where}.name: {name!r} is a registered task (fix: give your set another name, or write "
                        f"the registered task as the plain string {name!r})")
    t = spec.get("type")
    mtype = TYPE_NAMES.get(t, t) if isinstance(t, str) else None
    if mtype not in METRICS:
        known = ", ".join(list(TYPE_NAMES) + list(METRICS))
        raise UserError(f"{where}.type: {t!r} is not a task type{_did_you_mean(str(t), list(TYPE_NAMES))} "
                        f"(one of {known})")
    cols = spec.get("columns") or {}
    if not is_spec(cols):
        raise UserError(f"{where}.columns: expected a mapping our field -> the file's, e.g. {{'score': 'similarity'}}"
                        f", got {type(cols).__name__}")
    cols = dict(cols.items())
    for k, v in cols.items():
        if k not in FIELDS[mtype]:
            raise UserError(f"{where}.columns: {k!r} is not a field of {mtype} rows (fields: "
                            f"{', '.join(FIELDS[mtype]) or 'none: retrieval reads BEIR files'})")
        if not isinstance(v, str) or not v:
            raise UserError(f"{where}.columns[{k!r}]: expected a column name, got {v!r}")
    for k in ("query_instruction", "document_instruction"):
        if spec.get(k) is not None and not isinstance(spec[k], str):
            raise UserError(f"{where}.{k}: expected a string (the prompt, used as it is), got "
                            f"{type(spec[k]).__name__}")
    main = spec.get("main_score") or MAIN_SCORES[mtype]
    if main not in METRICS[mtype]:
        raise UserError(f"{where}.main_score: {main!r} is not a {mtype} metric (one of {', '.join(METRICS[mtype])})")
    rng = spec.get("score_range") or (0.0, 5.0)
    if (not isinstance(rng, (list, tuple)) or len(rng) != 2
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in rng) or rng[0] >= rng[1]):
        raise UserError(f"{where}.score_range: {rng!r} is not (low, high) (fix: e.g. (0, 5) or (0, 1))")
    files = _files(spec, mtype, where)
    if mtype != "Classification" and spec.get("train") is not None:
        raise UserError(f"{where}.train: only used by classification tasks (this one is {mtype})")
    if mtype != "Retrieval" and spec.get("split") is not None:
        raise UserError(f"{where}.split: only used by retrieval tasks (which qrels/<split>.tsv)")
    params = dict(CLASSIFICATION_DEFAULTS if mtype == "Classification" else
                  CLUSTERING_DEFAULTS if mtype == "Clustering" else {})
    task = Task(name=name, family=name, split="dev", type=mtype, files=files, main_score=main,
                query_instruction=spec.get("query_instruction") or "",
                document_instruction=spec.get("document_instruction") or "",
                description=f"user set ({mtype})", score_range=(float(rng[0]), float(rng[1])), params=params,
                columns=cols, user=True)
    try:
        check_first_rows(task)
    except InputError as e:
        raise UserError(f"{where}: {e}") from None
    return task


def _file(spec, key: str, where: str, what: str) -> str:
    v = spec.get(key)
    if not isinstance(v, str) or not v:
        raise UserError(f"{where}.{key}: required: {what}")
    p = Path(v).expanduser()
    if not p.exists():
        raise UserError(f"{where}.{key}: {v} does not exist (fix: {what})")
    return str(p.resolve())


def _files(spec, mtype: str, where: str) -> dict[str, str]:
    if mtype == "Retrieval":
        folder = Path(_file(spec, "path", where, "a BEIR folder: corpus.jsonl, queries.jsonl, qrels/<split>.tsv"))
        if not folder.is_dir():
            raise UserError(f"{where}.path: {folder} is a file; a retrieval task reads a BEIR folder (corpus.jsonl, "
                            "queries.jsonl, qrels/<split>.tsv)")
        for f in ("corpus.jsonl", "queries.jsonl"):
            if not (folder / f).is_file():
                raise UserError(f"{where}.path: {folder} has no {f} (fix: the BEIR layout: corpus.jsonl with _id, "
                                "title, text; queries.jsonl with _id, text; qrels/<split>.tsv)")
        have = sorted(p.stem for p in (folder / "qrels").glob("*.tsv")) if (folder / "qrels").is_dir() else []
        split = spec.get("split")
        if split is None:
            if len(have) != 1:
                raise UserError(f"{where}.split: required: {folder}/qrels holds "
                                f"{', '.join(h + '.tsv' for h in have) or 'no .tsv file'} (fix: split='dev' for "
                                "qrels/dev.tsv)")
            split = have[0]
        if split not in have:
            raise UserError(f"{where}.split: {folder}/qrels/{split}.tsv does not exist (have: "
                            f"{', '.join(have) or 'none'})")
        return {"corpus": str(folder / "corpus.jsonl"), "queries": str(folder / "queries.jsonl"),
                "qrels": str(folder / "qrels" / f"{split}.tsv")}
    what = {"STS": "a file of sentence1, sentence2, score rows", "PairClassification": "a file of sentence1, "
            "sentence2, label (1 / 0) rows", "Reranking": "a file of query, pos [...], neg [...] rows",
            "Classification": "a file of text, label rows", "Clustering": "a file of text, label rows"}[mtype]
    files = {"test": _file(spec, "path", where, what + " (.jsonl, .parquet, .csv or .tsv)")}
    if mtype == "Classification":
        files["train"] = _file(spec, "train", where, "the labelled texts (text, label) the logistic regression is "
                                                     "fitted on, e.g. your training file")
    for role, f in files.items():
        if Path(f).is_dir():
            raise UserError(f"{where}.{'train' if role == 'train' else 'path'}: {f} is a folder (fix: {what})")
    return files


def check_first_rows(task: Task) -> None:
    """Read the first row of each of a task's files and check its fields (an InputError naming file, line and
    field); the BEIR qrels header too. Cheap: the whole files are read later."""
    c = task.col
    checks = {"test": [c(f) for f in FIELDS[task.type]], "train": [c("text"), c("label")],
              "corpus": ["_id", "text"], "queries": ["_id", "text"]}
    for role, path in task.files.items():
        if role == "qrels":
            with open(path, encoding="utf-8") as f:
                head = f.readline().rstrip("\r\n").split("\t")
            if [h.strip() for h in head[:3]] != ["query-id", "corpus-id", "score"]:
                raise InputError(path, 1, "expected the header query-id<TAB>corpus-id<TAB>score (BEIR qrels)",
                                 "write that header line first (tab-separated)")
            continue
        first = next(iter(iter_rows(path)), None)
        if first is None:
            raise InputError(path, None, "empty file: no rows", "check the file, or remove the task")
        line, obj = first
        if role == "test" and task.type == "Reranking" and not task.columns and "query" not in obj:
            rerank_row(task, path, line, obj)  # a sentence-transformers row (anchor, positive, negatives...)
            continue
        for key in checks[role]:
            if key not in obj:
                keys = ", ".join(sorted(obj)) or "none"
                raise InputError(path, line, f"missing (keys present: {keys})",
                                 f"add the field, or map it with columns in the eval task (e.g. columns={{"
                                 f"{_ours(task, key)!r}: 'your_column'}})", field=key)


def _ours(task: Task, key: str) -> str:
    for ours, theirs in task.columns.items():
        if theirs == key:
            return ours
    return key
