"""``jaxembed score``, ``jaxembed curriculum`` and ``jaxembed mine``: the offline jobs that read a dataset store and
a reference model and write files the batch plan (``jaxembed plan build``) consumes.

``add_parsers(subparsers)`` adds the three commands (``func`` returns the exit status; a UserError is printed on one
line by the main CLI, exit status 2). The jobs are also Python functions: ``run_score``, ``run_curriculum`` and
``run_mine``.

- ``score --model M --store DIR | --config FILE[:VARIANT] --out DIR [--unit dataset|task] [--n-task-queries N]
  [--seed S] [--negatives min|mean]``: encodes every instructed query and document of the store with the reference
  model (cached per shard under DIR/cache: a killed run resumes), and writes::

      DIR/task_similarity.npz   Eq. 5 matrix [U, U], unit names, unit kind, n_t per unit (Eq. 4)
      DIR/task_similarity.png   its heat map
      DIR/scores.npz            phi (Eq. 8) per example, one float64 array per dataset name (plan.scores)
      DIR/score_summary.json    settings, the store, per-dataset phi statistics, timings

- ``curriculum --scores-dir DIR --out DIR [--objective max|min|random] [--solver anneal|2opt|exact] ...``: solves
  the task order (Eq. 6 / 7) and writes::

      DIR/task_order.json       {"order": [unit names], ...}          (plan.curriculum.task_order)
      DIR/instance_orders.json  {unit: [[dataset, index], ...]}        (plan.curriculum.instance_orders)
      DIR/plan_curriculum.json  the plan-config overrides: jaxembed plan build --config DIR/plan_curriculum.json
      DIR/curriculum_summary.json  objective values, mask counts

- ``mine --model M --input FILE | --store DIR --dataset NAME --out mined.jsonl [--report R.json] ...``: hard-negative
  mining with ranking-consistency filtering (``jaxembed.mining``); the output is a triplets file that
  ``jaxembed data prepare`` reads, carrying the dataset's instruction.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from jaxembed.errors import UserError

SCORE_FILES = ("task_similarity.npz", "task_similarity.png", "scores.npz", "score_summary.json")


# ============================================================================================== parsers

def _model_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--model", required=required, default=None,
                   help="reference model: folder (HF / sentence-transformers / jaxembed export) or hub id")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="computation dtype (default float32)")
    p.add_argument("--max-length", type=int, default=None,
                   help="tokenizer limit in tokens (default: the model's); each dataset's max_query_length / "
                        "max_doc_length still apply below it, as in training")
    p.add_argument("--pooling", default=None, choices=["mean", "cls", "lasttoken", "max", "mean_sqrt_len"],
                   help="override the folder's pooling")
    p.add_argument("--bidirectional", action="store_true", help="Qwen2/3 backbones: bidirectional attention")
    p.add_argument("--batch-size", type=int, default=64, help="encoding batch (split over all devices)")
    p.add_argument("--no-packing", action="store_true",
                   help="pad one text per row instead of packing several (the default, jaxembed.encode); a --config "
                        "with data.packing=False does the same")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def add_parsers(subparsers) -> None:
    """Add ``score``, ``curriculum`` and ``mine`` to an argparse sub-parsers object."""
    p = subparsers.add_parser(
        "score", help="reference-model scores for a store: task similarity (Data-CUBE Eq. 4-5) and instance "
                      "difficulty phi (Eq. 8)",
        description="Encode the store's instructed queries and documents with a reference model and write the task "
                    "similarity matrix (+ heat map) and phi per example. Embeddings are cached per shard under "
                    "OUT/cache: rerun the same command to resume a killed run.")
    _model_args(p, required=False)
    p.add_argument("--store", default=None, metavar="DIR", help="dataset store (jaxembed data prepare)")
    p.add_argument("--config", default=None, metavar="FILE[:VARIANT]",
                   help="a run config: its data.store, or its data config prepared into OUT/store; its model "
                        "(name, max_length, dtype) when --model is not given")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.add_argument("--unit", default=None, choices=["dataset", "task"],
                   help="what the curriculum orders: single datasets (Data-CUBE's task is a MEDI dataset) or the "
                        "data config's tasks, their datasets pooled (default: the --config's "
                        "plan.curriculum.unit, else dataset)")
    p.add_argument("--n-task-queries", type=int, default=1000, metavar="N",
                   help="n_t of Eq. 4: queries sampled per unit for its representation (default 1000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--negatives", default="min", choices=["min", "mean"],
                   help="several negatives: phi against the hardest (min, default) or the mean negative similarity")
    p.add_argument("--sampled-negatives", type=int, default=7, metavar="K",
                   help="examples without negatives: phi against K positives of other examples (default 7)")
    p.add_argument("--similarity-only", action="store_true",
                   help="only the task similarity: encode the sampled queries, no phi")
    p.add_argument("--shard-size", type=int, default=2048, help="texts per cached shard (default 2048)")
    p.set_defaults(func=cmd_score)

    c = subparsers.add_parser(
        "curriculum", help="Data-CUBE task order (simulated annealing, Eq. 6-7), instance orders and mask",
        description="Solve the task order on a task similarity matrix, order each unit's instances by phi, and "
                    "write the files (and the plan-config overrides) for jaxembed plan build.")
    c.add_argument("--scores-dir", required=True, metavar="DIR", help="the output folder of jaxembed score")
    c.add_argument("--out", required=True, metavar="DIR", help="output folder (may be the scores folder)")
    c.add_argument("--store", default=None, metavar="DIR", help="the store (default: the one the scores name)")
    c.add_argument("--objective", default="max", choices=["max", "min", "random"],
                   help="maximise the cyclic task similarity (Data-CUBE, default), minimise it (MQMin) or a random "
                        "order (MQRand)")
    c.add_argument("--solver", default="anneal", choices=["anneal", "2opt", "exact"],
                   help="simulated annealing as the paper (default), 2-opt / Or-opt iterated local search, or "
                        "Held-Karp (exact, <= 16 units)")
    c.add_argument("--iterations", type=int, default=2_000_000, help="annealing iterations N (default 2,000,000)")
    c.add_argument("--tau0", type=float, default=None,
                   help="initial temperature (default: a random worsening swap is accepted with probability 1/2)")
    c.add_argument("--cooling", type=float, default=None,
                   help="alpha of tau <- alpha * tau (default: tau falls 100x over the iterations)")
    c.add_argument("--patience", type=int, default=0,
                   help="stop the annealing after this many iterations without a new best (0 = run all)")
    c.add_argument("--kicks", type=int, default=200, help="2opt solver: perturbation rounds (default 200)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--instance-order", default="e2d", choices=["e2d", "d2e", "random"],
                   help="instances per unit: easy to difficult (phi descending, default), difficult to easy, random")
    c.add_argument("--walk", default="cyclic", choices=["cyclic", "balanced"],
                   help="plan.curriculum.walk of the written plan config: Algorithm 1's cyclic walk (default) or "
                        "the balanced walk (each unit visited in proportion to its size; see "
                        "jaxembed.data.plan.walk_order)")
    c.add_argument("--delta", type=float, default=None,
                   help="Eq. 9 mask threshold: an example with phi < delta gets loss weight 0 (default: no mask)")
    c.add_argument("--mask-direction", default="text", choices=["text", "printed"],
                   help="'text' (alpha = 0 where phi < delta, default) or Eq. 9 as printed")
    c.set_defaults(func=cmd_curriculum)

    m = subparsers.add_parser(
        "mine", help="hard-negative mining with ranking-consistency filtering (KaLM)",
        description="Encode the queries and the corpus, rank the corpus for every query (exact blocked top-k over "
                    "all devices, or IVF), drop pairs whose positive is not in the top-k, sample negatives from a "
                    "rank window, and write a dataset file plus a report.")
    _model_args(m)
    m.add_argument("--input", default=None, metavar="FILE", help="a dataset file (JSON Lines, any jaxembed format)")
    m.add_argument("--format", default="auto",
                   choices=["auto", "triplets", "scored_pairs", "labelled_pairs", "classification"],
                   help="--input record format (default: from the first record)")
    m.add_argument("--score-threshold", type=float, default=None, help="--input scored pairs: positive threshold")
    m.add_argument("--task-type", default=None,
                   choices=["retrieval", "reranking", "sts", "pair_classification", "classification", "clustering",
                            "nli"],
                   help="--input: the task type written into the mined records (default: the records' BGE type)")
    m.add_argument("--store", default=None, metavar="DIR", help="or a dataset store ...")
    m.add_argument("--dataset", default=None, metavar="NAME", help="... and one of its datasets")
    m.add_argument("--corpus", default=None, metavar="FILE",
                   help="corpus texts (JSON Lines with --corpus-field, or one text per line); default: every "
                        "positive and negative of the dataset. The positives are always added")
    m.add_argument("--corpus-field", default="text", help="JSON field of a --corpus file (default text)")
    m.add_argument("--query-instruction", default=None,
                   help="query prefix; a typed \\n is a newline, e.g. 'Instruct: Given a question, retrieve "
                        "passages that answer it. \\n Query: ' (default: the store's, or the BGE prompt of the "
                        "records, else none)")
    m.add_argument("--doc-instruction", default=None, help="document prefix (default: the store's, else none)")
    m.add_argument("--out", required=True, metavar="FILE.jsonl", help="the mined dataset (triplets)")
    m.add_argument("--report", default=None, metavar="FILE.json", help="default: OUT with .report.json")
    m.add_argument("--top-k", type=int, default=50, help="ranking-consistency threshold k (default 50)")
    m.add_argument("--window", default="50:100", metavar="A:B",
                   help="ranks to sample negatives from, 0-based, B excluded (default 50:100)")
    m.add_argument("--num-negatives", type=int, default=7, help="negatives per example (default 7)")
    m.add_argument("--margin", type=float, default=None,
                   help="drop a candidate scoring above MARGIN x the score of the query's weakest kept positive (a likely "
                        "false negative; e.g. 0.95; default off)")
    m.add_argument("--approx", default="none", choices=["none", "ivf"],
                   help="approximate search for very large corpora: an IVF index (k-means lists)")
    m.add_argument("--nlist", type=int, default=None, help="IVF lists (default sqrt(corpus size))")
    m.add_argument("--nprobe", type=int, default=8, help="IVF lists searched per query (default 8)")
    m.add_argument("--block-q", type=int, default=256, help="queries per search block (default 256)")
    m.add_argument("--block-c", type=int, default=4096, help="corpus rows per device per block (default 4096)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--on-error", default="stop", choices=["stop", "skip"],
                   help="--input: stop at the first bad record (default) or skip and count it")
    m.set_defaults(func=cmd_mine)


# ============================================================================================== helpers

_LOADED: dict = {}  # (model files, load options) -> (Loaded, Encoder): one compilation per process and model


def _load_model(name, args, config=None):
    """(Loaded, Encoder) of the reference model; reused within a process while the model's files are unchanged, so
    that several jobs in one process (or a notebook) compile the encoder once."""
    from jaxembed import hf
    from jaxembed.encode import Encoder

    kw = {}
    kw["dtype"] = getattr(args, "dtype", None) or (config.model.dtype if config is not None else None) or "float32"
    ml = getattr(args, "max_length", None) or (config.model.max_length if config is not None else 0) or None
    if ml:
        kw["max_length"] = ml
    pooling = getattr(args, "pooling", None) or (config.model.pooling if config is not None else "") or None
    if pooling:
        kw["pooling"] = pooling
    if getattr(args, "bidirectional", False):
        kw["causal"] = False
    elif config is not None and config.model.get("causal") is not None:
        kw["causal"] = config.model.causal
    folder = hf.resolve(name)
    stamp = tuple(sorted((str(f.relative_to(folder)), f.stat().st_size, f.stat().st_mtime_ns)
                         for f in folder.rglob("*") if f.is_file() and f.suffix in (".json", ".safetensors", ".bin")))
    key = (str(folder.resolve()), stamp, tuple(sorted(kw.items())))
    if key not in _LOADED:
        loaded = hf.load(folder, **kw)
        _LOADED.clear()  # keep one model alive at most
        _LOADED[key] = (loaded, Encoder.from_loaded(loaded))
    loaded, enc = _LOADED[key]
    # packed rows (the default) or padded ones: the same embeddings (jaxembed.encode), the padded path for comparison
    enc.packing = not (getattr(args, "no_packing", False) or (config is not None and not _config_packing(config)))
    return loaded, enc


def _config_packing(config) -> bool:
    from jaxembed.config import packing_enabled

    return packing_enabled(config) if "data" in config else True


def _model_key(loaded, encoder) -> str:
    from jaxembed.mining import model_fingerprint

    return f"{Path(loaded.source).resolve()}|{model_fingerprint(encoder)}"


def _limit(value, cap):
    if cap is None:
        return value or None
    return min(int(value or cap), int(cap))


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


# ============================================================================================== score

def _dataset_texts(store, d: int, indices: np.ndarray | None, need_docs: bool):
    """Unique query texts (+ example -> row) and, with need_docs, unique document texts with each example's positive
    and negative rows. Reads the store in chunks."""
    info = store.datasets[d]
    idx = np.arange(info.size) if indices is None else np.asarray(indices, np.int64)
    q_rows, q_index, d_index = [], {}, {}
    pos_ids, neg_ids = [], []
    for s in range(0, len(idx), 8192):
        for e in store.examples(d, idx[s:s + 8192].tolist()):
            q_rows.append(q_index.setdefault(e["query"], len(q_index)))
            if need_docs:
                p = [d_index.setdefault(t, len(d_index)) for t in e["pos"]]
                n = [d_index.setdefault(t, len(d_index)) for t in e["neg"]]
                pos_ids.append(p)
                neg_ids.append(n)
    q_texts = list(q_index)
    d_texts = list(d_index)
    return np.array(q_rows, np.int64), q_texts, d_texts, pos_ids, neg_ids


def run_score(encoder, store, out, *, unit: str = "dataset", n_task_queries: int = 1000, seed: int = 0,
              negatives: str = "min", sampled_negatives: int = 7, similarity_only: bool = False,
              shard_size: int = 2048, batch_size: int = 64, model_key: str | None = None, model_name: str = "",
              progress: bool | None = None) -> dict:
    """The ``jaxembed score`` job on an opened Store with an Encoder: writes SCORE_FILES into ``out`` and returns the
    summary. Embeddings are cached under ``out/cache`` (per dataset, per shard of ``shard_size`` texts)."""
    from jaxembed.curriculum import difficulty as dif
    from jaxembed.curriculum import similarity as sim
    from jaxembed.mining import encode_texts, model_fingerprint, normalize, progress_bar

    if negatives not in dif.REDUCE:
        raise UserError(f"--negatives {negatives!r}: one of {', '.join(dif.REDUCE)}")
    if shard_size < 1 or batch_size < 1:
        raise UserError("--shard-size and --batch-size must be positive")
    t0 = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    infos = store.datasets
    sizes = [int(i.size) for i in infos]
    units = sim.curriculum_units(infos, unit)
    samples = sim.sample_queries(units, sizes, n_task_queries, seed)
    model_key = model_key or model_fingerprint(encoder)
    tok = getattr(encoder, "tokenizer", None)
    cap = getattr(tok, "max_length", None)
    mote = getattr(encoder, "mote", None) is not None  # a MoTE reference model: each text through its task's expert

    def ekw(info, side):
        return {"task": info.task_type, "side": side} if mote else None

    # pass 1: the texts of every dataset
    per = []
    for d, info in enumerate(infos):
        indices = None
        if similarity_only:
            indices = np.unique(np.concatenate([s[s[:, 0] == d, 1] for s in samples.values()] + [np.zeros(0,
                                                                                                  np.int64)]))
        q_rows, q_texts, d_texts, pos_ids, neg_ids = _dataset_texts(store, d, indices, not similarity_only)
        per.append(dict(indices=indices, q_rows=q_rows, q_texts=q_texts, d_texts=d_texts, pos_ids=pos_ids,
                        neg_ids=neg_ids))
    total = sum(len(p["q_texts"]) + len(p["d_texts"]) for p in per)

    # pass 2: encode (cached per shard)
    cache = out / "cache"
    t1 = time.time()
    with progress_bar(total, "score: encode", progress) as bar:
        for d, (info, p) in enumerate(zip(infos, per)):
            bar.set_postfix_str(info.name)
            p["Q"] = normalize(encode_texts(
                encoder, p["q_texts"], prompt=info.query_instruction, max_length=_limit(info.max_query_length, cap),
                batch_size=batch_size, cache_dir=cache, name=f"{info.name}.queries", shard_size=shard_size,
                model_key=model_key, bar=bar, encode_kw=ekw(info, "query")))
            if not similarity_only:
                p["D"] = normalize(encode_texts(
                    encoder, p["d_texts"], prompt=info.doc_instruction, max_length=_limit(info.max_doc_length, cap),
                    batch_size=batch_size, cache_dir=cache, name=f"{info.name}.docs", shard_size=shard_size,
                    model_key=model_key, bar=bar, encode_kw=ekw(info, "document")))
    t_enc = time.time() - t1

    # Eq. 4 / 5 over the units
    reps, counts = [], []
    for u, members in units.items():
        s = samples[u]
        rows = []
        for d in members:
            ex = s[s[:, 0] == d, 1]
            if ex.size == 0:
                continue
            p = per[d]
            pos_in = ex if p["indices"] is None else np.searchsorted(p["indices"], ex)
            rows.append(p["Q"][p["q_rows"][pos_in]])
        emb = np.concatenate(rows)
        reps.append(sim.task_representation(emb))
        counts.append(emb.shape[0])
    S = sim.task_similarity(np.stack(reps))
    names = list(units)
    meta = {"model": model_name, "model_key": model_key, "seed": seed, "n_task_queries": n_task_queries,
            "store": str(Path(store.path).resolve())}
    sim.save_similarity(out / "task_similarity.npz", S, names, unit, counts, meta)
    renderer = sim.render_heatmap(S, names, out / "task_similarity.png",
                                  title=f"task similarity: {len(names)} {unit}s")

    # Eq. 8 per example
    datasets = []
    scores = {}
    for d, (info, p) in enumerate(zip(infos, per)):
        entry = {"name": info.name, "task": info.task, "task_type": info.task_type, "size": info.size,
                 "query_texts": len(p["q_texts"]), "doc_texts": len(p["d_texts"])}
        if not similarity_only:
            n_ex = len(p["pos_ids"])
            own = np.array([len(x) > 0 for x in p["neg_ids"]])
            neg_ids = p["neg_ids"]
            if not own.all():
                sampled = dif.sampled_negatives(p["pos_ids"], sampled_negatives, seed * 1_000_003 + d)
                neg_ids = [x if o else s for x, o, s in zip(neg_ids, own, sampled)]
            none = np.array([len(x) == 0 for x in neg_ids])
            pos_off = np.concatenate([[0], np.cumsum([len(x) for x in p["pos_ids"]])])
            neg_off = np.concatenate([[0], np.cumsum([len(x) for x in neg_ids])])
            ex_pos = np.repeat(np.arange(n_ex), np.diff(pos_off))
            ex_neg = np.repeat(np.arange(n_ex), np.diff(neg_off))
            flat_pos = np.array([i for x in p["pos_ids"] for i in x], np.int64)
            flat_neg = np.array([i for x in neg_ids for i in x], np.int64)
            ps = dif.pair_similarity(p["Q"], p["D"], p["q_rows"][ex_pos], flat_pos)
            ns = dif.pair_similarity(p["Q"], p["D"], p["q_rows"][ex_neg], flat_neg)
            if none.any():  # a one-example dataset has nothing to compare with: phi = sim(q, p) there
                pos_mean = dif.segment_reduce(ps, pos_off, "mean")
                neg_red = dif.segment_reduce(ns, neg_off, "max" if negatives == "min" else "mean")
                v = np.where(none, pos_mean, pos_mean - np.nan_to_num(neg_red))
            else:
                v = dif.phi(ps, pos_off, ns, neg_off, negatives)
            scores[info.name] = v
            entry.update(phi=dif.phi_stats(v), negatives_own=int(own.sum()),
                         negatives_sampled=int((~own & ~none).sum()), negatives_none=int(none.sum()))
        datasets.append(entry)
    if not similarity_only:
        np.savez(out / "scores.npz", **scores)
    summary = {"model": model_name, "model_key": model_key, "store": str(Path(store.path).resolve()),
               "unit": unit, "units": {u: [infos[d].name for d in m] for u, m in units.items()},
               "n_task_queries": n_task_queries, "queries_per_unit": dict(zip(names, counts)), "seed": seed,
               "negatives": negatives, "sampled_negatives": sampled_negatives, "similarity_only": similarity_only,
               "heatmap": renderer, "datasets": datasets, "similarity": np.round(S, 5).tolist(),
               "texts_encoded": total, "seconds_encode": round(t_enc, 2), "seconds": round(time.time() - t0, 2),
               "files": [f for f in SCORE_FILES if (out / f).exists() or f == "score_summary.json"]}
    _write_json(out / "score_summary.json", summary)
    return summary


def cmd_score(args) -> int:
    from jaxembed import runfiles
    from jaxembed.data.store import Store

    runfiles.single_host_only("jaxembed score")

    if (args.store is None) == (args.config is None):
        raise UserError("score: give exactly one of --store DIR or --config FILE[:VARIANT]")
    config = None
    if args.config:
        from jaxembed import config as cfglib

        config = cfglib.load_config_file(args.config)
        if "data" not in config:
            raise UserError(f"--config {args.config}: no data section (fix: a run config, e.g. configs/demo.py)")
        if config.data.get("store"):
            store = Store.open(config.data.store)
        else:
            sdir = Path(args.out) / "store"
            if not (sdir / "manifest.json").exists():
                from jaxembed.data.store import write_store

                print(f"preparing the data config of {args.config} into {sdir}")
                write_store(cfglib.data_section(config), sdir)
            store = Store.open(sdir)
    else:
        store = Store.open(args.store)
    name = args.model or (config.model.name if config is not None else "")
    if not name:
        raise UserError("score: --model is required (or a --config whose model.name is set)")
    unit = args.unit
    if unit is None:  # the unit the config's plan orders, so that its curriculum finds its units
        cur = (config.get("plan") or {}).get("curriculum") or {} if config is not None else {}
        unit = str(cur.get("unit") or "dataset")
    loaded, enc = _load_model(name, args, config)
    s = run_score(enc, store, args.out, unit=unit, n_task_queries=args.n_task_queries, seed=args.seed,
                  negatives=args.negatives, sampled_negatives=args.sampled_negatives,
                  similarity_only=args.similarity_only, shard_size=args.shard_size, batch_size=args.batch_size,
                  model_key=_model_key(loaded, enc), model_name=str(name), progress=not args.quiet)
    out = Path(args.out)
    if not args.similarity_only:
        w = max(len(d["name"]) for d in s["datasets"])
        print(f"{'dataset':<{w}}  {'size':>7}  {'phi mean':>8}  {'p10':>7}  {'median':>7}  {'< 0':>6}  negatives")
        for d in s["datasets"]:
            ph = d["phi"]
            src = "own" if not d["negatives_sampled"] else f"sampled ({d['negatives_sampled']})"
            print(f"{d['name']:<{w}}  {d['size']:>7}  {ph['mean']:>8.3f}  {ph['p10']:>7.3f}  {ph['median']:>7.3f}  "
                  f"{ph['share_below_0']:>6.1%}  {src}")
    print(f"task similarity over {len(s['units'])} {s['unit']}s -> {out / 'task_similarity.npz'} "
          f"(heat map {out / 'task_similarity.png'}: {s['heatmap']})")
    print(f"wrote {', '.join(s['files'])} in {out} ({s['texts_encoded']} texts, encode {s['seconds_encode']:.1f}s, "
          f"total {s['seconds']:.1f}s)")
    return 0


# ============================================================================================== curriculum

def _plan_units(store, unit: str) -> dict[str, list[int]]:
    """The units ``plan`` orders: those with a dataset of epochs > 0 and size > 0."""
    from jaxembed.curriculum.similarity import curriculum_units

    units = curriculum_units(store.datasets, unit)
    ok = lambda d: store.datasets[d].size > 0 and (store.datasets[d].epochs is None or store.datasets[d].epochs > 0)
    return {u: m for u, m in units.items() if any(ok(d) for d in m)}


def run_curriculum(scores_dir, out, *, store=None, objective: str = "max", solver: str = "anneal",
                   iterations: int = 2_000_000, tau0: float | None = None, cooling: float | None = None,
                   patience: int = 0, kicks: int = 200, seed: int = 0, instance_order: str = "e2d",
                   delta: float | None = None, mask_direction: str = "text", walk: str = "cyclic") -> dict:
    """The ``jaxembed curriculum`` job: reads ``scores_dir`` (jaxembed score), writes task_order.json,
    instance_orders.json, plan_curriculum.json and curriculum_summary.json into ``out``. -> the summary."""
    from jaxembed.curriculum import difficulty as dif
    from jaxembed.curriculum import order as O
    from jaxembed.curriculum.similarity import load_similarity
    from jaxembed.data.plan import load_scores
    from jaxembed.data.store import Store

    from jaxembed.data.plan import WALKS

    if walk not in WALKS:
        raise UserError(f"--walk {walk!r}: one of {', '.join(WALKS)}")
    scores_dir, out = Path(scores_dir), Path(out)
    S, names, unit, meta = load_similarity(scores_dir / "task_similarity.npz")
    if store is None:
        sp = meta.get("store")
        if not sp:
            raise UserError(f"{scores_dir}: the scores name no store (fix: pass --store DIR)")
        store = Store.open(sp)
    elif not hasattr(store, "datasets"):
        store = Store.open(store)
    units = _plan_units(store, unit)
    missing = [u for u in units if u not in names]
    if missing:
        raise UserError(f"{scores_dir / 'task_similarity.npz'}: no similarity for {unit}s {missing} of the store "
                        f"{store.path} (fix: run jaxembed score on this store)")
    keep = [names.index(u) for u in units]
    dropped_units = [n for n in names if n not in units]
    S = S[np.ix_(keep, keep)]
    names = list(units)
    res = O.solve(S, objective=objective, solver=solver, iterations=iterations, tau0=tau0, cooling=cooling,
                  patience=patience, seed=seed, kicks=kicks)
    order = [names[i] for i in res.order]
    rand_mean, rand_std = O.random_baseline(S, 1000, seed)
    values = {"chosen": res.value, "store_order": O.cyclic_objective(S, np.arange(len(names))),
              "random_mean": rand_mean, "random_std": rand_std}

    scores_path = scores_dir / "scores.npz"
    scores = load_scores(scores_path, store) if scores_path.exists() else None
    if scores is None and (instance_order != "random" or delta is not None):
        raise UserError(f"{scores_path}: no per-example scores (jaxembed score --similarity-only?) but "
                        f"--instance-order {instance_order} / --delta need them (fix: run jaxembed score without "
                        "--similarity-only, or --instance-order random and no --delta)")
    ds_names = [i.name for i in store.datasets]
    sizes = [i.size for i in store.datasets]
    orders = dif.instance_orders(units, sizes, ds_names, instance_order, scores, seed)
    out.mkdir(parents=True, exist_ok=True)
    task_order_path, io_path = out / "task_order.json", out / "instance_orders.json"
    _write_json(task_order_path, {"order": order, "unit": unit, "objective": objective, "solver": res.solver,
                                  "value": res.value, "values": values, "params": res.params,
                                  "similarity": str((scores_dir / "task_similarity.npz").resolve())})
    _write_json(io_path, {u: [[ds_names[int(d)], int(e)] for d, e in a] for u, a in orders.items()})
    mask = None
    if scores is not None:
        deltas = sorted({-0.1, 0.0, 0.05, 0.1} | ({float(delta)} if delta is not None else set()))
        total = sum(len(v) for v in scores.values())
        mask = {f"{x:g}": {"masked": sum(dif.mask_counts(scores, x, mask_direction).values()), "of": total}
                for x in deltas}
    snippet = {"scores": str(scores_path.resolve()) if scores is not None else "",
               "mask": {"delta": delta, "direction": mask_direction},
               "curriculum": {"enabled": True, "unit": unit, "walk": walk,
                              "task_order": str(task_order_path.resolve()),
                              "instance_order": "given", "instance_orders": str(io_path.resolve())}}
    _write_json(out / "plan_curriculum.json", snippet)
    summary = {"unit": unit, "units": len(names), "order": order, "objective": objective, "solver": res.solver,
               "values": values, "seconds_solver": round(res.seconds, 3), "iterations": res.iterations,
               "accepted": res.accepted, "params": res.params, "instance_order": instance_order,
               "delta": delta, "mask_direction": mask_direction,
               "masked_at_delta": dif.mask_counts(scores, delta, mask_direction) if (
                   scores is not None and delta is not None) else None,
               "mask_counts": mask, "units_without_data": dropped_units, "plan_config": snippet,
               "set_args": plan_set_args(snippet)}
    _write_json(out / "curriculum_summary.json", summary)
    return summary


def plan_set_args(snippet: dict) -> list[str]:
    """``--set KEY=VALUE`` arguments of ``jaxembed plan build`` equal to the snippet."""
    def flat(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from flat(v, prefix + k + ".")
            else:
                yield f"{prefix}{k}={'none' if v is None else (str(v).lower() if isinstance(v, bool) else v)}"

    return [a for a in flat(snippet) if a != "scores="]


def cmd_curriculum(args) -> int:
    s = run_curriculum(args.scores_dir, args.out, store=args.store, objective=args.objective, solver=args.solver,
                       iterations=args.iterations, tau0=args.tau0, cooling=args.cooling, patience=args.patience,
                       kicks=args.kicks, seed=args.seed, instance_order=args.instance_order, delta=args.delta,
                       mask_direction=args.mask_direction, walk=args.walk)
    v = s["values"]
    out = Path(args.out)
    print(f"task order ({s['units']} {s['unit']}s, objective {s['objective']}, solver {s['solver']}, "
          f"{s['seconds_solver']:.2f}s" + (f", {s['iterations']} iterations" if s["iterations"] else "") + "):")
    print("  " + " -> ".join(s["order"]) + " -> (back to the first)")
    print(f"Eq. 6 cyclic similarity: {v['chosen']:.4f} (store order {v['store_order']:.4f}, random orders "
          f"{v['random_mean']:.4f} +- {v['random_std']:.4f})")
    if s["mask_counts"]:
        print("Eq. 9 mask (" + s["mask_direction"] + "): examples with weight 0 at delta " + ", ".join(
            f"{k}: {c['masked']}" for k, c in s["mask_counts"].items()) + f" (of {next(iter(s['mask_counts'].values()))['of']})")
    if s["units_without_data"]:
        print(f"note: {s['units_without_data']} have no data to train (epochs 0) and are not ordered")
    print(f"wrote {out / 'task_order.json'}, {out / 'instance_orders.json'}, {out / 'plan_curriculum.json'}")
    print(f"next: jaxembed plan build --store STORE --config {out / 'plan_curriculum.json'} "
          "--set global_batch_size=64 --out PLAN.npz")
    print("  (or add to your plan config: " + " ".join(f"--set {a}" for a in s["set_args"]) + ")")
    return 0


# ============================================================================================== mine

def run_mine(encoder, examples, out, report_path=None, *, config=None, query_instruction: str = "",
             doc_instruction: str = "", corpus=None, task_type: str | None = None, dataset_name: str = "mined",
             info=None, max_query_length=None, max_doc_length=None, batch_size: int = 64,
             progress: bool | None = None, source: dict | None = None) -> dict:
    """The ``jaxembed mine`` job on examples (``{"id", "query", "pos", "neg", ...}``): mine, write the triplets file
    ``out`` (with the BGE prompt / type that restore the instruction and task type) and the report. -> report."""
    from jaxembed import mining

    cfg = config or mining.MineConfig()
    res = mining.mine(encoder, examples, cfg, query_instruction=query_instruction, doc_instruction=doc_instruction,
                      corpus=corpus, max_query_length=max_query_length, max_doc_length=max_doc_length,
                      batch_size=batch_size, progress=progress, task=task_type)
    notes = mining.annotate_records(res.records, query_instruction=query_instruction, task_type=task_type)
    out = Path(out)
    mining.write_jsonl(out, res.records)
    report = dict(res.report)
    report["source"] = source or {}
    report["output"] = str(out)
    report["notes"] = notes
    report["data_config"] = mining.data_config_entry(
        dataset_name, str(out.resolve()), task_type=task_type, query_instruction=query_instruction,
        doc_instruction=doc_instruction, num_negatives=cfg.num_negatives, info=info)
    rp = Path(report_path) if report_path else out.with_suffix(".report.json")
    mining.write_report(rp, report)
    report["report_path"] = str(rp)
    return report


def _read_input(args):
    from jaxembed.data.formats import ReadInfo, ReadOptions, Tally, apply_policy, read_jsonl

    info = ReadInfo()
    opts = ReadOptions(name=Path(args.input).stem, format=args.format, score_threshold=args.score_threshold)
    tally = Tally(Path(args.input).stem)
    examples = list(apply_policy(read_jsonl(args.input, opts, info), args.on_error, tally))
    if not examples:
        reasons = "; ".join(f"{r}: {n}" for r, n in tally.reasons().items()) or "no records"
        raise UserError(f"{args.input}: no examples to mine ({reasons})")
    return examples, info, tally


def cmd_mine(args) -> int:
    from jaxembed import mining, runfiles
    from jaxembed.data.jsonl import read_texts

    runfiles.single_host_only("jaxembed mine")

    if (args.input is None) == (args.store is None):
        raise UserError("mine: give exactly one of --input FILE or --store DIR --dataset NAME")
    cfg = mining.MineConfig(top_k=args.top_k, window=mining.parse_window(args.window),
                            num_negatives=args.num_negatives, margin=args.margin, seed=args.seed,
                            approx=None if args.approx == "none" else args.approx, nlist=args.nlist,
                            nprobe=args.nprobe, block_q=args.block_q, block_c=args.block_c)
    cfg.check()
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be positive, got {args.batch_size}")
    for k in ("query_instruction", "doc_instruction"):  # a shell passes "\n" as backslash + n
        v = getattr(args, k)
        if v is not None:
            setattr(args, k, v.replace("\\n", "\n"))
    info = None
    source: dict = {}
    if args.input:
        if args.dataset:
            raise UserError("mine: --dataset goes with --store, not --input")
        examples, rinfo, tally = _read_input(args)
        from jaxembed.data.formats import kalm_instruction

        qi = args.query_instruction if args.query_instruction is not None else (
            kalm_instruction(rinfo.prompt) if rinfo.prompt is not None else "")
        di = args.doc_instruction if args.doc_instruction is not None else ""
        task_type = args.task_type or rinfo.task_type
        name = Path(args.input).stem
        source = {"input": str(args.input), "format": rinfo.format, "read": tally.read, "examples": tally.written,
                  "skipped": tally.reasons()}
        mq = md = None
    else:
        from jaxembed.data.store import Store

        if not args.dataset:
            raise UserError("mine: --store needs --dataset NAME")
        if args.task_type:
            raise UserError("mine: --task-type goes with --input (a store dataset has its own)")
        store = Store.open(args.store)
        info = store.dataset(args.dataset)
        examples = store.examples(info.name, range(info.size))
        qi = args.query_instruction if args.query_instruction is not None else info.query_instruction
        di = args.doc_instruction if args.doc_instruction is not None else info.doc_instruction
        task_type, name = info.task_type, info.name
        source = {"store": str(args.store), "dataset": info.name, "examples": info.size}
        mq, md = info.max_query_length, info.max_doc_length
    corpus = None
    if args.corpus:
        corpus = read_texts(args.corpus, args.corpus_field)
        source["corpus"] = str(args.corpus)
    t0 = time.time()
    loaded, enc = _load_model(args.model, args)
    cap = loaded.tokenizer.max_length
    report = run_mine(enc, examples, args.out, args.report, config=cfg, query_instruction=qi, doc_instruction=di,
                      corpus=corpus, task_type=task_type, dataset_name=name, info=info,
                      max_query_length=_limit(mq, cap), max_doc_length=_limit(md, cap), batch_size=args.batch_size,
                      progress=not args.quiet, source=dict(source, model=str(args.model)))
    print(mining.format_report(report))
    for n in report["notes"]:
        print(f"note: {n}")
    print(f"wrote {args.out} ({report['kept']} examples) and {report['report_path']} in {time.time() - t0:.1f}s")
    return 0
