"""Training quality parity: jaxembed vs sentence-transformers on the same recipe, batches and order, plus the
papers' ablations on the same data (jaxembed only).

The recipe is configs/demo.py: all-MiniLM-L6-v2, the 14 datasets of ../shared/data/train with KaLM-style
instructions on the asymmetric tasks, one hard negative per query, task-homogeneous batches, InfoNCE at
temperature 0.05, AdamW (lr 2e-5, weight decay 0.01 except norms and biases, linear warm-up over 10% of the steps
then linear decay to 0, global-norm clipping at 1.0), dropout on. Both tools get:

- the same examples in the same order: one jaxembed batch plan per seed (the seed changes the plan's order and
  the dropout stream); sentence-transformers reads it through ``PlanBatchSampler`` (one batch per plan step), and
  the positive and negative of every row are chosen exactly as jaxembed's loader chooses them;
- the same strings: the instruction is prefixed to the query text (all-MiniLM-L6-v2's Pooling has
  include_prompt=True, so prompt tokens are pooled on both sides; the script checks this), tokenized by
  sentence-transformers' own collator with jaxembed's per-side lengths (queries 32, documents 64 tokens). Every
  batch's token ids are checked against jaxembed's loader batch for the same step (the run stops on a mismatch);
- the same loss: ST's MultipleNegativesRankingLoss at scale = 1 / temperature, extended by the two masks
  jaxembed's InfoNCE applies (``MaskedMNRL``): an empty negative slot (datasets without negatives) is not a
  candidate, and a candidate whose text equals the query's own positive (e.g. the same label description in a
  classification batch) is not a negative. ``--st-loss plain`` runs ST's loss unchanged instead;
- the same optimizer: the Hugging Face Trainer's AdamW step, written out (backward, clip_grad_norm_, AdamW with
  the Trainer's weight-decay groups, the linear warm-up/decay schedule, zero_grad), so that the batches come from
  the plan in its order (the Trainer would sample its own).

What the 'st' arm is, and is not: it is sentence-transformers made to train exactly like jaxembed (jaxembed's two
loss masks, the per-side lengths, the plan's batches, a hand-written Trainer step), to isolate the implementations.
It is not what a sentence-transformers user gets. The 'st_stock' arm (``--tools jaxembed,st,st_stock``) is: stock
``SentenceTransformerTrainer`` (its own AdamW, linear warm-up / decay, clipping, sampler, seed) with the stock
``MultipleNegativesRankingLoss`` (no masks), on the same examples (the plan's rows, each dataset one ST dataset of a
``DatasetDict``, positives and negatives chosen as jaxembed's loader chooses them; rows without a negative form their
own pair dataset), ST's default ``PROPORTIONAL`` multi-dataset sampler (one dataset per batch, like the recipe's
task-homogeneous batches) and one max length for every column (``max_seq_length`` = the documents' length).

Both trained models are scored by the same code: jaxembed's local evaluators on the eval tasks (never used for
tuning), with Matryoshka views at 256 / 128 / 64 dims, and mteb on a subset (--mteb-tasks): mteb through jaxembed's
encoder for both models, and mteb through sentence-transformers' own encoder for the ST-trained model.

Ablations (``--ablations``, jaxembed only, compared with this script's jaxembed baseline runs of the same seeds):
  peg                   loss.type='peg' vs plain InfoNCE
  mrl                   loss.matryoshka_dims=(384,256,128,64) (weights --mrl-weights) vs none; scores at 64/128/256
  curriculum            Data-CUBE curriculum (needs --curriculum-task-order and --curriculum-scores; the unit is the
                        order file's, a dataset by default) with Algorithm 1's cyclic walk ('curriculum') and with
                        the balanced walk ('curriculum_balanced', jaxembed's: each unit visited in proportion to its
                        size), vs the random (sampled) order of the baseline; also an arm with the same walk but
                        random instance order ('curriculum_shuffled', Table 3 w/o Inst) and the paper's Vanilla on
                        the same data mix ('curriculum_vanilla': no curriculum, one unit per batch, datasets drawn by
                        size, as the curriculum's compressed pass takes them); every curriculum arm is also compared
                        with Vanilla, the balanced walk with the cyclic one. --curriculum-mask-delta D adds
                        'curriculum_masked': the curriculum with the Eq. 9 mask
  mote                  MoTE (config overrides --mote KEY=VALUE ..., eval routing --mote-experts JSON) vs the
                        instruction-conditioned baseline
  mote_clustering       the same with clustering training data for the clustering expert (TREC / SST-5 clustering
                        sets built from the train/ classification files, jaxembed.data.clustering; heterogeneous
                        batches, temperature 0.06 as TA-CL): 'mote_clustering' vs 'ic_clustering' (the baseline with
                        the same data), and 'ic_clustering' vs the baseline
  padded                data.packing=False (one text per row, padded) vs the baseline (the recipe's packed rows):
                        the same plan and step count; packing must not change quality beyond the seeds' spread
Every comparison reports the average over the eval tasks, the STS average (Data-CUBE's measure: STSBenchmark,
SICK-R), the average per task type (MoTE's), per seed and as the mean with the spread over seeds.
Finished runs are reused (a run directory whose recorded config matches), so adding an ablation later reruns
nothing; a finished run of another config stops the script with the differing keys (it is never deleted).

One run at a time (background jobs, resumable): ``--job ARM:SEED`` trains and evaluates that jaxembed run only and
writes <workdir>/jaxembed_<ARM>_s<SEED>/result.json (a finished run is reused, an interrupted one starts again);
``--summarize`` then compares every finished run of the workdir (the same comparisons, over the seeds both arms
have) and writes the result file. Give both the same options (steps, batch, eval sample, curriculum files).
``--summarize --results-dir DIR`` adds the runs of copied (e.g. committed) result.json files
DIR/jaxembed_<ARM>_s<SEED>.json that the workdir lacks (full-width scores only, no Matryoshka views).

    python benchmarks/quality_parity.py [--steps 200] [--batch-size 16] [--seeds 0 1] [--ablations peg,mrl]
                                        [--ablation-seeds 0] [--workdir runs/quality_parity] [--no-readme]
    python benchmarks/quality_parity.py --job curriculum_balanced:0 --steps 400 ... ; ... --summarize --steps 400 ...
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from _harness.ablation import ablation_parts, ablation_rows, markdown_table  # noqa: E402,F401
from _harness.proc import log, public_argv, script_argv  # noqa: E402
from _harness.recipe import load_recipe, no_eval  # noqa: E402
from _harness.runs import finished_run, lock, record_differences  # noqa: E402,F401
from _harness.scoring import DIMS, STS_TASKS, diff_row, mteb_check, run_eval, summarize  # noqa: E402,F401
# the sentence-transformers side: its runs are _harness/st_train.py's; these names are also read from this script
from _harness.st import PlanBatchSampler, make_masked_mnrl, stock_datasets  # noqa: E402,F401
from _harness.st_train import train_st, train_st_stock  # noqa: E402
from _record import record_line, save_result  # noqa: E402

ABLATIONS = ("peg", "mrl", "curriculum", "mote", "mote_clustering", "padded")
#: the arms each --ablations entry runs (besides the baseline)
ABLATION_ARMS = {"curriculum": ("curriculum", "curriculum_balanced", "curriculum_shuffled", "curriculum_vanilla"),
                 "mote_clustering": ("ic_clustering", "mote_clustering")}
#: arms trained with the clustering sets added to the recipe's data (their own store)
CLUSTERING_ARMS = ("ic_clustering", "mote_clustering")
#: every jaxembed arm (--job ARM:SEED)
ARMS = ("base", "peg", "mrl", "curriculum", "curriculum_balanced", "curriculum_shuffled", "curriculum_vanilla",
        "curriculum_masked", "mote", "ic_clustering", "mote_clustering", "padded")


# ------------------------------------------------------------------------------------------------ config


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="configs/demo.py",
                    help="config file[:variant] every arm starts from (e.g. configs/mote.py:cpu,ic for MoTE vs IC)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="seeds of the parity runs (per tool)")
    ap.add_argument("--tools", default="jaxembed,st", help="comma list of jaxembed, st (sentence-transformers "
                    "matched to jaxembed: masks, plan batches, hand-written step), st_stock (stock ST Trainer and loss)")
    ap.add_argument("--ablations", default="", help=f"comma list of {', '.join(ABLATIONS)}")
    ap.add_argument("--ablation-seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--only-ablations", action="store_true", help="skip the ST runs (baselines still run)")
    ap.add_argument("--st-loss", choices=("masked", "plain"), default="masked")
    ap.add_argument("--st-threads", type=int, default=1,
                    help="torch threads of the ST run (0 = torch's default). On a shared, oversubscribed CPU torch's "
                         "OpenMP threads spin at barriers, so 1 thread runs a step faster than 2")
    ap.add_argument("--mrl-weights", default="1,1,1,1", help="weights of dims 384,256,128,64")
    ap.add_argument("--curriculum-task-order", default="", help="task order file (plan.curriculum.task_order)")
    ap.add_argument("--curriculum-scores", default="", help="per-example phi file (plan.scores)")
    ap.add_argument("--curriculum-instance-order", default="e2d")
    ap.add_argument("--curriculum-mask-delta", type=float, default=None,
                    help="also run the curriculum with the Eq. 9 mask at this delta ('curriculum_masked')")
    ap.add_argument("--mote", action="append", default=[], metavar="KEY=VALUE",
                    help="config override of the MoTE arm (repeat), e.g. model.mote.num_experts=4")
    ap.add_argument("--mote-experts", default="", help="JSON routing table task type -> expert for evaluation, "
                                                      "e.g. '{\"Retrieval\": 0, \"STS\": 1, \"default\": 2}'")
    ap.add_argument("--eval-tasks", default="eval", help="eval task names, or 'eval' (never the -dev tasks)")
    ap.add_argument("--eval-max-examples", type=int, default=0, help="0 = the full eval sets")
    ap.add_argument("--mteb-tasks", default="STSBenchmark,MRPC", help="'' to skip the mteb cross-check")
    ap.add_argument("--workdir", default="", help="default: runs/quality_parity (demo recipe) or "
                                                  "runs/quality_parity_<recipe>_<variant>")
    ap.add_argument("--name", default="quality_parity_cpu", help="result file benchmarks/results/<name>.json")
    ap.add_argument("--no-readme", action="store_true")
    ap.add_argument("--job", action="append", default=[], metavar="ARM:SEED",
                    help="train and evaluate this jaxembed run only (repeat for several), writing its "
                         "result.json in the workdir; then --summarize")
    ap.add_argument("--summarize", action="store_true",
                    help="compare the finished runs of the workdir and write the result file (no training)")
    ap.add_argument("--results-dir", default="", metavar="DIR",
                    help="with --summarize: also the runs of the per-run result files DIR/jaxembed_<ARM>_s<SEED>.json "
                         "(copies of a job's result.json, e.g. committed) that the workdir lacks; they hold the "
                         "full-width scores only (no Matryoshka views)")
    ap.add_argument("--_train", default="", help=argparse.SUPPRESS)  # internal: TOOL:ARM:SEED in a subprocess
    args = ap.parse_args(argv)
    if not args.workdir:
        path, _, variant = args.recipe.partition(":")
        tag = "" if args.recipe == "configs/demo.py" else "_" + "_".join(
            x for x in (Path(path).stem, variant.replace(",", "_")) if x)
        args.workdir = str(ROOT / "runs" / f"quality_parity{tag}")
    return args


def recipe_config(args, seed: int, store_dir: Path | None):
    """The recipe (--recipe, configs/demo.py by default) with this benchmark's steps / batch / seed; no dev
    evaluation, one checkpoint at the end."""
    c = load_recipe(args.recipe)
    c.plan.global_batch_size = args.batch_size
    c.plan.steps = args.steps
    c.data.seed = seed          # the plan's order
    c.train.seed = seed         # the dropout stream
    c.train.checkpoint_every = 0
    c.train.log_every = 10
    c.train.progress = False
    no_eval(c)
    if store_dir is not None:
        c.data.store = str(store_dir)
    return c


def arm_config(args, arm: str, seed: int, store_dir: Path | None):
    from jaxembed import config as cfglib

    c = recipe_config(args, seed, store_dir)
    if arm == "base":
        pass
    elif arm == "peg":
        c.loss.type = "peg"
    elif arm == "mrl":
        c.loss.matryoshka_dims = (384, 256, 128, 64)
        c.loss.matryoshka_weights = tuple(float(x) for x in args.mrl_weights.split(","))
    elif arm == "curriculum_vanilla":  # Data-CUBE Table 3 Vanilla: the curriculum's data mix, random order,
        #                                one unit per batch as the curriculum's batches
        c.plan.strategy = "heterogeneous" if curriculum_unit(args) == "task" else "homogeneous"
        c.plan.sampling = "size"
    elif arm in ("curriculum", "curriculum_balanced", "curriculum_shuffled", "curriculum_masked"):
        if not args.curriculum_task_order:
            raise SystemExit("error: --ablations curriculum needs --curriculum-task-order FILE (and "
                             "--curriculum-scores FILE for e2d / d2e)")
        c.plan.curriculum.enabled = True
        c.plan.curriculum.task_order = str(Path(args.curriculum_task_order).resolve())
        c.plan.curriculum.unit = curriculum_unit(args)
        c.plan.curriculum.walk = "balanced" if arm == "curriculum_balanced" else "cyclic"
        if arm == "curriculum_shuffled":
            c.plan.curriculum.instance_order = "random"
        else:
            c.plan.curriculum.instance_order = args.curriculum_instance_order
            if args.curriculum_instance_order in ("e2d", "d2e"):
                if not args.curriculum_scores:
                    raise SystemExit("error: --curriculum-instance-order e2d/d2e needs --curriculum-scores FILE")
        if args.curriculum_scores:
            c.plan.scores = str(Path(args.curriculum_scores).resolve())
        if arm == "curriculum_masked":
            if args.curriculum_mask_delta is None or not args.curriculum_scores:
                raise SystemExit("error: curriculum_masked needs --curriculum-mask-delta D and --curriculum-scores")
            c.plan.mask.delta = float(args.curriculum_mask_delta)
    elif arm == "mote":
        if not args.mote:
            raise SystemExit("error: --ablations mote needs the MoTE config overrides, e.g. --mote "
                             "model.mote.num_experts=4 (see the MoTE section of the README)")
        cfglib.apply_overrides(c, list(args.mote))
    elif arm == "padded":  # today's padded batches instead of packed rows (the recipe's data.packing default)
        c.data.packing = False
    elif arm in CLUSTERING_ARMS:
        add_clustering_sets(c)
        if store_dir is not None:  # another data config: its own store beside the recipe's
            c.data.store = str(Path(store_dir).parent / "clustering" / "store")
        if arm == "mote_clustering":
            c.model.mote.enabled = True
            cfglib.apply_overrides(c, list(args.mote))
    else:
        raise ValueError(arm)
    return c


def curriculum_unit(args) -> str:
    """The curriculum unit of --curriculum-task-order: its recorded "unit" (jaxembed curriculum writes it), else
    dataset (the plan's default)."""
    path = Path(args.curriculum_task_order) if args.curriculum_task_order else None
    if path is not None and path.suffix == ".json" and path.is_file():
        obj = json.loads(path.read_text())
        if isinstance(obj, dict) and obj.get("unit"):
            return str(obj["unit"])
    return "dataset"


def add_clustering_sets(c) -> None:
    """The clustering sets (TREC question types, SST-5 sentiment levels, from train/ classification files) added to
    the recipe's data, with the recipe's per-dataset settings (negatives, lengths) and TA-CL's clustering batching
    and temperature (heterogeneous, 0.06; MoTE App. D.2)."""
    from jaxembed import mote, paths
    from jaxembed.data.clustering import shared_clustering_datasets

    like = c.data.datasets[0]
    batching, temperature = mote.TA_CL["clustering"]
    extra = shared_clustering_datasets(paths.shared_data_dir())
    for d in extra:
        d.num_negatives = min(int(d.num_negatives), max(int(x.num_negatives) for x in c.data.datasets))
        d.max_query_length, d.max_doc_length = like.max_query_length, like.max_doc_length
        d.batching, d.temperature = batching, temperature
    c.data.datasets = list(c.data.datasets) + extra


def run_record(c, tool: str, args) -> dict:
    """What identifies a finished run: the resolved config (plain JSON) and, for ST, its loss variant."""
    from jaxembed import config as cfglib

    return {"config": json.loads(cfglib.to_json(c)), "st_loss": args.st_loss if tool == "st" else None}


def train_jaxembed(args, arm: str, seed: int, rundir: Path, store_dir: Path) -> dict:
    from jaxembed.train import train

    c = arm_config(args, arm, seed, store_dir)
    t0 = time.time()
    summary = train(c, rundir)
    train_s = time.time() - t0
    log = []
    for line in open(rundir / "metrics.jsonl", encoding="utf-8"):
        r = json.loads(line)
        if r.get("split") == "train":
            log.append({"step": r["step"], "loss": r["loss"], "grad_norm": r.get("grad_norm"), "time": r["time"]})
    from jaxembed.data.plan import Plan

    return {"train_s": train_s, "log": log, "plan": Plan.load(rundir / "plan.npz").fingerprint(),
            "skipped": summary["skipped"], "model_dir": summary["export"]}


def child(args) -> None:
    """Subprocess entry: train one run and write rundir/train.json."""
    tool, arm, seed = args._train.split(":")
    seed = int(seed)
    wd = Path(args.workdir)
    rundir = wd / f"{tool}_{arm}_s{seed}"
    rundir.mkdir(parents=True, exist_ok=True)
    if tool in ("st", "st_stock"):
        c = arm_config(args, "base", seed, wd / "store")
        res = (train_st(c, seed, rundir, args.st_loss, args.st_threads) if tool == "st"
               else train_st_stock(c, seed, rundir, args.st_threads))
        res["model_dir"] = str(rundir / "model")
    else:
        res = train_jaxembed(args, arm, seed, rundir, wd / "store")
    res["record"] = run_record(arm_config(args, arm, seed, wd / "store"), tool, args)
    (rundir / "train.json").write_text(json.dumps(res, indent=1) + "\n")


# ------------------------------------------------------------------------------------------------ driver


def run_training(args, tool: str, arm: str, seed: int) -> dict:
    wd = Path(args.workdir)
    rundir = wd / f"{tool}_{arm}_s{seed}"
    prev = finished_run(rundir, run_record(arm_config(args, arm, seed, wd / "store"), tool, args),
                        f"{tool} {arm} seed {seed}")
    if prev is not None:
        return prev
    log(f"{tool} {arm} seed {seed}: training ({args.steps} steps, batch {args.batch_size})")
    subprocess.run(script_argv(__file__, "--_train", f"{tool}:{arm}:{seed}", *_forward_argv(args)), check=True)
    res = json.loads((rundir / "train.json").read_text())
    log(f"{tool} {arm} seed {seed}: trained in {res['train_s']:.0f}s")
    return res


def _forward_argv(args) -> list[str]:
    out = ["--recipe", args.recipe, "--steps", str(args.steps), "--batch-size", str(args.batch_size),
           "--workdir", args.workdir,
           "--st-loss", args.st_loss, "--st-threads", str(args.st_threads), "--mrl-weights", args.mrl_weights,
           "--curriculum-instance-order", args.curriculum_instance_order]
    if args.curriculum_task_order:
        out += ["--curriculum-task-order", args.curriculum_task_order]
    if args.curriculum_scores:
        out += ["--curriculum-scores", args.curriculum_scores]
    if args.curriculum_mask_delta is not None:
        out += ["--curriculum-mask-delta", repr(args.curriculum_mask_delta)]
    for m in args.mote:
        out += ["--mote", m]
    return out


def _public_argv(argv: list[str]) -> list[str]:
    """The command line without --workdir / --name / --no-readme (machine-local or bookkeeping)."""
    return public_argv(argv, valued=("--workdir", "--name"))


def main():
    args = parse_args()
    if args._train:
        return child(args)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    abl = [a for a in args.ablations.split(",") if a]
    bad = [a for a in abl if a not in ABLATIONS]
    if bad:
        raise SystemExit(f"error: --ablations {bad}: unknown (allowed: {', '.join(ABLATIONS)})")
    tools = [t for t in args.tools.split(",") if t]
    if set(tools) - {"jaxembed", "st", "st_stock"}:
        raise SystemExit(f"error: --tools {args.tools}: allowed jaxembed, st, st_stock")
    wd = Path(args.workdir)
    wd.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    if args.job or args.summarize:
        return run_jobs(args) if args.job else summarize_workdir(args)

    arms = []
    for a in abl:
        arms += list(ABLATION_ARMS.get(a, [a])) + (["curriculum_masked"] if a == "curriculum" and
                                                  args.curriculum_mask_delta is not None else [])
    prepare_stores(args, ["base", *arms])  # once for every run of each data config

    jobs = []  # (tool, arm, seed)
    for s in args.seeds:
        jobs.append(("jaxembed", "base", s))
        for t in ("st", "st_stock"):
            if t in tools and not args.only_ablations:
                jobs.append((t, "base", s))
    for a in arms:
        for s in args.ablation_seeds:
            if ("jaxembed", "base", s) not in jobs:
                jobs.append(("jaxembed", "base", s))
            jobs.append(("jaxembed", a, s))
    experts = json.loads(args.mote_experts) if args.mote_experts else None

    runs = {}
    for tool, arm, s in jobs:
        r = run_training(args, tool, arm, s)
        r["eval"] = run_eval(wd / f"{tool}_{arm}_s{s}", r["model_dir"], args.eval_tasks, args.eval_max_examples,
                             experts if arm.startswith("mote") else None)
        runs[(tool, arm, s)] = r
    mteb_res = mteb_check(runs, args.mteb_tasks, args.eval_max_examples, min(args.seeds))

    # ---- summary
    par = {t: summarize(runs, t, "base", args.seeds) for t in ("jaxembed", "st", "st_stock")}
    result = {
        "benchmark": "quality_parity", "date": datetime.date.today().isoformat(), "device": "cpu",
        "host": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
        "recipe": {"model": "all-MiniLM-L6-v2", "config": args.recipe, "steps": args.steps,
                   "global_batch_size": args.batch_size, "max_lengths": "query 32 / document 64",
                   "temperature": 0.05, "st_scale": 20.0, "lr": 2e-5, "warmup": "10% linear, then linear decay",
                   "weight_decay": 0.01, "grad_clip": 1.0, "dropout": True, "st_loss": args.st_loss},
        "eval": {"tasks": args.eval_tasks, "max_examples": args.eval_max_examples, "dims": list(DIMS)},
        "seeds": args.seeds, "parity": par, "mteb_check": mteb_res,
        "runs": {f"{t}_{a}_s{s}": {k: v for k, v in r.items() if k not in ("key", "record")}
                 for (t, a, s), r in runs.items()},
        "wall_s": time.time() - t_start,
        "command": "python benchmarks/quality_parity.py " + " ".join(_public_argv(sys.argv[1:])),
    }
    if par["jaxembed"] and par["st"]:
        diff = par["jaxembed"]["average"] - par["st"]["average"]
        result["parity"]["difference_jaxembed_minus_st"] = diff
        result["parity"]["per_task_difference"] = {
            t: par["jaxembed"]["per_task"][t]["mean"] - par["st"]["per_task"][t]["mean"]
            for t in par["jaxembed"]["per_task"]}
        result["parity"]["target_met"] = diff >= -0.3
    if par["jaxembed"] and par["st_stock"]:
        result["parity"]["difference_jaxembed_minus_st_stock"] = par["jaxembed"]["average"] - par["st_stock"]["average"]
    ablation = ablation_rows(runs, arms, args.ablation_seeds)
    result["ablations"] = ablation
    name = args.name
    path = save_result(name, result)
    print(json.dumps({k: result[k] for k in ("parity", "ablations", "mteb_check")}, indent=1))

    parts = []
    if par["jaxembed"] and par["st"]:
        j, s = par["jaxembed"], par["st"]
        parts.append(f"average of {len(j['per_task'])} eval tasks over seeds {args.seeds}: jaxembed "
                     f"{j['average']:.2f} (seed spread {j['spread']:.2f}) vs sentence-transformers {s['average']:.2f} "
                     f"(spread {s['spread']:.2f}): **{j['average'] - s['average']:+.2f}** points")
    if par["jaxembed"] and par["st_stock"]:
        j, s = par["jaxembed"], par["st_stock"]
        parts.append(f"vs stock sentence-transformers (Trainer, MNRL, no masks) {s['average']:.2f} (spread "
                     f"{s['spread']:.2f}): **{j['average'] - s['average']:+.2f}** points")
    parts += ablation_parts(ablation)
    if parts:
        line = (f"| {result['date']} | quality_parity | cpu ({result['cpu_count']} cores) | all-MiniLM-L6-v2, "
                f"demo recipe, {args.steps} steps x batch {args.batch_size}"
                + (f", same plan batches, ST loss {args.st_loss}" if "st" in tools else "")
                + (", stock ST Trainer and loss on the same examples" if "st_stock" in tools else "")
                + f" | {'; '.join(parts)} | `{result['command']}` |")
        record_line(line, append=not args.no_readme)
    log(f"done in {(time.time() - t_start) / 60:.1f} min; results in {path}")


# ------------------------------------------------------------------------------------- one run at a time


def prepare_stores(args, arms) -> None:
    """The dataset store of each data config the arms train on (the recipe's; with the clustering sets), written
    once; a store prepared from another data config stops the script."""
    from jaxembed import config as cfglib
    from jaxembed.runs.rundir import RunDir
    from jaxembed.train import prepare_store

    wd = Path(args.workdir)
    wd.mkdir(parents=True, exist_ok=True)
    with lock(wd / ".quality_parity.lock"):  # jobs started side by side prepare a store once
        for arm in dict.fromkeys("ic_clustering" if a in CLUSTERING_ARMS else "base" for a in arms):
            c = arm_config(args, arm, args.seeds[0], None)
            where = wd if arm == "base" else wd / "clustering"
            data = json.loads(cfglib.to_json(cfglib.data_section(c)))
            data.pop("seed", None)  # the store does not depend on it (the plan does)
            stamp = where / "store_data_config.json"
            done = (where / "store" / "manifest.json").exists()
            if done and stamp.exists() and json.loads(stamp.read_text()) != data:
                raise SystemExit(f"error: {where / 'store'} was prepared from another data config (fix: another "
                                 "--workdir)")
            if not done:
                log(f"preparing the dataset store {where / 'store'}")
            where.mkdir(parents=True, exist_ok=True)
            prepare_store(c, RunDir(where))
            stamp.write_text(json.dumps(data, indent=1) + "\n")


def run_jobs(args) -> None:
    """--job ARM:SEED ...: train (or reuse) and evaluate each jaxembed run; write its result.json."""
    jobs = []
    for j in args.job:
        arm, _, seed = j.partition(":")
        if not seed.isdigit():
            raise SystemExit(f"error: --job {j!r}: expected ARM:SEED, e.g. curriculum_balanced:0")
        if arm not in ARMS:
            raise SystemExit(f"error: --job {j!r}: unknown arm (arms: {', '.join(ARMS)})")
        arm_config(args, arm, int(seed), None)  # a missing option (curriculum files, --mote) stops here
        jobs.append((arm, int(seed)))
    prepare_stores(args, [a for a, _ in jobs])
    experts = json.loads(args.mote_experts) if args.mote_experts else None
    for arm, seed in jobs:
        rundir = Path(args.workdir) / f"jaxembed_{arm}_s{seed}"
        t0 = time.time()
        r = run_training(args, "jaxembed", arm, seed)
        t1 = time.time()
        r["eval"] = run_eval(rundir, r["model_dir"], args.eval_tasks, args.eval_max_examples,
                             experts if arm.startswith("mote") else None)
        one = summarize({("jaxembed", arm, seed): r}, "jaxembed", arm, [seed])
        res = {"arm": arm, "seed": seed, "steps": args.steps, "global_batch_size": args.batch_size,
               "eval": {"tasks": args.eval_tasks, "max_examples": args.eval_max_examples},
               "average": one["average"], "groups": {k: g["average"] for k, g in one.get("groups", {}).items()},
               "scores": {t: v["mean"] for t, v in one["per_task"].items()}, "train_s": r["train_s"],
               "eval_s": time.time() - t1, "job_s": time.time() - t0, "plan": r["plan"],
               "command": "python benchmarks/quality_parity.py " + " ".join(_public_argv(sys.argv[1:]))}
        (rundir / "result.json").write_text(json.dumps(res, indent=1) + "\n")
        log(f"{arm} seed {seed}: average {res['average']:.2f}, STS {res['groups'].get('sts_average', float('nan')):.2f}"
            f" -> {rundir / 'result.json'}")


def runs_from_result_files(args, folder: Path) -> tuple[dict, list[str]]:
    """--results-dir: the runs of folder's per-run result files (jaxembed_<ARM>_s<SEED>.json, copies of --job's
    result.json) as summarize_workdir reads runs: {("jaxembed", arm, seed): {"eval": {task: {"main_score": x}},
    "train_s", "plan", "result_file"}}, and the names of the files of other settings (steps, batch size, eval tasks
    or sample), which are left out. A result.json has the full-width scores only: no Matryoshka views."""
    import re

    runs, stale = {}, []
    want = (args.steps, args.batch_size, {"tasks": args.eval_tasks, "max_examples": args.eval_max_examples})
    for p in sorted(folder.glob("jaxembed_*_s*.json")):
        m = re.fullmatch(r"jaxembed_(.+)_s(\d+)\.json", p.name)
        if not m:
            continue
        res = json.loads(p.read_text())
        if (res.get("steps"), res.get("global_batch_size"), res.get("eval")) != want:
            stale.append(p.name)
            continue
        runs[("jaxembed", m.group(1), int(m.group(2)))] = {
            "eval": {t: {"main_score": v} for t, v in res["scores"].items()}, "train_s": res["train_s"],
            "plan": res["plan"], "result_file": str(p)}
    return runs, stale


def summarize_workdir(args) -> None:
    """--summarize: every finished jaxembed run of the workdir (train.json + eval.json of the current eval
    settings) compared as in the all-in-one mode; the result file, a markdown table, a README line."""
    import re

    wd = Path(args.workdir)
    key = f"{args.eval_tasks}|{args.eval_max_examples}|{DIMS}"
    runs, seeds, stale = {}, set(), []
    for d in sorted(wd.glob("jaxembed_*_s*")):
        m = re.fullmatch(r"jaxembed_(.+)_s(\d+)", d.name)
        if not m or not (d / "train.json").exists() or not (d / "eval.json").exists():
            continue
        ev = json.loads((d / "eval.json").read_text())
        if not ev.get("key", "").startswith(key):
            stale.append(d.name)
            continue
        r = json.loads((d / "train.json").read_text())
        r["eval"] = ev["results"]
        runs[("jaxembed", m.group(1), int(m.group(2)))] = r
        seeds.add(int(m.group(2)))
    if args.results_dir:
        more, old = runs_from_result_files(args, Path(args.results_dir))
        stale += old
        for k, r in more.items():
            if k not in runs:
                runs[k] = r
                seeds.add(k[2])
    if stale:
        log(f"left out (evaluated with other settings): {', '.join(stale)}")
    arms = [a for a in dict.fromkeys(arm for _, arm, _ in sorted(runs)) if a != "base"]
    if not runs:
        raise SystemExit(f"error: no finished run in {wd} (fix: run --job ARM:SEED first)")
    ablation = ablation_rows(runs, arms, sorted(seeds))
    per_arm = {a: summarize(runs, "jaxembed", a, sorted(seeds)) for a in ["base", *arms]}
    result = {"benchmark": "quality_parity", "mode": "summarize", "date": datetime.date.today().isoformat(),
              "device": "cpu", "host": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
              "recipe": {"config": args.recipe, "steps": args.steps, "global_batch_size": args.batch_size},
              "eval": {"tasks": args.eval_tasks, "max_examples": args.eval_max_examples, "dims": list(DIMS)},
              "arms": {a: v for a, v in per_arm.items() if v}, "ablations": ablation,
              "runs": {f"{t}_{a}_s{s}": {k: v for k, v in r.items() if k not in ("key", "record")}
                       for (t, a, s), r in runs.items()},
              "train_s_total": sum(r["train_s"] for r in runs.values()),
              "command": "python benchmarks/quality_parity.py " + " ".join(_public_argv(sys.argv[1:]))}
    path = save_result(args.name, result)
    table = markdown_table(ablation)
    print(table)
    parts = ablation_parts(ablation)
    if parts:
        record_line(f"| {result['date']} | quality_parity | cpu ({result['cpu_count']} cores) | all-MiniLM-L6-v2, "
                    f"{args.recipe}, {args.steps} steps x batch {args.batch_size}, eval sample "
                    f"{args.eval_max_examples or 'full'} | {'; '.join(parts)} | `{result['command']}` |",
                    append=not args.no_readme)
    log(f"results in {path}")


if __name__ == "__main__":
    main()
