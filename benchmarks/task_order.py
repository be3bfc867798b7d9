"""Task-order solvers (Data-CUBE Eq. 6-7): speed of the simulated annealing and the objective each solver reaches.

1. Speed: 2,000,000 annealing iterations on a 330-task instance (the paper's setting), on one CPU core (the process
   is pinned to one core; the loop is numba-compiled, single-threaded). Compilation is timed apart: the first call
   in a process with an empty numba cache (NUMBA_CACHE_DIR is a fresh temporary folder), then the median of
   --repeats timed runs (different seeds).
2. Objective (Eq. 6, maximised) reached on
   - a 330-task random instance (cosine similarities of 330 random Gaussian 64-d vectors),
   - the real tasks of ../shared/data/train, both units (11 tasks, 14 datasets), with the similarity matrices of
     ``jaxembed score`` (all-MiniLM-L6-v2; pass the score folders, or the benchmark scores the shared store itself)
   by: random orders (mean +- std of 1000), simulated annealing (best and median of --repeats seeds), 2-opt alone
   and Or-opt alone (local search from random starts, best of --repeats), the 2-opt + Or-opt iterated local search
   (``--solver 2opt``), and Held-Karp's exact optimum where the units are few enough (<= 16).

Writes benchmarks/results/task_order_cpu.json and appends a line to benchmarks/README.md.

    python benchmarks/task_order.py [--repeats 5] [--scores-task DIR] [--scores-dataset DIR] [--n-task-queries 1000]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="numba-cold-")  # before numba is imported: cold compile

import numpy as np  # noqa: E402

from _record import record_line, save_result  # noqa: E402  (benchmarks/ is on sys.path)


def pin_one_core() -> str:
    try:
        cpu = sorted(os.sched_getaffinity(0))[0]
        os.sched_setaffinity(0, {cpu})
        return f"pinned to cpu {cpu}"
    except (AttributeError, OSError):
        return "not pinned (no sched_setaffinity)"


def solvers_on(S: np.ndarray, repeats: int, kicks: int) -> dict:
    from jaxembed.curriculum import order as O

    n = S.shape[0]
    out: dict = {"tasks": n}
    mean, std = O.random_baseline(S, 1000, seed=0)
    out["random"] = {"mean": mean, "std": std}
    an = [O.solve(S, solver="anneal", iterations=2_000_000, seed=s) for s in range(repeats)]
    out["anneal"] = {"best": max(r.value for r in an), "median": statistics.median(r.value for r in an),
                     "seconds_median": statistics.median(r.seconds for r in an), "iterations": 2_000_000,
                     "tau0": an[0].params["tau0"], "cooling": an[0].params["cooling"]}
    rng = np.random.default_rng(0)
    starts = [rng.permutation(n) for _ in range(repeats)]
    for name, moves in (("2opt_only", ("2opt",)), ("oropt_only", ("oropt",))):
        t0 = time.perf_counter()
        vals = [O.local_search(S, s, moves)[1] for s in starts]
        out[name] = {"best": max(vals), "median": statistics.median(vals),
                     "seconds_each": (time.perf_counter() - t0) / repeats}
    t0 = time.perf_counter()
    ils = O.solve(S, solver="2opt", kicks=kicks, seed=0)
    out["2opt_oropt_ils"] = {"value": ils.value, "seconds": time.perf_counter() - t0, "kicks": kicks}
    mn = O.solve(S, objective="min", solver="anneal", iterations=2_000_000, seed=0)
    out["anneal_min_mqmin"] = mn.value
    if n <= O.EXACT_MAX_TASKS:
        ex = O.solve(S, solver="exact")
        out["exact"] = {"value": ex.value, "seconds": ex.seconds}
    best = out.get("exact", {}).get("value", max(ils.value, out["anneal"]["best"]))
    out["anneal_best_over_best_known"] = out["anneal"]["best"] / best
    return out


def real_similarity(args, unit: str, given: str | None) -> tuple[np.ndarray, list[str], str]:
    from jaxembed.curriculum.similarity import load_similarity

    if given:
        S, names, u, meta = load_similarity(Path(given) / "task_similarity.npz")
        if u != unit:
            raise SystemExit(f"{given}: the similarity is over {u}s, expected {unit}s")
        return S, names, f"{given} (model {meta.get('model', '?')}, n_t {meta.get('n_task_queries')})"
    from jaxembed import loading, paths
    from jaxembed.curriculum.cli import run_score
    from jaxembed.data.shared_train import shared_train_config
    from jaxembed.data.store import Store, write_store
    from jaxembed.encode import Encoder

    work = Path(args.work)
    store_dir = work / "store"
    if not (store_dir / "manifest.json").exists():
        write_store(shared_train_config(paths.shared_data_dir()), store_dir)
    model = str(paths.demo_model_dir())
    enc = Encoder.from_loaded(loading.load(model, max_length=128))
    out = work / f"score_{unit}"
    run_score(enc, Store.open(store_dir), out, unit=unit, n_task_queries=args.n_task_queries, similarity_only=True,
              model_name=model)
    S, names, _, _ = load_similarity(out / "task_similarity.npz")
    return S, names, f"scored here: all-MiniLM-L6-v2, n_t {args.n_task_queries}, similarity only"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--kicks", type=int, default=200, help="2opt solver perturbation rounds")
    ap.add_argument("--scores-task", default=None, help="jaxembed score output over tasks (shared train store)")
    ap.add_argument("--scores-dataset", default=None, help="jaxembed score output over datasets")
    ap.add_argument("--n-task-queries", type=int, default=1000)
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "jaxembed_task_order_bench"))
    ap.add_argument("--no-readme", action="store_true")
    args = ap.parse_args()

    pinned = pin_one_core()
    t0 = time.perf_counter()
    from jaxembed.curriculum import order as O

    t_import = time.perf_counter() - t0
    x = np.random.default_rng(330).normal(size=(330, 64))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    S = x @ x.T
    t0 = time.perf_counter()
    O.anneal(S, iterations=10, seed=0)     # first call: numba compiles the loop (cold cache)
    compile_s = time.perf_counter() - t0
    times = []
    for s in range(args.repeats):
        r = O.solve(S, solver="anneal", iterations=2_000_000, seed=s)
        assert r.iterations == 2_000_000
        times.append(r.seconds)
    t_med = statistics.median(times)

    synthetic = solvers_on(S, args.repeats, args.kicks)
    real = {}
    for unit, given in (("task", args.scores_task), ("dataset", args.scores_dataset)):
        Sr, names, source = real_similarity(args, unit, given)
        res = solvers_on(Sr, args.repeats, args.kicks)
        best = O.solve(Sr, solver="exact" if len(names) <= O.EXACT_MAX_TASKS else "2opt", kicks=args.kicks)
        res["best_order"] = [names[i] for i in best.order]
        res["source"] = source
        real[unit] = res

    import numba

    result = {
        "benchmark": "task_order", "date": datetime.date.today().isoformat(), "device": "cpu",
        "host": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(), "affinity": pinned,
        "anneal_330_2M": {"seconds_median": t_med, "seconds_all": times, "compile_seconds_cold": compile_s,
                          "import_seconds": t_import, "ns_per_iteration": t_med / 2e6 * 1e9},
        "synthetic_330": synthetic, "real": real,
        "versions": {"numba": numba.__version__, "numpy": np.__version__},
        "command": "python benchmarks/task_order.py --repeats {}{}{}".format(
            args.repeats, f" --scores-task {args.scores_task}" if args.scores_task else "",
            f" --scores-dataset {args.scores_dataset}" if args.scores_dataset else ""),
    }
    save_result("task_order_cpu", result)
    syn = synthetic
    rt, rd = real["task"], real["dataset"]

    def fmt(r):
        ex = f", exact {r['exact']['value']:.3f}" if "exact" in r else ""
        return (f"random {r['random']['mean']:.3f}, anneal {r['anneal']['best']:.3f}, 2-opt "
                f"{r['2opt_only']['best']:.3f}, Or-opt {r['oropt_only']['best']:.3f}, 2-opt+Or-opt "
                f"{r['2opt_oropt_ils']['value']:.3f}{ex}")

    line = (f"| {result['date']} | task_order | cpu, 1 core ({result['cpu_count']}-core host) | 330 tasks, 2M "
            f"annealing iterations; Eq. 6 maximised | 2M iterations **{t_med:.2f} s** (compile {compile_s:.1f} s "
            f"cold); 330 random: {fmt(syn)}; real 11 tasks: {fmt(rt)}; real 14 datasets: {fmt(rd)} "
            f"| `{result['command']}` |")
    print(json.dumps(result, indent=2))
    record_line(line, append=not args.no_readme)


if __name__ == "__main__":
    main()
