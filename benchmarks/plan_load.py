"""What a host pays to open the batch plan at start-up: ``Plan.load`` of ``plan.npz`` + ``plan.json`` (what every
process of ``jaxembed train`` runs), then the first step's rows (``read_steps`` of step 0, as the loader reads
them), as the plan grows.

A plan of each size in --sizes rows (global batch --batch, one dataset of --dataset-size examples; ids and weights
synthetic: the load's cost does not depend on them) is saved once with ``Plan.save`` of this checkout. Each
(size, code) is then measured in a fresh Python process, --repeats times (the median is reported): CPU seconds
(user + system) and bytes read (``/proc/self/io`` rchar: what the process read from files, the plan's pages
among them) of ``Plan.load``, and of the first step's rows after it. --code names another checkout whose
``jaxembed`` the load imports (a before / after comparison on the same files: an older revision checks the whole
plan as it loads it); --older also measures this checkout on the files rewritten as a jaxembed without the stored
checks wrote them (a plan file from before: checked whole when loaded).

    python benchmarks/plan_load.py [--sizes 1e6,1e7,3e7] [--batch 4096] [--code DIR] [--older] [--repeats 3]
                                   [--keep DIR] [--no-readme]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _record import record_line, save_result  # noqa: E402  (benchmarks/ is on sys.path)

ROOT = Path(__file__).resolve().parent.parent

# one load in a fresh process: prints {"load_cpu_s", "load_read_bytes", "first_cpu_s", ...} as its last line
RUNNER = r"""
import json, resource, sys
from jaxembed.data.plan import Plan
from jaxembed.data.plan.file import read_steps

cpu = lambda: (lambda r: r.ru_utime + r.ru_stime)(resource.getrusage(resource.RUSAGE_SELF))
rchar = lambda: int(dict(l.split(": ") for l in open("/proc/self/io").read().splitlines())["rchar"])
c, r = cpu(), rchar()
plan = Plan.load(sys.argv[1])
load_cpu, load_read = cpu() - c, rchar() - r
c, r = cpu(), rchar()
rows = [read_steps(a, 0, 1) for a in (plan.dataset_ids, plan.example_ids, plan.weights)]
print(json.dumps({"steps": plan.steps, "load_cpu_s": load_cpu, "load_read_bytes": load_read,
                  "first_cpu_s": cpu() - c, "first_read_bytes": rchar() - r}))
"""


def write_plan(path: Path, rows: int, batch: int, dataset_size: int) -> None:
    """A plan of ``rows`` rows (steps of ``batch``), saved with this checkout's ``Plan.save``, a block at a time."""
    import numpy as np

    from jaxembed.data.plan import Plan

    S = rows // batch
    scratch = path.parent / (path.stem + ".scratch")
    scratch.mkdir(exist_ok=True)
    arrays = {}
    for name, dt in (("dataset_ids", np.int32), ("example_ids", np.int64), ("weights", np.float32)):
        arrays[name] = np.lib.format.open_memmap(scratch / f"{name}.npy", "w+", dt, (S, batch))
    rng = np.random.default_rng(0)
    for s0 in range(0, S, 256):
        s1 = min(S, s0 + 256)
        arrays["dataset_ids"][s0:s1] = 0
        arrays["example_ids"][s0:s1] = rng.integers(0, dataset_size, (s1 - s0, batch))
        arrays["weights"][s0:s1] = 1.0
    for a in arrays.values():
        a.flush()
    ro = {k: np.load(scratch / f"{k}.npy", mmap_mode="r") for k in arrays}
    plan = Plan(ro["dataset_ids"], ro["example_ids"], np.full(S, 0, np.int32), ro["weights"],
                np.full(S, 0.05, np.float32), ("t0",), ("d0",), np.zeros(1, np.int32),
                np.array([dataset_size], np.int64), {"global_batch_size": batch}, 0, {"mode": "epoch"})
    plan.save(path)
    for k in arrays:
        (scratch / f"{k}.npy").unlink()
    scratch.rmdir()


def as_older(path: Path, out: Path) -> None:
    """The plan file pair rewritten as a jaxembed without the stored checks wrote it."""
    import zipfile

    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED, allowZip64=True) as zout:
        for info in zin.infolist():
            if info.filename not in ("block_digests.npy", "used_dataset_ids.npy"):
                with zin.open(info) as src, zout.open(info.filename, "w", force_zip64=True) as dst:
                    while chunk := src.read(1 << 24):
                        dst.write(chunk)
    side = json.loads(path.with_suffix(".json").read_text())
    side.pop("checks", None)
    out.with_suffix(".json").write_text(json.dumps(side))


def measure(path: Path, code: Path, repeats: int) -> dict:
    runs = []
    for _ in range(repeats):
        r = subprocess.run([sys.executable, "-c", RUNNER, str(path)], capture_output=True, text=True, cwd=code)
        if r.returncode:
            raise SystemExit(f"{path} with {code}: exit {r.returncode}\n{r.stderr[-3000:]}")
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    med = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
    return dict(med, runs=runs)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1e6,1e7,3e7")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--dataset-size", type=int, default=1_000_000)
    ap.add_argument("--code", default=None, help="a checkout whose jaxembed loads the same files (before)")
    ap.add_argument("--older", action="store_true", help="also load the files as written without stored checks")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--keep", default=None, help="write (and reuse) the plan files in this folder")
    ap.add_argument("--no-readme", action="store_true")
    args = ap.parse_args(argv)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="plan_load_"))
    work.mkdir(parents=True, exist_ok=True)
    codes = {"after": ROOT} | ({"before": Path(args.code).resolve()} if args.code else {})
    rows = []
    for size in [int(float(s)) for s in args.sizes.split(",")]:
        path = work / f"plan_{size}_{args.batch}.npz"
        if not path.exists():
            write_plan(path, size, args.batch, args.dataset_size)
        files = {"": path}
        if args.older:
            files["older file"] = work / f"older_{size}_{args.batch}.npz"
            if not files["older file"].exists():
                as_older(path, files["older file"])
        for label, code in codes.items():
            for kind, f in files.items():
                if kind and label != "after":
                    continue
                r = dict(measure(f, code, args.repeats), rows=size, code=label + (f", {kind}" if kind else ""),
                         file_bytes=f.stat().st_size)
                rows.append(r)
                print(f"{size:>11,} rows {r['code']:18s} load {r['load_cpu_s']:.3f} CPU-s, read "
                      f"{r['load_read_bytes'] / 2**20:7.1f} MiB; first step {r['first_cpu_s']:.4f} CPU-s, read "
                      f"{r['first_read_bytes'] / 2**20:.1f} MiB", flush=True)
    cmd = "python benchmarks/plan_load.py " + " ".join(sys.argv[1:] if argv is None else argv)
    save_result("plan_load_cpu", {"command": cmd, "batch": args.batch, "rows": rows})
    cells = []
    for label in dict.fromkeys(r["code"] for r in rows):
        got = [r for r in rows if r["code"] == label]
        cells.append(f"{label}: load " + " / ".join(f"{r['load_cpu_s']:.3f}" for r in got) + " CPU-s, read "
                     + " / ".join(f"{r['load_read_bytes'] / 2**20:.1f}" for r in got) + " MiB; first step "
                     + " / ".join(f"{r['first_cpu_s'] * 1000:.1f}" for r in got) + " CPU-ms")
    sizes = " / ".join(f"{r['rows']:,}" for r in rows if r["code"] == "after")
    line = (f"| {time.strftime('%Y-%m-%d')} | plan_load | cpu (2 cores, shared) | "
            f"`Plan.load` then step 0's rows, plans of {sizes} rows, batch {args.batch}, median of {args.repeats} "
            f"fresh processes | " + "; ".join(cells) + f" | `{cmd.replace(str(args.code), 'CHECKOUT')}` |")
    record_line(line, append=not args.no_readme)


if __name__ == "__main__":
    main()
