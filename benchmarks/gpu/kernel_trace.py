"""Where a profiled step spent its time on the GPU: a perfetto trace summed per kernel name (``kernel_summary``) and
those kernels grouped by kind (``kernel_categories``: matmul, fused attention, copies, ...). Read by the train
worker's profile (timing.profile) and by benchmarks/gpu/diag.py; imports nothing beyond the standard library.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def kernel_summary(trace_dir: Path, top: int = 60) -> dict:
    """The perfetto trace under ``trace_dir`` -> time per kernel name (the events of the GPU's streams; on
    the CPU, of XLA's thunks), the ``top`` costliest with their share; the trace copied to trace_dir/../trace.json.gz.
    """
    found = sorted(trace_dir.rglob("perfetto_trace.json.gz"))
    if not found:
        return {"error": f"no perfetto_trace.json.gz under {trace_dir}"}
    raw = gzip.open(found[-1], "rt").read()
    (trace_dir.parent / "trace.json.gz").write_bytes(gzip.compress(raw.encode()))
    events = json.loads(raw)
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    names = {}  # pid -> process name (the GPU's streams are in a "/device:GPU:0" process)
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            names[e.get("pid")] = str(e.get("args", {}).get("name", ""))
    dev_pids = {p for p, n in names.items() if "/device:" in n and "CPU" not in n.upper()} or set(names)
    per: dict = {}
    for e in events:
        if e.get("ph") != "X" or e.get("pid") not in dev_pids:
            continue
        k = e.get("name", "?")
        d = per.setdefault(k, {"us": 0.0, "n": 0, "hlo": (e.get("args") or {}).get("hlo_op", "")})
        d["us"] += float(e.get("dur", 0.0))
        d["n"] += 1
    total = sum(v["us"] for v in per.values()) or 1.0
    rows = sorted(per.items(), key=lambda kv: -kv[1]["us"])[:top]
    return {"processes": sorted(names[p] for p in dev_pids), "total_us": total,
            "kernels": [{"name": k[:200], "us": v["us"], "share": v["us"] / total, "calls": v["n"], "hlo": v["hlo"]}
                        for k, v in rows]}


#: kernel name patterns -> category, first match wins (device kernels of XLA on CUDA; on the CPU, XLA's thunks)
KERNEL_CATEGORIES = (
    ("attention (fused)", ("fmha", "flash", "cudnn", "attention", "mha")),
    ("matmul", ("gemm", "nvjet", "cutlass", "cublas", "xmma", "matmul", "dot", "wgmma", "sm90_", "sm80_")),
    ("reduction", ("reduce",)),
    ("scatter / gather", ("scatter", "gather", "dynamic_slice", "dynamic-update")),
    ("random bits", ("xor", "threefry", "philox", "rng")),
    ("copy / transpose", ("copy", "transpose", "memcpy", "memset", "concatenate", "pad")),
    ("elementwise fusion", ("loop_", "input_", "fusion", "triton", "convert", "select", "multiply", "add")),
)


def kernel_categories(summary: dict) -> dict:
    """benchmarks/gpu/diag.py's kernel summary -> {category: share of the kernel time} (KERNEL_CATEGORIES)."""
    out: dict = {}
    total = float(summary.get("total_us") or 0.0)
    if not total:
        return out
    counted = 0.0
    for k in summary.get("all_kernels", summary.get("kernels", [])):
        name = k["name"].lower()
        cat = next((c for c, pats in KERNEL_CATEGORIES if any(p in name for p in pats)), "other")
        out[cat] = out.get(cat, 0.0) + k["us"] / total
        counted += k["us"]
    if counted < total:
        out["other"] = out.get("other", 0.0) + (total - counted) / total
    return {k: round(v, 4) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}
