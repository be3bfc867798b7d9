"""``jaxembed score``, ``jaxembed curriculum`` and ``jaxembed mine``: the offline jobs that read a dataset store and
a reference model and write files the batch plan (``jaxembed plan build``) consumes.

``add_parsers(subparsers)`` adds the three commands (``func`` returns the exit status; a UserError is printed on one
line by the main CLI, exit status 2). This module only parses arguments; the jobs are Python functions:
``jaxembed.curriculum.score.run_score``, ``jaxembed.curriculum.build.run_curriculum`` and
``jaxembed.mining.job.run_mine`` (re-exported here), the reference model ``jaxembed.mining.encoding.load_encoder``.

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
      DIR/instance_orders.npz   per unit: dataset ids, example ids     (plan.curriculum.instance_orders)
      DIR/plan_curriculum.json  the plan-config overrides: jaxembed plan build --config DIR/plan_curriculum.json
      DIR/curriculum_summary.json  objective values, mask counts

- ``mine --model M --input FILE | --store DIR --dataset NAME --out mined.jsonl [--report R.json] ...``: hard-negative
  mining with ranking-consistency filtering (``jaxembed.mining``); the output is a triplets file that
  ``jaxembed data prepare`` reads, carrying the dataset's instruction.
"""


from __future__ import annotations

import argparse
import time

from jaxembed.choices import DTYPES, POOLING_MODES
from jaxembed.curriculum.build import format_curriculum, plan_set_args, run_curriculum  # noqa: F401 (re-exported)
from jaxembed.curriculum.score import (SCORE_FILES, config_store, config_unit, format_score,  # noqa: F401
                                       load_run_config, run_score)
from jaxembed.data.formats import FORMAT_CHOICES
from jaxembed.data.task_types import TASK_TYPES
from jaxembed.errors import UserError
from jaxembed.mining.encoding import limit, load_encoder, model_key
from jaxembed.mining.job import input_from_file, input_from_store, run_mine  # noqa: F401 (run_mine: re-exported)


# ============================================================================================== parsers

def _model_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--model", required=required, default=None,
                   help="reference model: folder (HF / sentence-transformers / jaxembed export) or hub id")
    p.add_argument("--dtype", default=None, choices=DTYPES,
                   help="computation dtype (default float32)")
    p.add_argument("--max-length", type=int, default=None,
                   help="tokenizer limit in tokens (default: the model's); each dataset's max_query_length / "
                        "max_doc_length still apply below it, as in training")
    p.add_argument("--pooling", default=None, choices=POOLING_MODES,
                   help="override the folder's pooling")
    p.add_argument("--bidirectional", action="store_true", help="Qwen2/3 backbones: bidirectional attention")
    p.add_argument("--batch-size", type=int, default=64, help="encoding batch (split over all devices)")
    p.add_argument("--no-packing", action="store_true",
                   help="pad one text per row instead of packing several (the default, jaxembed.encode); a --config "
                        "with data.packing=False does the same")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")



def add_parsers(subparsers) -> None:
    """Add ``score``, ``curriculum`` and ``mine`` to an argparse sub-parsers object."""
    from jaxembed.config.io import config_help

    p = subparsers.add_parser(
        "score", help="reference-model scores for a store: task similarity (Data-CUBE Eq. 4-5) and instance "
                      "difficulty phi (Eq. 8)",
        description="Encode the store's instructed queries and documents with a reference model and write the task "
                    "similarity matrix (+ heat map) and phi per example. Embeddings are cached per shard under "
                    "OUT/cache: rerun the same command to resume a killed run.")
    _model_args(p, required=False)
    p.add_argument("--store", default=None, metavar="DIR", help="dataset store (jaxembed data prepare)")
    p.add_argument("--config", default=None, metavar="NAME|FILE[:VARIANT]",
                   help="a run config, " + config_help("a config file") + ": its data.store, or its data config "
                        "prepared into OUT/store; its model (name, max_length, dtype) when --model is not given")
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
    m.add_argument("--format", default="auto", choices=FORMAT_CHOICES,
                   help="--input record format (default: from the first record)")
    m.add_argument("--score-threshold", type=float, default=None, help="--input scored pairs: positive threshold")
    m.add_argument("--task-type", default=None, choices=TASK_TYPES,
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
    m.add_argument("--approx", default="none", choices=["none", "ivf", "hnsw"],
                   help="approximate search for very large corpora: an IVF index (k-means lists; FAISS's where "
                        "faiss is installed, pip install 'jaxembed[faiss]'), or an HNSW graph (needs FAISS)")
    m.add_argument("--nlist", type=int, default=None, help="IVF lists (default sqrt(corpus size))")
    m.add_argument("--nprobe", type=int, default=8, help="IVF lists searched per query (default 8)")
    m.add_argument("--block-q", type=int, default=256, help="queries per search block (default 256)")
    m.add_argument("--block-c", type=int, default=4096, help="corpus rows per device per block (default 4096)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--on-error", default="stop", choices=["stop", "skip"],
                   help="--input: stop at the first bad record (default) or skip and count it")
    m.set_defaults(func=cmd_mine)


# ============================================================================================== commands

def _load_model(name, args, config=None):
    """(Loaded, Encoder) of the reference model with the command's model options."""
    return load_encoder(name, dtype=getattr(args, "dtype", None), max_length=getattr(args, "max_length", None),
                        pooling=getattr(args, "pooling", None), bidirectional=getattr(args, "bidirectional", False),
                        no_packing=getattr(args, "no_packing", False), config=config)


def cmd_score(args) -> int:
    from jaxembed import pod
    from jaxembed.data.store import Store

    pod.single_host_only("jaxembed score")

    if (args.store is None) == (args.config is None):
        raise UserError("score: give exactly one of --store DIR or --config FILE[:VARIANT]")
    config = load_run_config(args.config) if args.config else None
    store = config_store(config, args.config, args.out) if config is not None else Store.open(args.store)
    name = args.model or (config.model.name if config is not None else "")
    if not name:
        raise UserError("score: --model is required (or a --config whose model.name is set)")
    unit = args.unit if args.unit is not None else config_unit(config)
    loaded, enc = _load_model(name, args, config)
    s = run_score(enc, store, args.out, unit=unit, n_task_queries=args.n_task_queries, seed=args.seed,
                  negatives=args.negatives, sampled_negatives=args.sampled_negatives,
                  similarity_only=args.similarity_only, shard_size=args.shard_size, batch_size=args.batch_size,
                  model_key=model_key(loaded, enc), model_name=str(name), progress=not args.quiet)
    print(format_score(s, args.out, args.similarity_only))
    return 0


def cmd_curriculum(args) -> int:
    s = run_curriculum(args.scores_dir, args.out, store=args.store, objective=args.objective, solver=args.solver,
                       iterations=args.iterations, tau0=args.tau0, cooling=args.cooling, patience=args.patience,
                       kicks=args.kicks, seed=args.seed, instance_order=args.instance_order, delta=args.delta,
                       mask_direction=args.mask_direction, walk=args.walk)
    print(format_curriculum(s, args.out))
    return 0


def cmd_mine(args) -> int:
    from jaxembed import mining, pod
    from jaxembed.data.jsonl import read_texts

    pod.single_host_only("jaxembed mine")

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
    if args.input:
        if args.dataset:
            raise UserError("mine: --dataset goes with --store, not --input")
        inp = input_from_file(args.input, format=args.format, score_threshold=args.score_threshold,
                              on_error=args.on_error, query_instruction=args.query_instruction,
                              doc_instruction=args.doc_instruction, task_type=args.task_type)
    else:
        if not args.dataset:
            raise UserError("mine: --store needs --dataset NAME")
        if args.task_type:
            raise UserError("mine: --task-type goes with --input (a store dataset has its own)")
        inp = input_from_store(args.store, args.dataset, query_instruction=args.query_instruction,
                               doc_instruction=args.doc_instruction)
    source = dict(inp.source)
    corpus = None
    if args.corpus:
        corpus = read_texts(args.corpus, args.corpus_field)
        source["corpus"] = str(args.corpus)
    t0 = time.time()
    loaded, enc = _load_model(args.model, args)
    cap = loaded.tokenizer.max_length
    report = run_mine(enc, inp.examples, args.out, args.report, config=cfg, query_instruction=inp.query_instruction,
                      doc_instruction=inp.doc_instruction, corpus=corpus, task_type=inp.task_type,
                      dataset_name=inp.name, info=inp.info, max_query_length=limit(inp.max_query_length, cap),
                      max_doc_length=limit(inp.max_doc_length, cap), batch_size=args.batch_size,
                      progress=not args.quiet, source=dict(source, model=str(args.model)))
    print(mining.format_report(report))
    for n in report["notes"]:
        print(f"note: {n}")
    print(f"wrote {args.out} ({report['kept']} examples) and {report['report_path']} in {time.time() - t0:.1f}s")
    return 0
