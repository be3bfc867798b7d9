"""jaxembed on one GPU, next to sentence-transformers (layout, engine speed, long texts, LLMs), in one or two calls.

    bash benchmarks/gpu/run.sh $OUT --parts 2 --budget 400   # on the device machine (benchmarks/gpu/README.md)
    python benchmarks/gpu/bench.py --out DIR --dry-run   # the same code on the CPU, tiny sizes (the test)
    python benchmarks/gpu/bench.py --record DIR     # here, afterwards: DIR's JSONs -> benchmarks/results/ + README
    python benchmarks/gpu/bench.py --record DIR1 DIR2   # two runs on one machine (one part split): merged

Parts (--parts, run in the order given, by default 2,5,6,3,4,1; a smoke step first checks that jaxembed runs at
all, and falls back to the flax / optax / orbax versions jaxembed is tested with, carried in .whl/pins, when it
does not on the image's own; the model folders are built on the CPU beside it):
  1 pytest     the GPU-marked tests (`pytest -m gpu`): fused attention kernels against XLA, MFU and device memory
               in the trainer's metrics, a bf16 step against float32, an 80k-candidate step
  2 train      layout vs engine, bf16 compute / float32 master weights, per model: jaxembed fixed (q 32 / d 128,
               the control) / packed / padded and sentence-transformers fixed / natural (its collator's padding) /
               padding-free (flattened rows, per-text positions, a varlen attention), the same steps' texts; each
               pair split into slots saved x speed per computed slot; MFU, peak memory, a profile of the step
  3 batch      the largest global batch for BERT-base with 1 positive + 5 hard negatives (gradient cache + tiled
               loss), doubling up to >= 80,000 candidates, step time relative to B=1,024; the cache's overhead
  4 encode     encode throughput vs sentence-transformers
  5 long       long documents (the shared longest-passage set's lengths, cut at 512 / 1,024 tokens) in packed rows
               of 512-2,048 slots: each attention kernel (xla, pallas, cudnn with the batches' segment bound and
               with the row length, te) in the full train step: step time, XLA's buffers, the largest batch they
               predict, the fastest kernel per row length (model.attention=auto's rule to be)
  6 llm        Qwen2-1.5B full fine-tuning and Qwen2-7B LoRA + remat at 512-token documents with the gradient cache
               vs sentence-transformers' recipe (PEFT, gradient checkpointing): tokens/s, memory, the largest batch

Time: a global budget (--budget seconds from the start); each part gets at most its cap and leaves the later
parts their minimum; a worker checks its deadline before every setting and round, and the parent stops it at the
deadline. Every figure is written to --out as soon as it is measured (one JSON per part, summary.json naming the
device); summary.json's "todo" lists what did not fit and the command that measures it in a second call.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path

from figures import (ENGINE_MODELS, FILES, PARTS, TARGETS, auto_rule, batch_figures, brief,  # noqa: F401
                     llm_figures, llm_specs, long_specs, next_command, ratios, round_spreads, targets)
from parts import (finish_prepare, part_batch, part_encode, part_llm, part_long, part_pytest,  # noqa: F401
                   part_train, pytest_outcomes, smoke, start_prepare)
from procs import HERE, ROOT, Workers, log, nvidia_smi, write_json  # noqa: F401

#: the sizes of a full run (an H100 / H200) and of --dry-run (the CPU test: coverage, not timing, so its time caps
#: are 10x; "auto" lengths: the fixed batch takes the natural steps' padded shape, one program for both).
#: part 5 (--long): name:document cap:global batch:row lengths (+-separated); part 6 (--llm):
#: name:full|lora:global batch:gradient-cache queries per sub-batch[:remat]
FULL = dict(models="minilm:512,bert-base:256,bert-large:128,qwen2-0.5b:64", look=24, take=4, plan_steps=40, rounds=3,
            q_len=32, d_len=128, jax_settings=["fixed", "packed", "padded"], st_settings=["fixed", "natural", "flat"],
            waves=[["fixed", "packed"], ["padded"]], compile_threads=3, profile=["fixed", "packed"], st_share=0.33,
            batch_model="bert-base", sizes=[1024, 16384, 8192, 4096, 2048], chunk=128, batch_q_len=32,
            batch_d_len=64, batch_rounds=2, overhead_batch=256, encode_models="minilm,bert-base", encode_n=20000,
            encode_batch=256, encode_repeats=3, long="bert-base:512:64:512+1024+2048,qwen2-0.5b:1024:32:1024+2048",
            long_kernels="xla,pallas,cudnn_bound,cudnn,te", long_take=1, long_rounds=3, long_plan_steps=4,
            llm="qwen2-1.5b:full:128:32,qwen2-7b:lora:64:16:remat", llm_sizes=[8, 16, 32, 64, 128], llm_take=1,
            llm_rounds=2, llm_plan_steps=2, llm_cap=512, lora_rank=16, capacity_gib=None, prepare_processes=4,
            check_varlen_wiring=False, budget=530.0, cap_scale=1, jax_min_s=110)
DRY = dict(models="tiny-bert:8", look=6, take=2, plan_steps=8, rounds=2, q_len="auto", d_len="auto",
           jax_settings=["fixed", "packed", "padded"], st_settings=["fixed", "natural", "flat"],
           waves=[["fixed", "packed"], ["padded"]], compile_threads=2, profile=["packed"], st_share=0.3,
           batch_model="tiny-bert", sizes=[16], chunk=8, batch_q_len=8, batch_d_len=16, batch_rounds=1,
           overhead_batch=16, encode_models="tiny-bert", encode_n=64, encode_batch=16, encode_repeats=1,
           long="tiny-bert:64:8:64", long_kernels="xla,pallas", long_take=1, long_rounds=1, long_plan_steps=2,
           llm="tiny-qwen2:lora:16:8:remat", llm_sizes=[4, 8], llm_take=1, llm_rounds=1, llm_plan_steps=1,
           llm_cap=64, lora_rank=4, capacity_gib=1.0, prepare_processes=0, check_varlen_wiring=True,
           budget=3600.0, cap_scale=10, jax_min_s=20)
#: seconds: the most a part may take (cap) and the least left for it when an earlier part runs long (floor)
CAP = {"smoke": 150, "pytest": 150, "train": 420, "batch": 150, "encode": 60, "long": 200, "llm": 200}
FLOOR = {"pytest": 30, "train": 120, "batch": 60, "encode": 30, "long": 80, "llm": 60}


def parser() -> argparse.ArgumentParser:
    """The command line (README: "Run it on your GPU machine")."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="folder for the JSON files (on the GPU machine: the run's output folder)")
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes (the CPU test): the same code paths")
    ap.add_argument("--parts", default="2,5,6,3,4,1", help="the parts, in the order to run them")
    ap.add_argument("--budget", type=float, help="seconds for the whole run (default 530; dry run 3600)")
    ap.add_argument("--models", help="part 2: name:global_batch,... (minilm, bert-base, bert-large, qwen2-0.5b, "
                                     "tiny-bert, tiny-qwen2)")
    ap.add_argument("--sizes", help="part 3: global batches, the reference first (default 1024,16384,8192,4096,2048)")
    ap.add_argument("--encode-models", help="part 4: model names (default minilm,bert-base)")
    ap.add_argument("--long", help="part 5: name:document cap:global batch:row lengths(+-separated),... (default "
                                   "bert-base:512:64:512+1024+2048,qwen2-0.5b:1024:32:1024+2048)")
    ap.add_argument("--long-kernels", help="part 5: attention kernels (default xla,pallas,cudnn_bound,cudnn,te: "
                                           "cuDNN after the others, whose failure may leave the CUDA context broken)")
    ap.add_argument("--llm", help="part 6: name:full|lora:global batch:cache sub-batch[:remat],... (default "
                                  "qwen2-1.5b:full:128:32,qwen2-7b:lora:64:16:remat)")
    ap.add_argument("--llm-sizes", help="part 6: sentence-transformers' global batches, tried in order until one "
                                        "does not fit (default 8,16,32,64,128)")
    ap.add_argument("--rounds", type=int, help="timed rounds per setting (default 3; the dry run 2)")
    ap.add_argument("--compile-threads", type=int, help="programs of one worker compiled side by side (default 3)")
    ap.add_argument("--flat-attention", help="part 2's ST padding-free arm: the attentions to try, comma-separated "
                                             "(default: flat.FLAT_ORDER, the first that runs)")
    ap.add_argument("--jax-settings", help="part 2: jaxembed's settings, comma-separated (default fixed,packed,padded; "
                                           "'none': no jaxembed worker)")
    ap.add_argument("--st-settings", help="part 2: sentence-transformers' settings, comma-separated (default "
                                          "fixed,natural,flat; 'none': no ST worker, e.g. when an earlier run on "
                                          "the machine measured it)")
    ap.add_argument("--own-processes", action="store_true",
                    help="the dry run: a process per job, as on a device (default: one shared process)")
    ap.add_argument("--peak-flops", type=float, default=None,
                    help="peak FLOP/s for MFU instead of the device's datasheet entry (the CPU test sets one)")
    ap.add_argument("--root", default="/tmp/gpu_bench", help="scratch: model folders, stores, worker logs")
    ap.add_argument("--no-smoke", action="store_true")
    ap.add_argument("--record", metavar="DIR", nargs="+",
                    help="record DIR's results in benchmarks/results/ and the README (several DIRs: runs on one "
                         "machine, merged arm by arm into one record)")
    ap.add_argument("--results-dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--readme", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_worker", nargs=2, help=argparse.SUPPRESS)
    return ap


def config_of(args) -> dict:
    """The run's sizes: FULL (or DRY with --dry-run) with the command line's overrides."""
    cfg = dict(DRY if args.dry_run else FULL)
    for k in ("models", "budget", "long", "llm", "rounds", "compile_threads"):
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    if args.sizes:
        cfg["sizes"] = [int(x) for x in args.sizes.split(",")]
    if args.encode_models:
        cfg["encode_models"] = args.encode_models
    if args.llm_sizes:
        cfg["llm_sizes"] = [int(x) for x in args.llm_sizes.split(",")]
    if args.long_kernels:
        cfg["long_kernels"] = args.long_kernels
    for k in ("jax_settings", "st_settings"):
        v = getattr(args, k)
        if v is not None:
            cfg[k] = [] if v == "none" else [x for x in v.split(",") if x]
            cfg["waves"] = [[s for s in wave if s in cfg["jax_settings"]] for wave in cfg["waves"]]
            cfg["waves"] = [wave for wave in cfg["waves"] if wave]
    if args.flat_attention:
        cfg["flat_attention"] = args.flat_attention.split(",")
    return cfg


def worker_env(root: Path) -> dict:
    """The workers' environment: unbuffered output, this folder and the repository first on PYTHONPATH, and one
    persistent compilation cache for the call (a program two workers compile, the dry run's smoke step and part 2's
    fixed setting, part 3's overhead run at its reference size, compiles once)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(root / "jax_cache"))
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT)] + [x for x in env.get("PYTHONPATH", "").split(
        os.pathsep) if x])
    return env


def todo_without_time(part: str, cfg: dict) -> list:
    """What a part that got no time leaves to a second call (next_command's arguments)."""
    if part == "train":
        return [s for s in cfg["models"].split(",")]
    if part == "batch":
        return cfg["sizes"]
    if part == "encode":
        return cfg["encode_models"].split(",")
    if part == "long":
        return long_specs(cfg["long"])
    if part == "llm":
        return llm_specs(cfg["llm"])
    return ["all"]


def run_part(part: str, w: Workers, cfg: dict, env: dict, allow: float, out_dir: Path, peak: float | None):
    """One part within ``allow`` seconds -> (its results, what it left to do); a part that fails records its
    traceback and leaves the others their run."""
    until = time.time() + allow
    try:
        if part == "pytest":
            r = part_pytest(env, allow, out_dir)
            return r, (["all"] if r["timed_out"] else [])
        if part == "encode":
            r = part_encode(w, cfg, until, out_dir)
        else:  # the parts that report MFU against the device's peak
            part_fn = {"train": part_train, "batch": part_batch, "long": part_long, "llm": part_llm}[part]
            r = part_fn(w, cfg, until, out_dir, peak)
        return r, r["todo"]
    except Exception as e:  # noqa: BLE001 -- one part's failure must not lose the others
        import traceback

        r = {"error": traceback.format_exc()[-2000:]}
        log(f"part {part} failed: {e!r}")
        write_json(out_dir / FILES[part], r)
        return r, None


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args._worker:
        sys.path.insert(0, str(HERE))
        import workers

        workers.main(*args._worker)
        return 0
    if args.record:
        import record

        record.record([Path(d) for d in args.record], results_dir=args.results_dir, readme=args.readme)
        return 0
    if not args.out:
        ap.error("--out is required")
    cfg = config_of(args)
    t_start = time.time()
    deadline = t_start + float(cfg["budget"])
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    parts = [PARTS[p] for p in args.parts.split(",") if p]
    env = worker_env(root)
    w = Workers(root, env, shared=args.dry_run and not args.own_processes)
    summary = {"benchmark": "gpu", "date": datetime.date.today().isoformat(),
               "started": datetime.datetime.now().isoformat(timespec="seconds"), "dry_run": args.dry_run,
               "parts": parts, "budget_s": cfg["budget"], "config": cfg, "argv": sys.argv[1:],
               "device": {"nvidia_smi": nvidia_smi()}, "load_average_at_start": list(os.getloadavg())}
    spath = out_dir / "summary.json"
    write_json(spath, summary)
    log(f"gpu benchmark: parts {parts}, budget {cfg['budget']:.0f} s, device {summary['device']['nvidia_smi']}")

    prep = start_prepare(w, cfg, parts)
    if not args.no_smoke:
        ok = smoke(w, cfg, summary, spath, min(CAP["smoke"] * cfg["cap_scale"], deadline - time.time()))
        if not ok:
            log("jaxembed does not run here: stopping (summary.json says why)")
            summary["stopped"] = "the smoke step failed"
            write_json(spath, summary)
            return 1
    summary["prepare"] = finish_prepare(w, prep, cfg, deadline)
    results, todo = {}, {}
    for i, part in enumerate(parts):
        later = sum(FLOOR[p] for p in parts[i + 1:])
        allow = min(CAP[part] * cfg["cap_scale"], deadline - time.time() - later)
        if allow < 10:
            log(f"part {part}: no time left ({deadline - time.time():.0f} s)")
            todo[part] = todo_without_time(part, cfg)
            continue
        t0 = time.time()
        results[part], left = run_part(part, w, cfg, env, allow, out_dir, args.peak_flops)
        if left is not None:
            todo[part] = left
        summary.setdefault("part_seconds", {})[part] = time.time() - t0
        summary["targets"] = targets(results)
        summary["round_spread"] = round_spreads(results)
        write_json(spath, summary)
    summary["todo"] = {k: v for k, v in todo.items() if v}
    summary["next_command"] = next_command(summary["todo"])
    summary["targets"] = targets(results)
    summary["round_spread"] = round_spreads(results)
    summary["wall_s"] = time.time() - t_start
    summary["load_average_at_end"] = list(os.getloadavg())
    summary["workers"] = {"count": w.n, "shared_process": w.shared}
    w.close()
    write_json(spath, summary)
    print_table(summary, results)
    return 0


def print_table(summary: dict, results: dict) -> None:
    """The short table a run prints last."""
    print("\n==== gpu benchmark:", summary["device"], flush=True)
    for m, e in results.get("train", {}).get("models", {}).items():
        for tool in ("jaxembed", "st"):
            for s, r in e.get(tool, {}).items():
                print(f"train {m:11s} {tool:8s} {s:8s} {brief(r)}")
        for k, v in e.items():
            if k.startswith("ratio_"):
                print(f"train {m:11s} {k}: {v:.2f}x")
        for key, c in e.get("compare", {}).items():
            print(f"train {m:11s} {key}: {c['summary']}")
    for m, e in results.get("long", {}).get("models", {}).items():
        for L, row in e.get("rows", {}).items():
            for k, r in row.items():
                if k not in ("layout", "choice", "error"):
                    print(f"long  {m:11s} rows {L:>5s} {k:12s} {brief(r)}")
            if "choice" in row:
                print(f"long  {m:11s} rows {L:>5s} fastest: {row['choice']['fastest']}")
    for m, e in results.get("llm", {}).get("models", {}).items():
        print(f"llm   {m:11s} jaxembed: {brief(e.get('jaxembed', {}))}")
        for B, r in e.get("st", {}).items():
            print(f"llm   {m:11s} ST B={B}: {brief(r)}")
    b = results.get("batch", {})
    if b:
        print(f"batch: largest {b.get('largest_global_batch')} ({b.get('largest_candidates')} candidates), "
              f"cache overhead {b.get('cache_overhead')}")
    for m, r in results.get("encode", {}).get("models", {}).items():
        print(f"encode {m}: ratio {r.get('ratio')}")
    p = results.get("pytest")
    if p:
        print(f"pytest -m gpu: {p.get('counts')}")
    for k, t in summary.get("targets", {}).items():
        print(f"target {k}: met={t['met']} {t.get('values', t.get('value'))}")
    sp = summary.get("round_spread") or {}
    for k, v in sp.get("flagged", {}).items():
        print(f"SPREAD {k}: rounds differ by {v:.1%} (> {sp['limit']:.0%}): not a steady figure")
    print(f"todo: {summary.get('todo')}\nnext: {summary.get('next_command')}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
