"""The evaluation task registry (the one place that names every local task) and the loaders of its data.

Naming: a task on a file of ``eval/`` (reporting only) has the plain name, following MTEB where the data is the
same (``STSBenchmark`` = ``eval/stsb_test.jsonl``, ``SICK-R`` = ``eval/sick_test.jsonl``); the same task on its
``dev/`` file (model selection, early stopping) is ``<name>-dev`` (``STSBenchmark-dev`` = ``dev/stsb_dev.jsonl``).
``TrecQA-dev`` has no eval counterpart; ``Cranfield``, ``TREC`` and ``Newsgroups`` have no dev counterpart.

Task types are MTEB's (``STS``, ``Retrieval``, ``Reranking``, ``PairClassification``, ``Classification``,
``Clustering``): prompts and MoTE routing are keyed by them exactly as mteb keys them.
"""

from __future__ import annotations

import csv
import dataclasses
import difflib
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from jaxembed import paths
from jaxembed.data.jsonl import iter_jsonl
from jaxembed.errors import InputError, UserError
from jaxembed.evaluate.prompts import instruction_prompts

SPLITS = ("eval", "dev")
TASK_TYPES = ("STS", "Retrieval", "Reranking", "PairClassification", "Classification", "Clustering")
SYMMETRIC_TYPES = ("STS", "PairClassification", "Classification", "Clustering")

# MTEB's classification protocol (mteb.abstasks.classification.AbsTaskClassification defaults): 10 experiments,
# each training LogisticRegression(max_iter=100) on 8 training examples per label drawn by a seeded shuffle.
CLASSIFICATION_DEFAULTS = {"n_experiments": 10, "samples_per_label": 8, "max_iter": 100}
# MTEB's clustering protocol (mteb.abstasks.clustering.AbsTaskClustering, the "fast" v2 protocol): 10 bootstrap
# samples of 16,384 documents (with replacement), MiniBatchKMeans(k = number of labels, batch_size=512,
# n_init=1), V-measure averaged. MTEB embeds 4% of a (large) corpus first; these sets are small, so all of it.
CLUSTERING_DEFAULTS = {"n_clusters": 10, "cluster_size": 16_384, "kmeans_batch_size": 512}


@dataclasses.dataclass(frozen=True)
class Task:
    """One registered evaluation task.

    files: role -> path relative to the shared data folder (``test`` / ``train`` / ``corpus`` / ``queries`` /
    ``qrels``), or absolute (a user's own set, ``jaxembed.evaluate.user_tasks``). query_instruction: the task's
    instruction for queries (for symmetric task types: for every text); document_instruction: for documents of
    Retrieval / Reranking tasks (usually empty). columns: our field name -> the file's (a user's set)."""

    name: str
    family: str
    split: str
    type: str
    files: dict
    main_score: str
    query_instruction: str
    document_instruction: str = ""
    description: str = ""
    mteb_name: str | None = None  # the MTEB task on the same rows, if any
    score_range: tuple = (0.0, 5.0)  # STS gold score range
    params: dict = dataclasses.field(default_factory=dict)
    columns: dict = dataclasses.field(default_factory=dict)
    user: bool = False  # a user's own set (eval.tasks), not in the registry

    def col(self, name: str) -> str:
        """The file's field for our field ``name`` (``columns``, else the name itself)."""
        return self.columns.get(name, name)

    def __hash__(self) -> int:
        return hash(self.name)

    @property
    def symmetric(self) -> bool:
        return self.type in SYMMETRIC_TYPES

    @property
    def hf_split(self) -> str:
        """The split name used in mteb result files: ``test`` for eval/ files, ``dev`` for dev/ files."""
        return "test" if self.split == "eval" else "dev"

    def instruction_prompts(self, template: str = "{instruction}") -> dict[str, str]:
        """The task's instructions as prompts keyed like mteb looks them up (``Name`` for symmetric tasks,
        ``Name-query`` / ``Name-document`` for retrieval and reranking), formatted with ``template``."""
        return instruction_prompts(self.name, self.type, self.query_instruction, self.document_instruction,
                                   template)

    def path(self, role: str, data_dir: Path | None = None) -> Path:
        return Path(data_dir or paths.shared_data_dir()) / self.files[role]


_STS_I = "Retrieve semantically similar text."
_SPECS: list[dict[str, Any]] = [
    dict(family="STSBenchmark", type="STS", main_score="cosine_spearman", query_instruction=_STS_I,
         mteb_name="STSBenchmark", description="STS Benchmark: Spearman of cosine similarity vs gold 0-5",
         eval={"test": "eval/stsb_test.jsonl"}, dev={"test": "dev/stsb_dev.jsonl"}),
    dict(family="SICK-R", type="STS", main_score="cosine_spearman", query_instruction=_STS_I, mteb_name="SICK-R",
         score_range=(1.0, 5.0), description="SICK relatedness: Spearman of cosine similarity vs gold 1-5",
         eval={"test": "eval/sick_test.jsonl"}, dev={"test": "dev/sick_trial.jsonl"}),
    dict(family="MRPC", type="PairClassification", main_score="cosine_ap",
         query_instruction="Retrieve text that is a paraphrase of the given text.",
         description="MRPC paraphrase pairs: average precision of cosine similarity",
         eval={"test": "eval/mrpc_test.jsonl"}, dev={"test": "dev/mrpc_val.jsonl"}),
    dict(family="WikiQA", type="Reranking", main_score="map_at_1000",
         query_instruction="Given a question, retrieve Wikipedia sentences that answer the question.",
         description="WikiQA answer selection: rerank each question's candidate sentences (MAP, MRR@10)",
         eval={"test": "eval/wikiqa_test.jsonl"}, dev={"test": "dev/wikiqa_dev.jsonl"}),
    dict(family="TrecQA", type="Reranking", main_score="map_at_1000",
         query_instruction="Given a question, retrieve news sentences that answer the question.",
         description="TrecQA answer selection: rerank each question's candidate sentences (MAP, MRR@10)",
         dev={"test": "dev/trecqa_dev.jsonl"}),
    dict(family="Cranfield", type="Retrieval", main_score="ndcg_at_10",
         query_instruction="Given a question about aeronautics, retrieve the abstracts of papers that answer it.",
         description="Cranfield 1400 (BEIR layout): nDCG@10 over the whole corpus",
         eval={"corpus": "eval/cranfield/corpus.jsonl", "queries": "eval/cranfield/queries.jsonl",
               "qrels": "eval/cranfield/qrels/test.tsv"}),
    dict(family="TREC", type="Classification", main_score="accuracy",
         query_instruction="Classify the type of answer the given question asks for.",
         description="TREC question type (6 labels): logistic regression on embeddings, accuracy",
         eval={"train": "train/trec_cls.jsonl", "test": "eval/trec_test.jsonl"}, params=CLASSIFICATION_DEFAULTS),
    dict(family="SST2", type="Classification", main_score="accuracy",
         query_instruction="Classify the sentiment of the given movie review as positive or negative.",
         description="SST-2 sentiment (2 labels): logistic regression on embeddings, accuracy",
         eval={"train": "train/sst2_cls.jsonl", "test": "eval/sst2_test.jsonl"},
         dev={"train": "train/sst2_cls.jsonl", "test": "dev/sst2_dev.jsonl"}, params=CLASSIFICATION_DEFAULTS),
    dict(family="SST5", type="Classification", main_score="accuracy",
         query_instruction="Classify the sentiment of the given movie review on a five-point scale.",
         description="SST-5 sentiment (5 labels): logistic regression on embeddings, accuracy",
         eval={"train": "train/sst5_cls.jsonl", "test": "eval/sst5_test.jsonl"},
         dev={"train": "train/sst5_cls.jsonl", "test": "dev/sst5_dev.jsonl"}, params=CLASSIFICATION_DEFAULTS),
    dict(family="Newsgroups", type="Clustering", main_score="v_measure",
         query_instruction="Identify the topic or theme of the given news articles.",
         description="20 Newsgroups sample (2 groups; subject + body, headers removed): mini-batch k-means, V-measure",
         eval={"test": "eval/newsgroups_mini.jsonl"}, params=CLUSTERING_DEFAULTS),
]


def _build_registry() -> dict[str, Task]:
    reg: dict[str, Task] = {}
    for spec in _SPECS:
        spec = dict(spec)
        family = spec.pop("family")
        variants = {s: spec.pop(s) for s in SPLITS if s in spec}
        params = dict(spec.pop("params", {}))
        for split, files in variants.items():
            name = family if split == "eval" else f"{family}-dev"
            mteb_name = spec.get("mteb_name") if split == "eval" else None
            reg[name] = Task(name=name, family=family, split=split, files=dict(files), params=params,
                             **{**spec, "mteb_name": mteb_name})
    return reg


TASKS: dict[str, Task] = _build_registry()


def task_names(split: str | None = None) -> list[str]:
    """Registered task names, eval tasks first (registry order), optionally only one split."""
    order = sorted(TASKS.values(), key=lambda t: SPLITS.index(t.split))
    return [t.name for t in order if split is None or t.split == split]


def dev_tasks() -> list[Task]:
    """Every task on a dev/ file: what the trainer evaluates for model selection."""
    return [TASKS[n] for n in task_names("dev")]


def eval_tasks() -> list[Task]:
    """Every task on an eval/ file: for reporting only."""
    return [TASKS[n] for n in task_names("eval")]


def get_task(name: str | Task) -> Task:
    if isinstance(name, Task):
        return name
    if name in TASKS:
        return TASKS[name]
    close = difflib.get_close_matches(name, list(TASKS), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise UserError(f"unknown task {name!r}; {hint}known tasks: {', '.join(task_names())} "
                    "(or all, dev, eval)")


def resolve_tasks(tasks: str | Task | Iterable[str | Task] | None, split: str | None = None) -> list[Task]:
    """Task names -> Tasks. ``tasks``: names (a list, or one comma-separated string) or the keywords ``all``
    (every task), ``dev`` (dev tasks), ``eval`` (eval tasks); None = all. ``split``: None = the tasks as named;
    ``dev`` / ``eval`` = each named task's variant on that split (an error if it has none); ``both`` = every
    variant that exists."""
    if split not in (None, "dev", "eval", "both"):
        raise UserError(f"split must be dev, eval or both, got {split!r}")
    if tasks is None:
        tasks = "all"
    if isinstance(tasks, (str, Task)):
        tasks = [tasks]
    names: list[str | Task] = []
    for t in tasks:
        if isinstance(t, Task):
            names.append(t)
            continue
        for n in (x.strip() for x in str(t).split(",")):
            if not n:
                continue
            names.extend(task_names(None if n == "all" else n) if n in ("all", "dev", "eval") else [n])
    out: list[Task] = []
    for n in names:
        task = get_task(n)
        if split is None:
            chosen = [task]
        else:
            fam = [TASKS[x] for x in task_names() if TASKS[x].family == task.family]
            chosen = [t for t in fam if split == "both" or t.split == split]
            if not chosen:
                have = ", ".join(t.name for t in fam)
                raise UserError(f"task {task.family} has no {split} variant (it has: {have})")
        out.extend(t for t in chosen if t not in out)
    if not out:
        raise UserError("no tasks selected")
    return out


# --------------------------------------------------------------------------------------------------- data


@dataclasses.dataclass
class PairData:
    """STS (scores) or pair classification (labels 0/1)."""

    sentence1: list[str]
    sentence2: list[str]
    targets: np.ndarray


@dataclasses.dataclass
class RerankingData:
    """Per query: its candidates; relevance 1 (pos) / 0 (neg); candidates are ``pos + neg`` in file order."""

    queries: list[str]
    candidates: list[list[str]]
    relevance: list[list[int]]


@dataclasses.dataclass
class RetrievalData:
    query_ids: list[str]
    queries: list[str]
    doc_ids: list[str]
    docs: list[str]
    qrels: dict  # query id -> {doc id: graded relevance}


@dataclasses.dataclass
class ClassificationData:
    train_texts: list[str]
    train_labels: list[str]
    test_texts: list[str]
    test_labels: list[str]


@dataclasses.dataclass
class ClusteringData:
    texts: list[str]
    labels: list[str]


_KINDS = {"str": "a string", "num": "a number", "list": "a list of strings"}


def _field(path, line, obj, key, kind):
    if key not in obj:
        raise InputError(path, line, f"missing (keys present: {', '.join(sorted(obj)) or 'none'})",
                         "add the field, or map it with columns in the eval task (e.g. columns={'score': "
                         "'similarity'})", field=key)
    v = obj[key]
    ok = {"str": isinstance(v, str), "num": isinstance(v, (int, float)) and not isinstance(v, bool),
          "list": isinstance(v, list) and all(isinstance(x, str) for x in v)}[kind]
    if not ok:
        raise InputError(path, line, f"expected {_KINDS[kind]}, got {type(v).__name__}",
                         f"store {_KINDS[kind]} in the field", field=key)
    return v


def rerank_row(task: Task, path, line: int, obj: dict) -> tuple[str, list[str], list[str]]:
    """(query, positives, negatives) of a reranking row, read as training reads it: our fields (``columns`` may
    rename them; a renamed pos / neg column may hold one text), or a sentence-transformers row (anchor, positive,
    negatives...: the text columns in order, an ``id`` column aside) when the file has no ``query`` field."""
    if not task.columns and "query" not in obj and {"anchor", "positive"} <= set(obj):
        keys = [k for k in obj if k != "id"]
        return (_field(path, line, obj, keys[0], "str"), [_field(path, line, obj, keys[1], "str")],
                [_field(path, line, obj, k, "str") for k in keys[2:]])
    c = task.col
    texts = lambda k: ([obj[c(k)]] if c(k) != k and isinstance(obj.get(c(k)), str)  # noqa: E731
                       else _field(path, line, obj, c(k), "list"))
    return _field(path, line, obj, c("query"), "str"), texts("pos"), texts("neg")


def iter_rows(path, numeric: Sequence[str] = ()) -> Iterable[tuple[int, dict]]:
    """(line / row number, record) of a JSON Lines, Parquet or CSV / TSV file (by suffix); a bad row is an
    InputError naming it. ``numeric``: CSV columns read as numbers (scores, labels)."""
    from jaxembed.data import sources
    from jaxembed.data.jsonl import BadLine

    kind = sources.source_kind(path)
    if kind == "jsonl":
        yield from iter_jsonl(str(path))
        return
    if kind == "parquet":
        rows = sources.iter_parquet(path)
    elif kind in ("csv", "tsv"):
        rows = sources.iter_csv(path, "\t" if kind == "tsv" else ",", numeric=numeric)
    else:
        raise UserError(f"{path}: expected a .jsonl, .parquet, .csv or .tsv file")
    for i, obj in rows:
        if isinstance(obj, BadLine):
            raise InputError(path, i, obj.reason, obj.fix, field=obj.field)
        yield i, obj


def _rows(path: Path, numeric: Sequence[str] = ()) -> Iterable[tuple[int, dict]]:
    if not path.exists():
        raise UserError(f"{path}: missing; evaluation reads the shared data folder ({paths.shared_data_dir()}), "
                        "set JAXEMBED_DATA to its location")
    return iter_rows(path, numeric)


def _subsample(n: int, max_examples: int | None, seed: int) -> np.ndarray:
    """Sorted indices of a seeded sample of ``max_examples`` of ``n`` (all of them when None or >= n)."""
    if max_examples is None or max_examples >= n:
        return np.arange(n)
    if max_examples <= 0:
        raise UserError(f"max_examples must be positive, got {max_examples}")
    return np.sort(np.random.default_rng(seed).choice(n, size=max_examples, replace=False))


def strip_news_headers(text: str) -> str:
    """A 20 Newsgroups message without its header block (whose ``Newsgroups:`` line is the label): the subject,
    then the body."""
    head, sep, body = text.partition("\n\n")
    if not sep:
        return text.strip()
    subject = ""
    for line in head.split("\n"):
        if line.lower().startswith("subject:"):
            subject = line.split(":", 1)[1].strip()
            break
    return (subject + "\n" + body.strip()).strip()


def doc_text(title: str, text: str) -> str:
    """A BEIR document as the model reads it: ``title text`` (mteb's join), or ``text`` alone when it already
    begins with the title (Cranfield's text does)."""
    title, text = (title or "").strip(), (text or "").strip()
    if not title or text.startswith(title):
        return text
    return f"{title} {text}"


def load_task_data(task: str | Task, *, max_examples: int | None = None, seed: int = 42,
                   data_dir: Path | None = None):
    """The data of a task (PairData, RerankingData, RetrievalData, ClassificationData or ClusteringData).

    max_examples: a seeded sample of at most N test examples (pairs, queries, test texts, documents to cluster),
    the same for every caller with the same seed -- the cheap in-training signal. Retrieval keeps N queries and a
    corpus of every document judged for them plus a seeded sample of the others, ``max(10 N, judged)`` in all.
    Classification always draws its training examples from the whole training file."""
    task = get_task(task)
    c = task.col
    if task.type in ("STS", "PairClassification"):
        p = task.path("test", data_dir)
        s1, s2, y = [], [], []
        key = c("score" if task.type == "STS" else "label")
        for i, obj in _rows(p, numeric=(key,)):
            s1.append(_field(p, i, obj, c("sentence1"), "str"))
            s2.append(_field(p, i, obj, c("sentence2"), "str"))
            y.append(_field(p, i, obj, key, "num"))
            if task.type == "PairClassification" and y[-1] not in (0, 1):
                raise InputError(p, i, f"{y[-1]!r} is not a pair label", "write 1 (a positive pair) or 0",
                                 field=key)
        idx = _subsample(len(s1), max_examples, seed)
        dtype = np.float64 if task.type == "STS" else np.int64
        return PairData([s1[i] for i in idx], [s2[i] for i in idx], np.asarray(y, dtype)[idx])
    if task.type == "Reranking":
        p = task.path("test", data_dir)
        qs, cands, rels = [], [], []
        for i, obj in _rows(p):
            q, pos, neg = rerank_row(task, p, i, obj)
            qs.append(q)
            cands.append(list(pos) + list(neg))
            rels.append([1] * len(pos) + [0] * len(neg))
        idx = _subsample(len(qs), max_examples, seed)
        return RerankingData([qs[i] for i in idx], [cands[i] for i in idx], [rels[i] for i in idx])
    if task.type == "Retrieval":
        return _load_retrieval(task, max_examples, seed, data_dir)
    if task.type == "Classification":
        out = []
        for role in ("train", "test"):
            p = task.path(role, data_dir)
            texts, labels = [], []
            for i, obj in _rows(p, numeric=(c("label"),)):
                texts.append(_field(p, i, obj, c("text"), "str"))
                lab = obj.get(c("label"))
                if not isinstance(lab, (str, int)) or isinstance(lab, bool):
                    raise InputError(p, i, f"expected a label name or integer, got {type(lab).__name__}",
                                     "give every text its label", field=c("label"))
                labels.append(str(lab))
            out.append((texts, labels))
        (tr_x, tr_y), (te_x, te_y) = out
        idx = _subsample(len(te_x), max_examples, seed)
        return ClassificationData(tr_x, tr_y, [te_x[i] for i in idx], [te_y[i] for i in idx])
    if task.type == "Clustering":
        p = task.path("test", data_dir)
        texts, labels = [], []
        for i, obj in _rows(p, numeric=(c("label"),)):
            t = _field(p, i, obj, c("text"), "str")
            texts.append(strip_news_headers(t) if task.family == "Newsgroups" else t)
            lab = obj.get(c("label"))
            if task.user and (not isinstance(lab, (str, int)) or isinstance(lab, bool)):
                raise InputError(p, i, f"expected a label name or integer, got {type(lab).__name__}",
                                 "give every text its label", field=c("label"))
            labels.append(str(lab))
        idx = _subsample(len(texts), max_examples, seed)
        return ClusteringData([texts[i] for i in idx], [labels[i] for i in idx])
    raise UserError(f"task {task.name}: unknown type {task.type}")


def _id_field(path, line, obj):
    """A BEIR ``_id``: a string, or an integer (as many BEIR exports write it)."""
    v = obj.get("_id")
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    return _field(path, line, obj, "_id", "str")


def _load_retrieval(task: Task, max_examples: int | None, seed: int, data_dir: Path | None) -> RetrievalData:
    cp, qp, rp = (task.path(r, data_dir) for r in ("corpus", "queries", "qrels"))
    doc_ids, docs = [], []
    for i, obj in _rows(cp):
        doc_ids.append(str(_id_field(cp, i, obj)))
        docs.append(doc_text(obj.get("title") or "", _field(cp, i, obj, "text", "str")))
    q_ids, queries = [], []
    for i, obj in _rows(qp):
        q_ids.append(str(_id_field(qp, i, obj)))
        queries.append(_field(qp, i, obj, "text", "str"))
    if not rp.exists():
        raise UserError(f"{rp}: missing qrels file (fix: BEIR layout: qrels/<split>.tsv with the header "
                        "query-id<TAB>corpus-id<TAB>score)")
    qrels: dict[str, dict[str, int]] = {}
    known = set(doc_ids)
    with open(rp, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t")
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:3]] != ["query-id", "corpus-id", "score"]:
            raise InputError(rp, 1, "expected the header query-id<TAB>corpus-id<TAB>score (BEIR qrels)",
                             "write that header line first (tab-separated)")
        for line, row in enumerate(reader, 2):
            if not row:
                continue
            if len(row) < 3:
                raise InputError(rp, line, f"expected 3 tab-separated fields, got {len(row)}",
                                 "query-id<TAB>corpus-id<TAB>score")
            try:
                score = int(row[2])
            except ValueError:
                raise InputError(rp, line, f"score {row[2]!r} is not an integer", "graded relevance: 0, 1, 2, ...",
                                 field="score") from None
            if row[1] not in known:
                raise InputError(rp, line, f"corpus-id {row[1]!r} is not in {cp.name}",
                                 "judge documents of the corpus only", field="corpus-id")
            qrels.setdefault(row[0], {})[row[1]] = score
    # like mteb: only queries with at least one judgement are evaluated
    keep = [i for i, q in enumerate(q_ids) if qrels.get(q)]
    if not keep:
        raise InputError(rp, None, f"no query of {qp.name} is judged here",
                         f"the qrels' query-ids must be _id values of {qp.name}")
    q_ids, queries = [q_ids[i] for i in keep], [queries[i] for i in keep]
    idx = _subsample(len(q_ids), max_examples, seed)
    if len(idx) < len(q_ids):
        q_ids, queries = [q_ids[i] for i in idx], [queries[i] for i in idx]
        judged = {d for q in q_ids for d in qrels[q]}
        others = [i for i, d in enumerate(doc_ids) if d not in judged]
        n_other = max(0, min(len(doc_ids), max(10 * len(q_ids), len(judged))) - len(judged))
        pick = set(_subsample(len(others), n_other, seed + 1).tolist())
        keep_docs = judged | {doc_ids[others[i]] for i in pick}
        sel = [i for i, d in enumerate(doc_ids) if d in keep_docs]
        doc_ids, docs = [doc_ids[i] for i in sel], [docs[i] for i in sel]
    return RetrievalData(q_ids, queries, doc_ids, docs, {q: dict(qrels[q]) for q in q_ids})


def describe(tasks: Sequence[Task] | None = None) -> str:
    """A plain-text listing of tasks (name, type, split, main score, files)."""
    rows = []
    for t in tasks or [TASKS[n] for n in task_names()]:
        rows.append(f"{t.name:<18} {t.type:<19} {t.split:<5} {t.main_score:<16} {', '.join(t.files.values())}")
    return "\n".join(rows)
