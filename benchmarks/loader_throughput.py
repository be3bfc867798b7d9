"""Loader throughput: host-local batches per second from the Grain loader with 0, 1 and 2 worker processes.

The real shared training data (../shared/data/train, every file) is prepared into a dataset store with the real
store writer, a plan is built (epoch mode, the data config's temperature sampling, global batch --batch-size),
and the loader of one host (process_count 1) is timed over the first --steps steps with the all-MiniLM-L6-v2
tokenizer. The per-step length table is computed once beforehand (timed separately as setup) and shared by every
run. Steady-state throughput skips the first --warmup batches (worker start-up, first tokenizer calls); the
start-up time is reported too. Figures: examples/s (queries), tokens/s (real tokens: queries + valid documents)
and padded tokens/s; each worker count runs --repeats times, interleaved, and the median is reported. Writes
benchmarks/results/loader_throughput_cpu.json and appends a line to benchmarks/README.md.

Worker processes tokenize on one thread each; the in-process loader (0 workers) lets the Rust tokenizer use every
core (TOKENIZERS_PARALLELISM), so on few cores 0 workers can be as fast as 2.

    python benchmarks/loader_throughput.py [--store DIR] [--steps 150] [--batch-size 64] [--workers 0 1 2]
                                           [--repeats 3]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from _record import record_line, save_result  # noqa: E402  (benchmarks/ is on sys.path)



def run(store, plan, tok, lengths, workers: int, steps: int, warmup: int) -> dict:
    from jaxembed.data.pipeline import batch_stats, make_loader

    t0 = time.perf_counter()
    loader = make_loader(store, plan, tok, end_step=steps, workers=workers, lengths=lengths, buffer=4)
    stamps, stats = [], []
    try:
        for b in loader:
            stamps.append(time.perf_counter())
            stats.append(batch_stats(b))
    finally:
        loader.close()
    ex = np.array([s["examples"] for s in stats])
    tk = np.array([s["tokens"] for s in stats])
    pd = np.array([s["padded_tokens"] for s in stats])
    dt = stamps[-1] - stamps[warmup - 1]
    sl = slice(warmup, None)
    return {"workers": workers, "batches": len(stats), "startup_s": stamps[warmup - 1] - t0,
            "total_s": stamps[-1] - t0, "steady_s": dt,
            "examples_per_s": float(ex[sl].sum() / dt), "tokens_per_s": float(tk[sl].sum() / dt),
            "padded_tokens_per_s": float(pd[sl].sum() / dt), "batches_per_s": float((len(stats) - warmup) / dt),
            "padding_efficiency": float(tk.sum() / pd.sum())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", default=None, help="a prepared store (default: prepare the shared training data "
                                                  "into a temporary folder)")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=64, help="global batch size (one host)")
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per worker count, interleaved (median)")
    ap.add_argument("--no-readme", action="store_true", help="do not append to benchmarks/README.md")
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

    from jaxembed import paths
    from jaxembed.data.pipeline import step_lengths
    from jaxembed.data.plan import build_plan
    from jaxembed.data.store import Store
    from jaxembed.tokenizer import Tokenizer

    tmp = None
    if args.store is None:
        from jaxembed.data.shared_train import shared_train_config
        from jaxembed.data.store import write_store

        tmp = tempfile.TemporaryDirectory()
        store_dir = Path(tmp.name) / "store"
        t0 = time.perf_counter()
        write_store(shared_train_config(paths.shared_data_dir()), store_dir)
        prepare_s = time.perf_counter() - t0
    else:
        store_dir, prepare_s = Path(args.store), None
    store = Store.open(store_dir)
    tok = Tokenizer.from_folder(paths.demo_model_dir())
    t0 = time.perf_counter()
    plan = build_plan(store, {"global_batch_size": args.batch_size})
    plan_s = time.perf_counter() - t0
    steps = min(args.steps, plan.steps)
    t0 = time.perf_counter()
    lengths = step_lengths(store, plan, tok, end_step=steps)
    lengths_s = time.perf_counter() - t0
    import statistics

    all_runs = {w: [] for w in args.workers}
    for _ in range(args.repeats):  # interleaved (0 1 2 0 1 2 ...): load from other processes falls on all alike
        for w in args.workers:
            all_runs[w].append(run(store, plan, tok, lengths, w, steps, args.warmup))
    runs = []
    for w, rs in all_runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0] if k not in ("workers", "batches")}
        runs.append(dict(med, workers=w, batches=rs[0]["batches"],
                         examples_per_s_each=[round(r["examples_per_s"], 1) for r in rs]))
    base = runs[0]["examples_per_s"]

    result = {
        "benchmark": "loader_throughput",
        "date": datetime.date.today().isoformat(),
        "device": "cpu",
        "host": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "data": f"shared train ({len(store.datasets)} datasets, {sum(d.size for d in store.datasets)} examples)",
        "tokenizer": "all-MiniLM-L6-v2",
        "global_batch_size": args.batch_size,
        "candidates_per_query": int(1 + max(d.num_negatives for d in store.datasets)),
        "steps": steps, "warmup_batches": args.warmup, "repeats": args.repeats,
        "load_average_1min_at_end": os.getloadavg()[0],
        "plan_steps": plan.steps, "plan_build_s": plan_s, "store_prepare_s": prepare_s,
        "length_table_s": lengths_s, "length_table_steps_per_s": steps / lengths_s,
        "runs": runs,
        "speedup_over_workers_0": {str(r["workers"]): r["examples_per_s"] / base for r in runs},
        "command": f"python benchmarks/loader_throughput.py --steps {args.steps} --batch-size {args.batch_size} "
                   f"--workers {' '.join(map(str, args.workers))} --repeats {args.repeats}",
    }
    save_result("loader_throughput_cpu", result)
    figs = "; ".join(f"{r['workers']} workers {r['examples_per_s']:.0f} ex/s, {r['tokens_per_s'] / 1000:.1f}k tok/s"
                     for r in runs)
    line = (f"| {result['date']} | loader_throughput | cpu ({result['cpu_count']} cores) | shared train store, "
            f"all-MiniLM-L6-v2 tokenizer, global batch {args.batch_size} x {result['candidates_per_query']} "
            f"candidates, 1 host, {steps} steps, median of {args.repeats} | {figs} (length table {lengths_s:.1f}s) "
            f"| `{result['command']}` |")
    print(json.dumps(result, indent=2))
    record_line(line, append=not args.no_readme)
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
