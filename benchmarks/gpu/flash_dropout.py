"""The attention call alone, forward + backward, with attention dropout: the einsum path (what ``model.attention=auto``
and ``xla`` run in training: float32 probabilities, the mask and the dropped probabilities kept for the backward)
against ``model.attention=pallas_flash`` (jaxembed.models.flash_dropout: the mask computed inside the kernel).

Per shape and dropout rate (0 and --rate): milliseconds per call (median of --iters after one warm-up), XLA's
compiled memory (temporaries + arguments + outputs), and how far the kernel's output and q / k / v gradients are
from the einsum path's (the same dropout mask: they should agree to bfloat16 rounding). Rows are packed: texts of
random lengths back to back, each with its own dropout coordinates, as the train step lays them out.

    python benchmarks/gpu/flash_dropout.py [--shapes 32x128x12x12x64,16x512x14x2x64] [--rate 0.1] [--iters 20]
                                           [--dtype bfloat16] [--block 64] [--out DIR] [--readme]
    python benchmarks/gpu/flash_dropout.py --dry-run --out /tmp/fd   # CPU, Pallas interpret mode, tiny: the code path

A shape is BxLxNxKxD (rows, slots per row, query heads, key/value heads, head dimension). Writes
flash_dropout_<device>_<date>_<time>.json under --out (default benchmarks/results/) and prints the README table line
(--readme also appends it to benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

import _record  # noqa: E402

DEFAULT_SHAPES = "32x128x12x12x64,8x512x12x12x64,16x512x14x2x64"  # BERT-base short / long, Qwen2-0.5B


def packed_rows(b: int, l: int, seed: int = 0):
    """Segment ids [B, L] (texts of 8..L/2 tokens back to back, padding 0 at the end), text ids unique in the batch
    and positions within each text: what the train step gives attention and dropout."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = np.zeros((b, l), np.int32)
    for r in range(b):
        at, s = 0, 1
        while at < l:
            n = int(rng.integers(8, max(9, l // 2)))
            if at + n > l:
                break
            ids[r, at:at + n] = s
            at, s = at + n, s + 1
    pos = np.zeros_like(ids)
    for r in range(b):
        for c in range(1, l):
            pos[r, c] = pos[r, c - 1] + 1 if ids[r, c] == ids[r, c - 1] else 0
    text = np.arange(b, dtype=np.int32)[:, None] * l + ids
    return ids, text, pos


def measure(fn, args, iters: int) -> dict:
    """jit(value_and_grad) of fn: ms per call (median), compiled memory, the outputs and gradients."""
    import jax
    import jax.numpy as jnp

    def loss(q, k, v):
        out = fn(q, k, v)
        return jnp.sum(out.astype(jnp.float32) * jnp.cos(out.astype(jnp.float32))), out

    compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)).lower(*args).compile()
    ma = compiled.memory_analysis()
    res = jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
    memory = None if ma is None else int(ma.temp_size_in_bytes + ma.argument_size_in_bytes + ma.output_size_in_bytes)
    return {"ms": round(statistics.median(times) * 1e3, 3), "xla_bytes": memory}, res


def run_shape(shape: str, rate: float, dtype: str, iters: int, block: int | None, interpret: bool) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxembed.models import attention as attn
    from jaxembed.models import dropout as dr
    from jaxembed.models import flash_dropout as fd

    b, l, n, kv, d = (int(x) for x in shape.split("x"))
    ids, text, pos = (jnp.asarray(x) for x in packed_rows(b, l))
    seg, tok = attn.Segments(ids), dr.Tokens(text, pos)
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(kk, (b, l, h, d), jnp.float32).astype(dtype) for kk, h in zip(keys, (n, kv, kv)))

    class Rngs:
        def dropout(self):
            return jax.random.key(1)

    out = {}
    for r in sorted({0.0, rate}):
        def einsum(q, k, v):
            with dr.tokens(tok.text, tok.position):
                return attn.xla_attention(q, k, v, seg, dropout_rate=r, deterministic=False, rngs=Rngs(),
                                          heads_first=False)

        def flash(q, k, v):
            return fd.flash_attention(q, k, v, seg, dropout_rate=r, key=jax.random.key(1), tokens=tok, block=block,
                                      interpret=interpret)

        ref, ref_res = measure(einsum, (q, k, v), iters)
        new, new_res = measure(flash, (q, k, v), iters)
        real = np.asarray(ids) > 0
        (_, o_ref), g_ref = ref_res
        (_, o_new), g_new = new_res
        diff = {"out": float(np.abs(np.asarray(o_new, np.float32) - np.asarray(o_ref, np.float32))[real].max())}
        for name, a, c in zip(("dq", "dk", "dv"), g_new, g_ref):
            diff[name] = float(np.abs(np.asarray(a, np.float32) - np.asarray(c, np.float32)).max())
        out[f"rate={r}"] = {"einsum": ref, "pallas_flash": new, "speedup": round(ref["ms"] / new["ms"], 3),
                            "max_abs_diff": diff}
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES)
    p.add_argument("--rate", type=float, default=0.1)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--block", type=int, default=None, help="queries and keys per kernel block (default: 64)")
    p.add_argument("--out", type=Path, default=None, help="folder of the JSON result (default benchmarks/results/)")
    p.add_argument("--readme", action="store_true", help="also append the table line to benchmarks/README.md")
    p.add_argument("--dry-run", action="store_true", help="CPU, interpret mode, one tiny shape, 1 iteration")
    a = p.parse_args(argv)
    import jax

    if a.dry_run:
        a.shapes, a.iters, a.dtype, a.block = "2x32x4x2x8", 1, "float32", 16
    elif jax.default_backend() != "gpu":
        p.error(f"the compiled kernel needs a CUDA GPU (JAX's backend is {jax.default_backend()}); --dry-run runs "
                "the code path interpreted on the CPU")
    device = jax.devices()[0].device_kind
    result = {"device": device, "jax": jax.__version__, "dtype": a.dtype, "rate": a.rate, "iters": a.iters,
              "block": a.block, "dry_run": a.dry_run,
              "shapes": {s: run_shape(s, a.rate, a.dtype, a.iters, a.block, a.dry_run) for s in a.shapes.split(",")}}
    tag = device.lower().replace("nvidia ", "").split()[0] if device else "unknown"
    _record.save_result(f"flash_dropout_{tag}", result, a.out)
    parts = [f"{s} rate {a.rate}: einsum {v[f'rate={a.rate}']['einsum']['ms']} ms, pallas_flash "
             f"{v[f'rate={a.rate}']['pallas_flash']['ms']} ms ({v[f'rate={a.rate}']['speedup']}x)"
             for s, v in result["shapes"].items()]
    _record.record_line(f"| {_record.run_id()[:10]} | flash_dropout | {device} | attention call alone, forward + "
                        f"backward, packed rows, {a.dtype}, einsum path vs pallas_flash | {'; '.join(parts)} | "
                        f"`python benchmarks/gpu/flash_dropout.py` |", append=a.readme)
    return result


if __name__ == "__main__":
    main()
