"""Hard-negative mining's search on a CPU host: FAISS's IVF and HNSW indexes (``jaxembed mine --approx ivf / hnsw``,
the optional extra ``jaxembed[faiss]``) against the exact blocked search and jaxembed's own IVF index, on a
synthetic corpus of unit vectors.

The corpus: --corpus vectors of --dim dimensions around --clusters random centres (each a centre plus Gaussian noise
of --noise per dimension, normalised), so that neighbours are structured as real embeddings are; --queries queries
drawn the same way. For each search: the time to build the index and to search, and recall@k (the share of the
exact top-k found), k = --k. HNSW's graph is built on the first --hnsw-corpus vectors only (its build is the slow
part on a few cores); its recall is against the exact search of that sub-corpus.

Writes benchmarks/results/faiss_mining_cpu_<date>_<time>.json and appends a line to benchmarks/README.md.

    python benchmarks/faiss_mining.py [--corpus 1000000] [--dim 384] [--queries 1000] [--k 100]
                                      [--nprobe 8 32] [--own-nprobe 8] [--hnsw-corpus 200000]
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import sys
import time

import numpy as np

from _record import record_line, save_result  # noqa: E402  (benchmarks/ is on sys.path)


def synthetic(n: int, q: int, dim: int, clusters: int, noise: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)

    def draw(m):
        out = np.empty((m, dim), np.float32)
        for s in range(0, m, 100_000):
            e = min(m, s + 100_000)
            out[s:e] = centres[rng.integers(0, clusters, e - s)] + noise * rng.standard_normal((e - s, dim),
                                                                                                dtype=np.float32)
            out[s:e] /= np.linalg.norm(out[s:e], axis=1, keepdims=True)
        return out

    return draw(n), draw(q)


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(a[a >= 0]) & set(b)) / len(b) for a, b in zip(found, exact)]))


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--clusters", type=int, default=10_000)
    ap.add_argument("--noise", type=float, default=0.05)
    ap.add_argument("--nprobe", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--hnsw-corpus", type=int, default=200_000, help="vectors HNSW's graph is built on (0: skip)")
    ap.add_argument("--own-nprobe", type=int, nargs="*", default=None,
                    help="nprobe values for jaxembed's own IVF index (default: --nprobe; none: leave it out)")
    ap.add_argument("--name", default="faiss_mining_cpu")
    ap.add_argument("--no-readme", action="store_true")
    args = ap.parse_args()

    import faiss

    from jaxembed.mining.search import FaissIndex, IVFIndex, blocked_search

    D, Q = synthetic(args.corpus, args.queries, args.dim, args.clusters, args.noise)
    k, n = args.k, args.corpus
    nlist = max(1, int(round(math.sqrt(n))))
    print(f"corpus {n:,} x {args.dim}, {args.queries} queries, k {k}, nlist {nlist}", flush=True)
    exact, t_exact = timed(lambda: blocked_search(Q, D, k))
    rows = {"exact": {"search_s": t_exact, "recall": 1.0}}
    print(f"exact: {t_exact:.1f} s", flush=True)
    index, t_build = timed(lambda: FaissIndex(D, "ivf", nlist=nlist))
    for p in args.nprobe:
        res, t = timed(lambda: index.search(Q, k, nprobe=p))
        rows[f"faiss_ivf_nprobe{p}"] = {"build_s": t_build, "search_s": t, "recall": recall(res.ids, exact.ids)}
        print(f"faiss ivf nprobe {p}: build {t_build:.1f} s, search {t:.2f} s, recall@{k} "
              f"{rows[f'faiss_ivf_nprobe{p}']['recall']:.4f}", flush=True)
    del index
    own_nprobe = args.nprobe if args.own_nprobe is None else args.own_nprobe
    if own_nprobe:
        own, t_build = timed(lambda: IVFIndex(D, nlist))
        for p in own_nprobe:
            res, t = timed(lambda: own.search(Q, k, nprobe=p))
            rows[f"jaxembed_ivf_nprobe{p}"] = {"build_s": t_build, "search_s": t, "recall": recall(res.ids, exact.ids)}
            print(f"jaxembed ivf nprobe {p}: build {t_build:.1f} s, search {t:.2f} s, recall@{k} "
                  f"{rows[f'jaxembed_ivf_nprobe{p}']['recall']:.4f}", flush=True)
        del own
    if args.hnsw_corpus:
        m = min(args.hnsw_corpus, n)
        sub = D[:m]
        sub_exact, t_sub = timed(lambda: blocked_search(Q, sub, k))
        hnsw, t_build = timed(lambda: FaissIndex(sub, "hnsw"))
        res, t = timed(lambda: hnsw.search(Q, k))
        rows["faiss_hnsw"] = {"corpus": m, "build_s": t_build, "search_s": t, "exact_search_s": t_sub,
                              "ef_search": int(hnsw.index.hnsw.efSearch), "recall": recall(res.ids, sub_exact.ids)}
        print(f"faiss hnsw on {m:,}: build {t_build:.1f} s, search {t:.2f} s (exact {t_sub:.1f} s), recall@{k} "
              f"{rows['faiss_hnsw']['recall']:.4f}", flush=True)
    cmd = "python benchmarks/faiss_mining.py " + " ".join(sys.argv[1:])
    result = {"date": datetime.date.today().isoformat(), "benchmark": "faiss_mining",
              "device": f"cpu ({os.cpu_count()} cores)", "platform": platform.platform(),
              "faiss": faiss.__version__, "corpus": n, "dim": args.dim, "queries": args.queries, "k": k,
              "clusters": args.clusters, "noise": args.noise, "nlist": nlist, "load_average": os.getloadavg()[0],
              "results": rows, "command": cmd.strip()}
    save_result(args.name, result)
    parts = []
    for name, r in rows.items():
        if name == "exact":
            parts.append(f"exact {r['search_s']:.0f} s")
            continue
        build = f"build {r['build_s']:.0f} s + " if "build_s" in r else ""
        on = f" (on {r['corpus']:,}; exact there {r['exact_search_s']:.0f} s)" if "corpus" in r else ""
        parts.append(f"{name.replace('_', ' ')}: {build}search {r['search_s']:.1f} s, recall@{k} "
                     f"**{r['recall']:.3f}**{on}")
    line = (f"| {result['date']} | faiss_mining | cpu ({os.cpu_count()} cores) | `jaxembed mine`'s search, synthetic "
            f"{n:,} x {args.dim} unit vectors ({args.clusters:,} clusters), {args.queries:,} queries, top {k}, nlist "
            f"{nlist}, faiss {faiss.__version__}, load average {result['load_average']:.1f} | {'; '.join(parts)} | "
            f"`{cmd.strip()}` |")
    record_line(line, append=not args.no_readme)


if __name__ == "__main__":
    main()
