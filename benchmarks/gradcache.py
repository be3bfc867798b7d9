"""Gradient cache: peak memory of a train step (loss + parameter gradients) vs global batch size, with and without
the cache, and the step-time overhead where both fit.

Model: a MiniLM-L6-sized BERT (6 layers, hidden 384, random weights), queries of 32 tokens, 1 positive + 1 hard
negative of 64 tokens each, InfoNCE over the whole batch. Memory is XLA's buffer assignment for the compiled step
(temp + arguments + outputs); it is the same on any backend for the same program. Writes
benchmarks/results/gradcache_<platform>.json and appends a line to benchmarks/README.md.

    python benchmarks/gradcache.py [--batches 32,64,128,256,512,1024] [--chunk 32] [--time-batch 64]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time

from _record import record_line, save_result  # noqa: E402  (benchmarks/ is on sys.path)



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="32,64,128,256,512,1024")
    ap.add_argument("--chunk", type=int, default=32, help="gradient-cache sub-batch (rows)")
    ap.add_argument("--time-batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-readme", action="store_true")
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxembed import models
    from jaxembed.train import gradcache
    from jaxembed.losses import contrastive_loss, layout_pos_index
    from jaxembed.models.embedding import EmbeddingModel, HeadConfig

    cfg = models.config_from_hf(dict(model_type="bert", vocab_size=30522, hidden_size=384, num_hidden_layers=6,
                                     num_attention_heads=12, intermediate_size=1536, max_position_embeddings=512,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    graphdef, state = nnx.split(EmbeddingModel.init(cfg, HeadConfig("mean")))
    lq, ld, k = 32, 64, 2

    def step_fn(chunk):
        def encode(st, x, key):
            return nnx.merge(graphdef, st)(x["ids"], x["mask"])

        def loss(st, q, d):
            eq = gradcache.encode_chunked(encode, st, {"ids": q, "mask": jnp.ones_like(q)}, chunk)
            ed = gradcache.encode_chunked(encode, st, {"ids": d, "mask": jnp.ones_like(d)}, chunk)
            return contrastive_loss(eq, ed, layout_pos_index(q.shape[0], k), temperature=0.05)[0]

        return jax.jit(jax.value_and_grad(loss))

    def inputs(b):
        kq, kd = jax.random.split(jax.random.key(b))
        return (jax.random.randint(kq, (b, lq), 1, 30522, jnp.int32),
                jax.random.randint(kd, (b * k, ld), 1, 30522, jnp.int32))

    rows = []
    for b in [int(x) for x in args.batches.split(",")]:
        row = {"queries": b, "candidates": b * k}
        for name, chunk in (("no_cache", None), ("cache", args.chunk)):
            q, d = inputs(b)
            ma = step_fn(chunk).lower(state, q, d).compile().memory_analysis()
            row[f"{name}_bytes"] = int(ma.temp_size_in_bytes + ma.argument_size_in_bytes + ma.output_size_in_bytes)
        rows.append(row)
        print(f"B={b:>5}: no cache {row['no_cache_bytes'] / 2**20:8.1f} MiB, cache {row['cache_bytes'] / 2**20:8.1f} MiB",
              flush=True)

    timing = {}
    q, d = inputs(args.time_batch)
    for name, chunk in (("no_cache", None), ("cache", args.chunk)):
        f = step_fn(chunk)
        jax.block_until_ready(f(state, q, d))
        ts = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(f(state, q, d))
            ts.append(time.perf_counter() - t0)
        timing[name] = ts
    overhead = statistics.median(timing["cache"]) / statistics.median(timing["no_cache"])
    dev = jax.devices()[0]
    out = {"benchmark": "gradcache", "date": datetime.date.today().isoformat(),
           "device": f"{dev.platform}:{dev.device_kind}", "cpu_count": os.cpu_count(),
           "model": "BERT 6x384 (MiniLM-L6 size), random weights", "query_len": lq, "doc_len": ld,
           "candidates_per_query": k, "chunk": args.chunk, "memory": rows, "time_batch": args.time_batch,
           "times_s": timing, "overhead_cache_over_no_cache": overhead,
           "command": f"python benchmarks/gradcache.py --batches {args.batches} --chunk {args.chunk} "
                      f"--time-batch {args.time_batch}"}
    save_result(f"gradcache_{dev.platform}", out)
    first, last = rows[0], rows[-1]
    line = (f"| {out['date']} | gradcache | {out['device']} ({out['cpu_count']} cores) | train step, BERT 6x384, "
            f"q {lq} / d {ld} tokens, 1 pos + 1 neg, sub-batch {args.chunk} | peak memory B={first['queries']} -> "
            f"B={last['queries']}: no cache {first['no_cache_bytes'] / 2**20:.0f} -> {last['no_cache_bytes'] / 2**20:.0f}"
            f" MiB, cache {first['cache_bytes'] / 2**20:.0f} -> {last['cache_bytes'] / 2**20:.0f} MiB; step time "
            f"overhead at B={args.time_batch}: **{overhead:.2f}x** | `{out['command']}` |")
    record_line(line, append=not args.no_readme)


if __name__ == "__main__":
    main()
