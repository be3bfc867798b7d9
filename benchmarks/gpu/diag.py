"""Where a jaxembed training step spends its time on the device:
the packed step of one model under a few variants (dropout on / off, attention kernel), each timed over the same
steps, the optimised HLO of the first variant, and a profiler trace (perfetto JSON) of it.

    python benchmarks/gpu/diag.py --out OUT [--model minilm] [--batch 512] [--variants ...] [--budget 150]

Every figure goes to OUT/diag.json as soon as it is measured; with --trace, the trace's kernels summed by name
(OUT/kernels.json: the 60 costliest, with the HLO fusion each came from) and the perfetto trace itself, flat
(OUT/trace.json.gz: one file to copy back). Run with benchmarks/gpu/run.sh's
environment (PYTHONPATH with the carried wheels; benchmarks/gpu/README.md has the command); on the CPU with
--model tiny-bert --batch 16 (tests/test_gpu_bench.py). ``--record DIR`` files a returned DIR under
benchmarks/results/ (gpu_diag_<device>_<date>_<time>.json) with a line in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import harness as H  # noqa: E402
from kernel_trace import kernel_summary  # noqa: E402,F401  (its trace summary, read here and by the tests)

VARIANTS = {  # name -> (train.dropout, model.attention, data.packing)
    "packed_dropout_auto": (True, "auto", True),
    "packed_nodrop_auto": (False, "auto", True),
    "packed_nodrop_pallas": (False, "pallas", True),
    "packed_nodrop_cudnn": (False, "cudnn", True),
    "padded_dropout_auto": (True, "auto", False),
}


def record(folder: Path) -> None:
    """File a returned diag folder under benchmarks/results/ and a line in benchmarks/README.md."""
    sys.path.insert(0, str(HERE.parent))
    import _record

    d = json.loads((folder / "diag.json").read_text())
    if (folder / "kernels.json").is_file():
        d["kernels"] = json.loads((folder / "kernels.json").read_text())
    if (folder / "pytest.log").is_file():
        d["pytest_tail"] = (folder / "pytest.log").read_text()[-4000:]
    dev = str(d.get("device", "unknown"))
    tag = dev.lower().replace("nvidia ", "").split()[0] if dev else "unknown"
    _record.save_result(f"gpu_diag_{tag}", d)
    parts = []
    for name, v in d.get("variants", {}).items():
        parts.append(f"{name} {v['step_s'] * 1e3:.0f} ms" if "step_s" in v else f"{name}: {next(iter(v))}")
    for shape, cases in d.get("attention_ms", {}).items():
        parts.append(f"attention alone (fwd + bwd) {shape}: " + ", ".join(
            f"{k} {v} ms" if isinstance(v, (int, float)) else f"{k}: {str(v).split(':')[0]}" for k, v in cases.items()))
    _record.record_line(f"| {_record.run_id()[:10]} | gpu diag | {dev} | train step time per variant (dropout, "
                        f"attention kernel, packing), {d.get('model')} B={d.get('batch')}, natural lengths | "
                        f"{'; '.join(parts)} | `python benchmarks/gpu/diag.py --out $OUT --trace` |")


def attention_bench(ids_list, heads: int, head_dim: int, t_end: float, iters: int = 20) -> dict:
    """The attention call alone, forward + backward, on the packed rows' segment ids (a list of [R, L] host
    arrays), bfloat16 q / k / v [R, L, heads, head_dim]: the XLA path with and without attention dropout, cuDNN
    with max segments = L (what the model passes) and = the rows' real bound, Pallas. -> {case: ms per call}."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxembed.models import attention as A

    out = {}
    for ids in ids_list:
        R, L = ids.shape
        m = int((A.segment_runs(jnp.asarray(ids))[0] > 0).sum(axis=1).max())  # texts + the padding run
        key = f"{R}x{L} (max runs {m})"
        ks = jax.random.split(jax.random.key(0), 4)
        q, k, v, g = (jax.random.normal(kk, (R, L, heads, head_dim), jnp.bfloat16) for kk in ks)
        seg = A.Segments(jnp.asarray(ids))
        cases = {
            "xla": lambda q, k, v: A.xla_attention(q, k, v, seg),
            "xla_dropout": lambda q, k, v: A.xla_attention(q, k, v, seg, dropout_rate=0.1, deterministic=False,
                                                           rngs=nnx.Rngs(dropout=0)),
            "cudnn_M=L": lambda q, k, v: A.cudnn_attention(q, k, v, seg),
            f"cudnn_M={m}": lambda q, k, v: A.cudnn_attention(q, k, v, seg, max_runs=m),
            "pallas": lambda q, k, v: A.pallas_attention(q, k, v, seg),
        }
        res = out.setdefault(key, {})
        for name, fn in cases.items():
            if time.time() > t_end:
                res[name] = "skipped: budget"
                continue
            try:
                step = jax.jit(jax.grad(lambda q, k, v, fn=fn: (fn(q, k, v).astype(jnp.float32) * g).sum(),
                                        argnums=(0, 1, 2)))
                jax.block_until_ready(step(q, k, v))
                t0 = time.perf_counter()
                for _ in range(iters):
                    r = step(q, k, v)
                jax.block_until_ready(r)
                res[name] = round((time.perf_counter() - t0) / iters * 1e3, 3)
            except Exception as e:  # noqa: BLE001 -- a kernel's failure is a finding too
                res[name] = "error: " + "".join(traceback.format_exception_only(e))[-300:]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--record", metavar="DIR", help="file DIR (a returned --out) under benchmarks/results/")
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--dtype", default="bfloat16", help="compute dtype (float32 for what the CPU benchmarks run)")
    ap.add_argument("--budget", type=float, default=150.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--take", type=int, default=4)
    ap.add_argument("--trace", action="store_true", help="profiler trace of the first variant (perfetto JSON)")
    ap.add_argument("--attn", action="store_true",
                    help="also time the attention call alone (forward + backward) per kernel on the packed rows")
    a = ap.parse_args()
    if a.record:
        return record(Path(a.record))
    if not a.out:
        ap.error("--out is required")
    t_end = time.time() + a.budget
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict = {"model": a.model, "batch": a.batch, "dtype": a.dtype, "variants": {}}

    def save():
        (out / "diag.json").write_text(json.dumps(res, indent=1))

    import jax

    import timing
    from jaxembed.train import init_state

    res["device"] = jax.devices()[0].device_kind
    root = Path(os.environ.get("DIAG_ROOT", "/tmp/gpu_bench"))
    folder = H.model_folder(a.model, root / "models")
    first = True
    for name in a.variants.split(","):
        if time.time() > t_end - 20:
            res["variants"][name] = {"skipped": "budget"}
            save()
            continue
        dropout, attn, packing = VARIANTS[name]
        t0 = time.time()
        try:
            c = H.run_config(folder, a.batch, data=H.natural_data_file(root), store=root / "store_k2", plan_steps=40,
                             dtype=a.dtype)
            c.train.dropout = dropout
            c.model.attention = attn
            packed, padded = H.make_runs(c, Path(tempfile.mkdtemp(prefix="diag_", dir=root)))
            run = packed if packing else padded
            loader = H.loader_of(run, "packed" if packing else "padded")
            hosts = [loader.batch(s) for s in range(a.take)]
            state, kept = init_state(run), {}
            state, timed = timing.compile_and_time(run, state, hosts, a.rounds, H.Deadline(t_end - 10), keep=kept)
            if first:
                with gzip.open(out / f"hlo_{name}.txt.gz", "wt") as f:
                    f.write(kept["programs"][0].as_text())
            if first and a.trace and time.time() < t_end - 30:
                tdir = out / "trace"
                jax.profiler.start_trace(str(tdir), create_perfetto_trace=True)
                for p, b in zip(kept["programs"], kept["batches"]):
                    state, m = p(state, b)
                jax.block_until_ready(m["loss"])
                jax.profiler.stop_trace()
                ks = kernel_summary(tdir)
                (out / "kernels.json").write_text(json.dumps(ks, indent=1))
                res["top_kernels"] = ks.get("kernels", [])[:15]
            if first and a.attn and packing:
                cfg = json.loads((Path(folder) / "config.json").read_text())
                heads = int(cfg["num_attention_heads"])
                hd = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
                ids = {str(v.shape): v for h in hosts for kk, v in h.items() if kk.endswith("segment_ids")}
                res["attention_ms"] = attention_bench(list(ids.values())[:2], heads, hd, t_end - 30)
                print("attention_ms", json.dumps(res["attention_ms"]), flush=True)
                save()
            shapes = sorted({str([list(v.shape) for k, v in h.items() if k.endswith("input_ids")]) for h in hosts})
            times = timed["round_times_s"]
            res["variants"][name] = {"compile_s": timed["compile_s"], "programs": timed["programs"],
                                     "round_s": times, "step_s": min(times) / len(hosts), "shapes": shapes,
                                     "loss": timed["loss"], "wall_s": time.time() - t0}
        except Exception as e:  # noqa: BLE001 -- a variant's failure is a finding too
            res["variants"][name] = {"error": "".join(traceback.format_exception(e)[-4:])[-2000:]}
        first = False
        print(name, json.dumps(res["variants"][name])[:400], flush=True)
        save()


if __name__ == "__main__":
    main()
