"""The train step of two source trees on the same batches, interleaved: what a change costs or saves.

    git archive BASE | tar -x -C /tmp/before      # the tree before the change
    python benchmarks/step_ab.py --before /tmp/before [--after .] [--model minilm:64] [--data demo] [--steps 4]
        [--rounds 5] [--threads 1]

Each tree runs in a long-lived worker process of its own (the tree's benchmarks/train_throughput.py natural-length
worker, ``_harness.steps.serve_natural``, with the tree first on PYTHONPATH): ``jaxembed train``'s packed step as it
runs by default (dropout on, float32) on --steps batches of the plan (--pick), every text <= --max-len tokens.
Both workers build their batches and run each once (compilation), then --rounds rounds: a round runs batch 0 in
one tree then the other, then batch 1, ... (which tree goes first alternates), so the two trees' times for the
same batch are taken seconds apart on a shared machine. --threads 1 pins both workers to the same core (they take
turns, never run at once). Reported: each tree's median step time over rounds and the median over rounds of the
after / before ratio of the round's total time (wall and CPU seconds), and each tree's first loss (the same
batches: a change that keeps the values keeps it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from _harness.models import MODELS, model_folder  # noqa: E402
from _harness.proc import LineWorker, log, worker_env  # noqa: E402
from _harness.recipe import NATURAL_PICKS, natural_steps, natural_store  # noqa: E402
from _record import record_line, save_result  # noqa: E402


def _worker(tree: Path, spec: list, env: dict) -> LineWorker:
    argv = [sys.executable, str(tree / "benchmarks" / "train_throughput.py"), "--_natural",
            json.dumps(["jaxembed-packed", *spec])]
    return LineWorker(str(tree), argv, {**env, "PYTHONPATH": os.pathsep.join([str(tree), env.get("PYTHONPATH", "")])})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="the source tree before the change")
    ap.add_argument("--after", default=str(ROOT), help="the source tree after it (default: this one)")
    ap.add_argument("--model", default="minilm:64", help="NAME:GLOBAL_BATCH (benchmarks/_harness/models.py)")
    ap.add_argument("--data", default="demo", help="demo (configs/demo.py's mix) or snli")
    ap.add_argument("--max-len", type=int, default=64)
    ap.add_argument("--plan-steps", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=4, help="batches of the plan")
    ap.add_argument("--pick", default="spread", choices=NATURAL_PICKS)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="cores per worker (1: both on the same core)")
    ap.add_argument("--cache", default=str(ROOT / "runs" / "bench_models"))
    ap.add_argument("--name", default="step_ab_cpu")
    ap.add_argument("--label", default="", help="what the change is, for the record line")
    ap.add_argument("--no-readme", action="store_true")
    args = ap.parse_args(argv)
    name, _, b = args.model.partition(":")
    if name not in MODELS:
        raise SystemExit(f"error: --model {name!r}: unknown (known: {', '.join(MODELS)})")
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    trees = {"before": Path(args.before).resolve(), "after": Path(args.after).resolve()}
    store = natural_store(args.data, args.max_len, cache)
    spec = [str(model_folder(name, cache)), args.data, int(b or 64), args.max_len, args.plan_steps, args.steps,
            str(store), args.pick]
    env = worker_env(args.threads, cache)
    workers, ready = {}, {}
    try:
        for k, tree in trees.items():  # one after the other: each compiles alone
            log(f"{k}: {tree}: building the batches, compiling")
            workers[k] = _worker(tree, spec, env)
            ready[k] = workers[k].ready()
        times = {k: [] for k in trees}
        cpu = {k: [] for k in trees}
        loads = []
        for r in range(args.rounds):
            wall = {k: 0.0 for k in trees}
            used = {k: 0.0 for k in trees}
            for i in range(args.steps):
                order = list(trees) if (r + i) % 2 == 0 else list(trees)[::-1]
                for k in order:
                    t = workers[k].run(i)
                    wall[k] += sum(t["times_s"])
                    used[k] += t["cpu_s"]
            for k in trees:
                times[k].append(wall[k] / args.steps)
                cpu[k].append(used[k] / args.steps)
            loads.append(os.getloadavg()[0])
            log(f"round {r + 1}: before {times['before'][-1]:.3f} s/step, after {times['after'][-1]:.3f} s/step")
        info = {k: workers[k].end() for k in trees}
    finally:
        for w in workers.values():
            w.kill()
    ratio = statistics.median(a / b for a, b in zip(times["after"], times["before"]))
    ratio_cpu = statistics.median(a / b for a, b in zip(cpu["after"], cpu["before"]))
    step = {k: statistics.median(v) for k, v in times.items()}
    result = {"model": name, "global_batch": spec[2], "data": args.data, "max_len": args.max_len,
              "plan_steps": args.plan_steps, "plan_step_ids": natural_steps(args.plan_steps, args.steps, args.pick),
              "rounds": args.rounds, "threads_per_tree": args.threads, "trees": {k: str(v) for k, v in trees.items()},
              "label": args.label, "step_s": step, "step_s_rounds": times, "cpu_s_rounds": cpu,
              "after_over_before": ratio, "after_over_before_cpu": ratio_cpu, "load_average": loads,
              "workers": info, "ready": ready}
    save_result(args.name, result)
    losses = ", ".join(f"{k} {info[k]['loss']:.6f}" for k in trees)
    line = (f"| {__import__('datetime').date.today()} | step_ab | cpu ({os.cpu_count()} cores) | {name} "
            f"{args.data} B={spec[2]}, packed, dropout on, texts <= {args.max_len} tokens, {args.steps} batches "
            f"({args.pick}) of a {args.plan_steps}-step plan, {args.threads} core(s) per tree, {args.rounds} "
            f"interleaved rounds, load average {min(loads):.1f}-{max(loads):.1f}"
            f"{': ' + args.label if args.label else ''} | before {step['before']:.3f} s/step, after "
            f"{step['after']:.3f} s/step: after/before **{ratio:.3f}** (CPU seconds {ratio_cpu:.3f}); last loss "
            f"{losses} | `python benchmarks/step_ab.py {' '.join(argv if argv is not None else sys.argv[1:])}` |")
    record_line(line, append=not args.no_readme)
    return 0


if __name__ == "__main__":
    sys.exit(main())
