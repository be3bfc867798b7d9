"""Local evaluators and ``evaluate()``: each task is encoded once at the model's full dimension; Matryoshka
dimensions are truncations of those embeddings (identical to encoding with ``dim``). Scores are in points
(0-100), like MTEB, and each evaluator follows MTEB's protocol so that its main score equals mteb's."""

from __future__ import annotations

import os
import random
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from jaxembed.errors import UserError
from jaxembed.evaluate import scoring
from jaxembed.evaluate.prompts import (DEFAULT_INSTRUCTION_TEMPLATE, EvalEncoder, Router, as_encoder,
                                       resolve_model_path)  # noqa: F401 (resolve_model_path: re-exported)
from jaxembed.evaluate.tasks import (ClassificationData, ClusteringData, PairData, RerankingData, RetrievalData,
                                     Task, load_task_data, resolve_tasks)


# ------------------------------------------------------------------------------------------------ evaluators


def _pair_embeddings(data: PairData, emb: Callable) -> tuple[np.ndarray, np.ndarray]:
    both = emb(list(data.sentence1) + list(data.sentence2), None)  # one pass: symmetric tasks share the prompt
    return both[:len(data.sentence1)], both[len(data.sentence1):]


def _sts(data: PairData, emb: Callable, views: Callable, task: Task, seed: int) -> dict:
    a, b = _pair_embeddings(data, emb)
    out = {}
    for d, (x, y) in views(a, b):
        cos = scoring.paired_cosine(x, y)
        out[d] = {"cosine_spearman": scoring.spearman(cos, data.targets),
                  "cosine_pearson": scoring.pearson(cos, data.targets)}
    return out


def _pair_classification(data: PairData, emb: Callable, views: Callable, task: Task, seed: int) -> dict:
    a, b = _pair_embeddings(data, emb)
    labels = np.asarray(data.targets, np.int64)
    out = {}
    for d, (x, y) in views(a, b):
        cos = scoring.paired_cosine(x, y)
        acc, _ = scoring.best_accuracy(cos, labels)
        f1, prec, rec, _ = scoring.best_f1(cos, labels)
        out[d] = {"cosine_ap": scoring.average_precision(labels, cos), "cosine_accuracy": acc, "cosine_f1": f1,
                  "cosine_precision": prec, "cosine_recall": rec}
    return out


def _reranking(data: RerankingData, emb: Callable, views: Callable, task: Task, seed: int) -> dict:
    keep = [i for i, r in enumerate(data.relevance) if any(r)]  # like mteb: queries without positives are left out
    q = emb([data.queries[i] for i in keep], "query")
    flat = [c for i in keep for c in data.candidates[i]]
    docs = emb(flat, "document")
    offsets = np.cumsum([0] + [len(data.candidates[i]) for i in keep])
    qrels = {str(n): {f"{j:05d}": 1 for j, r in enumerate(data.relevance[i]) if r} for n, i in enumerate(keep)}
    out = {}
    for d, (qq, dd) in views(q, docs):
        qn, dn = scoring.normalize(qq), scoring.normalize(dd)
        rankings = {}
        for n in range(len(keep)):
            s = dn[offsets[n]:offsets[n + 1]] @ qn[n]
            order = np.lexsort((np.arange(len(s)), s))[::-1]  # ties: the later candidate first (id descending)
            rankings[str(n)] = [f"{j:05d}" for j in order[:1000]]
        out[d] = scoring.ranking_metrics(rankings, qrels, ndcg_k=(10,), mrr_k=(10,), map_k=(1000,))
    return out


def _retrieval(data: RetrievalData, emb: Callable, views: Callable, task: Task, seed: int) -> dict:
    q = emb(data.queries, "query")
    docs = emb(data.docs, "document")
    tie = scoring.tie_rank(data.doc_ids)
    out = {}
    for d, (qq, dd) in views(q, docs):
        idx, _ = scoring.top_k(qq, dd, 100, tie=tie)
        rankings = {qid: [data.doc_ids[j] for j in row] for qid, row in zip(data.query_ids, idx)}
        out[d] = scoring.ranking_metrics(rankings, data.qrels, ndcg_k=(10, 100), recall_k=(10, 100), mrr_k=(10,),
                                         map_k=(100,))
    return out


def classification_samples(labels: Sequence[str], n_experiments: int, samples_per_label: int,
                           seed: int) -> list[list[int]]:
    """MTEB's undersampling of the training split: for experiment i, the index list is shuffled again (in place,
    ``np.random.RandomState(seed)``) and the first ``samples_per_label`` rows of each label are taken."""
    idxs = list(range(len(labels)))
    wanted = len(set(labels))
    out = []
    for _ in range(n_experiments):
        np.random.RandomState(seed).shuffle(idxs)
        count: dict[str, int] = defaultdict(int)
        sel, full = [], 0
        for i in idxs:
            lab = labels[i]
            if count[lab] < samples_per_label:
                sel.append(i)
                count[lab] += 1
                full += count[lab] == samples_per_label
                if full == wanted:
                    break
        out.append(sel)
    return out


def _sklearn():
    try:
        import sklearn  # noqa: F401
    except ImportError:
        raise UserError("classification and clustering need scikit-learn: pip install 'jaxembed[eval]'") from None


def _classification(data: ClassificationData, emb: Callable, views: Callable, task: Task, seed: int) -> dict:
    _sklearn()
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import f1_score

    p = task.params
    selections = classification_samples(data.train_labels, p["n_experiments"], p["samples_per_label"], seed)
    union = sorted(set().union(*selections))
    pos = {j: n for n, j in enumerate(union)}
    train = emb([data.train_texts[j] for j in union], None)
    test = emb(data.test_texts, None)
    y_test = np.asarray(data.test_labels)
    out = {}
    for d, (tr, te) in views(train, test):
        scores = defaultdict(list)
        for sel in selections:
            clf = LogisticRegression(max_iter=p["max_iter"], random_state=seed)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                clf.fit(tr[[pos[j] for j in sel]], [data.train_labels[j] for j in sel])
            pred = clf.predict(te)
            scores["accuracy"].append(float(np.mean(pred == y_test)))
            scores["f1"].append(float(f1_score(y_test, pred, average="macro")))
            scores["f1_weighted"].append(float(f1_score(y_test, pred, average="weighted")))
        out[d] = {k: float(np.mean(v)) for k, v in scores.items()}
    return out


def _clustering(data: ClusteringData, emb: Callable, views: Callable, task: Task, seed: int) -> dict:
    _sklearn()
    from sklearn.cluster import MiniBatchKMeans
    from threadpoolctl import threadpool_limits

    p = task.params
    x = emb(data.texts, None)
    labels = np.asarray(data.labels)
    k = int(np.unique(labels).size)
    out = {}
    for d, (xx,) in views(x):
        rng = random.Random(seed)  # mteb: the task's random.Random(seed), bootstrap samples with replacement
        km = MiniBatchKMeans(n_clusters=k, batch_size=p["kmeans_batch_size"], init="k-means++", n_init=1,
                             random_state=seed)
        v = []
        for _ in range(p["n_clusters"]):
            idx = rng.choices(range(len(xx)), k=p["cluster_size"])
            with threadpool_limits(1, user_api="openmp"):  # same result; on small data far slower multi-threaded
                assign = km.fit_predict(xx[idx])
            v.append(scoring.v_measure(labels[idx], assign))
        out[d] = {"v_measure": float(np.mean(v)), "v_measure_std": float(np.std(v))}
    return out


_EVALUATORS = {"STS": _sts, "PairClassification": _pair_classification, "Reranking": _reranking,
               "Retrieval": _retrieval, "Classification": _classification, "Clustering": _clustering}


def _views(dims: Sequence[int], renormalize: bool) -> Callable:
    """views(*arrays) -> (dim, truncated arrays) for the full dimension (key None) and each Matryoshka dim."""

    def views(*arrays):
        yield None, arrays
        for d in dims or ():
            yield d, tuple(scoring.truncate(a, d, renormalize) for a in arrays)

    return views


# ------------------------------------------------------------------------------------------------ evaluate


def evaluate_task(enc: EvalEncoder, task: Task, *, dims: Sequence[int] = (), max_examples: int | None = None,
                  seed: int = 42, data_dir: Path | None = None, data=None) -> dict:
    """One task -> ``{"main_score": points, metric: points, ..., ["dims": {"64": {...}}]}``. ``data``: the task's
    data, already loaded (``load_task_data``), e.g. once for every evaluation of a training run."""
    if data is None:
        data = load_task_data(task, max_examples=max_examples, seed=seed, data_dir=data_dir)

    def emb(texts, prompt_type):
        prompt = enc.prompt(task.name, task.type, prompt_type, task.query_instruction, task.document_instruction)
        return enc.encode(texts, prompt=prompt, task_type=task.type, prompt_type=prompt_type)

    raw = _EVALUATORS[task.type](data, emb, _views(dims, enc.renormalize), task, seed)

    def points(m: dict) -> dict:
        m = {k: 100.0 * v for k, v in m.items()}
        return {"main_score": m[task.main_score], **m}

    res = points(raw[None])
    if dims:
        res["dims"] = {str(d): points(raw[d]) for d in dims}
    return res


def evaluate(model_or_encoder, tasks: str | Task | Iterable[str | Task] | None = None, *,
             dims: Sequence[int] | None = None, split: str | None = None, batch_size: int = 64,
             progress: bool = False, max_examples: int | None = None, seed: int = 42,
             prompts: Mapping[str, str] | None = None, task_instructions: bool = False,
             instruction_template: str = DEFAULT_INSTRUCTION_TEMPLATE, experts: Router | None = None,
             data_dir: str | os.PathLike | None = None,
             on_result: Callable[[Task, dict, float], None] | None = None) -> dict[str, dict]:
    """Evaluate a model on local tasks -> ``{"TaskName": {"main_score": float, metric: float, ...}}`` (points).

    model_or_encoder: a jaxembed Encoder (or any object with ``encode(texts, prompt=, batch_size=)``), a
    ``jaxembed.loading.Loaded``, or a model folder / workdir / hub id. tasks: names, or ``all`` / ``dev`` / ``eval``
    (see ``resolve_tasks``; None = all). split: map the named tasks to their ``dev`` / ``eval`` / ``both``
    variants. dims: Matryoshka dimensions, reported under ``"dims"`` (the top level is the full dimension).
    max_examples: a seeded sample of at most N test examples per task -- a cheap in-training signal (not
    comparable with the full-set scores). seed: MTEB's seed (classification undersampling, clustering
    bootstrap) and the sampling seed. prompts / task_instructions / instruction_template: see
    ``jaxembed.evaluate.prompts``. experts: MoTE routing, task type -> expert (a mapping or callable, see
    ``make_router``), passed to the encoder as ``encode(..., expert=i)``; a MoTE model without it routes by its own
    config (retrieval queries and documents to their experts). on_result(task, result, seconds): called after each
    task."""
    task_list = resolve_tasks(tasks, split)
    dims = check_dims(dims)
    encoder = as_encoder(model_or_encoder)
    enc = EvalEncoder(encoder, prompts=prompts, task_instructions=task_instructions,
                      instruction_template=instruction_template, experts=experts, batch_size=batch_size,
                      progress=progress)
    if enc.dim is not None:
        bad = [d for d in dims if d > enc.dim]
        if bad:
            raise UserError(f"--dims {bad}: larger than the model's dimension {enc.dim}")
    results: dict[str, dict] = {}
    for task in task_list:
        t0 = time.time()
        results[task.name] = evaluate_task(enc, task, dims=dims, max_examples=max_examples, seed=seed,
                                           data_dir=Path(data_dir) if data_dir else None)
        dt = time.time() - t0
        if on_result is not None:
            on_result(task, results[task.name], dt)
        elif progress:
            print(f"{task.name}: {task.main_score} {results[task.name]['main_score']:.2f} ({dt:.1f}s)",
                  file=sys.stderr)
    return results


def check_dims(dims) -> list[int]:
    if not dims:
        return []
    if isinstance(dims, str):
        dims = [x for x in dims.split(",") if x.strip()]
    out = []
    for d in dims:
        try:
            d = int(d)
        except (TypeError, ValueError):
            raise UserError(f"--dims: {d!r} is not an integer") from None
        if d <= 0:
            raise UserError(f"--dims: dimensions must be positive, got {d}")
        if d not in out:
            out.append(d)
    return out


def format_table(results: Mapping[str, Mapping], tasks: Sequence[Task] | None = None,
                 times: Mapping[str, float] | None = None) -> str:
    """A plain-text table: task, type, split, main metric, score, then one column per Matryoshka dimension."""
    from jaxembed.evaluate.tasks import get_task

    dims = []
    for r in results.values():
        for d in r.get("dims", {}):
            if d not in dims:
                dims.append(d)
    head = ["task", "type", "split", "metric", "score"] + [f"@{d}" for d in dims] + (["time"] if times else [])
    rows = []
    for name, r in results.items():
        t = get_task(name) if tasks is None else next(x for x in tasks if x.name == name)
        row = [name, t.type, t.split, t.main_score, f"{r['main_score']:.2f}"]
        row += [f"{r['dims'][d]['main_score']:.2f}" if d in r.get("dims", {}) else "" for d in dims]
        if times:
            row.append(f"{times.get(name, 0):.1f}s")
        rows.append(row)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) if i < 4 else str(c).rjust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in rows])


def format_comparison(before: Mapping[str, Mapping], after: Mapping[str, Mapping], tasks: Sequence = (),
                      labels: tuple[str, str] = ("before", "after")) -> str:
    """Two models' scores side by side (the demo's before / after table, ``jaxembed eval --compare``): task, main
    metric, each model's main score, the change; then the averages. ``tasks``: Task objects of names outside the
    registry (a user's sets); an entry of neither (``mteb:NAME``) shows ``main_score``."""
    from jaxembed.evaluate.tasks import TASKS

    known = {**TASKS, **{t.name: t for t in tasks}}
    names = [n for n in after if n in before]
    w = max([16] + [len(n) + 2 for n in names])
    a, b = (max(8, len(x) + 1) for x in labels)
    lines = [f"{'task':<{w}}{'metric':<22}{labels[0]:>{a}}{labels[1]:>{b}}{'change':>9}"]
    for n in names:
        x, y = before[n]["main_score"], after[n]["main_score"]
        metric = known[n].main_score if n in known else "main_score"
        lines.append(f"{n:<{w}}{metric:<22}{x:{a}.2f}{y:{b}.2f}{y - x:+9.2f}")
    if names:
        mx = float(np.mean([before[n]["main_score"] for n in names]))
        my = float(np.mean([after[n]["main_score"] for n in names]))
        lines.append(f"{'average':<{w + 22}}{mx:{a}.2f}{my:{b}.2f}{my - mx:+9.2f}")
    return "\n".join(lines)
