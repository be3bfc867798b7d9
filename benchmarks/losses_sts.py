"""The new losses against InfoNCE on one recipe: all-MiniLM-L6-v2 fine-tuned for a few dozen steps on the shared STS
training pairs (train/stsb_pairs + train/sick_pairs), scored on the shared STS-B dev set (dev/stsb_dev.jsonl,
``eval.tasks=("STSBenchmark-dev",)``, Spearman x 100) before and after. Never eval/.

Two groups, each compared with InfoNCE on the same data:

A. scored pairs: InfoNCE (pairs with score >= 4 as positives, in-batch negatives), CoSENT and AnglE (every pair with
   its score); ``s_*``: the same on the STS-B pairs alone (``--runs s_infonce,s_cosent,s_angle``);
B. triplets: the positive pairs with 3 hard negatives mined by the base model (``jaxembed mine``, ranks 5-40 of the
   pairs' second sentences) and scored by a teacher (``jaxembed teacher-score``): InfoNCE, InfoNCE + KL distillation,
   InfoNCE + MarginMSE, InfoNCE with GIST's guide. The only teacher / guide available offline is the base model
   itself (frozen): the distillation is self-distillation from the starting point, GIST masks what the base model
   finds as close as the positive.

    .venv/bin/python benchmarks/losses_sts.py [--steps 40] [--lr 2e-5] [--workdir runs/losses_sts]
        [--runs a_infonce,a_cosent]

Each run is ``jaxembed train`` in its own folder (a rerun skips the finished ones); the result file is
benchmarks/results/losses_sts_<device>_<date>_<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import save_result  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
JAXEMBED = str(Path(sys.executable).parent / "jaxembed")

CONFIG = '''
from jaxembed.config import default_config
from jaxembed.data.config import dataset_config


def get_config(arg=None):
    run = json.loads(arg)
    c = default_config()
    c.model.name = {model!r}
    c.model.max_length = 64
    if run["group"] in ("a", "s"):
        scored = run["loss"] in ("cosent", "angle")
        thr = None if scored else 4.0
        c.data.datasets = [
            dataset_config(name="stsb", path={stsb!r}, format="scored_pairs", task="sts", task_type="sts",
                           query_instruction="", num_negatives=0, score_threshold=thr),
            dataset_config(name="sick", path={sick!r}, format="scored_pairs", task="sts", task_type="sts",
                           query_instruction="", num_negatives=0, score_threshold=thr, extra_fields=["entailment"]),
        ][:1 if run["group"] == "s" else 2]
        c.loss.type = run["loss"]
    else:
        c.data.datasets = [dataset_config(name="sts_mined", path={mined!r}, format="triplets", task_type="sts",
                                          query_instruction="", num_negatives=3)]
        c.loss.distill = run.get("distill", "none")
        c.loss.gist_guide = {model!r} if run.get("gist") else ""
    c.data.sampling = "size"
    c.plan.strategy = "random"  # both STS datasets in every batch (one task anyway)
    c.plan.global_batch_size = 16
    c.plan.steps = {steps}
    c.optim.lr = {lr}
    c.optim.warmup_ratio = 0.1
    c.train.seed = 0
    c.train.log_every = 5
    c.train.checkpoint_every = 0
    c.train.keep_checkpoints = 1
    c.eval.tasks = ("STSBenchmark-dev",)
    c.eval.every = {steps}  # the dev score after the last step (and before the first)
    c.eval.before = True
    c.export.at_end = False
    return c
'''

RUNS = {
    "a_infonce": dict(group="a", loss="infonce"),
    "a_cosent": dict(group="a", loss="cosent"),
    "a_angle": dict(group="a", loss="angle"),
    "b_infonce": dict(group="b"),
    "b_kl": dict(group="b", distill="kl"),
    "b_margin_mse": dict(group="b", distill="margin_mse"),
    "b_gist": dict(group="b", gist=True),
    # not run by default: group A on the STS-B pairs alone (the dev set's own distribution)
    "s_infonce": dict(group="s", loss="infonce"),
    "s_cosent": dict(group="s", loss="cosent"),
    "s_angle": dict(group="s", loss="angle"),
}
DEFAULT_RUNS = [n for n in RUNS if not n.startswith("s_")]


def _run(args: list[str], log: Path) -> None:
    t0 = time.time()
    with open(log, "w") as f:
        r = subprocess.run(args, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    if r.returncode:
        raise SystemExit(f"failed ({r.returncode}) after {time.time() - t0:.0f}s: {' '.join(args)}; see {log}")


def _pairs_for_mining(data: Path, out: Path) -> None:
    """stsb + sick pairs in one scored-pairs file (mine reads one file)."""
    with open(out, "w", encoding="utf-8") as f:
        for name in ("stsb_pairs", "sick_pairs"):
            for line in open(data / "train" / f"{name}.jsonl", encoding="utf-8"):
                r = json.loads(line)
                f.write(json.dumps({k: r[k] for k in ("sentence1", "sentence2", "score")}) + "\n")


def main() -> int:
    from jaxembed import paths

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--workdir", default=str(ROOT / "runs" / "losses_sts"))
    ap.add_argument("--runs", default=",".join(DEFAULT_RUNS), help=f"of {', '.join(RUNS)}")
    a = ap.parse_args()
    wd = Path(a.workdir)
    wd.mkdir(parents=True, exist_ok=True)
    data, model = paths.shared_data_dir(), str(paths.demo_model_dir())
    names = [n for n in a.runs.split(",") if n]
    mined = wd / "sts_mined.scored.jsonl"
    timings = {}
    if any(RUNS[n]["group"] == "b" for n in names) and not mined.exists():
        t0 = time.time()
        _pairs_for_mining(data, wd / "sts_pairs.jsonl")
        _run([JAXEMBED, "mine", "--model", model, "--input", str(wd / "sts_pairs.jsonl"), "--format", "scored_pairs",
              "--score-threshold", "4.0", "--task-type", "sts", "--out", str(wd / "sts_mined.jsonl"),
              "--top-k", "20", "--window", "5:40", "--num-negatives", "3"], wd / "mine.log")
        _run([JAXEMBED, "teacher-score", "--model", model, "--input", str(wd / "sts_mined.jsonl"), "--out",
              str(mined), "-q"], wd / "teacher_score.log")
        timings["mine_and_teacher_score_s"] = round(time.time() - t0, 1)
    cfg = wd / "losses_sts_config.py"
    cfg.write_text("import json\n" + CONFIG.format(model=model, stsb=str(data / "train" / "stsb_pairs.jsonl"),
                                                   sick=str(data / "train" / "sick_pairs.jsonl"), mined=str(mined),
                                                   steps=a.steps, lr=a.lr))
    results = {}
    for name in names:
        run_dir = wd / name
        if not (run_dir / "summary.json").exists():
            t0 = time.time()
            _run([JAXEMBED, "train", "--config", f"{cfg}:{json.dumps(RUNS[name])}", "--workdir", str(run_dir)],
                 wd / f"{name}.log")
            timings[f"{name}_s"] = round(time.time() - t0, 1)
        evals = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()
                 if '"split": "eval"' in x]
        first, last = evals[0], evals[-1]
        key = "STSBenchmark-dev/main_score"
        train = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()
                 if '"split": "train"' in x]
        results[name] = {"setting": RUNS[name], "dev_before": first[key], "dev_after": last[key],
                         "dev_change": round(last[key] - first[key], 3), "steps": last["step"],
                         "train_loss_first": train[0]["loss"], "train_loss_last": train[-1]["loss"],
                         **{k: train[-1][k] for k in ("distill_loss", "cosent_loss", "angle_loss",
                                                      "masked_candidates") if k in train[-1]}}
        print(f"{name:14s} STSBenchmark-dev {first[key]:.2f} -> {last[key]:.2f} ({last[key] - first[key]:+.2f})",
              flush=True)
    import jax

    device = jax.devices()[0].platform
    out = save_result(f"losses_sts_{device}", {
        "benchmark": "losses_sts", "model": "all-MiniLM-L6-v2", "steps": a.steps, "global_batch_size": 16,
        "lr": a.lr, "dev": "dev/stsb_dev.jsonl (STSBenchmark-dev, Spearman x 100)",
        "command": f"{sys.executable} benchmarks/losses_sts.py --steps {a.steps} --lr {a.lr} --workdir {wd}",
        "results": results,
        "timings": timings, "device": device, "cpus": os.cpu_count()})
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
