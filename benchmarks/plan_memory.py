"""Build time and peak memory of a batch plan as it grows: the plan written in blocks (``build_plan_file``, what
``jaxembed train`` runs on process 0) against the plan built in memory and saved (``build_plan`` + ``Plan.save``).

The store is synthetic metadata only (no records, nothing tokenised), epoch mode, global batch --batch, scaled to
each total in --sizes, in one of three shapes (--shapes):

- ``zipf``: --datasets datasets whose sizes follow a Zipf law (size of the k-th ∝ 1 / k^--zipf), homogeneous
  batches (a unit per dataset: the largest holds --zipf's share);
- ``single``: one dataset of all the examples (one unit: the whole plan);
- ``random``: the ``zipf`` datasets under the ``random`` strategy (one unit holding every dataset);
- ``curriculum``: one dataset, a curriculum unit in easy-to-difficult order (``instance_order='e2d'``) by random
  scores, made before the process's baseline is read (the scores are an input the build is handed, 8 B an example);
- ``curriculum_random``: the same unit in random order (``instance_order='random'``).

Each build runs in its own Python process, which reports its peak resident set size (getrusage ru_maxrss) over what
it held after imports and a warm-up build, its wall time and its CPU seconds (user + system). A least-squares line
through the sizes gives the growth in bytes per example, and the 300M extrapolation. A unit's pass is sorted
through bucket files and de-duplicated a block at a time, so the blocked build's peak does not follow the largest
unit. --code names another checkout whose ``jaxembed`` the builds import (a before / after comparison).
glibc raises its mmap threshold as large arrays are freed, so later ones come from a heap that keeps its peak:
the RSS of a bounded build still creeps up by a few MiB with the size; --fixed-mmap-threshold shows the peak
without that.

    python benchmarks/plan_memory.py [--sizes 1e6,3e6,1e7] [--shapes zipf,single,random] [--datasets 100]
                                     [--zipf 0.8] [--batch 1024] [--modes blocked,memory] [--code DIR] [--no-readme]
"""

from __future__ import annotations

import argparse
import json
import os
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

mode, total, D, zipf, G, out, shape = sys.argv[1], int(float(sys.argv[2])), int(sys.argv[3]), \
    float(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7]
D = 1 if shape in ("single", "curriculum", "curriculum_random") else D
w = 1.0 / (1 + np.arange(D)) ** zipf
sizes = np.floor(w / w.sum() * total).astype(int)
sizes[0] += total - sizes.sum()
batching = "random" if shape == "random" else "homogeneous"
info = lambda k, s: SimpleNamespace(name=f"d{k}", task=f"t{k % 20}", size=int(s), batching=batching,
                                     epochs=None, weight=None, temperature=None)
datasets = [info(k, s) for k, s in enumerate(sizes)]
cpu = lambda: (lambda r: r.ru_utime + r.ru_stime)(resource.getrusage(resource.RUSAGE_SELF))
cfg, kw = {"global_batch_size": G}, {}
if shape.startswith("curriculum"):
    cfg["curriculum"] = {"enabled": True, "instance_order": "e2d" if shape == "curriculum" else "random"}
    kw = {"scores": {"d0": np.random.default_rng(0).normal(size=int(sizes[0]))}, "task_order": ["d0"]}
warm = {"d0": np.zeros(3 * G)} if shape.startswith("curriculum") else None
build_plan_file(os.path.join(out, "warm.npz"), [info(0, 3 * G)], cfg, **dict(kw, scores=warm))  # imports, first calls
build_plan([info(0, 3 * G)], cfg, **dict(kw, scores=warm))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
t, c = time.perf_counter(), cpu()
if mode == "blocked":
    plan = build_plan_file(os.path.join(out, "plan.npz"), datasets, cfg, **kw)
else:
    plan = build_plan(datasets, cfg, **kw)
    plan.save(os.path.join(out, "plan.npz"))
seconds, cpu_seconds = time.perf_counter() - t, cpu() - c
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
examples = plan.steps * plan.global_batch_size
print(json.dumps({"mode": mode, "shape": shape, "cpu_seconds": round(cpu_seconds, 3), "examples": total, "planned": int(examples), "steps": plan.steps,
                  "largest_dataset": int(sizes.max()), "seconds": round(seconds, 3), "base_rss": base,
                  "peak_rss": peak, "peak_bytes": peak - base, "plan_bytes": int(examples * 16),
                  "file_bytes": os.path.getsize(os.path.join(out, "plan.npz"))}))
"""


LABELS = {"blocked": "blocked (`build_plan_file`, process 0 of `jaxembed train`)",
          "memory": "in memory (`build_plan` + `Plan.save`)"}


SHAPES = {"zipf": "homogeneous, a unit per dataset", "single": "one dataset (one unit)",
          "random": "the random strategy (one unit of every dataset)",
          "curriculum": "one dataset, a curriculum unit in e2d order (its scores not counted)",
          "curriculum_random": "one dataset, a curriculum unit in random order"}


def one(mode: str, shape: str, total: float, args) -> dict:
    code = Path(args.code).resolve() if args.code else ROOT
    with tempfile.TemporaryDirectory(prefix="plan_memory_") as out:
        env = dict(os.environ, **({"MALLOC_MMAP_THRESHOLD_": "131072"} if args.fixed_mmap_threshold else {}))
        r = subprocess.run([sys.executable, "-c", RUNNER, mode, str(total), str(args.datasets), str(args.zipf),
                            str(args.batch), out, shape], capture_output=True, text=True, cwd=code, env=env)
    if r.returncode:
        raise SystemExit(f"{mode} {shape} {total:g}: exit {r.returncode}\n{r.stderr[-3000:]}")
    rec = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"{mode:8s} {shape:7s} {rec['examples']:>12,} examples: {rec['seconds']:7.2f} s ({rec['cpu_seconds']:.2f} "
          f"CPU s), peak +{rec['peak_bytes'] / 2**20:8.1f} MiB (plan arrays {rec['plan_bytes'] / 2**20:.1f} MiB)",
          flush=True)
    return rec


def fit(xs, ys) -> tuple[float, float]:
    """Least-squares line y = a + b x -> (a, b)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def summarise(recs: list[dict], at: float) -> dict:
    """The fit of peak bytes, wall and CPU seconds through the sizes, its value at ``at`` examples, and the peak's
    growth from the smallest size to the largest."""
    xs = [r["examples"] for r in recs]
    a, b = fit(xs, [r["peak_bytes"] for r in recs])
    ta, tb = fit(xs, [r["seconds"] for r in recs])
    ca, cb = fit(xs, [r["cpu_seconds"] for r in recs])
    return {"peak_bytes_per_example": b, "peak_fixed_bytes": a, "seconds_per_million": tb * 1e6,
            "cpu_seconds_per_million": cb * 1e6, f"peak_at_{at:g}_GiB": (a + b * at) / 2**30,
            f"seconds_at_{at:g}": ta + tb * at, f"cpu_seconds_at_{at:g}": ca + cb * at,
            "peak_growth": recs[-1]["peak_bytes"] / max(recs[0]["peak_bytes"], 1) - 1}


def readme_figures(key: str, recs: list[dict], s: dict, at: float) -> str:
    shape, mode = key.split("/")
    return (f"{shape} {LABELS.get(mode, mode).split(' (')[0]}: "
            + ", ".join(f"{r['examples'] / 1e6:g}M {r['cpu_seconds']:.1f} CPU s / +{r['peak_bytes'] / 2**20:.0f} MiB"
                        for r in recs)
            + f" (peak {s['peak_growth'] * 100:+.0f} % from {recs[0]['examples'] / 1e6:g}M; fit "
              f"{s['peak_bytes_per_example']:.1f} B/example; {at / 1e6:g}M: **{peak_at(recs, s, at)}**, "
              f"{s[f'cpu_seconds_at_{at:g}'] / 60:.0f} CPU min)")


def peak_at(recs: list[dict], s: dict, at: float) -> str:
    """The fit's peak at ``at`` examples; a fit that does not rise says the peak is flat (the largest measured)."""
    if s["peak_bytes_per_example"] <= 0:
        return f"flat, at most +{max(r['peak_bytes'] for r in recs) / 2**20:.0f} MiB measured"
    return f"{s[f'peak_at_{at:g}_GiB']:.2f} GiB"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1e6,3e6,1e7", help="total examples, comma-separated")
    p.add_argument("--shapes", default="zipf,single,random", help=f"of {', '.join(SHAPES)}, comma-separated")
    p.add_argument("--datasets", type=int, default=100)
    p.add_argument("--zipf", type=float, default=0.8, help="size of the k-th dataset ∝ 1 / k^zipf")
    p.add_argument("--batch", type=int, default=1024, help="global batch size")
    p.add_argument("--modes", default="blocked,memory")
    p.add_argument("--code", default=None, help="a checkout whose jaxembed the builds import (default: this one)")
    p.add_argument("--label", default="", help="what the record measures, e.g. 'before: <commit>'")
    p.add_argument("--fixed-mmap-threshold", action="store_true",
                   help="run the builds with glibc's mmap threshold fixed at 128 KiB (MALLOC_MMAP_THRESHOLD_): freed "
                        "large arrays go back to the system, so the peak RSS shows what is held, not the heap's "
                        "fragmentation")
    p.add_argument("--extrapolate", type=float, default=3e8)
    p.add_argument("--name", default="plan_memory_cpu")
    p.add_argument("--no-readme", action="store_true")
    args = p.parse_args(argv)
    sizes = [float(s) for s in args.sizes.split(",")]
    at = args.extrapolate
    runs = {f"{sh}/{m}": [one(m, sh, n, args) for n in sizes]
            for sh in args.shapes.split(",") for m in args.modes.split(",")}
    summary = {}
    for key, recs in runs.items():
        summary[key] = s = summarise(recs, at)
        print(f"{key}: peak {s['peak_bytes_per_example']:.2f} bytes / example (+{s['peak_fixed_bytes'] / 2**20:.0f} "
              f"MiB), growth {s['peak_growth'] * 100:+.1f} %, {s['cpu_seconds_per_million']:.2f} CPU s / million "
              f"examples; {at:g} examples: {s[f'peak_at_{at:g}_GiB']:.2f} GiB, {s[f'cpu_seconds_at_{at:g}'] / 60:.1f} "
              "CPU min")
    path = save_result(args.name, {"benchmark": "plan_memory", "device": "cpu", "settings": vars(args),
                                   "runs": runs, "fit": summary})
    print(f"saved {path}")
    figs = "; ".join(readme_figures(k, recs, summary[k], at) for k, recs in runs.items())
    label = f"{args.label}: " if args.label else ""
    label += "glibc mmap threshold fixed at 128 KiB; " if args.fixed_mmap_threshold else ""
    line = (f"| {__import__('datetime').date.today()} | plan_memory | cpu (2 cores, shared) | {label}plan of N "
            f"examples ({sizes[0] / 1e6:g}M..{sizes[-1] / 1e6:g}M), batch {args.batch}, epoch mode; shapes: "
            + "; ".join(f"{sh}: {SHAPES[sh]}" for sh in args.shapes.split(","))
            + f" ({args.datasets} datasets, Zipf {args.zipf:g}); peak RSS over the process after imports (plan "
            f"arrays: 16 B/example) | {figs} | `python benchmarks/plan_memory.py --sizes {args.sizes} --shapes "
            f"{args.shapes} --modes {args.modes}" + (" --fixed-mmap-threshold" if args.fixed_mmap_threshold else "")
            + (" --code CHECKOUT" if args.code else "") + "` |")
    record_line(line, append=not args.no_readme)
    return 0


if __name__ == "__main__":
    sys.exit(main())
