"""The GPU benchmark's measurements, each run in a process of its own by benchmarks/gpu/bench.py
(``python benchmarks/gpu/bench.py --_worker NAME JSON``): one framework's memory never counts against the other's,
and a crash or an out-of-memory error ends one measurement, not the call. Every figure is printed as soon as it
is measured, one ``RESULT {json}`` line each, so a worker stopped at its deadline still reports what it has.

  smoke       versions, devices and one bf16 train step of a tiny BERT (is jaxembed usable here?)
  train_jax   jaxembed's train step on natural-length batches (packed, padded) and a fixed-length batch
  train_st    sentence-transformers (MultipleNegativesRankingLoss, bf16 autocast) on the same batches
  batch       the largest global batch (1 positive + 5 hard negatives, gradient cache + tiled loss)
  encode      jaxembed's encode vs sentence-transformers' on the natural texts
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _harness

import harness as H  # noqa: E402
from _harness.st import st_step, trainer_adamw  # noqa: E402


def emit(**kw) -> None:
    print("RESULT " + json.dumps(kw, default=float), flush=True)


def _device() -> dict:
    import jax

    d = jax.devices()[0]
    return {"platform": d.platform, "kind": d.device_kind, "count": jax.device_count()}


def _error(e: BaseException) -> str:
    tb = traceback.format_exception(type(e), e, e.__traceback__)
    return "".join(tb[-3:])[-1500:]


# ------------------------------------------------------------------------------------------------ jaxembed


def _compile_and_time(run, state, hosts: list[dict], rounds: int, dl: H.Deadline, sync_each: bool = False,
                      keep: dict | None = None):
    """Compile the run's step for each distinct shape of ``hosts`` (ahead of time), run them once (warm-up), then
    ``rounds`` timed rounds over all of them (one device sync per round: the loop's dispatch overlaps as in the
    trainer). -> (state, figures). ``keep``: a dict that receives the compiled program of each batch
    ("programs") and the device batches ("batches"), for a caller that runs them again (benchmarks/gpu/diag.py)."""
    import jax

    from jaxembed import parallel
    from jaxembed.data.pipeline import to_global
    from jaxembed.train import make_train_step

    step = make_train_step(run)
    sharding = parallel.batch_sharding(run.mesh)
    dev = [to_global(h, sharding) for h in hosts]
    shape = lambda b: tuple(sorted((k, tuple(v.shape)) for k, v in b.items()))
    compiled, mem = {}, {}
    t0 = time.perf_counter()
    for b in dev:
        key = shape(b)
        if key not in compiled:
            compiled[key] = step.lower(state, b).compile()
            for k, v in H.xla_memory(compiled[key]).items():
                mem[k] = max(mem.get(k, 0.0), v)
    compile_s = time.perf_counter() - t0
    progs = [compiled[shape(b)] for b in dev]
    if keep is not None:
        keep.update(programs=progs, batches=dev)
    t0 = time.perf_counter()
    for p, b in zip(progs, dev):
        state, m = p(state, b)
    jax.block_until_ready(m["loss"])
    warm_s = time.perf_counter() - t0
    times = []
    for _ in range(rounds):
        if times and not dl.enough(2 * max(times) + 2):
            break
        t0 = time.perf_counter()
        for p, b in zip(progs, dev):
            state, m = p(state, b)
            if sync_each:
                jax.block_until_ready(m["loss"])
        jax.block_until_ready(m["loss"])
        times.append(time.perf_counter() - t0)
    out = {"compile_s": compile_s, "programs": len(compiled), "warmup_s": warm_s, "round_times_s": times,
           "loss": float(m["loss"]), "finite": bool(np.isfinite(float(m["loss"]))), **mem}
    return state, out


def _train_figures(res: dict, run, hosts: list[dict], B: int, peak: float | None, cached: bool = False) -> dict:
    """examples/s, real tokens/s, MFU (computed slots, as the trainer logs it; and real tokens alone)."""
    from jaxembed.data.pipeline import batch_stats
    from jaxembed.train import step_flops

    cfg, dim = run.loaded.model.config, int(run.loaded.model.dim)
    stats = [batch_stats(h, 1) for h in hosts]
    real = sum(s["tokens"] for s in stats)
    slots = sum(s["padded_tokens"] for s in stats)
    fl_comp = sum(step_flops(run, h) for h in hosts)
    fl_real = sum(H.real_flops(cfg, H.text_lengths(h), B, B * run.K, dim, cached) for h in hosts)
    out = dict(res, steps_per_round=len(hosts), examples_per_round=B * len(hosts), real_tokens_per_round=real,
               token_slots_per_round=slots, real_fraction=real / max(slots, 1), flops_per_round=fl_comp,
               real_flops_per_round=fl_real)
    if res.get("round_times_s"):
        t = statistics.median(res["round_times_s"])
        out.update(step_s=t / len(hosts), examples_per_s=B * len(hosts) / t, real_tokens_per_s=real / t,
                   tflops_per_s=fl_comp / t / 1e12)
        if peak:
            out.update(mfu=fl_comp / t / peak, mfu_real_tokens=fl_real / t / peak)
    return out


def _fixed_lengths(a: dict, info: dict) -> tuple[int, int]:
    """The fixed batch's query / document lengths: a.q_len / a.d_len, or with "auto" (the dry run) the natural
    steps' padded shape, so that the padded and the fixed settings (and the smoke step) run one program."""
    if a["q_len"] == "auto":
        return int(info["chosen_shape"][0]), int(info["chosen_shape"][1])
    return int(a["q_len"]), int(a["d_len"])


def smoke(a: dict) -> None:
    """Versions and devices, then one bf16 train step of a tiny BERT (a fixed batch of 8 queries, a plan of
    a.plan_steps steps: in the dry run, the very program of part 2's padded and fixed settings, which then come
    from the compilation cache) through the harness."""
    emit(kind="versions", versions=H.versions(), device=_device())
    root = Path(a["root"])
    from jaxembed.train import init_state

    t0 = time.time()
    folder = H.model_folder("tiny-bert", root / "models")
    c = H.run_config(folder, 8, data=H.natural_data_file(root), store=root / "store_k2", plan_steps=a["plan_steps"])
    _, padded = H.make_runs(c, Path(tempfile.mkdtemp(prefix="smoke_", dir=root)))
    loader = H.loader_of(padded, "padded")
    steps, info = H.choose_steps(loader, min(a["look"], padded.plan.steps), a["take"])
    lq, ld = _fixed_lengths(a, info)
    host = H.fixed_batch(loader.batch(steps[0]), 8, padded.K, lq, ld, 30522)
    state = init_state(padded)
    _, res = _compile_and_time(padded, state, [host], 1, H.Deadline(time.time() + 60))
    emit(kind="step", ok=res["finite"], loss=res["loss"], seconds=time.time() - t0, compile_s=res["compile_s"])


def train_jax(a: dict) -> None:
    """jaxembed on one model: the plan's natural batches packed and padded, then a fixed-length batch."""
    import jax

    from jaxembed.train import init_state

    dl = H.Deadline(a["deadline"])
    root, name, B = Path(a["root"]), a["model"], int(a["batch"])
    t0 = time.time()
    folder = H.model_folder(name, root / "models")
    build_s = time.time() - t0
    c = H.run_config(folder, B, data=H.natural_data_file(root), store=root / "store_k2",
                     plan_steps=a["plan_steps"])
    packed, padded = H.make_runs(c, Path(tempfile.mkdtemp(prefix=f"train_{name}_", dir=root)))
    pad_loader, pack_loader = H.loader_of(padded, "padded"), H.loader_of(packed, "packed")
    steps, info = H.choose_steps(pad_loader, min(a["look"], packed.plan.steps), a["take"])
    state = init_state(packed)
    dev = _device()
    peak = H.peak_flops(dev["kind"], a.get("peak_flops"))
    emit(kind="setup", model=name, batch=B, device=dev, peak_flops=peak, steps=steps, model_build_s=build_s,
         setup_s=time.time() - t0, params=int(sum(x.size for x in jax.tree.leaves(state["params"]))), **info)
    est = 0.0
    lq, ld = _fixed_lengths(a, info)
    for setting in a["settings"]:
        if est and not dl.enough(est):
            emit(kind="train", tool="jaxembed", setting=setting, model=name, skipped=f"{dl.left():.0f} s left, "
                 f"~{est:.0f} s needed")
            continue
        t1 = time.time()
        try:
            if setting == "fixed":
                run = padded
                hosts = [H.fixed_batch(pad_loader.batch(steps[0]), B, run.K, lq, ld,
                                       int(run.loaded.hf_config["vocab_size"]))]
            else:
                run, loader = (packed, pack_loader) if setting == "packed" else (padded, pad_loader)
                hosts = [loader.batch(s) for s in steps]
            state, res = _compile_and_time(run, state, hosts, a["rounds"], dl)
            out = _train_figures(res, run, hosts, B, peak)
            out["device_peak_gib_so_far"] = H.jax_device_peak_gib()
            if setting == "fixed":
                out.update(q_len=lq, d_len=ld)
            else:
                out["shapes"] = sorted({str([list(v.shape) for k, v in h.items() if k.endswith("input_ids")])
                                        for h in hosts})
            emit(kind="train", tool="jaxembed", setting=setting, model=name, **out)
        except Exception as e:  # noqa: BLE001 -- one setting's failure (out of memory) is a figure too
            emit(kind="train", tool="jaxembed", setting=setting, model=name, error=_error(e))
        est = 1.3 * (time.time() - t1)


# ------------------------------------------------------------------------------------------------ sentence-transformers


def _st_model(folder: Path, device: str):
    import torch
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    model = SentenceTransformer(str(folder), device=device)
    model.max_seq_length = H.MAX_LEN
    return model


def _st_loss_cls():
    try:
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers.losses import MultipleNegativesRankingLoss
    return MultipleNegativesRankingLoss


def train_st(a: dict) -> None:
    """sentence-transformers on the same model folder and the same steps' texts (each column padded to its longest
    text, as its collator does), then the fixed-length batch; bf16 autocast around forward and backward (the HF
    Trainer's bf16=True), float32 master weights, AdamW, grad-norm clipping 1.0."""
    import torch

    from jaxembed import models

    dl = H.Deadline(a["deadline"])
    root, name, B = Path(a["root"]), a["model"], int(a["batch"])
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    folder = H.model_folder(name, root / "models")
    c = H.run_config(folder, B, data=H.natural_data_file(root), store=root / "store_k2",
                     plan_steps=a["plan_steps"])
    view = H.plan_view(c, Path(tempfile.mkdtemp(prefix=f"st_{name}_", dir=root)))
    steps, info = H.choose_steps(H.loader_of(view, "padded"), min(a["look"], view.plan.steps), a["take"])
    cols = H.natural_texts(view, steps)
    cfg = models.config_from_hf(H.hf_config(name))
    model = _st_model(folder, device)
    model.train()
    loss_fn = _st_loss_cls()(model, scale=1.0 / H.TEMPERATURE)
    opt = trainer_adamw(model, lr=2e-5, weight_decay=0.01)  # the HF Trainer's AdamW groups
    kind = torch.cuda.get_device_name() if gpu else "cpu"
    peak = H.peak_flops(kind, a.get("peak_flops"))
    emit(kind="setup", tool="st", model=name, batch=B, device=kind, steps=steps, torch=torch.__version__,
         chosen_shape=info["chosen_shape"])
    import inspect

    with_tt = "token_type_ids" in inspect.signature(model[0].auto_model.forward).parameters

    def to_dev(f):  # the tensors to the device; other entries (sentence-transformers 6's "modality") as they are
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in f.items()}

    def one_step(f):  # bf16 autocast on the GPU; on the CPU (the dry run) float32: CPU autocast is very slow
        return st_step(model, loss_fn, opt, f, lambda: torch.autocast(device, dtype=torch.bfloat16, enabled=gpu))

    dim = int(model.get_sentence_embedding_dimension())
    lq, ld = _fixed_lengths(a, info)
    for setting in a["settings"]:
        if not dl.enough(5):
            emit(kind="train", tool="st", setting=setting, model=name, skipped=f"{dl.left():.0f} s left")
            continue
        try:
            feats, lengths, padded = [], [], []
            if setting == "natural":
                for step_cols in cols:
                    fs, ls, ps = [], [], []
                    for texts in step_cols.values():
                        t = model.tokenize(texts)
                        m = t["attention_mask"]
                        ls.append(m.sum(1).numpy())
                        ps.append(tuple(m.shape))
                        fs.append(to_dev(t))
                    feats.append(fs)
                    lengths.append(np.concatenate(ls))
                    padded.append(ps)
            else:
                vocab = int(model[0].auto_model.config.vocab_size)
                K = len(cols[0]) - 1 if cols else 2  # the candidate columns
                q = H.synthetic_ids(B, lq, vocab, 1)
                d = H.synthetic_ids(B * K, ld, vocab, 2)

                def f_of(ids):
                    t = torch.as_tensor(ids, dtype=torch.long)
                    f = {"input_ids": t, "attention_mask": torch.ones_like(t)}
                    if with_tt:
                        f["token_type_ids"] = torch.zeros_like(t)
                    return to_dev(f)

                feats.append([f_of(q)] + [f_of(d[j::K]) for j in range(K)])
                lengths.append(np.array([lq] * B + [ld] * (B * K)))
                padded.append([(B, lq)] + [(B, ld)] * K)
            n_cand = B * (len(feats[0]) - 1)
            if gpu:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            for f in feats:
                loss = one_step(f)
            if gpu:
                torch.cuda.synchronize()
            warm_s = time.perf_counter() - t0
            times = []
            for _ in range(a["rounds"]):
                if times and not dl.enough(2 * max(times) + 2):
                    break
                t0 = time.perf_counter()
                for f in feats:
                    loss = one_step(f)
                if gpu:
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            real = int(sum(x.sum() for x in lengths))
            slots = int(sum(r * L for ps in padded for r, L in ps))
            fl_real = sum(H.real_flops(cfg, x, B, n_cand, dim) for x in lengths)
            fl_comp = sum(H.padded_flops(cfg, ps, B, n_cand, dim) for ps in padded)
            out = {"warmup_s": warm_s, "round_times_s": times, "loss": float(loss.detach()),
                   "finite": bool(torch.isfinite(loss.detach()).item()), "steps_per_round": len(feats),
                   "examples_per_round": B * len(feats), "real_tokens_per_round": real,
                   "token_slots_per_round": slots, "real_fraction": real / max(slots, 1), "flops_per_round": fl_comp,
                   "real_flops_per_round": fl_real, "shapes": [str(ps) for ps in padded[:4]]}
            if gpu:
                out["device_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
            if times:
                t = statistics.median(times)
                out.update(step_s=t / len(feats), examples_per_s=B * len(feats) / t, real_tokens_per_s=real / t,
                           tflops_per_s=fl_comp / t / 1e12)
                if peak:
                    out.update(mfu=fl_comp / t / peak, mfu_real_tokens=fl_real / t / peak)
            if setting == "fixed":
                out.update(q_len=lq, d_len=ld)
            emit(kind="train", tool="st", setting=setting, model=name, **out)
        except Exception as e:  # noqa: BLE001
            emit(kind="train", tool="st", setting=setting, model=name, error=_error(e))
        finally:
            feats = None
            if gpu:
                torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------ largest batch


def batch(a: dict) -> None:
    """BERT-base, 1 positive + 5 hard negatives per query, q_len / d_len tokens, gradient cache (a.chunk queries
    per sub-batch) + tiled loss: the step at each global batch of a.sizes (the first is the reference, the
    second the target; the rest fill in the curve while time is left), then the cache's overhead: the same
    step without cache or tiling at a.overhead_batch."""
    import dataclasses

    from jaxembed.train import init_state

    dl = H.Deadline(a["deadline"])
    root, K = Path(a["root"]), 6
    folder = H.model_folder(a["model"], root / "models")
    # the plan's global batch (the template's rows, tiled to each size) is one sub-batch: the config asks for a
    # multiple of it
    c = H.run_config(folder, a["chunk"], data=H.natural_data_file(root), store=root / "store_k6", K=K,
                     packing=False, chunk=a["chunk"], tiled=True, plan_steps=2)
    _, run = H.make_runs(c, Path(tempfile.mkdtemp(prefix="batch_", dir=root)))
    template = H.loader_of(run, "padded").batch(0)
    vocab = int(run.loaded.hf_config["vocab_size"])
    state = init_state(run)
    dev = _device()
    peak = H.peak_flops(dev["kind"], a.get("peak_flops"))
    emit(kind="setup", model=a["model"], device=dev, K=K, chunk=a["chunk"], q_len=a["q_len"], d_len=a["d_len"],
         peak_flops=peak)
    per_example, compile_est = None, 0.0

    def one(run_, B, label):
        nonlocal state
        host = H.fixed_batch(template, B, K, a["q_len"], a["d_len"], vocab)
        res = {"global_batch": B, "candidates": B * K, "setting": label}
        try:
            state, r = _compile_and_time(run_, state, [host], a["rounds"], dl)
            res.update(_train_figures(r, run_, [host], B, peak, cached=label == "cached"))
            res["device_peak_gib_so_far"] = H.jax_device_peak_gib()
        except Exception as e:  # noqa: BLE001 -- out of memory ends the search at this size
            res["error"] = _error(e)
        return res

    for B in a["sizes"]:
        need = compile_est + (3 * per_example * B if per_example else 0.0)
        if per_example is not None and not dl.enough(need):
            emit(kind="batch", global_batch=B, candidates=B * K, setting="cached",
                 skipped=f"{dl.left():.0f} s left, ~{need:.0f} s needed")
            continue
        r = one(run, B, "cached")
        emit(kind="batch", **r)
        if "step_s" in r:
            per_example = r["step_s"] / B if per_example is None else max(per_example, r["step_s"] / B)
            compile_est = max(compile_est, r["compile_s"])
    Bo = a["overhead_batch"]
    plain = dataclasses.replace(run, config=c.copy_and_resolve_references())
    plain.config.train.gradcache_chunk = 0
    plain.config.loss.tiled = False
    for label, run_ in (("plain", plain), ("cached", run)):
        need = compile_est + (3 * per_example * Bo if per_example else 0.0)
        if not dl.enough(need):
            emit(kind="overhead", global_batch=Bo, setting=label, skipped=f"{dl.left():.0f} s left")
            continue
        emit(kind="overhead", **one(run_, Bo, label))


# ------------------------------------------------------------------------------------------------ encode


def encode(a: dict) -> None:
    """Inference: jaxembed's Encoder (packed rows, bf16) vs sentence-transformers' encode (bf16 weights, its
    length-sorted batches) on the natural texts (snli + wikiqa queries, positives and negatives, distinct), the
    same batch size; each warmed up, then timed in turns; the embeddings' agreement on the first 256 texts."""
    import torch

    from jaxembed.encode import load_encoder

    dl = H.Deadline(a["deadline"])
    root = Path(a["root"])
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    texts, seen = [], set()
    for line in open(H.natural_data_file(root), encoding="utf-8"):
        r = json.loads(line)
        for t in [r["query"]] + r["pos"] + r["neg"]:
            if t not in seen:
                seen.add(t)
                texts.append(t)
    texts = texts[: a["n"]]
    emit(kind="setup", n_texts=len(texts), device=_device(), torch_device=torch.cuda.get_device_name() if gpu
         else "cpu", batch_size=a["batch_size"])
    for name in a["models"]:
        if not dl.enough(10):
            emit(kind="encode", model=name, skipped=f"{dl.left():.0f} s left")
            continue
        try:
            folder = H.model_folder(name, root / "models")
            ours = load_encoder(str(folder), dtype="bfloat16", max_length=H.MAX_LEN)
            st = _st_model(folder, device)
            st.eval()
            if gpu:  # bf16 weights; the CPU (dry run) stays float32, where bf16 is very slow
                st.to(torch.bfloat16)
            n_tokens = int(sum(min(len(x), ours.tokenizer.max_length) for x in ours.tokenizer.tokenize(texts)))
            bs = a["batch_size"]

            def run_ours():
                return ours.encode(texts, batch_size=bs, progress=False)

            def run_st():
                with torch.inference_mode():
                    e = st.encode(texts, batch_size=bs, convert_to_tensor=True, show_progress_bar=False)
                if gpu:
                    torch.cuda.synchronize()
                return e

            first = {}
            for k, fn in (("jaxembed", run_ours), ("st", run_st)):
                t0 = time.perf_counter()
                fn()
                first[k] = time.perf_counter() - t0
            times = {"jaxembed": [], "st": []}
            for _ in range(a["repeats"]):
                if times["st"] and not dl.enough(2 * (max(times["st"]) + max(times["jaxembed"])) + 2):
                    break
                for k, fn in (("jaxembed", run_ours), ("st", run_st)):
                    t0 = time.perf_counter()
                    fn()
                    times[k].append(time.perf_counter() - t0)
            x = ours.encode(texts[:256], batch_size=bs, progress=False)
            with torch.inference_mode():
                y = st.encode(texts[:256], batch_size=bs, convert_to_tensor=True,
                              show_progress_bar=False).float().cpu().numpy()
            cos = (x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1) + 1e-12)
            out = {"n_tokens": n_tokens, "first_pass_s": first, "times_s": times,
                   "real_fraction_jaxembed": (ours.last_stats or {}).get("real_fraction"),
                   "max_abs_diff": float(np.abs(x - y).max()), "min_cosine": float(cos.min())}
            if times["st"]:
                tj, ts = statistics.median(times["jaxembed"]), statistics.median(times["st"])
                out.update(jaxembed_texts_per_s=len(texts) / tj, st_texts_per_s=len(texts) / ts,
                           jaxembed_tokens_per_s=n_tokens / tj, st_tokens_per_s=n_tokens / ts, ratio=ts / tj)
            emit(kind="encode", model=name, **out)
            del ours, st
            if gpu:
                torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001
            emit(kind="encode", model=name, error=_error(e))


WORKERS = {"smoke": smoke, "train_jax": train_jax, "train_st": train_st, "batch": batch, "encode": encode}


def main(name: str, payload: str) -> None:
    try:
        WORKERS[name](json.loads(payload))
    except Exception as e:  # noqa: BLE001 -- the parent reads this line; the exit status says it too
        emit(kind="fatal", error=_error(e))
        sys.exit(1)
