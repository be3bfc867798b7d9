"""Training throughput and memory: jaxembed's train step vs sentence-transformers, same model, batch, lengths, loss,
precision and optimizer.

Per model (``--models name:batch,...``; the batch is the global batch of queries):
  minilm       all-MiniLM-L6-v2, its real weights
  bert-base    a BERT-base-size config (12 x 768, 110M parameters), random weights
  qwen2-0.5b   a Qwen2-0.5B-size config (24 x 896, GQA 14/2, 494M parameters), random weights, causal
Both tools load the very same folder (the random models are written once under --cache). Every query has one
positive and one hard negative; queries are padded to --q-len and documents to --d-len tokens, every token real
(attention mask 1), so both tools process the same tokens. Loss: InfoNCE over the whole batch at temperature 0.05
-- jaxembed's loss (its false-negative masks are active, nothing is masked with distinct random texts) vs
sentence-transformers' MultipleNegativesRankingLoss (scale 20) with (anchor, positive, negative) columns. One AdamW
step per iteration with global-norm clipping 1.0, weight decay 0.01 except norms and biases, dropout on (train
mode). Precision: float32 on CPU; bfloat16 compute with float32 master weights on GPU (jaxembed model.dtype
bfloat16; torch.autocast bfloat16 around forward and backward, as the HF Trainer's bf16=True does).

Every (tool, model, setting) runs in a fresh subprocess, so one tool's memory never counts against the other:
--warmup steps (compilation, allocator) then --steps timed steps, steady state. Memory: the process's RSS
high-water mark on CPU (the runtime included: measure differences, not the absolute value), the device's peak
allocated bytes on GPU. MFU (GPU, when the device's peak FLOP/s is known) uses jaxembed.flops' analytic count
for both tools (3 forward passes per step, 4 with the gradient cache).

Settings (CPU): --threads 1,0 runs every throughput measurement twice: both tools pinned to one core (the fair
per-core comparison on a shared machine), and with all cores and each framework's default threads (what a user
gets). Each reports the steady-state step (after --warmup steps: compilation and allocator excluded) and the
average step with compilation included ((compile + warm-up + timed steps) / steps run: jaxembed's XLA compilation
is part of every run's cost, PyTorch has none), the peak RSS (compilation included) and the RSS at the end.

Sections (--sections, default all):
  throughput   examples/s, tokens/s, peak and end memory and jaxembed / ST ratio per model and thread setting
  scaling      GPU: the largest global batch (doubling, up to 80k candidates) each tool trains with its gradient
               cache (jaxembed train.gradcache_chunk + loss.tiled; ST CachedMultipleNegativesRankingLoss), model
               --search-model. CPU: a memory table over --scaling-batches instead (cache on in both tools)
  loader       the Grain loader's examples/s on the shared training data (benchmarks/loader_throughput.py's
               measurement) vs the jaxembed step's examples/s at the same global batch: the headroom ratio
  natural      (not in the default list) real data at natural lengths (--natural-data: the shared snli_triplets,
               and / or configs/demo.py's 14-dataset mix with its instructions), every text <= --natural-max-len
               tokens: jaxembed's `jaxembed train` step as it runs by default (packed rows, data.packing=True),
               jaxembed padded (data.packing=False: one text per row, pow2 length buckets) and sentence-
               transformers (stock MultipleNegativesRankingLoss, its own dynamic padding: each column padded to
               its longest text) on the same texts: --natural-steps batches of the plan (--natural-pick: spread
               evenly over the plan, a run's average, or its first ones). Each tool runs in a
               long-lived process: it builds its batches, runs each once (compilation, allocator), then the parent
               runs --natural-rounds rounds, each running every tool's batches in turn, and reports the median
               over rounds of the time ratio for the same batches (robust to load that changes between rounds),
               the fraction of the computed token slots that hold real tokens, and each process's peak RSS

    python benchmarks/train_throughput.py --sections natural --threads 1 [--natural-models minilm:64]
        [--natural-data snli,demo] [--natural-steps 4] [--natural-pick spread] [--natural-rounds 3]
        [--natural-resident 3]

    python benchmarks/train_throughput.py [--models minilm:32,bert-base:8,qwen2-0.5b:4] [--steps 3]
        [--warmup 1] [--q-len 32] [--d-len 64] [--sections throughput,scaling,loader] [--device-info]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from _harness.models import MODELS, model_folder  # noqa: E402
from _harness.natural_figures import (NATURAL_TOOLS, natural_figures, natural_ratio_text,  # noqa: E402,F401
                                      natural_ratios, threads_text)
from _harness.proc import (LineWorker, cpu_s, device_info, log, pin_threads, public_argv, run_worker,  # noqa: E402
                           script_argv, worker_env)
from _harness.recipe import NATURAL_PICKS, TEMPERATURE, load_recipe, natural_steps, natural_store  # noqa: E402
from _harness.steps import K, peak_flops, serve_natural, step_flops, worker_jaxembed, worker_st  # noqa: E402
from _record import record_line, save_result  # noqa: E402

_START_LOAD = os.getloadavg()[0]
MAX_CANDIDATES = 80_000
THREADS = [0]       # --threads (CPU), set in main
CACHE = [ROOT / "runs" / "bench_models"]  # --cache, set in main


# ------------------------------------------------------------------------------------------------ workers


def spawn(tool: str, folder: Path, B: int, lq: int, ld: int, chunk: int, steps: int, warmup: int,
          timeout: float | None = None) -> dict:
    """Run one worker in a fresh process; -> its result, or {"error": ...} (out of memory, timeout, crash)."""
    argv = script_argv(__file__, "--_worker", json.dumps([tool, str(folder), B, lq, ld, chunk, steps, warmup]))
    return run_worker(argv, _worker_env(), timeout)


def _worker_env() -> dict:
    """The environment of a worker of the current thread setting (--threads) and --cache."""
    return worker_env(THREADS[0], CACHE[0])


def natural_worker(tool: str, params: list, extra_env: dict | None = None) -> LineWorker:
    """A serve_natural process of ``tool`` (steps.serve_natural: READY, run [I] -> TIMES, end -> RESULT)."""
    argv = script_argv(__file__, "--_natural", json.dumps([tool, *params]))
    return LineWorker(tool, argv, {**_worker_env(), **(extra_env or {})})


# ------------------------------------------------------------------------------------------------ natural lengths


def natural_phases(tools: list[str], resident: int) -> list[list[str]]:
    """Which tools run side by side: all of them when ``resident`` processes fit in memory; else sentence-
    transformers (the reference) stays and the others take turns beside it (resident 2, or 1 without ST)."""
    if resident >= len(tools):
        return [list(tools)]
    if resident == 1 or "st" not in tools:
        return [[t] for t in tools]
    return [[t, "st"] for t in tools if t != "st"]


def measure_natural(tools: list[str], params: list, steps: int, rounds: int, resident: int, log) -> dict:
    """Interleaved measurement: the processes of a phase are started one after the other (each compiles and warms
    up alone), then ``rounds`` rounds; a round runs batch 0 in every resident tool in turn, then batch 1, ..., (the
    order of the tools rotates from batch to batch and round to round), so the tools' times for the same batches
    are taken seconds apart. resident 1 (when two processes do not fit in memory): every round starts each tool's
    process afresh, in turn, warm-up included (jaxembed's programs then come from a persistent compilation cache
    after the first round). -> per tool: the worker's figures and its rounds (wall and CPU seconds of the round's
    batches, load average); ``rounds``: every record."""
    if resident == 1:
        return _measure_restarting(tools, params, steps, rounds, log)
    workers: dict[str, LineWorker] = {}
    out: dict[str, dict] = {t: {"rounds": []} for t in tools}
    records = []
    phases = natural_phases(tools, resident)
    try:
        for p, phase in enumerate(phases):
            for t in phase:
                if t not in workers:
                    log(f"  starting {t}")
                    workers[t] = natural_worker(t, params)
                    r = workers[t].ready()
                    log(f"  {t}: ready (warm-up {r['warmup_s']:.0f} s, RSS {r['rss_mib'] / 1024:.2f} GiB)")
            for k in range(rounds):
                rec = {t: {"phase": p, "round": k, "tool": t, "times_s": [], "cpu_s": 0.0,
                           "load_average_before": os.getloadavg()[0]} for t in phase}
                for i in range(steps):
                    j = (k + i) % len(phase)
                    for t in phase[j:] + phase[:j]:
                        r = workers[t].run(i)
                        rec[t]["times_s"] += r["times_s"]
                        rec[t]["cpu_s"] += r["cpu_s"]
                load = os.getloadavg()[0]
                for t in phase:
                    x = rec[t]
                    x.update(total_s=sum(x["times_s"]), load_average_after=load)
                    records.append(x)
                    out[t]["rounds"].append(x)
                log(f"  phase {p} round {k}: " + ", ".join(
                    f"{t} {rec[t]['total_s'] / steps:.2f} s/step ({rec[t]['cpu_s'] / steps:.2f} CPU-s)" for t in phase)
                    + f" (load {rec[phase[0]]['load_average_before']:.1f} -> {load:.1f})")
            for t in [t for t in phase if t not in sum(phases[p + 1:], [])]:
                out[t].update(workers.pop(t).end())
    except Exception as e:  # a crashed worker (out of memory, ...): its error, the others stopped
        for t in tools:
            if t in workers or "real_fraction" not in out[t]:
                out[t].setdefault("error", str(e)[-400:])
        log(f"  failed: {e}")
    finally:
        for w in workers.values():
            w.kill()
    out["rounds"] = records
    return out


def _measure_restarting(tools: list[str], params: list, steps: int, rounds: int, log) -> dict:
    """measure_natural with one process at a time: a fresh process per tool and round."""
    out: dict[str, dict] = {t: {"rounds": []} for t in tools}
    records = []
    env = {"JAX_COMPILATION_CACHE_DIR": str(CACHE[0] / "jax_compilation_cache"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    for k in range(rounds):
        for t in tools[k % len(tools):] + tools[:k % len(tools)]:
            w = None
            try:
                w = natural_worker(t, params, extra_env=env)
                ready = w.ready()
                load = os.getloadavg()[0]
                r = w.run()
                res = w.end()
            except Exception as e:  # out of memory, ...: this tool's error, the others go on
                out[t]["error"] = str(e)[-400:]
                log(f"  round {k} {t}: failed: {e}")
                continue
            finally:
                if w is not None:
                    w.kill()
            rec = {"phase": 0, "round": k, "tool": t, "times_s": r["times_s"], "cpu_s": r["cpu_s"],
                   "total_s": sum(r["times_s"]), "load_average_before": load, "load_average_after": os.getloadavg()[0],
                   "warmup_s": ready["warmup_s"], "peak_rss_mib": res["peak_rss_mib"]}
            records.append(rec)
            log(f"  round {k} {t}: {rec['total_s'] / steps:.2f} s/step (warm-up {ready['warmup_s']:.0f} s, load "
                f"{load:.1f} -> {rec['load_average_after']:.1f}, peak RSS {res['peak_rss_mib'] / 1024:.2f} GiB)")
            peak = max(res["peak_rss_mib"], out[t].get("peak_rss_mib", 0.0))
            out[t].update(res, peak_rss_mib=peak)  # the highest peak of its processes (the first one compiled)
            out[t]["rounds"].append(rec)
    out["rounds"] = records
    return out


def section_natural(args, cache: Path, log, thread_settings=(0,)) -> list[dict]:
    """Natural lengths: for each --natural-models entry and --natural-data set, jaxembed packed (the default),
    jaxembed padded (data.packing=False) and sentence-transformers on the same rows (--natural-steps batches of
    the plan, --natural-pick), measured interleaved (measure_natural)."""
    rows = []
    tools = [t for t in args.natural_tools.split(",") if t]
    bad = [t for t in tools if t not in NATURAL_TOOLS]
    if bad:
        raise SystemExit(f"error: --natural-tools {','.join(bad)}: unknown (known: {', '.join(NATURAL_TOOLS)})")
    for spec in args.natural_models.split(","):
        name, _, b = spec.partition(":")
        if name not in MODELS:
            raise SystemExit(f"error: --natural-models {name!r}: unknown (known: {', '.join(MODELS)})")
        B = int(b or 64)
        folder = model_folder(name, cache)
        for data in args.natural_data.split(","):
            store = natural_store(data, args.natural_max_len, cache)
            for threads in thread_settings:
                THREADS[0] = threads
                row = {"model": name, "random_weights": MODELS[name] is not None, "data": data, "global_batch": B,
                       "max_len": args.natural_max_len, "steps": args.natural_steps, "rounds": args.natural_rounds,
                       "resident": args.natural_resident, "plan_steps": args.natural_plan_steps,
                       "pick": args.natural_pick,
                       "plan_step_ids": natural_steps(args.natural_plan_steps, args.natural_steps, args.natural_pick),
                       "threads_per_tool": threads or "all cores, framework default"}
                log(f"natural {name} {data} B={B}, {threads_text(threads)}: {', '.join(tools)}")
                params = [str(folder), data, B, args.natural_max_len, args.natural_plan_steps, args.natural_steps,
                          str(store), args.natural_pick]
                row.update(measure_natural(tools, params, args.natural_steps, args.natural_rounds,
                                           args.natural_resident, log))
                natural_ratios(row, args.natural_steps, B)
                for t in tools:
                    r = row[t]
                    if "step_s" in r:
                        log(f"  {t}: step {r['step_s']:.2f} s, {r['examples_per_s']:.1f} ex/s, real tokens "
                            f"{100 * r['real_fraction']:.0f}% of the computed slots, {fmt_mem(r)}"
                            + (f", shapes {r['shapes']}" if "shapes" in r else ""))
                log("  " + "; ".join(natural_ratio_text(row)))
                rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------------ figures


def figures(res: dict, B: int, lq: int, ld: int, flops: float, warmup: int = 1) -> dict:
    if "error" in res or not res["times_s"]:  # failed, or a memory-only run (no timed step)
        return res
    t = statistics.median(res["times_s"])
    out = dict(res, step_s=t, examples_per_s=B / t, tokens_per_s=B * (lq + K * ld) / t)
    # compilation included: everything from the first step's compilation to the last timed step, per step run
    total = res.get("compile_s", 0.0) + res.get("warmup_s", 0.0) + sum(res["times_s"])
    out["step_s_with_compile"] = total / (warmup + len(res["times_s"]))
    out["examples_per_s_with_compile"] = B / out["step_s_with_compile"]
    if res.get("cpu_s"):  # throughput per CPU second: robust to the share of a busy machine the process got
        out["examples_per_cpu_s"] = B * len(res["times_s"]) / res["cpu_s"]
        out["cpu_utilisation"] = res["cpu_s"] / sum(res["times_s"])
    pk = peak_flops(res["device"]) if not res["device"].startswith("cpu") else None
    if pk:
        out["mfu"] = flops / t / pk
    return out


def fmt_mem(r: dict) -> str:
    if "device_peak_mib" in r:
        return f"{r['device_peak_mib'] / 1024:.2f} GiB device"
    if "rss_end_mib" in r:  # CPU: the high-water mark includes XLA's compilation; the end RSS is the footprint
        return f"{r['peak_rss_mib'] / 1024:.2f} GiB peak / {r['rss_end_mib'] / 1024:.2f} GiB end RSS"
    return f"{r['peak_rss_mib'] / 1024:.2f} GiB RSS"


# ------------------------------------------------------------------------------------------------ sections


def section_throughput(args, cache: Path, log, thread_settings=(0,)) -> list[dict]:
    """One row per (model, thread setting): both tools' figures and the ratios."""
    rows = []
    for spec in args.models.split(","):
        name, _, b = spec.partition(":")
        if name not in MODELS:
            raise SystemExit(f"error: --models {name!r}: unknown (known: {', '.join(MODELS)})")
        B = int(b or args.batch_size)
        folder = model_folder(name, cache)
        fl = step_flops(folder, B, args.q_len, args.d_len, False)
        for threads in thread_settings:
            THREADS[0] = threads
            row = {"model": name, "global_batch": B, "q_len": args.q_len, "d_len": args.d_len,
                   "flops_per_step": fl, "threads_per_tool": threads or "all cores, framework default"}
            for tool in ("jaxembed", "st"):
                log(f"throughput {name} B={B}, {threads_text(threads)}: {tool}")
                r = figures(spawn(tool, folder, B, args.q_len, args.d_len, 0, args.steps, args.warmup), B,
                            args.q_len, args.d_len, fl, args.warmup)
                row[tool] = r
                if "error" in r:
                    log(f"  {tool}: {r['error']}")
                else:
                    log(f"  {tool}: {r['examples_per_s']:.2f} ex/s ({r['examples_per_s_with_compile']:.2f} with "
                        f"compilation), {r['tokens_per_s']:.0f} tok/s, {fmt_mem(r)}"
                        + (f", {r['examples_per_cpu_s']:.2f} ex/CPU-s (CPU use {r['cpu_utilisation']:.2f})"
                           if "examples_per_cpu_s" in r else "")
                        + (f", MFU {100 * r['mfu']:.1f}%" if "mfu" in r else ""))
            if "error" not in row["jaxembed"] and "error" not in row["st"]:
                j, s = row["jaxembed"], row["st"]
                row["ratio_jaxembed_over_st"] = j["examples_per_s"] / s["examples_per_s"]
                row["ratio_with_compile_jaxembed_over_st"] = (j["examples_per_s_with_compile"]
                                                              / s["examples_per_s_with_compile"])
                if "examples_per_cpu_s" in j and "examples_per_cpu_s" in s:
                    row["ratio_per_cpu_s_jaxembed_over_st"] = j["examples_per_cpu_s"] / s["examples_per_cpu_s"]
                key = "device_peak_mib" if "device_peak_mib" in j else "peak_rss_mib"
                row["memory_ratio_jaxembed_over_st"] = j[key] / s[key]
                if "rss_end_mib" in j and "rss_end_mib" in s:
                    row["end_rss_ratio_jaxembed_over_st"] = j["rss_end_mib"] / s["rss_end_mib"]
            rows.append(row)
    return rows


def section_scaling(args, cache: Path, gpu: bool, log) -> dict:
    folder = model_folder(args.search_model, cache)
    if not gpu:
        log("scaling: no accelerator, so no largest-batch search; memory table with the gradient cache instead")
        table = []
        for B in [int(x) for x in args.scaling_batches.split(",")]:
            row = {"global_batch": B, "candidates": B * K}
            for tool in ("jaxembed", "st"):
                r = figures(spawn(tool, folder, B, args.q_len, args.d_len, args.chunk, args.scaling_steps, 1), B,
                            args.q_len, args.d_len, step_flops(folder, B, args.q_len, args.d_len, True))
                row[tool] = r
                log(f"  B={B} {tool}: " + (r["error"] if "error" in r else fmt_mem(r) + (
                    f", {r['examples_per_s']:.2f} ex/s" if "examples_per_s" in r else "")))
            table.append(row)
        return {"mode": "cpu_memory_table", "model": args.search_model, "chunk": args.chunk,
                "timed_steps": args.scaling_steps,
                "note": "no accelerator: the largest-batch search runs only on GPU / TPU", "table": table}
    out = {"mode": "largest_batch_search", "model": args.search_model, "chunk": args.search_chunk,
           "max_candidates": MAX_CANDIDATES}
    cap = MAX_CANDIDATES // K
    sizes = []
    b = args.search_start
    while b < cap:
        sizes.append(b)
        b *= 2
    sizes.append(cap - cap % args.search_chunk)
    for tool in ("jaxembed", "st"):
        best, trials = None, []
        for B in sizes:
            r = spawn(tool, folder, B, args.q_len, args.d_len, args.search_chunk, 1, 1, timeout=args.search_timeout)
            r = figures(r, B, args.q_len, args.d_len, step_flops(folder, B, args.q_len, args.d_len, True))
            trials.append({"global_batch": B, **{k: r.get(k) for k in ("error", "examples_per_s", "device_peak_mib",
                                                                          "mfu")}})
            log(f"  search {tool} B={B} ({B * K} candidates): " + (r["error"][:200] if "error" in r else
                                                                     f"ok, {fmt_mem(r)}"))
            if "error" in r:
                break
            best = B
        out[tool] = {"largest_global_batch": best, "largest_candidates": best * K if best else None,
                     "trials": trials}
    return out


def section_loader(args, step_row: dict | None, log) -> dict:
    """Loader examples/s (loader_throughput.run) on the shared data at the jaxembed step's global batch."""
    from loader_throughput import run as loader_run

    from jaxembed import paths
    from jaxembed.data.pipeline import step_lengths
    from jaxembed.data.plan import build_plan
    from jaxembed.data.store import Store, write_store
    from jaxembed.tokenizer import Tokenizer

    from jaxembed import config as cfglib

    c = load_recipe("configs/demo.py")

    store_dir = Path(args.cache) / "store"
    if not (store_dir / "manifest.json").exists():
        log(f"loader: preparing the demo data store into {store_dir}")
        write_store(cfglib.data_section(c), store_dir)
    store = Store.open(store_dir)
    B = step_row["global_batch"] if step_row else args.batch_size
    c.plan.global_batch_size = B
    c.plan.steps = args.loader_steps
    plan = build_plan(store, c.plan, data_config=cfglib.data_section(c))
    tok = Tokenizer.from_folder(paths.demo_model_dir(), 128)
    lengths = step_lengths(store, plan, tok, end_step=plan.steps)
    r = loader_run(store, plan, tok, lengths, 0, plan.steps, min(10, plan.steps // 4))
    out = {"data": "demo recipe (configs/demo.py): 14 datasets, 1 hard negative, query 32 / document 64 tokens",
           "global_batch": B, "steps": plan.steps, "workers": 0, "loader": r}
    if step_row and "error" not in step_row.get("jaxembed", {"error": 1}):
        step = step_row["jaxembed"]["examples_per_s"]
        out["step_examples_per_s"] = step
        out["headroom_loader_over_step"] = r["examples_per_s"] / step
    log(f"loader: {r['examples_per_s']:.0f} ex/s at global batch {B}"
        + (f"; headroom over the step {out['headroom_loader_over_step']:.0f}x" if "headroom_loader_over_step" in out
           else ""))
    return out


# ------------------------------------------------------------------------------------------------ main


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="minilm:32,bert-base:8,qwen2-0.5b:4",
                    help="name:global_batch,... (names: minilm, bert-base, qwen2-0.5b)")
    ap.add_argument("--batch-size", type=int, default=32, help="global batch of a --models entry without one")
    ap.add_argument("--q-len", type=int, default=32)
    ap.add_argument("--d-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3, help="timed steps (median)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--sections", default="throughput,scaling,loader")
    ap.add_argument("--chunk", type=int, default=32, help="gradient-cache sub-batch for the CPU memory table")
    ap.add_argument("--scaling-batches", default="32,64,128,256")
    ap.add_argument("--scaling-steps", type=int, default=1,
                    help="CPU memory table: timed steps after the warm-up step (0 = peak memory only)")
    ap.add_argument("--search-model", default="minilm")
    ap.add_argument("--search-start", type=int, default=1024)
    ap.add_argument("--search-chunk", type=int, default=256, help="gradient-cache sub-batch for the GPU search")
    ap.add_argument("--search-timeout", type=float, default=900.0)
    ap.add_argument("--loader-steps", type=int, default=100)
    ap.add_argument("--cache", default=str(ROOT / "runs" / "bench_models"), help="random-weight model folders")
    ap.add_argument("--threads", default="1,0",
                    help="CPU only, comma list of settings, each measured: cores of each tool's process (CPU "
                         "affinity), with torch.set_num_threads(N) and, for 1, XLA's --xla_cpu_multi_thread_eigen="
                         "false; 0 = all cores, framework defaults. On a shared, oversubscribed CPU torch's OpenMP "
                         "threads spin at barriers and lose 3-6x: 1 compares one core against one core, 0 is what a "
                         "user gets (default: both)")
    ap.add_argument("--device-info", action="store_true", help="print the device description and exit")
    ap.add_argument("--name", default="", help="result file benchmarks/results/<name>.json (default: "
                    "train_throughput_cpu / train_throughput_gpu); a partial run should not overwrite the full one")
    ap.add_argument("--no-readme", action="store_true")
    ap.add_argument("--natural-models", default="minilm:64,bert-base:64",
                    help="natural section: name:global_batch,... (queries per step)")
    ap.add_argument("--natural-data", default="snli,demo", help="natural section: snli and / or demo")
    ap.add_argument("--natural-max-len", type=int, default=64, help="natural section: tokens per text at most")
    ap.add_argument("--natural-steps", type=int, default=4,
                    help="natural section: N batches of the plan (--natural-pick), each run once (compilation), "
                         "then once per round, timed")
    ap.add_argument("--natural-pick", default="spread", choices=NATURAL_PICKS,
                    help="natural section: which steps: spread evenly over the plan (a run's average lengths and "
                         "shapes) or the plan's first ones")
    ap.add_argument("--natural-rounds", type=int, default=3,
                    help="natural section: rounds; each runs every resident tool's batches in turn (interleaved)")
    ap.add_argument("--natural-resident", type=int, default=3,
                    help="natural section: tool processes alive at once (3: all, interleaved; 2: "
                         "sentence-transformers stays, the jaxembed paths take turns beside it; 1: one at a time, "
                         "a fresh process per tool and round)")
    ap.add_argument("--natural-tools", default=",".join(NATURAL_TOOLS),
                    help="natural section: comma list of jaxembed-packed, jaxembed-padded, st")
    ap.add_argument("--natural-plan-steps", type=int, default=1000,
                    help="natural section: the plan's length; a run's packed shapes are chosen over all its steps "
                         "(a shape is added when it saves more slots than a compilation costs), so a longer run "
                         "gets fuller rows")
    ap.add_argument("--_worker", default="", help=argparse.SUPPRESS)
    ap.add_argument("--_natural", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args._natural:
        pin_threads()
        return serve_natural(args._natural)
    if args._worker:
        tool, folder, B, lq, ld, chunk, steps, warmup = json.loads(args._worker)
        pin_threads()
        fn = worker_jaxembed if tool == "jaxembed" else worker_st
        print("RESULT " + json.dumps(fn(folder, B, lq, ld, chunk, steps, warmup)), flush=True)
        return
    info = device_info()
    if args.device_info:
        print(json.dumps(info, indent=2))
        return
    sections = [s for s in args.sections.split(",") if s]
    gpu = info["gpu"] is not None
    thread_settings = [0] if gpu else [int(x) for x in str(args.threads).split(",") if x != ""]
    THREADS[0] = thread_settings[0]
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    CACHE[0] = cache
    if "throughput" in sections or "scaling" in sections:
        natural_store("snli", 64, cache)  # the synthetic workers' run reads its loss settings from a store
    t_start = time.time()
    log(f"device: {info}")
    result = {"benchmark": "train_throughput", "date": datetime.date.today().isoformat(), "device_info": info,
              "setting": {"q_len": args.q_len, "d_len": args.d_len, "candidates_per_query": K,
                          "temperature": TEMPERATURE, "steps": args.steps, "warmup": args.warmup,
                          "threads_per_tool": [t or "all cores, framework default" for t in thread_settings],
                          "precision": "bfloat16 compute, float32 master weights" if gpu else "float32"}}
    rows = section_throughput(args, cache, log, thread_settings) if "throughput" in sections else []
    THREADS[0] = thread_settings[0]  # the other sections run in the first setting
    result["throughput"] = rows
    if "scaling" in sections:
        result["scaling"] = section_scaling(args, cache, gpu, log)
    if "loader" in sections:
        first = next((r for r in rows if r["model"] == "minilm"), rows[0] if rows else None)
        result["loader"] = section_loader(args, first, log)
    if "natural" in sections:
        result["natural"] = section_natural(args, cache, log, thread_settings)
    result["load_average_1min_at_end"] = os.getloadavg()[0]
    result["load_average_at_end"] = list(os.getloadavg())
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # every worker's CPU, compilation included
    result["cpu_s_all"] = kids.ru_utime + kids.ru_stime + cpu_s()
    result["wall_s"] = time.time() - t_start
    result["command"] = "python benchmarks/train_throughput.py " + " ".join(public_argv(sys.argv[1:]))
    kind = "gpu" if gpu else "cpu"
    save_result(args.name or f"train_throughput_{kind}", result)

    dev = info["gpu"] or f"cpu ({info['cpu_count']} cores)"
    figs = []
    for r in rows:
        what = f"{r['model']} B={r['global_batch']}, " + threads_text(
            r["threads_per_tool"] if isinstance(r["threads_per_tool"], int) else 0)
        if "ratio_jaxembed_over_st" in r:
            j, s = r["jaxembed"], r["st"]
            figs.append(f"{what}: jaxembed {j['examples_per_s']:.3g} ex/s ({fmt_mem(j)}) vs ST "
                        f"{s['examples_per_s']:.3g} ex/s ({fmt_mem(s)}): **{r['ratio_jaxembed_over_st']:.2f}x**"
                        f" (compilation included {r['ratio_with_compile_jaxembed_over_st']:.2f}x"
                        + (f", per CPU-second {r['ratio_per_cpu_s_jaxembed_over_st']:.2f}x"
                           if "ratio_per_cpu_s_jaxembed_over_st" in r else "") + ")"
                        + (f", MFU {100 * j['mfu']:.0f}% vs {100 * s['mfu']:.0f}%" if "mfu" in j and "mfu" in s
                           else ""))
        else:
            figs.append(f"{what}: failed ({r['jaxembed'].get('error') or ''} {r['st'].get('error') or ''})")
    sc = result.get("scaling")
    if sc and sc["mode"] == "cpu_memory_table":
        t = sc["table"]
        ok = [x for x in t if "error" not in x["jaxembed"] and "error" not in x["st"]]
        if ok:
            figs.append(f"cached B={ok[0]['global_batch']}->{ok[-1]['global_batch']}: jaxembed "
                        f"{fmt_mem(ok[0]['jaxembed'])}->{fmt_mem(ok[-1]['jaxembed'])}, ST {fmt_mem(ok[0]['st'])}->"
                        f"{fmt_mem(ok[-1]['st'])}")
    elif sc:
        figs.append(f"largest batch with cache: jaxembed {sc['jaxembed']['largest_global_batch']} vs ST "
                    f"{sc['st']['largest_global_batch']} queries (cap {MAX_CANDIDATES} candidates)")
    ld = result.get("loader")
    if ld and "headroom_loader_over_step" in ld:
        figs.append(f"loader {ld['loader']['examples_per_s']:.0f} ex/s = {ld['headroom_loader_over_step']:.0f}x "
                    f"the step")
    load = f"load average {result['load_average_1min_at_end']:.1f} (at the start {_START_LOAD:.1f})"
    lines = []
    if figs:
        lines.append(f"| {result['date']} | train_throughput | {dev} | train step, q {args.q_len} / d {args.d_len} "
                     f"tokens, 1 pos + 1 neg, AdamW, {result['setting']['precision']}, median of {args.steps} after "
                     f"{args.warmup} warm-up, {load} | {'; '.join(figs)} | `{result['command']}` |")
    if result.get("natural"):
        how = ("one tool process at a time, a fresh one per tool and round, the order alternating"
               if args.natural_resident == 1 else f"{args.natural_resident} tool processes resident; batch by batch, "
               "tools in turn")
        ids = natural_steps(args.natural_plan_steps, args.natural_steps, args.natural_pick)
        which = ("the first" if args.natural_pick == "first" else "spread evenly over the plan:") + " steps " + \
            ", ".join(map(str, ids))
        lines.append(f"| {result['date']} | train_throughput (natural lengths) | {dev} | {args.natural_steps} "
                     f"batches ({which}) of a {args.natural_plan_steps}-step plan, every text <= "
                     f"{args.natural_max_len} tokens, 1 pos + 1 hard neg, AdamW, {result['setting']['precision']}, "
                     f"same rows for all tools, ST with its own dynamic padding and stock MNRL; each batch run once "
                     f"(compilation), then {args.natural_rounds} interleaved rounds ({how}), ratio = median over "
                     f"rounds of the same batches' wall time (and of each process's CPU seconds), {load} | "
                     f"{'; '.join(natural_figures(result['natural']))} | `{result['command']}` |")
    print(json.dumps(result, indent=1))
    for line in lines:
        record_line(line, append=not args.no_readme)
    log(f"done in {(time.time() - t_start) / 60:.1f} min")


if __name__ == "__main__":
    main()
