"""Each tool's train step as a throughput worker runs it, in a process of its own: jaxembed's jitted step and
sentence-transformers' step (MultipleNegativesRankingLoss, the HF Trainer's AdamW groups, clipping), on a fixed
synthetic batch (``worker_jaxembed`` / ``worker_st``: compile, warm up, time) or on batches of the plan at
natural lengths (``NaturalJaxembed`` / ``NaturalST``, served by ``serve_natural``); the analytic FLOPs of a step."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

from .models import synthetic_ids
from .proc import cpu_s, peak_rss_mib, rss_now_mib
from .recipe import ROOT, TEMPERATURE, natural_config, natural_steps, natural_store, natural_texts
from .st import st_step, trainer_adamw

K = 2  # candidates per query: the positive and one hard negative


def worker_jaxembed(folder: str, B: int, lq: int, ld: int, chunk: int, steps: int, warmup: int) -> dict:
    """jaxembed's train step on one synthetic batch (B queries of lq tokens, B * K documents of ld tokens, every token
    real; gradient cache sub-batch ``chunk``, 0 = none): compiled ahead of time, ``warmup`` steps, then ``steps``
    timed steps, one sync each. -> times, CPU seconds, memory (RSS; the device's peak on GPU), compile time."""
    import jax
    import numpy as np
    from flax import nnx

    from jaxembed import loading, parallel
    from jaxembed.runs import optim
    from jaxembed.config import default_config
    from jaxembed.data.pipeline import to_global
    from jaxembed.train import Run, init_state, make_train_step

    gpu = jax.default_backend() != "cpu"
    dtype = "bfloat16" if gpu else "float32"
    loaded = loading.load(folder, dtype=dtype, param_dtype="float32", max_length=max(lq, ld))
    c = default_config()
    c.model.name = folder
    c.model.dtype = dtype
    c.loss.temperature = TEMPERATURE
    c.plan.global_batch_size = B
    c.train.gradcache_chunk = chunk
    c.train.dropout = True
    if chunk and gpu:
        c.loss.tiled = True  # with the cache, the [B, N] logits are what is left: tile them as the README says
    graphdef, params, rest = nnx.split(loaded.model, nnx.Param, ...)
    tx, sched = optim.make_optimizer(nnx.to_pure_dict(params), lr=2e-5, total_steps=10_000, warmup_steps=0,
                                     weight_decay=c.optim.weight_decay, grad_clip=c.optim.grad_clip)
    mesh = parallel.make_mesh(-1, 1)
    # the trainer reads the loss of each dataset from a store and a plan: the snli store (one dataset, infonce)
    from jaxembed import config as cfglib
    from jaxembed.data.plan import build_plan
    from jaxembed.data.store import Store

    store = Store.open(natural_store("snli", 64, Path(os.environ.get("BENCH_CACHE", ROOT / "runs" / "bench_models"))))
    plan = build_plan(store, c.plan, data_config=cfglib.data_section(natural_config("snli", folder, B, 64, 10, False)))
    run = Run(c, Path("."), mesh, loaded, store, plan, graphdef, rest, tx, sched, K)
    state = init_state(run)
    step = make_train_step(run)
    vocab = loaded.hf_config["vocab_size"]
    n = B * K
    host = {
        "query_input_ids": synthetic_ids(B, lq, vocab, 1), "query_attention_mask": np.ones((B, lq), np.int32),
        "query_prompt_length": np.zeros(B, np.int32),
        "doc_input_ids": synthetic_ids(n, ld, vocab, 2), "doc_attention_mask": np.ones((n, ld), np.int32),
        "doc_prompt_length": np.zeros(n, np.int32), "doc_valid": np.ones(n, bool),
        "doc_hash": np.stack([np.arange(n, dtype=np.uint32) + 1, np.zeros(n, np.uint32)], 1),
        "query_hash": np.stack([np.arange(B, dtype=np.uint32) + 1, np.ones(B, np.uint32)], 1),
        "task_id": np.zeros(B, np.int32), "dataset_id": np.zeros(B, np.int32), "weight": np.ones(B, np.float32),
        "example_index": np.arange(B, dtype=np.int64), "temperature": np.array(np.nan, np.float32),
        "step": np.array(0, np.int64),
    }
    batch = to_global(host, parallel.batch_sharding(mesh))
    rss_loaded = peak_rss_mib()
    t0 = time.perf_counter()
    step = step.lower(state, batch).compile()  # ahead of time: the RSS high-water of compilation on its own
    compile_s, rss_compiled = time.perf_counter() - t0, peak_rss_mib()
    try:
        ma = step.memory_analysis()
        xla_mib = (ma.temp_size_in_bytes + ma.argument_size_in_bytes + ma.output_size_in_bytes) / 2**20
    except Exception:  # not every backend reports it
        xla_mib = None
    t0 = time.perf_counter()
    for _ in range(warmup):
        state, m = step(state, batch)
    jax.block_until_ready(m["loss"])
    warm_s = time.perf_counter() - t0
    times, cpu0 = [], cpu_s()
    for _ in range(steps):  # one sync per step: the step time is honest, the loop's dispatch overlap is small
        t0 = time.perf_counter()
        state, m = step(state, batch)
        jax.block_until_ready(m["loss"])
        times.append(time.perf_counter() - t0)
    cpu = cpu_s() - cpu0
    dev = jax.devices()[0]
    out = {"device": f"{dev.platform}:{dev.device_kind}", "times_s": times, "warmup_s": warm_s, "cpu_s": cpu,
           "loss": float(m["loss"]), "peak_rss_mib": peak_rss_mib(), "rss_after_load_mib": rss_loaded,
           "rss_after_compile_mib": rss_compiled, "compile_s": compile_s, "rss_end_mib": rss_now_mib(),
           "xla_step_buffers_mib": xla_mib, "precision": dtype, "dim": int(loaded.model.dim),
           "params": int(sum(x.size for x in jax.tree.leaves(nnx.to_pure_dict(params))))}
    if gpu:
        stats = dev.memory_stats() or {}
        out["device_peak_mib"] = stats.get("peak_bytes_in_use", 0) / 2**20
    return out


def worker_st(folder: str, B: int, lq: int, ld: int, chunk: int, steps: int, warmup: int) -> dict:
    """sentence-transformers' step on the same synthetic batch (CachedMultipleNegativesRankingLoss when ``chunk``),
    bfloat16 autocast on GPU: ``warmup`` steps, then ``steps`` timed steps. -> the figures worker_jaxembed gives."""
    import contextlib

    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import (CachedMultipleNegativesRankingLoss,
                                                                   MultipleNegativesRankingLoss)

    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    threads = int(os.environ.get("BENCH_THREADS", "0"))
    if threads and not gpu:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = SentenceTransformer(folder, device=device)
    model.max_seq_length = max(lq, ld)
    model.train()
    if chunk:
        loss_fn = CachedMultipleNegativesRankingLoss(model, scale=1.0 / TEMPERATURE, mini_batch_size=chunk)
    else:
        loss_fn = MultipleNegativesRankingLoss(model, scale=1.0 / TEMPERATURE)
    vocab = model[0].auto_model.config.vocab_size
    import inspect

    with_tt = "token_type_ids" in inspect.signature(model[0].auto_model.forward).parameters

    def feats(ids):
        t = torch.as_tensor(ids, dtype=torch.long, device=device)
        f = {"input_ids": t, "attention_mask": torch.ones_like(t)}
        if with_tt:
            f["token_type_ids"] = torch.zeros_like(t)
        return f

    q = synthetic_ids(B, lq, vocab, 1)
    d = synthetic_ids(B * K, ld, vocab, 2)
    features = [feats(q), feats(d[0::K]), feats(d[1::K])]  # anchor, positive, negative
    opt = trainer_adamw(model, lr=2e-5, weight_decay=0.01)
    amp = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if gpu else contextlib.nullcontext
    sync = torch.cuda.synchronize if gpu else (lambda: None)

    def one_step():
        return st_step(model, loss_fn, opt, features, amp)

    rss_loaded = peak_rss_mib()
    t0 = time.perf_counter()
    for _ in range(warmup):
        loss = one_step()
    sync()
    warm_s = time.perf_counter() - t0
    times, cpu0 = [], cpu_s()
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = one_step()
        sync()
        times.append(time.perf_counter() - t0)
    cpu = cpu_s() - cpu0
    out = {"device": f"cuda:{torch.cuda.get_device_name()}" if gpu else "cpu:cpu", "times_s": times,
           "warmup_s": warm_s, "cpu_s": cpu, "loss": float(loss.detach()), "peak_rss_mib": peak_rss_mib(),
           "rss_after_load_mib": rss_loaded, "rss_end_mib": rss_now_mib(),
           "precision": "bfloat16 autocast" if gpu else "float32",
           "torch_threads": torch.get_num_threads(), "params": int(sum(p.numel() for p in model.parameters()))}
    if gpu:
        out["device_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return out


class NaturalJaxembed:
    """jaxembed's trainer as ``jaxembed train`` runs it (setup, the step table, pow2 length buckets, the loader's
    packed or padded batches, the jitted step) on ``steps`` batches of the plan (``natural_steps``: the first
    ones, or spread over the plan)."""

    def __init__(self, folder: str, data: str, B: int, max_len: int, plan_steps: int, steps: int, packing: bool,
                 store: str, pick: str = "first"):
        import tempfile

        from jaxembed import parallel
        from jaxembed.data.pipeline import batch_stats, make_loader, to_global
        from jaxembed.train import init_state, make_train_step, setup, step_table

        c = natural_config(data, folder, B, max_len, plan_steps, packing, store)
        run = setup(c, tempfile.mkdtemp(prefix="bench_natural_"))
        # the plan's length table, kept beside the store (keyed by plan, tokenizer and packing: a stale file is
        # recomputed), so that a restarted worker (--natural-resident 1) does not tokenize the plan again
        name = f"lengths_{Path(folder).name}_{B}_{plan_steps}_{'packed' if packing else 'padded'}.npz"
        table = step_table(run, Path(store).parent / name, "pow2")  # as length_buckets="pow2"
        loader = make_loader(run.store, run.plan, run.loaded.tokenizer, num_candidates=run.K, packing=run.packing,
                             step_table=table)
        ids = natural_steps(plan_steps, steps, pick)
        host = [loader.batch(s) for s in ids]
        self.stats = [batch_stats(b, loader.batcher.shards if run.packing is not None else 1) for b in host]
        self.shapes = sorted({tuple(loader.batcher.shape(s)) for s in ids})
        self.run_shapes = loader.shapes.get("packed_shapes")
        self.batches = [to_global(b, parallel.batch_sharding(run.mesh)) for b in host]
        self.packing, self.run = bool(packing), run
        self.layout = ("one pack" if run.packing.combined else "two packs") if run.packing is not None else "padded"
        self.state = init_state(run)
        self.step = make_train_step(run)
        self.rss_loaded = peak_rss_mib()
        self.loss = float("nan")

    def one(self, b) -> None:
        import jax

        self.state, m = self.step(self.state, b)
        self.loss = float(jax.block_until_ready(m["loss"]))

    def info(self) -> dict:
        import jax

        real = sum(x["tokens"] for x in self.stats)
        slots = sum(x["padded_tokens"] for x in self.stats)
        cache = getattr(self.step, "_cache_size", None)
        dev = jax.devices()[0]
        return {"device": f"{dev.platform}:{dev.device_kind}", "real_tokens": real, "token_slots": slots,
                "real_fraction": real / slots, "shapes": [list(x) for x in self.shapes],
                "run_shapes": [list(x) for x in self.run_shapes] if self.run_shapes else None,
                "compiled_programs": cache() if callable(cache) else None, "packing": self.packing,
                "layout": self.layout, "loss": self.loss, "rss_after_load_mib": self.rss_loaded}


class NaturalST:
    """sentence-transformers on the same texts: (anchor, positive, negative_1, ...) columns, each tokenized with
    its own dynamic padding (ST's collator: the longest text of the column in the batch), stock
    MultipleNegativesRankingLoss at scale 20, AdamW with the Trainer's weight-decay groups, clipping 1.0."""

    def __init__(self, folder: str, data: str, B: int, max_len: int, plan_steps: int, steps: int, store: str,
                 pick: str = "first"):
        import torch
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

        c = natural_config(data, folder, B, max_len, plan_steps, True, store)
        cols = natural_texts(c, natural_steps(plan_steps, steps, pick))
        threads = int(os.environ.get("BENCH_THREADS", "0"))
        if threads:
            torch.set_num_threads(threads)
        torch.manual_seed(0)
        model = SentenceTransformer(folder, device="cpu")
        model.max_seq_length = max_len
        model.train()
        self.loss_fn = MultipleNegativesRankingLoss(model, scale=1.0 / TEMPERATURE)
        self.batches, self.real, self.slots = [], 0, 0
        for step_cols in cols:
            f = []
            for texts in step_cols.values():
                t = model.tokenize(texts)
                self.real += int(t["attention_mask"].sum())
                self.slots += int(t["attention_mask"].numel())
                f.append(t)
            self.batches.append(f)
        self.opt = trainer_adamw(model, lr=2e-5, weight_decay=0.01)
        self.model = model
        self.rss_loaded = peak_rss_mib()
        self.loss = float("nan")

    def one(self, f) -> None:
        self.loss = float(st_step(self.model, self.loss_fn, self.opt, f, contextlib.nullcontext).detach())

    def info(self) -> dict:
        import torch

        return {"device": "cpu:cpu", "real_tokens": self.real, "token_slots": self.slots,
                "real_fraction": self.real / self.slots, "loss": self.loss, "rss_after_load_mib": self.rss_loaded,
                "torch_threads": torch.get_num_threads()}


def serve_natural(spec: str) -> None:
    """Worker process of the natural section: build the tool's trainer and its batches, run each batch once
    (compilation, allocator), answer READY; then on each ``run`` line run every batch once more (``run I``: batch I
    only), timed (wall and this process's CPU seconds), and answer TIMES; on ``end`` answer RESULT (memory, token
    counts) and exit."""
    tool, folder, data, B, max_len, plan_steps, steps, store, pick = json.loads(spec)
    if tool == "st":
        w = NaturalST(folder, data, B, max_len, plan_steps, steps, store, pick)
    else:
        w = NaturalJaxembed(folder, data, B, max_len, plan_steps, steps, tool == "jaxembed-packed", store, pick)
    t0 = time.perf_counter()
    for b in w.batches:
        w.one(b)
    ready = {"warmup_s": time.perf_counter() - t0, "peak_rss_mib": peak_rss_mib(), "rss_mib": rss_now_mib()}
    print("READY " + json.dumps(ready), flush=True)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "run":
            times, cpu0 = [], cpu_s()
            for b in ([w.batches[int(arg)]] if arg else w.batches):
                t0 = time.perf_counter()
                w.one(b)
                times.append(time.perf_counter() - t0)
            print("TIMES " + json.dumps({"times_s": times, "cpu_s": cpu_s() - cpu0}), flush=True)
        elif cmd == "end":
            print("RESULT " + json.dumps({**w.info(), **ready, "peak_rss_mib": peak_rss_mib(),
                                          "rss_end_mib": rss_now_mib()}), flush=True)
            return


def peak_flops(device: str) -> float | None:
    from jaxembed.flops import PEAK_FLOPS

    for name, v in PEAK_FLOPS.items():
        if name.lower() in device.lower():
            return v
    return None


def step_flops(folder: Path, B: int, lq: int, ld: int, cached: bool) -> float:
    """Analytic FLOPs of one step (jaxembed.flops.train_step_flops) from the folder's config.json."""
    from jaxembed import models
    from jaxembed.flops import train_step_flops
    from jaxembed.loading import read_sentence_transformers

    st = read_sentence_transformers(folder)
    cfg = models.config_from_hf(json.loads((st.transformer_dir / "config.json").read_text()))
    return train_step_flops(cfg, B, lq, B * K, ld, cfg.hidden_size, cached)
