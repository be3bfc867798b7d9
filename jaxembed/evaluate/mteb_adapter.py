"""The mteb side: ``MTEBEncoder`` (mteb v2's encoder protocol around a jaxembed model; JAX forward, no torch),
the local sets as mteb custom tasks (``mteb_task`` / ``mteb_tasks``, so ``mteb.evaluate`` runs offline), and
``run_mteb`` (what ``jaxembed eval --mteb`` runs).

Importing this module imports mteb, which creates its result cache folder (``$MTEB_CACHE``, default
``~/.cache/mteb``) at import time.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

try:
    import mteb
    from mteb.models.abs_encoder import AbsEncoder
    from mteb.models.model_meta import ModelMeta, ScoringFunction
except ImportError as e:  # pragma: no cover - depends on the environment
    from jaxembed.errors import UserError

    raise UserError(f"the mteb integration needs mteb: pip install 'jaxembed[eval]' ({e})") from None

from jaxembed.errors import UserError
from jaxembed.evaluate import scoring
from jaxembed.evaluate.prompts import DEFAULT_INSTRUCTION_TEMPLATE, EvalEncoder, Router, as_encoder, model_label
from jaxembed.evaluate.tasks import (TASKS, ClassificationData, ClusteringData, PairData, RerankingData,
                                     RetrievalData, Task, get_task, load_task_data)


def _model_name(source, name: str | None) -> str:
    """mteb's model name (its result folder): ``name``, else the model's (``prompts.model_label``: a hub id, or
    ``jaxembed/<base>-<run>`` for an export)."""
    if name:
        return name if "/" in name else f"jaxembed/{name}"
    if source is not None:
        return model_label(source, slug=True)
    return "jaxembed/model"


def _n_parameters(encoder) -> int | None:
    model = getattr(encoder, "model", None)
    if model is None:
        return None
    try:
        import jax
        from flax import nnx

        return int(sum(np.size(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))))
    except Exception:  # noqa: BLE001 - metadata only
        return None


def _model_revision(source) -> str:
    """A short hash of the model folder's config and weight file sizes (cheap, changes when the model does)."""
    if source is None:
        return "no_revision_available"
    src = Path(source)
    h = hashlib.sha256()
    for p in sorted(src.rglob("*")):
        if p.is_file() and (p.suffix in (".json", ".safetensors", ".bin", ".txt", ".model")):
            h.update(str(p.relative_to(src)).encode())
            h.update(str(p.stat().st_size).encode())
            if p.suffix == ".json" and p.stat().st_size < 1_000_000:
                h.update(p.read_bytes())
    return h.hexdigest()[:12]


class MTEBEncoder(AbsEncoder):
    """mteb v2 encoder (``EncoderProtocol``) around a jaxembed model: ``mteb.evaluate(MTEBEncoder(...), tasks)``.

    model_or_encoder: a model folder / workdir / hub id, a ``jaxembed.loading.Loaded`` or a jaxembed Encoder (any
    object with ``encode(texts, prompt=, batch_size=)``). Prompts are resolved per task name / task type /
    query-document in mteb's order from the model's prompts, the task's instruction (``task_instructions=True``:
    ``TaskMetadata.prompt``; the local custom tasks carry the registry's instructions there) and ``prompts``.
    experts: MoTE routing, task type -> expert (mapping or callable, see ``make_router``), passed as
    ``encode(..., expert=i)``; a MoTE model without it routes by its own config (queries / documents apart).
    dim: Matryoshka dimension of the returned embeddings (a truncation, re-normalised when the model normalises).
    """

    def __init__(self, model_or_encoder, revision: str | None = None, *, name: str | None = None,
                 source: str | os.PathLike | None = None, prompts: Mapping[str, str] | None = None,
                 task_instructions: bool = False, instruction_template: str = DEFAULT_INSTRUCTION_TEMPLATE,
                 experts: Router | None = None, dim: int | None = None, batch_size: int = 64,
                 progress: bool = False, device: str | None = None, **load_kwargs: Any):
        if isinstance(model_or_encoder, (str, os.PathLike)):
            from jaxembed import loading
            from jaxembed.evaluate.prompts import resolve_model_path

            model_or_encoder = loading.load(resolve_model_path(model_or_encoder), **load_kwargs)
        if source is None:
            source = getattr(model_or_encoder, "source", None)  # a jaxembed.loading.Loaded knows its folder
        encoder = as_encoder(model_or_encoder)
        self.model = encoder
        self.eval_encoder = EvalEncoder(encoder, prompts=prompts, task_instructions=task_instructions,
                                        instruction_template=instruction_template, experts=experts,
                                        batch_size=batch_size, progress=progress)
        self.model_prompts = self.eval_encoder.prompts_for("", "")
        full = self.eval_encoder.dim
        if dim is not None and (dim <= 0 or (full is not None and dim > full)):
            raise UserError(f"dim must be between 1 and the model's dimension {full}, got {dim}")
        self.dim = None if dim == full else dim
        self.mteb_model_meta = ModelMeta.create_empty(overwrites=dict(
            name=_model_name(source, name),
            revision=revision or _model_revision(source),
            embed_dim=self.dim or full,
            max_tokens=getattr(getattr(encoder, "tokenizer", None), "max_length", None),
            n_parameters=_n_parameters(encoder),
            similarity_fn_name=ScoringFunction.COSINE,
            framework=["JAX"],
            use_instructions=bool(task_instructions or self.model_prompts),
            experiment_kwargs={"dim": self.dim} if self.dim else None,
        ))

    def encode(self, inputs, *, task_metadata, hf_split: str, hf_subset: str, prompt_type=None,
               **kwargs: Any) -> np.ndarray:
        """mteb's call: a DataLoader of batches with a ``text`` column -> [N, D] float32."""
        texts = [t for batch in inputs for t in batch["text"]]
        side = prompt_type.value if prompt_type is not None else None
        prompt = self.eval_encoder.prompt(task_metadata.name, task_metadata.type, side, task_metadata.prompt)
        if "batch_size" in kwargs and kwargs["batch_size"]:
            self.eval_encoder.batch_size = int(kwargs["batch_size"])
        emb = self.eval_encoder.encode(texts, prompt=prompt, task_type=task_metadata.type, prompt_type=side)
        return scoring.truncate(emb, self.dim, self.eval_encoder.renormalize)

    def similarity(self, embeddings1, embeddings2):
        return mteb.similarity_functions.cos_sim(embeddings1, embeddings2)

    def similarity_pairwise(self, embeddings1, embeddings2):
        return mteb.similarity_functions.pairwise_cos_sim(embeddings1, embeddings2)


# ------------------------------------------------------------------------------------------------ custom tasks


def _data_revision(task: Task, max_examples: int | None, seed: int) -> str:
    h = hashlib.sha256()
    for role in sorted(task.files):
        p = task.path(role)
        h.update(role.encode())
        if p.exists():
            h.update(p.read_bytes())
    rev = h.hexdigest()[:12]
    return rev if max_examples is None else f"{rev}-n{max_examples}-s{seed}"


def _metadata(task: Task, max_examples: int | None, seed: int):
    from mteb.abstasks.task_metadata import TaskMetadata

    if task.symmetric:
        prompt = task.query_instruction or None
    else:
        prompt = {k: v for k, v in (("query", task.query_instruction), ("document", task.document_instruction))
                  if v} or None
    return TaskMetadata(
        name=task.name,
        description=task.description + f" (jaxembed local task, {task.split} split: "
                                       f"{', '.join(task.files.values())})",
        dataset={"path": f"jaxembed-local/{task.name}", "revision": _data_revision(task, max_examples, seed)},
        type=task.type, category="t2t", modalities=["text"], eval_splits=[task.hf_split],
        eval_langs=["eng-Latn"], main_score=task.main_score, prompt=prompt, dialect=[], bibtex_citation="",
        sample_creation="found")


def _dataset_dict(task: Task, data) -> Any:
    from datasets import Dataset, DatasetDict

    split = task.hf_split
    if isinstance(data, PairData):
        key = "score" if task.type == "STS" else "labels"
        vals = [float(x) for x in data.targets] if task.type == "STS" else [int(x) for x in data.targets]
        return {"default": DatasetDict({split: Dataset.from_dict(
            {"sentence1": list(data.sentence1), "sentence2": list(data.sentence2), key: vals})})}
    if isinstance(data, ClassificationData):
        # integer labels (mteb's metrics need them), numbered in sorted name order: the order sklearn gives the
        # local evaluator's string labels, so both fit the same classifier
        code = {name: i for i, name in enumerate(sorted(set(data.train_labels) | set(data.test_labels)))}
        return {"default": DatasetDict({
            "train": Dataset.from_dict({"text": data.train_texts, "label": [code[x] for x in data.train_labels]}),
            split: Dataset.from_dict({"text": data.test_texts, "label": [code[x] for x in data.test_labels]})})}
    if isinstance(data, ClusteringData):
        return {"default": DatasetDict({split: Dataset.from_dict(
            {"sentences": data.texts, "labels": data.labels})})}
    if isinstance(data, RetrievalData):
        return {"default": {split: {
            "corpus": Dataset.from_dict({"id": data.doc_ids, "text": data.docs}),
            "queries": Dataset.from_dict({"id": data.query_ids, "text": data.queries}),
            "relevant_docs": {q: dict(v) for q, v in data.qrels.items()},
            "top_ranked": None}}}
    if isinstance(data, RerankingData):
        # one document per (query, candidate): ids "q00012-00003" sort like the candidate index, so mteb's
        # tie-break (doc id descending) equals the local one (later candidate first)
        doc_ids, docs, q_ids, qrels, top = [], [], [], {}, {}
        for i, (q, cands, rels) in enumerate(zip(data.queries, data.candidates, data.relevance)):
            qid = f"q{i:05d}"
            q_ids.append(qid)
            ids = [f"{qid}-{j:05d}" for j in range(len(cands))]
            doc_ids += ids
            docs += cands
            qrels[qid] = {d: 1 for d, r in zip(ids, rels) if r}
            top[qid] = ids
        return {"default": {split: {
            "corpus": Dataset.from_dict({"id": doc_ids, "text": docs}),
            "queries": Dataset.from_dict({"id": q_ids, "text": list(data.queries)}),
            "relevant_docs": qrels, "top_ranked": top}}}
    raise TypeError(type(data))


class _ListColumns:
    """A datasets.Dataset whose columns read as plain lists. mteb's classification undersampling indexes the
    label column row by row, which on a lazy datasets column decodes one row per index (SST-2's 67k training rows
    x 10 experiments); through this view the columns are plain lists, read once, and mteb's own code runs
    unchanged."""

    def __init__(self, dataset):
        self._ds = dataset
        self._cols: dict = {}

    def __len__(self):
        return len(self._ds)

    def __getitem__(self, key):
        if isinstance(key, str):
            if key not in self._cols:
                self._cols[key] = self._ds.select_columns([key])[:][key]
            return self._cols[key]
        return self._ds[key]

    def __getattr__(self, name):
        return getattr(self._ds, name)


def _fast_undersample(base):
    def _undersample_data(self, dataset, experiment_num, idxs=None):
        return base._undersample_data(self, _ListColumns(dataset), experiment_num, idxs)

    return _undersample_data


def _fast_experiment(base):
    """mteb's classification experiment with its train and test splits seen through ``_ListColumns``: its
    classifier and its nine metric calls per experiment each turn a label column into an array, which on a lazy
    datasets column goes row by row; as a list it is read once."""
    def _run_experiment(self, train_split, eval_split, *args, **kwargs):
        return base._run_experiment(self, _ListColumns(train_split), _ListColumns(eval_split), *args, **kwargs)

    return _run_experiment


def _single_thread_openmp(base):
    """sklearn's MiniBatchKMeans gives the same clusters with one OpenMP thread, and on small data is much faster
    than with several (thread synchronisation dominates)."""

    def _evaluate_subset(self, *args, **kwargs):
        from threadpoolctl import threadpool_limits

        with threadpool_limits(1, user_api="openmp"):
            return base._evaluate_subset(self, *args, **kwargs)

    return _evaluate_subset


def _base_class(task: Task):
    from mteb.abstasks.classification import AbsTaskClassification
    from mteb.abstasks.clustering import AbsTaskClustering
    from mteb.abstasks.pair_classification import AbsTaskPairClassification
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.sts import AbsTaskSTS
    from sklearn.linear_model import LogisticRegression

    p = task.params
    if task.type == "STS":
        return AbsTaskSTS, {"min_score": task.score_range[0], "max_score": task.score_range[1]}
    if task.type == "PairClassification":
        return AbsTaskPairClassification, {}
    if task.type in ("Retrieval", "Reranking"):
        return AbsTaskRetrieval, {}
    if task.type == "Classification":
        return AbsTaskClassification, {"n_experiments": p["n_experiments"], "samples_per_label": p["samples_per_label"],
                                       "evaluator_model": LogisticRegression(max_iter=p["max_iter"]),
                                       "_undersample_data": _fast_undersample(AbsTaskClassification),
                                       "_run_experiment": _fast_experiment(AbsTaskClassification)}
    if task.type == "Clustering":
        return AbsTaskClustering, {"max_fraction_of_documents_to_embed": None, "max_document_to_embed": None,
                                   "max_documents_per_cluster": p["cluster_size"], "n_clusters": p["n_clusters"],
                                   "k_mean_batch_size": p["kmeans_batch_size"],
                                   "_evaluate_subset": _single_thread_openmp(AbsTaskClustering)}
    raise UserError(f"task {task.name}: no mteb task type for {task.type}")


def mteb_task(name: str | Task, *, max_examples: int | None = None, seed: int = 42,
              data_dir: Path | None = None):
    """A local task as an mteb task object (data read from the local files; runs offline). max_examples / seed:
    the same seeded sample as ``evaluate(..., max_examples=, seed=)``; seed is also the mteb task seed."""
    task = get_task(name)
    base, attrs = _base_class(task)
    metadata = _metadata(task, max_examples, seed)

    def load_data(self, num_proc=None, *, timer=None, **kwargs):
        if self.data_loaded:
            return
        self.dataset = _dataset_dict(task, load_task_data(task, max_examples=max_examples, seed=seed,
                                                          data_dir=data_dir))
        self.data_loaded = True

    cls = type(f"Local{task.name.replace('-', '_')}", (base,),
               {"metadata": metadata, "load_data": load_data, "__module__": __name__, **attrs})
    return cls(seed=seed)


def mteb_tasks(names: str | Iterable[str] | None = None, *, split: str | None = None,
               max_examples: int | None = None, seed: int = 42) -> list:
    """Local tasks (names / all / dev / eval, as ``resolve_tasks``) as mteb task objects."""
    from jaxembed.evaluate.tasks import resolve_tasks

    return [mteb_task(t, max_examples=max_examples, seed=seed) for t in resolve_tasks(names, split)]


def _resolve_mteb_tasks(names: str | Iterable[str], split: str | None, max_examples: int | None, seed: int):
    """Each name: a local task (offline custom task), ``mteb:NAME`` or an unknown name -> the MTEB task."""
    from jaxembed.evaluate.tasks import resolve_tasks

    if isinstance(names, str):
        names = [names]
    flat = [n.strip() for x in names for n in str(x).split(",") if n.strip()]
    out = []
    for n in flat:
        if n.startswith("mteb:"):
            n = n[5:]
        elif n in TASKS or n in ("all", "dev", "eval") or split is not None and any(
                t.family == n for t in TASKS.values()):
            out += [mteb_task(t, max_examples=max_examples, seed=seed) for t in resolve_tasks(n, split)]
            continue
        try:
            out.append(mteb.get_task(n))
        except KeyError:
            raise UserError(f"unknown task {n!r}: neither a local task nor an MTEB task (local tasks: "
                            f"{', '.join(TASKS)}; MTEB tasks: mteb.get_tasks())") from None
    return out


def scores_of(result, dim_points: bool = True) -> dict:
    """A TaskResult -> {"main_score": points, metric: points, ...} for its first split and subset."""
    split = next(iter(result.scores))
    s = result.scores[split][0]
    out = {"main_score": 100.0 * float(s["main_score"])}
    for k, v in s.items():
        if k in ("main_score", "hf_subset", "languages") or isinstance(v, (dict, list, str)) or v is None:
            continue
        if isinstance(v, float) and np.isnan(v):
            continue
        out[k] = 100.0 * float(v)
    return out


def run_mteb(model_or_encoder, tasks: str | Iterable[str], *, out: str | os.PathLike | None = None,
             dims: Sequence[int] | None = None, split: str | None = None, batch_size: int = 64,
             max_examples: int | None = None, seed: int = 42, name: str | None = None,
             prompts: Mapping[str, str] | None = None, task_instructions: bool = False,
             instruction_template: str = DEFAULT_INSTRUCTION_TEMPLATE, experts: Router | None = None,
             progress: bool = False, overwrite: bool = True, packing: bool | None = None) -> dict[str, dict]:
    """Run ``mteb.evaluate`` on local tasks (offline custom tasks) and / or MTEB tasks (their data from the hub
    or the local Hugging Face cache). Writes mteb's result files under ``out`` (``out/results/<model>/<revision>/
    <Task>.json``; Matryoshka dims under ``experiments/dim_<D>``) when given. -> {"Task": {"main_score": points,
    ...}} with the full dimension at the top level and ``"dims"`` like ``evaluate``. packing: pack several texts
    per row (True) or pad one per row (False); None: the encoder's own setting (packed by default)."""
    import copy

    from jaxembed.evaluate.runner import check_dims

    dims = check_dims(dims)
    task_objs = _resolve_mteb_tasks(tasks, split, max_examples, seed)
    source = getattr(model_or_encoder, "source", None)
    if isinstance(model_or_encoder, (str, os.PathLike)):
        from jaxembed import loading
        from jaxembed.evaluate.prompts import resolve_model_path

        model_or_encoder = loading.load(resolve_model_path(model_or_encoder))
        source = model_or_encoder.source
    base = as_encoder(model_or_encoder)  # one Encoder (one set of compilations) for every dim
    if packing is not None and packing != base.packing:
        base = copy.copy(base)  # the caller's encoder keeps its setting
        base.packing = bool(packing)
    cache = mteb.ResultCache(cache_path=str(out)) if out is not None else None
    if not progress:
        import datasets

        datasets.disable_progress_bars()
    results: dict[str, dict] = {}
    for dim in [None, *dims]:
        enc = MTEBEncoder(base, name=name, source=source, prompts=prompts, task_instructions=task_instructions,
                          instruction_template=instruction_template, experts=experts, dim=dim,
                          batch_size=batch_size, progress=progress)
        from threadpoolctl import threadpool_limits

        try:
            with threadpool_limits(1, user_api="openmp"):  # k-means: same result, far faster (see above)
                res = mteb.evaluate(enc, task_objs, cache=cache,
                                    overwrite_strategy="always" if overwrite else "only-missing",
                                    encode_kwargs={"batch_size": batch_size, "show_progress_bar": progress},
                                    show_progress_bar=progress, co2_tracker=False)
        except OSError as e:  # no network / dataset not in the local cache (datasets' errors are OSErrors)
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise UserError(f"mteb.evaluate failed: {type(e).__name__}: {msg} (MTEB tasks need their datasets: "
                            "the hub, or the local Hugging Face cache when offline)") from e
        for tr in res.task_results:
            sc = scores_of(tr)
            if dim is None:
                results[tr.task_name] = sc
            else:
                results.setdefault(tr.task_name, {}).setdefault("dims", {})[str(dim)] = sc
    return results


def write_json(obj, path: str | os.PathLike) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
