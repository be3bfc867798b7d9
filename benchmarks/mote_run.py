"""MoTE vs instruction conditioning (IC): train each for N steps on the real shared data, score the dev tasks.

Both runs start from all-MiniLM-L6-v2 and use ``configs/mote.py:cpu``. They see the same data, instructions,
TA-CL batches and temperatures and the same steps. ``mote`` up-cycles every feed-forward block into the four
task experts; ``ic`` keeps the dense model (``:cpu,ic``). Optional extra variants: ``static`` (MoTE with the
static baseline of MoTE Table 4) and ``eob`` (every other block).

Each run is evaluated after training with jaxembed's local evaluators on the dev tasks (``*-dev``, the whole
sets). The instructions are those of training: the registered task instruction, in KaLM style, on the queries of
asymmetric tasks (retrieval, reranking, classification) and none on STS / pair classification. A MoTE model
routes each task to its experts by its own routing. The untrained base model is scored the same way.

Writes benchmarks/results/mote_run_<platform>.json and appends a line to benchmarks/README.md.

    nice -n 10 python benchmarks/mote_run.py --steps 100 [--variants mote,ic] [--workdir runs/mote_bench]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import time
from pathlib import Path

from _record import record_line, save_result  # noqa: E402  (benchmarks/ is on sys.path)

HERE = Path(__file__).resolve().parent
VARIANTS = {"mote": "cpu", "ic": "cpu,ic", "static": "cpu,static", "eob": "cpu,eob"}
KALM = "Instruct: {instruction} \n Query: "  # jaxembed.data.config.KALM_TEMPLATE, as in training


def dev_prompts(tasks) -> dict[str, str]:
    """Training's instruction style: KaLM-style instructions on asymmetric tasks, none on symmetric ones."""
    from jaxembed.evaluate import instruction_prompts

    out = {}
    for t in tasks:
        if t.type in ("STS", "PairClassification"):
            continue
        out.update(instruction_prompts(t.name, t.type, t.query_instruction, t.document_instruction, KALM))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--variants", default="mote,ic", help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--workdir", default=str(HERE.parent / "runs" / "mote_bench"))
    ap.add_argument("--max-examples", type=int, default=0, help="dev sample per task (0 = whole dev sets)")
    ap.add_argument("--fresh", action="store_true", help="delete earlier runs in --workdir first")
    ap.add_argument("--no-readme", action="store_true")
    args = ap.parse_args()

    import jax
    import numpy as np

    from jaxembed import config as cfglib
    from jaxembed import loading
    from jaxembed.encode import Encoder
    from jaxembed.evaluate import dev_tasks, evaluate
    from jaxembed.train import train

    variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"unknown variants {bad}; choose from {', '.join(VARIANTS)}")
    tasks = dev_tasks()
    prompts = dev_prompts(tasks)
    kw = dict(max_examples=args.max_examples or None, prompts=prompts)
    root = Path(args.workdir)
    if args.fresh and root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)

    def scores(path_or_loaded) -> dict:
        res = evaluate(Encoder.from_loaded(loading.load(path_or_loaded) if isinstance(path_or_loaded, (str, Path))
                                           else path_or_loaded), tasks, **kw)
        return {t: round(r["main_score"], 2) for t, r in res.items()}

    cfg0 = cfglib.load_config_file(str(HERE.parent / "configs" / "mote.py") + ":cpu")
    t0 = time.time()
    results = {"base": {"scores": scores(cfg0.model.name), "eval_s": round(time.time() - t0, 1)}}
    print("base", results["base"], flush=True)
    for v in variants:
        cfg = cfglib.load_config_file(str(HERE.parent / "configs" / "mote.py") + ":" + VARIANTS[v])
        cfg.plan.steps = args.steps
        cfg.eval.tasks, cfg.eval.every, cfg.eval.before = (), 0, False  # scored below, on the export
        cfg.train.checkpoint_every = args.steps
        t0 = time.time()
        summary = train(cfg, root / v)
        train_s = time.time() - t0
        t0 = time.time()
        sc = scores(summary["export"])
        lines = [json.loads(x) for x in (root / v / "metrics.jsonl").read_text().splitlines()]
        last = [x for x in lines if x["split"] == "train"][-1]
        results[v] = {"scores": sc, "train_s": round(train_s, 1), "eval_s": round(time.time() - t0, 1),
                      "final_loss": round(last["loss"], 4), "step_time_s": round(last["step_time_s"], 3),
                      "config": f"configs/mote.py:{VARIANTS[v]}", "steps": args.steps}
        print(v, results[v], flush=True)

    names = [t.name for t in tasks]
    avg = {k: round(float(np.mean([r["scores"][n] for n in names])), 2) for k, r in results.items()}
    dev = jax.devices()[0]
    out = {"date": datetime.date.today().isoformat(), "device": f"{dev.platform}:{dev.device_kind}",
           "cpu_count": os.cpu_count(), "steps": args.steps, "global_batch_size": cfg0.plan.global_batch_size,
           "tasks": names, "max_examples": args.max_examples or None, "results": results, "average": avg}
    save_result(f"mote_run_{dev.platform}", out)
    table = ", ".join(f"{k} {avg[k]:.2f}" for k in results)
    per_task = "; ".join(f"{n}: " + "/".join(f"{results[k]['scores'][n]:.2f}" for k in results) for n in names)
    line = (f"| {out['date']} | mote_run | {out['device']} ({os.cpu_count()} cores) | all-MiniLM-L6-v2, "
            f"{args.steps} steps x {cfg0.plan.global_batch_size} queries, shared train data, TA-CL; dev tasks "
            f"({'/'.join(results)}) | average {table}; {per_task} | "
            f"`nice -n 10 python benchmarks/mote_run.py --steps {args.steps} --variants {args.variants}` |")
    record_line(line, append=not args.no_readme)


if __name__ == "__main__":
    main()
