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
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from _record import record_line, save_result  # noqa: E402

ABLATIONS = ("peg", "mrl", "curriculum", "mote", "mote_clustering", "padded")
#: the arms each --ablations entry runs (besides the baseline)
ABLATION_ARMS = {"curriculum": ("curriculum", "curriculum_balanced", "curriculum_shuffled", "curriculum_vanilla"),
                 "mote_clustering": ("ic_clustering", "mote_clustering")}
#: arms compared with another arm than the baseline too: arm -> [(key prefix, reference arm)]
REFERENCES = {**{a: [("vanilla", "curriculum_vanilla")] for a in ("curriculum", "curriculum_shuffled",
                                                                   "curriculum_masked")},
              "curriculum_balanced": [("vanilla", "curriculum_vanilla"), ("cyclic", "curriculum")],
              "mote_clustering": [("ic_clustering", "ic_clustering")]}
#: arms trained with the clustering sets added to the recipe's data (their own store)
CLUSTERING_ARMS = ("ic_clustering", "mote_clustering")
#: every jaxembed arm (--job ARM:SEED)
ARMS = ("base", "peg", "mrl", "curriculum", "curriculum_balanced", "curriculum_shuffled", "curriculum_vanilla",
        "curriculum_masked", "mote", "ic_clustering", "mote_clustering", "padded")
#: Data-CUBE's measure: the average over the STS tasks
STS_TASKS = ("STSBenchmark", "SICK-R")
DIMS = (256, 128, 64)


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
                         "OpenMP threads spin at barriers: 1 thread ran a step 3-6x faster than 2 here")
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
    from jaxembed import config as cfglib

    path, _, variant = args.recipe.partition(":")
    if not Path(path).is_absolute():
        path = str(ROOT / path)
    c = cfglib.load_config_file(f"{path}:{variant}" if variant else path)
    c.plan.global_batch_size = args.batch_size
    c.plan.steps = args.steps
    c.data.seed = seed          # the plan's order
    c.train.seed = seed         # the dropout stream
    c.train.checkpoint_every = 0
    c.train.log_every = 10
    c.train.progress = False
    c.eval.tasks = ()
    c.eval.every = 0
    c.eval.best_metric = ""
    c.eval.before = False
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


def _flat(d, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def record_differences(old: dict, new: dict) -> list[str]:
    """Keys where a finished run's record and the wanted one differ. A key that only the new config has (a field
    added to jaxembed since the run) counts only when it is not at its default: other engineers extend
    default_config() while runs exist, and a new field at its default changes nothing the run did."""
    from jaxembed import config as cfglib

    if old.get("st_loss") != new.get("st_loss"):
        return ["st_loss"]
    a, b = _flat(old["config"]), _flat(new["config"])
    defaults = _flat(json.loads(cfglib.to_json(cfglib.default_config())))
    diff = [k for k in a.keys() & b.keys() if a[k] != b[k]]
    diff += [k for k in b.keys() - a.keys() if k not in defaults or defaults[k] != b[k]]
    return sorted(diff)


# ------------------------------------------------------------------------------------ sentence-transformers


class PlanBatchSampler:
    """Yields the row indices of plan step 0, 1, ... (rows are laid out step-major: row = step * G + r), so a
    torch DataLoader over the flattened plan gives exactly jaxembed's batches in jaxembed's order."""

    def __init__(self, steps: int, batch_size: int):
        self.steps, self.batch_size = steps, batch_size

    def __iter__(self):
        for s in range(self.steps):
            yield list(range(s * self.batch_size, (s + 1) * self.batch_size))

    def __len__(self):
        return self.steps


def plan_rows(store, plan, tok):
    """The flattened plan as ST dataset rows: {"anchor", "positive", "negative_1", ..., "label"}, where anchor is
    instruction + query and the documents are exactly the loader's choice for that (step, row). label holds
    [id(positive), id(negative_1) or -1 when the slot is empty, ..., step]: text identities (ids of the raw text
    without instruction, as jaxembed's hashes) for the masks, and the step for the token check."""
    import numpy as np

    from jaxembed.data.pipeline import _fetch, _row_items, _Tables

    tables = _Tables(store.datasets, tok, np.unique(plan.dataset_ids).tolist())
    used = np.unique(plan.dataset_ids).tolist()
    lq = {tables.max_q[d] for d in used}
    ld = {tables.max_d[d] for d in used}
    if len(lq) != 1 or len(ld) != 1:
        raise SystemExit(f"error: the datasets of the plan have different max lengths (queries {sorted(lq)}, "
                         f"documents {sorted(ld)}); ST's collator takes one length per column")
    K = tables.K
    negatives = plan.config.get("negatives", "first")
    G = plan.global_batch_size
    ids: dict[str, int] = {}
    rows = []
    for s in range(plan.steps):
        ds, ex = plan.dataset_ids[s], plan.example_ids[s]
        q_items, d_items, _, d_raw = _row_items(tables, _fetch(store, ds, ex), ds, np.arange(G), s, plan.seed,
                                                negatives)
        for r in range(G):
            row = {"anchor": q_items[r][0]}
            label = []
            for j in range(K):
                item, raw = d_items[r * K + j], d_raw[r * K + j]
                row["positive" if j == 0 else f"negative_{j}"] = item[0] if item is not None else ""
                label.append(ids.setdefault(raw, len(ids)) if raw is not None else -1)
            row["label"] = label + [s]
            rows.append(row)
    return rows, K, lq.pop(), ld.pop()


def make_masked_mnrl():
    import torch
    import torch.nn.functional as F
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    class MaskedMNRL(MultipleNegativesRankingLoss):
        """ST's MultipleNegativesRankingLoss (query -> documents, joint softmax) with jaxembed's two masks: an
        empty negative slot (label id -1) is no candidate, and a candidate whose text is the query's own positive
        (same id, another column) is no negative. labels: int64 [B, K + 1] = ids of (positive, negatives), step."""

        def compute_loss_from_embeddings(self, embeddings, labels):
            q, docs = embeddings[0], embeddings[1:]
            B, K = q.shape[0], len(docs)
            cand = torch.cat(docs, 0)                        # column-major: all positives, then negatives_1, ...
            cid = labels[:, :K].T.reshape(-1)                # [K*B] text ids in the same order
            logits = self.similarity_fct(q, cand) * self.scale   # [B, K*B]
            rows = torch.arange(B, device=q.device)
            allowed = (cid >= 0)[None, :] & (cid[None, :] != labels[:, :1])
            allowed[rows, rows] = True                       # the own positive (column r) always counts
            logits = logits.masked_fill(~allowed, float("-inf"))
            return F.cross_entropy(logits, rows)

    return MaskedMNRL


def loss_agreement(c, store, plan, loader, st_loss, collator, rows, K: int, doc_cols: list[str]) -> dict:
    """Before training, with dropout off and the same starting weights: ST's loss on a batch vs jaxembed's
    InfoNCE on jaxembed's loader batch of the same step, for the first step, the first step with empty negative
    slots and the first step whose queries share a positive. -> {step: (st, jaxembed)}."""
    import numpy as np
    import torch

    from jaxembed import hf
    from jaxembed.losses import CandidateInfo, QueryInfo, layout_pos_index
    from jaxembed.losses.infonce import contrastive_loss

    G = plan.global_batch_size
    labels = np.array([r["label"] for r in rows]).reshape(plan.steps, G, K + 1)
    empty = np.flatnonzero((labels[:, :, 1:K] < 0).any(axis=(1, 2)))
    shared = np.flatnonzero([len(set(x[:, 0].tolist())) < G for x in labels])
    steps = [0] + [int(a[0]) for a in (empty, shared) if a.size]
    model = hf.load(c.model.name, max_length=c.model.max_length or None).model
    out = {}
    was_training = st_loss.model.training
    st_loss.model.eval()
    for s in dict.fromkeys(steps):
        b = loader.batch(s)
        eq = model(b["query_input_ids"], b["query_attention_mask"], b["query_prompt_length"], deterministic=True)
        ed = model(b["doc_input_ids"], b["doc_attention_mask"], b["doc_prompt_length"], deterministic=True)
        qi = QueryInfo(pos_hash=b["doc_hash"][::K])
        ci = CandidateInfo(b["doc_valid"], b["doc_hash"], None)
        jl, _ = contrastive_loss(eq, ed, layout_pos_index(eq.shape[0], K), temperature=float(c.loss.temperature),
                                 qi=qi, ci=ci)
        batch = collator(rows[s * G:(s + 1) * G])
        labels = batch.pop("label")
        feats = [{k[len(col) + 1:]: v for k, v in batch.items() if k.startswith(col + "_")}
                 for col in ["anchor", *doc_cols]]
        with torch.no_grad():
            sl = float(st_loss(feats, labels))
        out[int(s)] = (sl, float(jl))
    st_loss.model.train(was_training)
    return out


def train_st(args, seed: int, rundir: Path, store_dir: Path) -> dict:
    """One sentence-transformers run on the plan of ``seed``; saves the model to rundir/model."""
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.data_collator import SentenceTransformerDataCollator
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from torch import nn
    from transformers import set_seed
    from transformers.optimization import get_linear_schedule_with_warmup
    from transformers.trainer_pt_utils import get_parameter_names

    from jaxembed import config as cfglib
    from jaxembed.data.pipeline import make_loader
    from jaxembed.data.plan import build_plan
    from jaxembed.data.store import Store
    from jaxembed.hf import read_sentence_transformers
    from jaxembed.tokenizer import Tokenizer

    c = arm_config(args, "base", seed, store_dir)
    store = Store.open(store_dir)
    plan = build_plan(store, c.plan, data_config=cfglib.data_section(c))
    jax_plan = rundir.parent / f"jaxembed_base_s{seed}" / "plan.npz"
    if jax_plan.exists():
        from jaxembed.data.plan import Plan

        if Plan.load(jax_plan).fingerprint() != plan.fingerprint():
            raise SystemExit(f"error: the plan differs from {jax_plan}")
    info = read_sentence_transformers(Path(c.model.name))
    if not info.head.include_prompt:
        raise SystemExit("error: this model's pooling excludes prompt tokens; pass the instructions as ST prompts "
                         "(prompt_length) instead of prefixed text")
    tok = Tokenizer.from_folder(info.transformer_dir, c.model.max_length or info.max_seq_length,
                                lowercase=info.do_lower_case)
    if np.isfinite(plan.temperatures).any():
        raise SystemExit("error: the recipe gives some tasks their own temperature; the ST side has one scale "
                         "(run the parity on a recipe without per-dataset temperatures, e.g. configs/demo.py)")
    if "mote" in c.model and c.model.mote.enabled:
        raise SystemExit("error: the ST side has no MoTE; run --tools jaxembed for a MoTE recipe")
    rows, K, Lq, Ld = plan_rows(store, plan, tok)
    loader = make_loader(store, plan, tok)  # jaxembed's batches, to check ST's tokenization against

    if args.st_threads:
        torch.set_num_threads(args.st_threads)
    set_seed(seed)  # as the HF Trainer does: dropout stream
    model = SentenceTransformer(c.model.name, device="cpu")
    if not getattr(model[1], "include_prompt", True):
        raise SystemExit("error: the ST Pooling excludes prompt tokens")
    model.max_seq_length = c.model.max_length or model.max_seq_length
    doc_cols = ["positive"] + [f"negative_{j}" for j in range(1, K)]
    lengths = {"anchor": Lq, **{col: Ld for col in doc_cols}}

    class Collator(SentenceTransformerDataCollator):
        """ST's collator, with one max length per column (queries Lq, documents Ld) and a check that every batch
        tokenizes to the very ids of jaxembed's loader batch for the same step."""

        checked = 0

        def _get_task_for_column(self, column_name, column_position, router_mapping):
            self._column = column_name
            return None

        def _get_max_length_for_task(self, task):
            return lengths[self._column]

        def __call__(self, features):
            batch = super().__call__(features)
            step = int(batch["label"][0, -1])
            ref = loader.batch(step)
            pairs = [("anchor", ref["query_input_ids"], ref["query_attention_mask"])]
            pairs += [(col, ref["doc_input_ids"][j::K], ref["doc_attention_mask"][j::K])
                      for j, col in enumerate(doc_cols)]
            for col, rid, rmask in pairs:
                ids, mask = batch[f"{col}_input_ids"].numpy(), batch[f"{col}_attention_mask"].numpy()
                for r in range(ids.shape[0]):
                    a, b = ids[r][mask[r] == 1], rid[r][rmask[r] == 1]
                    if not np.array_equal(a, b):
                        raise SystemExit(f"error: step {step} row {r} column {col}: ST tokens {a.tolist()} != "
                                         f"jaxembed tokens {b.tolist()}")
            Collator.checked += 1
            return batch

    collator = Collator(preprocess_fn=model.preprocess)
    dl = torch.utils.data.DataLoader(rows, batch_sampler=PlanBatchSampler(plan.steps, plan.global_batch_size),
                                     collate_fn=collator)
    scale = 1.0 / float(c.loss.temperature)
    loss_fn = (make_masked_mnrl() if args.st_loss == "masked" else MultipleNegativesRankingLoss)(model, scale=scale)
    # the HF Trainer's optimizer: AdamW, no weight decay on LayerNorm weights and biases
    decay = set(get_parameter_names(model, [nn.LayerNorm],
                                    [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in named if n in decay], "weight_decay": c.optim.weight_decay},
              {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=c.optim.lr, betas=(c.optim.b1, c.optim.b2), eps=c.optim.eps)
    warmup = c.optim.warmup_steps if c.optim.warmup_steps >= 0 else int(c.optim.warmup_ratio * plan.steps)
    sched = get_linear_schedule_with_warmup(opt, warmup, plan.steps)
    agree = loss_agreement(c, store, plan, loader, loss_fn, collator, rows, K, doc_cols)
    diff = max(abs(a - b) for a, b in agree.values())
    print(f"[st seed {seed}] loss before training, ST vs jaxembed (no dropout): " +
          ", ".join(f"step {s}: {a:.6f} vs {b:.6f}" for s, (a, b) in agree.items()) + f"; max |diff| {diff:.2e}",
          flush=True)
    if args.st_loss == "masked" and diff > 1e-3:
        raise SystemExit(f"error: ST's masked loss and jaxembed's InfoNCE differ by {diff:.2e} on the same batch")
    Collator.checked = 0
    model.train()
    losses, log = [], []
    t0 = time.time()
    for step, batch in enumerate(dl):
        labels = batch.pop("label")
        features = [{k[len(col) + 1:]: v for k, v in batch.items() if k.startswith(col + "_")}
                    for col in ["anchor", *doc_cols]]
        loss = loss_fn(features, labels)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), c.optim.grad_clip)
        opt.step()
        sched.step()
        model.zero_grad()
        losses.append(float(loss))
        if (step + 1) % c.train.log_every == 0:
            rec = {"step": step + 1, "loss": statistics.mean(losses[-c.train.log_every:]),
                   "grad_norm": float(gnorm), "time": round(time.time() - t0, 1)}
            log.append(rec)
            print(f"[st seed {seed}] step {step + 1}/{plan.steps} loss {rec['loss']:.4f} ({rec['time']}s)",
                  flush=True)
    train_s = time.time() - t0
    model.save(str(rundir / "model"))
    return {"train_s": train_s, "log": log, "token_checks": Collator.checked, "plan": plan.fingerprint(),
            "loss_agreement_before_training": {str(k): v for k, v in agree.items()},
            "loss_fn": type(loss_fn).__name__, "scale": scale, "warmup_steps": warmup}


def stock_datasets(store, plan, rows: list[dict], K: int) -> dict[str, list[dict]]:
    """The plan's rows (``plan_rows``) grouped by dataset for a stock ST ``DatasetDict``: columns anchor, positive,
    negative_1, ... (no label, no empty slot); rows whose negative slots are empty go to ``<name>_pairs``."""
    G = plan.global_batch_size
    out: dict[str, list[dict]] = {}
    for i, row in enumerate(rows):
        name = store.datasets[int(plan.dataset_ids[i // G][i % G])].name
        negs = [row[f"negative_{j}"] for j in range(1, K) if row.get(f"negative_{j}")]
        rec = {"anchor": row["anchor"], "positive": row["positive"]}
        rec.update({f"negative_{j + 1}": t for j, t in enumerate(negs)})
        key = name if len(negs) == K - 1 else f"{name}_pairs" if not negs else f"{name}_{len(negs)}neg"
        out.setdefault(key, []).append(rec)
    return out


def train_st_stock(args, seed: int, rundir: Path, store_dir: Path) -> dict:
    """One stock sentence-transformers run (see the module docstring) on the examples of the plan of ``seed``;
    saves the model to rundir/model."""
    import datasets
    import torch
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, \
        SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sentence_transformers.sentence_transformer.training_args import MultiDatasetBatchSamplers

    from jaxembed import config as cfglib
    from jaxembed.data.plan import build_plan
    from jaxembed.data.store import Store
    from jaxembed.hf import read_sentence_transformers
    from jaxembed.tokenizer import Tokenizer

    c = arm_config(args, "base", seed, store_dir)
    store = Store.open(store_dir)
    plan = build_plan(store, c.plan, data_config=cfglib.data_section(c))
    info = read_sentence_transformers(Path(c.model.name))
    tok = Tokenizer.from_folder(info.transformer_dir, c.model.max_length or info.max_seq_length,
                                lowercase=info.do_lower_case)
    rows, K, Lq, Ld = plan_rows(store, plan, tok)
    groups = stock_datasets(store, plan, rows, K)
    train_ds = datasets.DatasetDict({k: datasets.Dataset.from_list(v) for k, v in groups.items()})
    if args.st_threads:
        torch.set_num_threads(args.st_threads)
    model = SentenceTransformer(c.model.name, device="cpu")
    model.max_seq_length = max(Lq, Ld)  # stock ST: one length for every column
    warmup = c.optim.warmup_steps if c.optim.warmup_steps >= 0 else int(c.optim.warmup_ratio * plan.steps)
    targs = SentenceTransformerTrainingArguments(
        output_dir=str(rundir / "trainer"), max_steps=plan.steps, per_device_train_batch_size=plan.global_batch_size,
        learning_rate=c.optim.lr, warmup_steps=warmup, lr_scheduler_type="linear", weight_decay=c.optim.weight_decay,
        max_grad_norm=c.optim.grad_clip, adam_beta1=c.optim.b1, adam_beta2=c.optim.b2, adam_epsilon=c.optim.eps,
        seed=seed, data_seed=seed, multi_dataset_batch_sampler=MultiDatasetBatchSamplers.PROPORTIONAL,
        logging_steps=c.train.log_every, save_strategy="no", report_to="none", use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True)
    loss = MultipleNegativesRankingLoss(model, scale=1.0 / float(c.loss.temperature))
    trainer = SentenceTransformerTrainer(model=model, args=targs, train_dataset=train_ds, loss=loss)
    t0 = time.time()
    out = trainer.train()
    train_s = time.time() - t0
    model.save(str(rundir / "model"))
    log = [{"step": x["step"], "loss": x["loss"], "grad_norm": x.get("grad_norm")}
           for x in trainer.state.log_history if "loss" in x]
    return {"train_s": train_s, "log": log, "steps": int(out.global_step), "plan": plan.fingerprint(),
            "datasets": {k: len(v) for k, v in groups.items()}, "loss_fn": type(loss).__name__,
            "max_seq_length": model.max_seq_length, "warmup_steps": warmup,
            "trainer": "SentenceTransformerTrainer (stock)"}


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
        res = (train_st if tool == "st" else train_st_stock)(args, seed, rundir, wd / "store")
        res["model_dir"] = str(rundir / "model")
    else:
        res = train_jaxembed(args, arm, seed, rundir, wd / "store")
    res["record"] = run_record(arm_config(args, arm, seed, wd / "store"), tool, args)
    (rundir / "train.json").write_text(json.dumps(res, indent=1) + "\n")


# ------------------------------------------------------------------------------------------------ driver


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_training(args, tool: str, arm: str, seed: int) -> dict:
    wd = Path(args.workdir)
    rundir = wd / f"{tool}_{arm}_s{seed}"
    want = run_record(arm_config(args, arm, seed, wd / "store"), tool, args)
    done = rundir / "train.json"
    if done.exists():
        prev = json.loads(done.read_text())
        diff = record_differences(prev["record"], want)
        if not diff:
            log(f"{tool} {arm} seed {seed}: reusing {rundir}")
            return prev
        raise SystemExit(f"error: {rundir} holds a finished run of another config ({', '.join(diff[:8])} differ); "
                         "fix: use another --workdir, or delete that run directory to retrain it")
    if rundir.exists():
        import shutil

        shutil.rmtree(rundir)  # an interrupted run (no train.json): start it again
    log(f"{tool} {arm} seed {seed}: training ({args.steps} steps, batch {args.batch_size})")
    argv = [sys.executable, str(Path(__file__).resolve()), "--_train", f"{tool}:{arm}:{seed}",
            *[a for a in _forward_argv(args)]]
    subprocess.run(argv, check=True)
    res = json.loads(done.read_text())
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


def run_eval(args, rundir: Path, model_dir: str, experts=None) -> dict:
    out = rundir / "eval.json"
    key = f"{args.eval_tasks}|{args.eval_max_examples}|{DIMS}|{experts}"
    if out.exists():
        prev = json.loads(out.read_text())
        if prev.get("key") == key:
            return prev["results"]
    from jaxembed.evaluate import evaluate

    t0 = time.time()
    # a Path, not a str: jaxembed.evaluate's as_encoder takes anything with .encode for an encoder (str has one)
    res = evaluate(Path(model_dir), args.eval_tasks, dims=list(DIMS), max_examples=args.eval_max_examples or None,
                   experts=experts)
    log(f"  evaluated {rundir.name} in {time.time() - t0:.0f}s: " +
        ", ".join(f"{t} {r['main_score']:.2f}" for t, r in res.items()))
    out.write_text(json.dumps({"key": key, "results": res}, indent=1) + "\n")
    return res


def mteb_check(args, runs: dict) -> dict:
    """mteb on --mteb-tasks for seed-0 models: jaxembed's MTEB encoder for both, ST's own encoder for the ST one."""
    tasks = [t for t in args.mteb_tasks.split(",") if t]
    if not tasks:
        return {}
    import tempfile

    import mteb

    from jaxembed.evaluate import mteb_tasks, run_mteb
    from jaxembed.evaluate.mteb_adapter import _scores_of

    out = {}
    for (tool, arm, seed), r in runs.items():
        if arm != "base" or seed != min(args.seeds):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            mx = args.eval_max_examples or None
            res = run_mteb(Path(r["model_dir"]), tasks, out=tmp, max_examples=mx)
            row = {t: {"local": r["eval"][t]["main_score"], "mteb_jaxembed_encoder": res[t]["main_score"]}
                   for t in tasks}
            if tool in ("st", "st_stock"):
                from sentence_transformers import SentenceTransformer

                st_model = SentenceTransformer(r["model_dir"], device="cpu")
                st_res = mteb.evaluate(st_model, mteb_tasks(tasks, max_examples=mx), cache=mteb.ResultCache(cache_path=tmp),
                                       overwrite_strategy="always", show_progress_bar=False, co2_tracker=False)
                for tr in st_res.task_results:
                    row[tr.task_name]["mteb_st_encoder"] = _scores_of(tr)["main_score"]
        out[f"{tool}_s{seed}"] = row
        log(f"  mteb {tool} seed {seed}: {row}")
    return out


def summarize(runs: dict, tool: str, arm: str, seeds, dim: str | None = None) -> dict | None:
    """Per task: mean over seeds and the seeds' values; the average over tasks per seed, its mean and spread."""
    got = [runs[(tool, arm, s)] for s in seeds if (tool, arm, s) in runs]
    if not got:
        return None

    def score(r, t):
        e = r["eval"][t]
        return e["main_score"] if dim is None else e["dims"][dim]["main_score"]

    tasks = list(got[0]["eval"])
    per_task = {t: {"mean": statistics.mean(score(r, t) for r in got), "seeds": [score(r, t) for r in got]}
                for t in tasks}
    avgs = [statistics.mean(score(r, t) for t in tasks) for r in got]
    out = {"per_task": per_task, "average": statistics.mean(avgs), "average_seeds": avgs,
           "spread": (max(avgs) - min(avgs)) if len(avgs) > 1 else 0.0, "seeds": [s for s in seeds
                                                                                   if (tool, arm, s) in runs]}
    for key, group in task_groups(tasks).items():  # the STS average (Data-CUBE) and each task type's (MoTE)
        vals = [statistics.mean(score(r, t) for t in group) for r in got]
        out.setdefault("groups", {})[key] = {"tasks": group, "average": statistics.mean(vals), "seeds": vals,
                                             "spread": (max(vals) - min(vals)) if len(vals) > 1 else 0.0}
    return out


def task_groups(tasks) -> dict[str, list[str]]:
    """{"sts_average": the STS tasks of STS_TASKS (Data-CUBE's measure), "type:<Type>": the tasks of each MTEB task
    type (MoTE's per-type averages)}, over the evaluated tasks."""
    from jaxembed.evaluate.tasks import get_task

    out = {"sts_average": [t for t in tasks if t in STS_TASKS]} if any(t in STS_TASKS for t in tasks) else {}
    for t in tasks:
        out.setdefault(f"type:{get_task(t).type}", []).append(t)
    return out


def _diff_row(runs, arm: str, ref: str, seeds, dim: str | None = None) -> dict | None:
    """arm vs ref over the seeds both have: averages, the difference per seed, its mean and spread, and the same for
    the STS average and each task type."""
    both = [s for s in seeds if ("jaxembed", arm, s) in runs and ("jaxembed", ref, s) in runs]
    a, b = (summarize(runs, "jaxembed", x, both, dim) for x in (arm, ref))
    if not both or a is None or b is None:
        return None

    def diff(x, y):
        d = [p - q for p, q in zip(x, y)]
        return {"difference": statistics.mean(d), "difference_seeds": d,
                "difference_spread": (max(d) - min(d)) if len(d) > 1 else 0.0}

    row = {"seeds": both, "reference": ref, "baseline_average": b["average"], "arm_average": a["average"],
           "baseline_average_seeds": b["average_seeds"], "arm_average_seeds": a["average_seeds"],
           "baseline_spread": b["spread"], "arm_spread": a["spread"], **diff(a["average_seeds"], b["average_seeds"]),
           "per_task": {t: {"baseline": b["per_task"][t]["mean"], "arm": a["per_task"][t]["mean"]}
                        for t in a["per_task"]}}
    row["groups"] = {k: {"baseline": b["groups"][k]["average"], "arm": g["average"], "tasks": g["tasks"],
                         "baseline_seeds": b["groups"][k]["seeds"], "arm_seeds": g["seeds"],
                         **diff(g["seeds"], b["groups"][k]["seeds"])}
                     for k, g in a.get("groups", {}).items()}
    return row


def ablation_rows(runs: dict, arms, seeds) -> dict:
    """Each arm vs the baseline ('base'; at 384 dims and every Matryoshka view), plus its REFERENCES (the curriculum
    arms vs Vanilla, the balanced walk vs the cyclic one, MoTE with clustering data vs the baseline with it) as
    ``difference_vs_<key>`` / ``vs_<key>``. Arms or references without a finished run are left out."""
    out = {}
    dims = DIMS if all("dims" in e for r in runs.values() for e in r["eval"].values()) else ()
    for a in arms:
        row = _diff_row(runs, a, "base", seeds)
        if row is None:
            continue
        for d in dims:
            x = _diff_row(runs, a, "base", seeds, str(d))
            row[f"dim{d}"] = {"baseline_average": x["baseline_average"], "arm_average": x["arm_average"],
                              "difference": x["difference"]}
        for key, ref in REFERENCES.get(a, []):
            v = _diff_row(runs, a, ref, seeds)
            if v is not None:
                row[f"{key}_average"] = v["baseline_average"]
                row[f"difference_vs_{key}"] = v["difference"]
                row[f"difference_vs_{key}_seeds"] = v["difference_seeds"]
                row[f"vs_{key}"] = v
        out[a] = row
    return out


def _public_argv(argv: list[str]) -> list[str]:
    """The command line without --workdir / --name / --no-readme (machine-local or bookkeeping)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--workdir", "--name"):
            skip = True
            continue
        if a.startswith(("--workdir=", "--name=")) or a == "--no-readme":
            continue
        out.append(a)
    return out


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
        r["eval"] = run_eval(args, wd / f"{tool}_{arm}_s{s}", r["model_dir"],
                             experts if arm.startswith("mote") else None)
        runs[(tool, arm, s)] = r
    mteb_res = mteb_check(args, runs)

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


def ablation_parts(ablation: dict) -> list[str]:
    """One phrase per arm for the README line: vs base at every dimension, then vs its references."""
    return [f"{a} vs base (seeds {row['seeds']}): {row['difference']:+.2f} at 384"
            + "".join(f", {row[f'dim{d}']['difference']:+.2f} at {d}" for d in DIMS if f"dim{d}" in row)
            + "".join(f"; vs {ref} {row[f'difference_vs_{key}']:+.2f}" for key, ref in REFERENCES.get(a, [])
                      if f"difference_vs_{key}" in row)
            for a, row in ablation.items()]


def markdown_table(ablation: dict) -> str:
    """The comparisons as a markdown table: the average over the eval tasks, the STS average and each task type,
    difference as mean over seeds (spread over seeds), per seed."""
    lines = []
    for a, row in ablation.items():
        for key, r in [("base", row)] + [(k, row[f"vs_{k}"]) for k, _ in REFERENCES.get(a, [])
                                         if f"vs_{k}" in row]:
            if not lines:
                groups = list(r["groups"])
                lines.append("| arm | vs | seeds | all tasks | " + " | ".join(
                    g.replace("type:", "") for g in groups) + " | all tasks per seed |")
                lines.append("|" + "---|" * (len(groups) + 5))
            cell = lambda x: f"{x['difference']:+.2f} ({x['difference_spread']:.2f})"  # noqa: E731
            lines.append(f"| {a} | {r['reference']} | {len(r['seeds'])} | {cell(r)} | "
                         + " | ".join(cell(r["groups"][g]) if g in r["groups"] else "" for g in groups)
                         + " | " + " / ".join(f"{x:+.2f}" for x in r["difference_seeds"]) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------- one run at a time


def _lock(wd: Path):
    """An exclusive lock on <workdir>/.quality_parity.lock (jobs started side by side prepare a store once)."""
    import fcntl

    f = open(wd / ".quality_parity.lock", "w")
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def prepare_stores(args, arms) -> None:
    """The dataset store of each data config the arms train on (the recipe's; with the clustering sets), written
    once; a store prepared from another data config stops the script."""
    from jaxembed import config as cfglib
    from jaxembed.train import prepare_store

    wd = Path(args.workdir)
    wd.mkdir(parents=True, exist_ok=True)
    with _lock(wd):
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
            prepare_store(c, where)
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
        r["eval"] = run_eval(args, rundir, r["model_dir"], experts if arm.startswith("mote") else None)
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
