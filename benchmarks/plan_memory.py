"""Build time and peak memory of a batch plan as it grows: the plan written in blocks (``build_plan_file``, what
``jaxembed train`` runs on process 0) against the plan built in memory and saved (``build_plan`` + ``Plan.save``).

The store is synthetic metadata only (no records, nothing tokenised): --datasets datasets whose sizes follow a
Zipf law (size of the k-th ∝ 1 / k^--zipf), homogeneous batches (a unit per dataset), epoch mode, global batch
--batch, scaled to each total in --sizes. Each build runs in its own Python process, which reports its peak
resident set size (getrusage ru_maxrss) over what it held after imports and a warm-up build, and its wall time. A
least-squares line through the sizes gives the growth in bytes per example, and the 300M extrapolation.
The blocked build's peak follows the largest unit (one dataset's batches are put together in memory), so
--largest is reported too.

    python benchmarks/plan_memory.py [--sizes 1e6,3e6,1e7] [--datasets 100] [--zipf 0.8] [--batch 1024]
                                     [--modes blocked,memory] [--no-readme]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from _record import record_line, save_result  # noqa: E402  (benchmarks/ is on sys.path)

ROOT = Path(__file__).resolve().parent.parent

# one build in a fresh process: prints {"peak_bytes", "seconds", ...} as its last line
RUNNER = r"""
import json, os, resource, sys, time
import numpy as np
from types import SimpleNamespace
from jaxembed.data.plan import build_plan, build_plan_file

mode, total, D, zipf, G, out = sys.argv[1], int(float(sys.argv[2])), int(sys.argv[3]), float(sys.argv[4]), \
    int(sys.argv[5]), sys.argv[6]
w = 1.0 / (1 + np.arange(D)) ** zipf
sizes = np.floor(w / w.sum() * total).astype(int)
sizes[0] += total - sizes.sum()
info = lambda k, s: SimpleNamespace(name=f"d{k}", task=f"t{k % 20}", size=int(s), batching="homogeneous",
                                     epochs=None, weight=None, temperature=None)
datasets = [info(k, s) for k, s in enumerate(sizes)]
build_plan_file(os.path.join(out, "warm.npz"), [info(0, 3 * G)], {"global_batch_size": G})  # imports, first calls
build_plan([info(0, 3 * G)], {"global_batch_size": G})
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
t = time.perf_counter()
if mode == "blocked":
    plan = build_plan_file(os.path.join(out, "plan.npz"), datasets, {"global_batch_size": G})
else:
    plan = build_plan(datasets, {"global_batch_size": G})
    plan.save(os.path.join(out, "plan.npz"))
seconds = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
examples = plan.steps * plan.global_batch_size
print(json.dumps({"mode": mode, "examples": total, "planned": int(examples), "steps": plan.steps,
                  "largest_dataset": int(sizes.max()), "seconds": round(seconds, 3), "base_rss": base,
                  "peak_rss": peak, "peak_bytes": peak - base, "plan_bytes": int(examples * 16),
                  "file_bytes": os.path.getsize(os.path.join(out, "plan.npz"))}))
"""


LABELS = {"blocked": "blocked (`build_plan_file`, process 0 of `jaxembed train`)",
          "memory": "in memory (`build_plan` + `Plan.save`)"}


def one(mode: str, total: float, args) -> dict:
    with tempfile.TemporaryDirectory(prefix="plan_memory_") as out:
        r = subprocess.run([sys.executable, "-c", RUNNER, mode, str(total), str(args.datasets), str(args.zipf),
                            str(args.batch), out], capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        raise SystemExit(f"{mode} {total:g}: exit {r.returncode}\n{r.stderr[-3000:]}")
    rec = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"{mode:8s} {rec['examples']:>12,} examples: {rec['seconds']:7.2f} s, peak +{rec['peak_bytes'] / 2**20:8.1f} "
          f"MiB (plan arrays {rec['plan_bytes'] / 2**20:.1f} MiB)", flush=True)
    return rec


def fit(xs, ys) -> tuple[float, float]:
    """Least-squares line y = a + b x -> (a, b)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1e6,3e6,1e7", help="total examples, comma-separated")
    p.add_argument("--datasets", type=int, default=100)
    p.add_argument("--zipf", type=float, default=0.8, help="size of the k-th dataset ∝ 1 / k^zipf")
    p.add_argument("--batch", type=int, default=1024, help="global batch size")
    p.add_argument("--modes", default="blocked,memory")
    p.add_argument("--extrapolate", type=float, default=3e8)
    p.add_argument("--name", default="plan_memory_cpu")
    p.add_argument("--no-readme", action="store_true")
    args = p.parse_args(argv)
    sizes = [float(s) for s in args.sizes.split(",")]
    runs = {m: [one(m, n, args) for n in sizes] for m in args.modes.split(",")}
    summary = {}
    for m, recs in runs.items():
        xs = [r["examples"] for r in recs]
        a, b = fit(xs, [r["peak_bytes"] for r in recs])
        ta, tb = fit(xs, [r["seconds"] for r in recs])
        summary[m] = {"peak_bytes_per_example": b, "peak_fixed_bytes": a, "seconds_per_million": tb * 1e6,
                      f"peak_at_{args.extrapolate:g}_GiB": (a + b * args.extrapolate) / 2**30,
                      f"seconds_at_{args.extrapolate:g}": ta + tb * args.extrapolate}
        print(f"{m}: peak {b:.2f} bytes / example (+{a / 2**20:.0f} MiB), {tb * 1e6:.2f} s / million examples; "
              f"{args.extrapolate:g} examples: {(a + b * args.extrapolate) / 2**30:.2f} GiB, "
              f"{(ta + tb * args.extrapolate) / 60:.1f} min")
    save_result(args.name, {"benchmark": "plan_memory", "device": "cpu", "settings": vars(args), "runs": runs,
                            "fit": summary})
    big = {m: runs[m][-1] for m in runs}
    figs = "; ".join(
        f"{LABELS.get(m, m)}: "
        + ", ".join(f"{r['examples'] / 1e6:g}M {r['seconds']:.1f} s / +{r['peak_bytes'] / 2**20:.0f} MiB"
                    for r in runs[m])
        + f" (fit {summary[m]['peak_bytes_per_example']:.1f} B/example; {args.extrapolate / 1e6:g}M: "
          f"**{summary[m][f'peak_at_{args.extrapolate:g}_GiB']:.1f} GiB**, "
          f"{summary[m][f'seconds_at_{args.extrapolate:g}'] / 60:.0f} min)" for m in runs)
    largest = next(iter(big.values()))["largest_dataset"]
    line = (f"| {__import__('datetime').date.today()} | plan_memory | cpu (2 cores) | plan of N examples, "
            f"{args.datasets} datasets (Zipf {args.zipf:g}: the largest {largest / 1e6:.2g}M of "
            f"{sizes[-1] / 1e6:g}M), homogeneous, batch {args.batch}; peak RSS over the process after imports "
            f"(plan arrays: 16 B/example) | {figs} | `python benchmarks/plan_memory.py --sizes {args.sizes} "
            f"--datasets {args.datasets} --batch {args.batch}` |")
    record_line(line, append=not args.no_readme)
    return 0


if __name__ == "__main__":
    sys.exit(main())
