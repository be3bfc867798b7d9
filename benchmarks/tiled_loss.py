"""Plain vs tiled InfoNCE: loss + gradient for B queries x K candidates each (1 positive + K-1 hard negatives),
d = 384, float32, on the current device.

Each configuration runs in a fresh subprocess so that its peak resident memory (ru_maxrss) is its own; XLA's
compile-time buffer analysis (temp + arguments + outputs) is recorded too. Writes
benchmarks/results/tiled_loss_<platform>.json and appends a line to benchmarks/README.md.

    python benchmarks/tiled_loss.py [--sizes 1024,2048,4096] [--big 32768] [--repeats 2]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import time

from _record import record_line, save_result  # noqa: E402  (benchmarks/ is on sys.path)



def run_one(kind: str, b: int, k: int, d: int, repeats: int, block_q: int, block_c: int) -> dict:
    import jax
    import jax.numpy as jnp

    from jaxembed.losses import contrastive_loss, layout_pos_index, query_terms, tiled_terms

    n = b * k
    terms = query_terms if kind == "plain" else tiled_terms(block_q, block_c)
    pos = layout_pos_index(b, k)
    f = jax.jit(jax.value_and_grad(lambda q, c: contrastive_loss(q, c, pos, temperature=0.01,
                                                                 terms_fn=terms)[0], argnums=(0, 1)))
    kq, kc = jax.random.split(jax.random.key(0))
    q = jax.random.normal(kq, (b, d), jnp.float32)
    c = jax.random.normal(kc, (n, d), jnp.float32)
    compiled = f.lower(q, c).compile()
    ma = compiled.memory_analysis()
    xla_bytes = None if ma is None else int(ma.temp_size_in_bytes + ma.argument_size_in_bytes
                                            + ma.output_size_in_bytes)
    times = []
    loss = None
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        loss, (gq, gc) = compiled(q, c)
        jax.block_until_ready(gc)
        times.append(time.perf_counter() - t0)
    times = times[1:] if repeats else times
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    flops = 4 * 2 * b * n * d  # forward logits + recompute + two gradient products
    return {"kind": kind, "queries": b, "candidates": n, "dim": d, "xla_peak_bytes": xla_bytes,
            "peak_rss_bytes": rss, "time_s": min(times), "times_s": times, "loss": float(loss),
            "plain_logits_bytes": 4 * b * n, "gflops_per_s": flops / min(times) / 1e9}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1024,2048,4096", help="query counts where both plain and tiled run")
    ap.add_argument("--big", type=int, default=32768, help="query count for the tiled-only run (0 = skip)")
    ap.add_argument("--k", type=int, default=6)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--block-q", type=int, default=1024)
    ap.add_argument("--block-c", type=int, default=8192)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: kind,b
    ap.add_argument("--no-readme", action="store_true")
    args = ap.parse_args()
    if args.one:
        kind, b = args.one.split(",")
        reps = args.repeats if int(b) < args.big or not args.big else 0
        print(json.dumps(run_one(kind, int(b), args.k, args.dim, reps, args.block_q, args.block_c)))
        return
    runs = [(kind, int(b)) for b in args.sizes.split(",") for kind in ("plain", "tiled")]
    if args.big:
        runs.append(("tiled", args.big))
    results = []
    for kind, b in runs:
        cmd = [sys.executable, __file__, "--one", f"{kind},{b}", "--k", str(args.k), "--dim", str(args.dim),
               "--repeats", str(args.repeats), "--block-q", str(args.block_q), "--block-c", str(args.block_c),
               "--big", str(args.big)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            print(r.stderr[-2000:], file=sys.stderr)
            results.append({"kind": kind, "queries": b, "error": r.stderr.strip().splitlines()[-1][:300]})
            continue
        res = json.loads(r.stdout.strip().splitlines()[-1])
        results.append(res)
        print(f"{kind:>5} B={b:>6} N={res['candidates']:>7}: peak RSS {res['peak_rss_bytes'] / 2**30:6.2f} GiB, "
              f"XLA buffers {res['xla_peak_bytes'] / 2**30:6.2f} GiB, {res['time_s']:8.2f} s "
              f"(plain logits alone would be {res['plain_logits_bytes'] / 2**30:.1f} GiB)", flush=True)
    import jax

    dev = jax.devices()[0]
    out = {"benchmark": "tiled_loss", "date": datetime.date.today().isoformat(),
           "device": f"{dev.platform}:{dev.device_kind}", "cpu_count": os.cpu_count(), "k": args.k,
           "dim": args.dim, "block_q": args.block_q, "block_c": args.block_c, "results": results,
           "command": f"python benchmarks/tiled_loss.py --sizes {args.sizes} --big {args.big} --repeats {args.repeats}"}
    save_result(f"tiled_loss_{dev.platform}", out)
    ok = [r for r in results if "error" not in r]
    both = [b for b in {r["queries"] for r in ok if r["kind"] == "plain"}
            if any(r["kind"] == "tiled" and r["queries"] == b for r in ok)]
    parts = []
    for b in sorted(both):
        p = next(r for r in ok if r["kind"] == "plain" and r["queries"] == b)
        t = next(r for r in ok if r["kind"] == "tiled" and r["queries"] == b)
        parts.append(f"B={b}: peak RSS plain {p['peak_rss_bytes'] / 2**30:.2f} / tiled {t['peak_rss_bytes'] / 2**30:.2f}"
                     f" GiB, time {p['time_s']:.2f} / {t['time_s']:.2f} s")
    big = [r for r in ok if r["queries"] == args.big]
    if big:
        r = big[0]
        parts.append(f"tiled B={args.big} x N={r['candidates']}: peak RSS {r['peak_rss_bytes'] / 2**30:.2f} GiB "
                     f"(plain logits alone {r['plain_logits_bytes'] / 2**30:.0f} GiB), {r['time_s']:.0f} s")
    line = (f"| {out['date']} | tiled_loss | {out['device']} ({out['cpu_count']} cores) | loss+grad, K={args.k}, "
            f"d={args.dim}, fp32 | " + "; ".join(parts) + f" | `{out['command']}` |")
    record_line(line, append=not args.no_readme)


if __name__ == "__main__":
    main()
