"""LoRA vs full fine-tuning on Qwen2-0.5B (CPU): parameters trained, optimizer-state bytes, and the memory of a few
train steps of jaxembed's trainer.

The model: Qwen2-0.5B's real config (24 x 896, GQA 14/2, vocab 151,936, 494M parameters) with random weights
(jaxembed's own initialisation, seed 0; no hub access: the config is the dict below), written once as a model folder
under --cache with the tiny Qwen2-layout tokenizer (jaxembed.models.tiny; the benchmark feeds token ids). Each mode
runs in a fresh subprocess through the trainer's own pieces (jaxembed.train: setup -> init_state ->
make_train_step), so one mode's memory never counts against the other's:

- full: every parameter trained, AdamW (float32 master weights and moments);
- lora: ``model.lora`` (rank --rank, alpha 2 x rank, the default targets: q/k/v/o and gate/up/down of every layer),
  the base frozen (jaxembed.lora).

One synthetic padded batch: --batch queries x (positive + hard negative), --q-len / --d-len tokens, every token
real; --warmup steps (compilation), then --steps timed steps. Float32 compute (CPU).

Figures per mode: trainable and frozen parameter counts; the optimizer state's bytes and the whole train state's
(the checkpoint's content); XLA's memory analysis of the compiled step (arguments + outputs + temporaries, the
device-memory figure); the process's resident memory after loading the model, and the peak resident memory of the
training phase (init_state, compilation, steps; the high-water mark reset after loading through
/proc/self/clear_refs, so the loader's transient copy of the weights is not in it; if the reset is not allowed the
whole-process peak is reported and says so); step times. The machine is shared: memory figures are robust to its
load, times are not (the load average is recorded with the result).

    python benchmarks/lora_memory.py [--batch 4] [--q-len 32] [--d-len 64] [--rank 16] [--steps 3] [--warmup 1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from _record import record_line, save_result  # noqa: E402

#: Qwen2-0.5B's config.json fields (Hugging Face Qwen/Qwen2-0.5B)
QWEN2_05B = dict(model_type="qwen2", vocab_size=151936, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, intermediate_size=4864, max_position_embeddings=32768, rope_theta=1e6,
                 rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=True, attention_dropout=0.0,
                 use_sliding_window=False, sliding_window=None, max_window_layers=24)


def model_folder(cache: Path) -> Path:
    """The random Qwen2-0.5B folder (written once, in a subprocess of its own)."""
    out = cache / "qwen2-0.5b-random"
    if (out / "model.safetensors").is_file():
        return out
    code = ("import sys, json; from pathlib import Path; sys.path.insert(0, %r); import lora_memory as b; "
            "b._write_folder(Path(%r))") % (str(HERE), str(out))
    subprocess.run([sys.executable, "-c", code], check=True)
    return out


def _write_folder(out: Path) -> None:
    from jaxembed import export, models
    from jaxembed.models.embedding import EmbeddingModel, HeadConfig
    from jaxembed.models.tiny import tiny_model_dir
    from jaxembed.tokenizer import Tokenizer

    config = models.config_from_hf(QWEN2_05B, where="Qwen2-0.5B config")
    model = EmbeddingModel.init(config, HeadConfig("mean"), seed=0)
    tokenizer = Tokenizer.from_folder(tiny_model_dir("qwen2"), 512)
    export.export(model, tokenizer, out, hf_config=dict(QWEN2_05B),
                  model_card="# Qwen2-0.5B config, random weights (benchmarks/lora_memory.py)\n")


# ------------------------------------------------------------------------------------------------- worker


def _status_kib(field: str) -> int:
    for line in open("/proc/self/status", encoding="utf-8"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # Linux >= 4.0: reset the resident-memory high-water mark (VmHWM)
        return True
    except OSError:
        return False


def _data(out: Path) -> Path:
    """The first 64 rows of the shared STS-B and WikiQA training files (the store the run's config needs)."""
    from jaxembed import paths

    src = paths.shared_data_dir() / "train"
    for name, f in (("stsb", "stsb_pairs"), ("wikiqa", "wikiqa")):
        lines = (src / f"{f}.jsonl").read_text(encoding="utf-8").splitlines(True)[:64]
        (out / f"{name}.jsonl").write_text("".join(lines), encoding="utf-8")
    return out


def worker(mode: str, folder: str, workdir: str, B: int, lq: int, ld: int, rank: int, steps: int,
           warmup: int) -> dict:
    import jax
    import numpy as np
    from flax import nnx

    from jaxembed import config as cfglib
    from jaxembed import lora, parallel
    from jaxembed.data.config import dataset_config
    from jaxembed.data.pipeline import make_loader, to_global
    from jaxembed.train import init_state, make_train_step, setup

    wd = Path(workdir)
    data = _data(Path(wd.parent))
    c = cfglib.default_config()
    c.model.name = folder
    c.model.max_length = max(lq, ld)
    c.data.packing = False  # fixed [B, L] shapes: one compilation, the same tokens in both modes
    c.data.datasets = [
        dataset_config(name="stsb", path=str(data / "stsb.jsonl"), format="scored_pairs", task_type="sts",
                       score_threshold=3.0, num_negatives=0, max_query_length=lq, max_doc_length=ld),
        dataset_config(name="wikiqa", path=str(data / "wikiqa.jsonl"), task_type="retrieval", num_negatives=1,
                       max_query_length=lq, max_doc_length=ld)]
    c.plan.global_batch_size = B
    c.plan.steps = 10
    c.loss.temperature = 0.05
    c.train.dropout = False
    c.optim.lr = 2e-4
    if mode == "lora":
        c.model.lora.enabled = True
        c.model.lora.rank = rank
        c.model.lora.alpha = 2.0 * rank
    t0 = time.perf_counter()
    run = setup(c, wd)
    load_s = time.perf_counter() - t0
    import gc

    gc.collect()
    rss_loaded = _status_kib("VmRSS") / 1024
    peak_loading = _status_kib("VmHWM") / 1024
    reset = _reset_peak()

    state = init_state(run)
    trainable = int(sum(x.size for x in jax.tree.leaves(state["params"])))
    if run.lora is not None:
        frozen = int(sum(int(np.prod(v.shape)) for _, v in nnx.to_flat_state(nnx.split(run.loaded.model,
                                                                                          lora.TRAINABLE, nnx.Param)[2])))
    else:
        frozen = 0
    opt_bytes = int(sum(x.nbytes for x in jax.tree.leaves(state["opt_state"])))
    state_bytes = int(sum(x.nbytes for x in jax.tree.leaves(state)))
    rss_state = _status_kib("VmRSS") / 1024

    # the loader's first batch with every row's tokens replaced by random ids over the full --q-len / --d-len (every
    # token real, distinct rows): both modes compute exactly the same tokens
    host = dict(make_loader(run.store, run.plan, run.loaded.tokenizer, num_candidates=run.K).batch(0))
    rng = np.random.default_rng(0)
    for side, L in (("query", lq), ("doc", ld)):
        rows = host[f"{side}_input_ids"].shape[0]
        host[f"{side}_input_ids"] = rng.integers(100, 16000, size=(rows, L), dtype=np.int32)
        host[f"{side}_attention_mask"] = np.ones((rows, L), np.int32)
        host[f"{side}_prompt_length"] = np.zeros(rows, np.int32)
    shapes = {k: list(v.shape) for k, v in host.items() if k.endswith("input_ids")}
    batch = to_global(host, parallel.batch_sharding(run.mesh))
    step = make_train_step(run)
    fn, kw = getattr(step, "func", step), dict(getattr(step, "keywords", {}))
    t0 = time.perf_counter()
    compiled = fn.lower(state, batch, **kw).compile()
    compile_s = time.perf_counter() - t0
    try:
        ma = compiled.memory_analysis()
        xla = {"arguments_mib": ma.argument_size_in_bytes / 2**20, "outputs_mib": ma.output_size_in_bytes / 2**20,
               "temporaries_mib": ma.temp_size_in_bytes / 2**20,
               "aliased_mib": getattr(ma, "alias_size_in_bytes", 0) / 2**20}
    except Exception:  # not every backend reports it
        xla = None
    losses = []
    for _ in range(warmup):
        state, m = compiled(state, batch, **kw)
        losses.append(float(m["loss"]))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        state, m = compiled(state, batch, **kw)
        jax.block_until_ready(m["loss"])
        times.append(time.perf_counter() - t0)
    return {"mode": mode, "batch_shapes": shapes, "trainable_params": trainable, "frozen_params": frozen, "optimizer_state_bytes": opt_bytes,
            "train_state_bytes": state_bytes, "xla_step": xla, "load_s": load_s, "compile_s": compile_s,
            "step_times_s": times, "losses": losses + [float(m["loss"])], "rss_after_load_mib": rss_loaded,
            "peak_rss_loading_mib": peak_loading, "rss_after_init_state_mib": rss_state,
            "peak_rss_training_mib": _status_kib("VmHWM") / 1024, "peak_reset_after_loading": reset,
            "peak_rss_process_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "rss_end_mib": _status_kib("VmRSS") / 1024}


# --------------------------------------------------------------------------------------------------- main


def _run_worker(mode: str, folder: Path, args, tmp: Path) -> dict:
    out = tmp / f"{mode}.json"
    code = ("import sys, json; sys.path.insert(0, %r); import lora_memory as b; "
            "r = b.worker(%r, %r, %r, %d, %d, %d, %d, %d, %d); open(%r, 'w').write(json.dumps(r))") % (
        str(HERE), mode, str(folder), str(tmp / mode / "run"), args.batch, args.q_len, args.d_len, args.rank,
        args.steps, args.warmup, str(out))
    (tmp / mode).mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    return json.loads(out.read_text())


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--q-len", type=int, default=32)
    p.add_argument("--d-len", type=int, default=64)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--cache", type=Path, default=Path(os.environ.get("JAXEMBED_CACHE") or "~/.cache/jaxembed")
                   .expanduser() / "bench")
    p.add_argument("--no-readme", action="store_true", help="do not append the line to benchmarks/README.md")
    args = p.parse_args(argv)
    import shutil
    import tempfile

    folder = model_folder(args.cache)
    tmp = Path(tempfile.mkdtemp(prefix="lora_memory_"))
    try:
        res = {m: _run_worker(m, folder, args, tmp) for m in ("full", "lora")}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    full, lo = res["full"], res["lora"]
    gib = lambda b: b / 2**30  # noqa: E731
    ratio = lambda a, b: a / b if b else float("nan")  # noqa: E731
    summary = {
        "trainable_params": {"full": full["trainable_params"], "lora": lo["trainable_params"],
                             "lora_share_of_base": ratio(lo["trainable_params"], lo["frozen_params"])},
        "optimizer_state_gib": {"full": gib(full["optimizer_state_bytes"]), "lora": gib(lo["optimizer_state_bytes"]),
                                "saving_x": ratio(full["optimizer_state_bytes"], lo["optimizer_state_bytes"])},
        "train_state_gib": {"full": gib(full["train_state_bytes"]), "lora": gib(lo["train_state_bytes"])},
        "peak_rss_training_gib": {"full": full["peak_rss_training_mib"] / 1024,
                                  "lora": lo["peak_rss_training_mib"] / 1024,
                                  "saving_gib": (full["peak_rss_training_mib"] - lo["peak_rss_training_mib"]) / 1024},
        "rss_after_load_gib": {"full": full["rss_after_load_mib"] / 1024, "lora": lo["rss_after_load_mib"] / 1024},
        "median_step_s": {m: sorted(r["step_times_s"])[len(r["step_times_s"]) // 2] for m, r in res.items()},
    }
    if full["xla_step"] and lo["xla_step"]:
        tot = lambda x: x["arguments_mib"] + x["outputs_mib"] + x["temporaries_mib"] - x["aliased_mib"]  # noqa
        summary["xla_step_gib"] = {"full": tot(full["xla_step"]) / 1024, "lora": tot(lo["xla_step"]) / 1024}
    result = {"benchmark": "lora_memory", "device": "cpu", "model": "Qwen2-0.5B config, random weights",
              "settings": vars(args) | {"cache": str(args.cache)}, "summary": summary, "runs": res}
    path = save_result("lora_memory_cpu", result)
    print(json.dumps(summary, indent=2))
    s = summary
    line = (f"| {time.strftime('%Y-%m-%d')} | lora_memory | cpu ({os.cpu_count()} cores) | Qwen2-0.5B config, random "
            f"weights, B={args.batch} x (pos + neg), q {args.q_len} / d {args.d_len} tokens, float32, LoRA rank "
            f"{args.rank} on q/k/v/o + MLP, load average {os.getloadavg()[0]:.1f} | trained parameters "
            f"{s['trainable_params']['full'] / 1e6:.0f}M -> {s['trainable_params']['lora'] / 1e6:.2f}M; optimizer "
            f"state {s['optimizer_state_gib']['full']:.2f} -> {s['optimizer_state_gib']['lora']:.3f} GiB "
            f"(**{s['optimizer_state_gib']['saving_x']:.0f}x**); peak RSS of the training phase "
            f"{s['peak_rss_training_gib']['full']:.2f} -> {s['peak_rss_training_gib']['lora']:.2f} GiB "
            f"(**-{s['peak_rss_training_gib']['saving_gib']:.2f} GiB**)"
            + (f"; XLA step buffers {s['xla_step_gib']['full']:.2f} -> {s['xla_step_gib']['lora']:.2f} GiB"
               if "xla_step_gib" in s else "")
            + f"; step {s['median_step_s']['full']:.1f} -> {s['median_step_s']['lora']:.1f} s (shared machine) | "
            f"`python benchmarks/lora_memory.py --batch {args.batch} --q-len {args.q_len} --d-len {args.d_len} "
            f"--rank {args.rank} --steps {args.steps}` |")
    record_line(line, append=not args.no_readme)
    print(path)


if __name__ == "__main__":
    main()
