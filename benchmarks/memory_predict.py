"""The largest global batch a device of a given size holds for a model's train step, predicted on the CPU from XLA's
memory analysis of the trainer's real step compiled ahead of time with abstract shapes (no weights are made or
downloaded; jaxembed/train/memory.py says how, and what the figure leaves out).

A model is a preset (the config.json fields of qwen2-0.5b, qwen2-1.5b, qwen2-7b, mistral-7b, from their Hugging
Face configs) or the path of a config.json (or of a model folder holding one). The batch: --batch-step-aligned
global batches of queries of --query-length tokens, each with a positive and --negatives hard negatives of --seq
tokens, padded rows (every token real: the worst case of packed rows of that length). A device holds the step
when its peak (arguments + outputs - donated + temporaries) is at most --fraction of --device-gb GiB (0.9: the
launch scripts' XLA_PYTHON_CLIENT_MEM_FRACTION).

    python benchmarks/memory_predict.py --model qwen2-1.5b --seq 512 --device-gb 80 [--remat] [--gradcache-chunk 32]
        [--lora-rank 16 --base-dtype bfloat16] [--dtype bfloat16] [--depths 2,3]
    python benchmarks/memory_predict.py --matrix   # the committed record: the settings of MATRIX below

--depths D1,D2 compiles the model cut to D1 and D2 layers and extrapolates along the depth (much faster; the
whole model's own figure within 0.02 % where it was checked); without it the whole model is compiled for every
probe (minutes each for a 7B model on a CPU). Writes benchmarks/results/memory_predict_<date>_<time>.json and a
line in benchmarks/README.md (--no-readme: not).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _record import record_line, save_result  # noqa: E402

_QWEN2 = dict(model_type="qwen2", max_position_embeddings=131072, rope_theta=1e6, rms_norm_eps=1e-6, hidden_act="silu",
              attention_dropout=0.0, use_sliding_window=False)
#: config.json fields of the presets (Hugging Face Qwen/Qwen2-0.5B, Qwen/Qwen2-1.5B, Qwen/Qwen2-7B,
#: mistralai/Mistral-7B-v0.1)
PRESETS = {
    "qwen2-0.5b": dict(_QWEN2, vocab_size=151936, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2, intermediate_size=4864, tie_word_embeddings=True),
    "qwen2-1.5b": dict(_QWEN2, vocab_size=151936, hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                       num_key_value_heads=2, intermediate_size=8960, tie_word_embeddings=True),
    "qwen2-7b": dict(_QWEN2, vocab_size=152064, hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                     num_key_value_heads=4, intermediate_size=18944, tie_word_embeddings=False),
    "mistral-7b": dict(model_type="mistral", vocab_size=32000, hidden_size=4096, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
                       max_position_embeddings=32768, rope_theta=10000.0, rms_norm_eps=1e-5, hidden_act="silu",
                       sliding_window=None, tie_word_embeddings=False, attention_dropout=0.0),
}

#: the committed record: (model, LoRA rank) x document length x (plain | remat + a gradient cache of `chunk`
#: queries per sub-batch); `start`: the first batch probed (near the answer: fewer compilations)
MATRIX = [dict(model=m, rank=r, seq=s, remat=v, chunk=c if v else 0, start=(b if not v else 64 * c))
          for m, r, c, starts in (("qwen2-1.5b", 0, 4, (6, 3)), ("qwen2-7b", 16, 2, (2, 1)))
          for s, b in zip((512, 1024), starts) for v in (False, True)]


def model_config(name: str) -> dict:
    """A preset's config.json fields, or a config.json file / a folder with one (a sentence-transformers folder:
    its transformer's)."""
    if name in PRESETS:
        return dict(PRESETS[name])
    p = Path(name).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        sys.exit(f"error: --model {name!r}: neither a preset ({', '.join(PRESETS)}) nor a config.json or a folder "
                 "holding one")
    return json.loads(p.read_text(encoding="utf-8"))


def predict(hf: dict, settings, *, seq: int, query_length: int, device_gib: float, fraction: float, step: int,
            depths, max_probes: int, start: int) -> dict:
    """One search: its settings, the largest batch, each probe."""
    from jaxembed.train import memory

    budget = int(device_gib * fraction * 2**30)
    t0 = time.perf_counter()
    probe = memory.prober(hf, settings, query_length, seq, depths)
    say = lambda s: print(f"  {s}", flush=True)  # noqa: E731
    batch, probes = memory.largest_batch(probe, budget, step=step, start=start, max_probes=max_probes, log=say)
    fits = [p for p in probes if p.peak <= budget]
    overs = [p for p in probes if p.peak > budget]
    lo, hi = probes[0], probes[-1]
    per_query = (hi.peak - lo.peak) / (hi.batch - lo.batch) if hi.batch != lo.batch else None
    fit = {"fixed_gib": (lo.peak - per_query * lo.batch) / 2**30, "per_query_mib": per_query / 2**20} \
        if per_query is not None else None
    return {"settings": dataclasses.asdict(settings), "describe": settings.describe(), "seq": seq,
            "query_length": query_length, "budget_gib": budget / 2**30, "step": step, "largest_batch": batch,
            "converged": bool(overs and (not fits or min(p.batch for p in overs) - batch <= step)),
            "peak_gib_at_largest": max((p.peak for p in fits), default=0) / 2**30,
            "affine_fit": fit, "probes": [p.as_dict() for p in probes], "seconds": round(time.perf_counter() - t0, 1)}


def main(argv=None) -> None:
    from jaxembed.train.memory import MemorySettings

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2-1.5b", help=f"a preset ({', '.join(PRESETS)}) or a config.json path")
    p.add_argument("--seq", default="512", help="document length(s) in tokens, e.g. 512,1024")
    p.add_argument("--query-length", type=int, default=128)
    p.add_argument("--negatives", type=int, default=1, help="hard negatives per query")
    p.add_argument("--device-gb", type=float, default=80.0, help="device memory in GiB")
    p.add_argument("--fraction", type=float, default=0.9, help="the share of it XLA may use")
    p.add_argument("--dtype", default="bfloat16", help="compute dtype (model.dtype)")
    p.add_argument("--remat", nargs="?", const=True, default=False,
                   help="model.remat=True, optionally with a model.remat_policy: nothing | dots | dots_no_batch")
    p.add_argument("--gradcache-chunk", type=int, default=0, help="train.gradcache_chunk (0 = off)")
    p.add_argument("--lora-rank", type=int, default=0, help="0 = full fine-tuning")
    p.add_argument("--base-dtype", default="bfloat16", help="model.lora.base_dtype")
    p.add_argument("--batch-step", type=int, default=8, help="global batches searched are multiples of this")
    p.add_argument("--start", type=int, default=16, help="the first batch probed")
    p.add_argument("--depths", default="", help="D1,D2: extrapolate from the model cut to D1 and D2 layers")
    p.add_argument("--max-probes", type=int, default=6)
    p.add_argument("--matrix", action="store_true", help="the committed record's searches (MATRIX)")
    p.add_argument("--cases", default="", help="with --matrix: these entries only, e.g. 0,1 (0-based)")
    p.add_argument("--no-readme", action="store_true")
    args = p.parse_args(argv)
    depths = tuple(int(x) for x in args.depths.split(",")) if args.depths else None
    if args.matrix:
        cases = [(c["model"], MemorySettings(dtype=args.dtype, remat=c["remat"], gradcache_chunk=c["chunk"],
                                             lora_rank=c["rank"], base_dtype=args.base_dtype,
                                             negatives=args.negatives), c["seq"], c["start"]) for c in MATRIX]
        if args.cases:
            cases = [cases[int(i)] for i in args.cases.split(",")]
    else:
        st = MemorySettings(dtype=args.dtype, remat=args.remat, gradcache_chunk=args.gradcache_chunk,
                            lora_rank=args.lora_rank, base_dtype=args.base_dtype, negatives=args.negatives)
        cases = [(args.model, st, int(s), args.start) for s in args.seq.split(",")]
    import jax

    results = []
    result = {"benchmark": "memory_predict", "device": "cpu (XLA's CPU compiler; a prediction for the device)",
              "jax": jax.__version__, "settings": vars(args), "depths": depths, "results": results}
    path = None
    for name, st, seq, start in cases:
        step = max(args.batch_step, st.gradcache_chunk) if st.gradcache_chunk else args.batch_step
        if st.gradcache_chunk and step % st.gradcache_chunk:
            sys.exit(f"error: --batch-step {args.batch_step} is not a multiple of --gradcache-chunk "
                     f"{st.gradcache_chunk}")
        print(f"{name}, {seq}-token documents, {st.describe()}:", flush=True)
        r = predict(model_config(name), st, seq=seq, query_length=args.query_length, device_gib=args.device_gb,
                    fraction=args.fraction, step=step, depths=depths, max_probes=args.max_probes,
                    start=max(step, start // step * step))
        r["model"] = name
        results.append(r)
        print(f"  -> largest global batch {r['largest_batch']} ({r['peak_gib_at_largest']:.1f} GiB of "
              f"{r['budget_gib']:.1f}){'' if r['converged'] else ' (search not converged: see the probes)'}",
              flush=True)
        if path is None:  # the record is written after each search (a long matrix keeps what it has done)
            path = save_result("memory_predict", result)
        else:
            path.write_text(json.dumps({**json.loads(path.read_text()), "results": results}, indent=2) + "\n")
    summary = "; ".join(f"{r['model']} {r['seq']} tok, {r['describe']}: **{r['largest_batch']}**"
                        f"{'' if r['converged'] else ' (not converged)'}" for r in results)
    print(summary)
    cmd = "python benchmarks/memory_predict.py " + " ".join(argv if argv is not None else sys.argv[1:])
    setting = (f"{args.dtype} compute; the largest global batch (queries of {args.query_length} tokens, each with a "
               f"positive and {args.negatives} hard negative(s) of the document length, padded rows) whose step needs "
               f"<= {args.fraction:g} x {args.device_gb:g} GiB, from XLA's CPU buffer assignment"
               + (f", extrapolated from {depths[0]} and {depths[1]} layers" if depths else "")
               + "; a prediction to check on the device")
    record_line(f"| {time.strftime('%Y-%m-%d')} | memory_predict | cpu ({os.cpu_count()} cores) | {setting} | "
                f"{summary} | `{cmd.strip()}` |", append=not args.no_readme)

if __name__ == "__main__":
    main()
