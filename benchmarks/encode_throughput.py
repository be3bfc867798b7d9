"""Inference throughput: jaxembed encode vs sentence-transformers, same model, texts, batch size and precision.

Both run in this process on the same machine, after a warm-up pass (compilation, thread pools), and the median of
--repeats timed passes is reported. Writes benchmarks/results/encode_throughput_<device>.json and appends a line to
benchmarks/README.md.

    python benchmarks/encode_throughput.py [--model DIR] [--n 2000] [--batch-size 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from _record import record_line, save_result  # noqa: E402  (benchmarks/ is on sys.path)



def _time_interleaved(fns: dict, repeats: int) -> dict:
    """Warm every function up, then time them in turns (A B A B ...) so that load from other processes on a
    shared machine falls on all of them alike. Returns name -> list of seconds; ``<name>_first_pass`` -> [the
    warm-up pass's seconds] (compilation included: what a one-off encode costs); ``<name>_cpu`` -> the CPU seconds
    of each timed pass (this process, every thread: both tools run here, one at a time), which other processes'
    load does not inflate the way it does wall time."""
    first = {}
    for k, fn in fns.items():
        t0 = time.perf_counter()
        fn()  # warm-up: compilation / allocator / thread pools
        first[f"{k}_first_pass"] = [time.perf_counter() - t0]
    times = {k: [] for k in fns}
    cpu = {f"{k}_cpu": [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            times[k].append(time.perf_counter() - t0)
            cpu[f"{k}_cpu"].append(time.process_time() - c0)
    return {**times, **first, **cpu}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="model folder (default: bundled all-MiniLM-L6-v2)")
    ap.add_argument("--n", type=int, default=2000, help="number of sentences (STS-B dev, both sides)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-readme", action="store_true", help="do not append to benchmarks/README.md")
    ap.add_argument("--packing", action=argparse.BooleanOptionalAction, default=True,
                    help="jaxembed packs several texts per row (default) or pads one per row (--no-packing)")
    ap.add_argument("--texts", choices=("stsb", "wikiqa"), default="stsb",
                    help="STS-B dev sentences (both sides) or WikiQA dev questions and candidate answers")
    ap.add_argument("--threads", type=int, default=0,
                    help="1: this process on one core (CPU affinity), torch.set_num_threads(1) and XLA's "
                         "--xla_cpu_multi_thread_eigen=false: one core against one core, which a shared CPU "
                         "distorts least (torch's OpenMP threads spin at barriers when cores are oversubscribed); "
                         "0: all cores, framework defaults (what a user gets)")
    args = ap.parse_args()
    if args.threads == 1:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
                                   "intra_op_parallelism_threads=1").strip()

    import jax
    import torch

    if args.threads == 1:
        torch.set_num_threads(1)
    from sentence_transformers import SentenceTransformer

    from jaxembed import paths
    from jaxembed.encode import load_encoder

    model_dir = args.model or str(paths.demo_model_dir())
    if args.texts == "wikiqa":
        rows = [json.loads(line) for line in open(paths.shared_data_dir() / "dev" / "wikiqa_dev.jsonl",
                                                  encoding="utf-8")]
        texts = ([r["query"] for r in rows] + [x for r in rows for x in r["pos"] + r["neg"]])[: args.n]
    else:
        rows = [json.loads(line) for line in open(paths.shared_data_dir() / "dev" / "stsb_dev.jsonl",
                                                  encoding="utf-8")]
        texts = ([r["sentence1"] for r in rows] + [r["sentence2"] for r in rows])[: args.n]

    ours = load_encoder(model_dir)
    st = SentenceTransformer(model_dir, device="cuda" if torch.cuda.is_available() else "cpu")
    n_tokens = sum(min(len(x), ours.tokenizer.max_length) for x in ours.tokenizer.tokenize(texts))

    with torch.inference_mode():
        times = _time_interleaved({
            "jaxembed": lambda: ours.encode(texts, batch_size=args.batch_size, progress=False, packing=args.packing),
            "sentence_transformers": lambda: st.encode(texts, batch_size=args.batch_size, convert_to_numpy=True),
        }, args.repeats)
    t_ours, t_st = statistics.median(times["jaxembed"]), statistics.median(times["sentence_transformers"])
    stats = dict(ours.last_stats)  # token slots computed vs real tokens, of the last timed pass
    a = ours.encode(texts[:256], batch_size=args.batch_size, progress=False, packing=args.packing)
    b = st.encode(texts[:256], batch_size=args.batch_size, convert_to_numpy=True)

    dev = jax.devices()[0]
    device = f"{dev.platform}:{dev.device_kind}"
    result = {
        "benchmark": "encode_throughput",
        "date": datetime.date.today().isoformat(),
        "device": device,
        "host": platform.processor() or platform.machine(),
        "cpu_count": __import__("os").cpu_count(),
        "model": Path(model_dir).name if args.model else "all-MiniLM-L6-v2",
        "n_texts": len(texts),
        "n_tokens": n_tokens,
        "batch_size": args.batch_size,
        "texts": args.texts,
        "packing": args.packing,
        "jaxembed_real_token_fraction": stats.get("real_fraction"),
        "jaxembed_shapes": [list(x) for x in stats.get("shapes", [])],
        "precision": "float32",
        "jaxembed_texts_per_s": len(texts) / t_ours,
        "sentence_transformers_texts_per_s": len(texts) / t_st,
        "jaxembed_tokens_per_s": n_tokens / t_ours,
        "ratio_jaxembed_over_st": t_st / t_ours,
        "ratio_cpu_seconds_jaxembed_over_st": statistics.median(times["sentence_transformers_cpu"])
        / statistics.median(times["jaxembed_cpu"]),
        "load_average": list(__import__("os").getloadavg()),
        "ratio_with_compile_jaxembed_over_st": times["sentence_transformers_first_pass"][0]
        / times["jaxembed_first_pass"][0],
        "threads": {"torch": torch.get_num_threads(), "jax": "XLA default (all cores)" if args.threads != 1 else
                    "1 (--xla_cpu_multi_thread_eigen=false)", "affinity": sorted(os.sched_getaffinity(0))},
        "times_s": times,
        "max_abs_diff_embeddings": float(np.abs(a - b).max()),
        "versions": {"jax": jax.__version__, "torch": torch.__version__},
        "command": "python benchmarks/encode_throughput.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in (("n", args.n), ("batch_size", args.batch_size),
                                                        ("repeats", args.repeats), ("texts", args.texts)))
        + ("" if args.packing else " --no-packing") + (" --threads 1" if args.threads == 1 else ""),
    }
    save_result(f"encode_throughput_{dev.platform}" + ("" if args.texts == "stsb" else f"_{args.texts}")
                + ("" if args.packing else "_padded"), result)
    cores = "1 core, the tools in turn" if args.threads == 1 else f"{result['cpu_count']} cores"
    line = (f"| {result['date']} | encode_throughput | {device} ({cores}) | {result['model']}, "
            f"{len(texts)} {'STS-B' if args.texts == 'stsb' else 'WikiQA'} dev texts, batch {args.batch_size}, fp32, "
            f"{'packed' if args.packing else 'padded'} | jaxembed {result['jaxembed_texts_per_s']:.0f}"
            f" texts/s vs sentence-transformers {result['sentence_transformers_texts_per_s']:.0f} texts/s: "
            f"**{result['ratio_jaxembed_over_st']:.2f}x** (per CPU-second "
            f"{result['ratio_cpu_seconds_jaxembed_over_st']:.2f}x; first pass, compilation included: "
            f"{result['ratio_with_compile_jaxembed_over_st']:.2f}x; load {result['load_average'][0]:.1f}"
            f"{', busy machine' if result['load_average'][0] > 1.5 else ''}) | `{result['command']}` |")
    print(json.dumps(result, indent=2))
    record_line(line, append=not args.no_readme)


if __name__ == "__main__":
    main()
