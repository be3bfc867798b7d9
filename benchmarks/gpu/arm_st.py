"""The sentence-transformers arms: MultipleNegativesRankingLoss with bf16 autocast and the HF Trainer's AdamW
on the same steps as jaxembed's (the fixed-length control, its own padding, padding-free), and encode
throughput against jaxembed's Encoder.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _harness

import harness as H  # noqa: E402
from _harness.st import st_step, trainer_adamw  # noqa: E402
from flat import (Flat, cpu_varlen_reference, flat_agreement, flat_attentions, flex_compiled,  # noqa: E402
                  kernel_ran)
from timing import FIXED_STEPS, device_info, emit, error_text, fixed_lengths, torch_time  # noqa: E402


def st_model(folder: Path, device: str):
    import torch
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    model = SentenceTransformer(str(folder), device=device)
    model.max_seq_length = H.MAX_LEN
    return model


def st_loss_cls():
    try:
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers.losses import MultipleNegativesRankingLoss
    return MultipleNegativesRankingLoss


def train_st(a: dict) -> None:
    """sentence-transformers on every model of a.models ([name, global batch, deadline], one process: torch's
    start once), in a.settings' order: the fixed-length batches (the control, back to back), the same steps' texts
    as jaxembed's natural batches with ST's collator (each column padded to its longest text), and padding-free
    (``flat``: the same texts flattened into one row with per-text positions and the best varlen attention
    transformers reaches here, ``flat_attentions``); bf16 autocast around forward and backward (the HF Trainer's
    bf16=True), float32 master weights, AdamW (``st_adamw``: fused on CUDA), grad-norm clipping 1.0. Each model's
    deadline: the time left until a.until split by the weights of the models still to run, read as it starts (one
    that ends early leaves its time to the rest)."""
    weights = [float(m[2]) for m in a["models"]]
    for i, (name, B, _) in enumerate(a["models"]):
        left = a["until"] - time.time()
        try:
            _st_one(a, name, int(B), H.Deadline(time.time() + left * weights[i] / sum(weights[i:])))
        except Exception as e:  # noqa: BLE001 -- one model's failure must not lose the next
            emit(kind="train", tool="st", setting="setup", model=name, error=error_text(e))
        finally:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def st_adamw(model, gpu: bool):
    """The HF Trainer's AdamW (its weight-decay groups) as its default optim runs it: fused on CUDA
    (``adamw_torch_fused``), foreach where the fused kernel is not supported (the CPU) -> (optimizer, the
    implementation's name for the record)."""
    impl = "fused" if gpu else "foreach"
    try:
        opt = trainer_adamw(model, lr=2e-5, weight_decay=0.01, **{impl: True})
    except (RuntimeError, ValueError):  # a device without the fused kernel: the multi-tensor one
        impl = "foreach"
        opt = trainer_adamw(model, lr=2e-5, weight_decay=0.01, foreach=True)
    return opt, f"torch.optim.AdamW({impl}=True)"


def st_loss(loss_fn, cols):
    """ST's MultipleNegativesRankingLoss on embeddings per column (its compute_loss_from_embeddings; the same
    formula inline for a version without it)."""
    import torch

    if hasattr(loss_fn, "compute_loss_from_embeddings"):
        return loss_fn.compute_loss_from_embeddings(cols, None)
    q, d = torch.nn.functional.normalize(cols[0], dim=-1), torch.nn.functional.normalize(torch.cat(cols[1:]), dim=-1)
    return torch.nn.functional.cross_entropy(q @ d.T / H.TEMPERATURE, torch.arange(len(q), device=q.device))


def _st_one(a: dict, name: str, B: int, dl: H.Deadline) -> None:
    import inspect

    import torch

    from jaxembed import models

    root = Path(a["root"])
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    folder = H.model_folder(name, root / "models")
    c = H.run_config(folder, B, data=H.natural_data_file(root), store=root / "store_k2",
                     plan_steps=a["plan_steps"])
    view = H.plan_view(c, Path(tempfile.mkdtemp(prefix=f"st_{name}_", dir=root)))
    steps, info = H.choose_steps(H.loader_of(view, "padded"), min(a["look"], view.plan.steps), a["take"])
    cols = H.natural_texts(view, steps)
    cfg = models.config_from_hf(H.hf_config(name))
    model = st_model(folder, device)
    model.train()
    loss_fn = st_loss_cls()(model, scale=1.0 / H.TEMPERATURE)
    opt, opt_impl = st_adamw(model, gpu)
    kind = torch.cuda.get_device_name() if gpu else "cpu"
    peak = H.peak_flops(kind, a.get("peak_flops"))
    flat_impls, tried = flat_attentions(gpu, a.get("flat_attention"))
    emit(kind="setup", tool="st", model=name, batch=B, device=kind, steps=steps, torch=torch.__version__,
         chosen_shape=info["chosen_shape"], flat_candidates=flat_impls, flat_tried=tried)
    with_tt = "token_type_ids" in inspect.signature(model[0].auto_model.forward).parameters
    amp = lambda: torch.autocast(device, dtype=torch.bfloat16, enabled=gpu)  # noqa: E731 (CPU: float32)

    def to_dev(f):  # the tensors to the device; other entries (sentence-transformers 6's "modality") as they are
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in f.items()}

    def one_step(f):  # bf16 autocast on the GPU; on the CPU (the dry run) float32: CPU autocast is very slow
        return st_step(model, loss_fn, opt, f, amp)

    flat = None  # the padding-free arm's Flat, once one passed its probe

    def flat_step(f):  # the same step as st_step, on the flattened row
        with amp():
            loss = st_loss(loss_fn, flat.embed(f))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    dim = int(model.get_sentence_embedding_dimension())
    lq, ld = fixed_lengths(a, info)
    for setting in a["settings"]:
        if not dl.enough(5):
            emit(kind="train", tool="st", setting=setting, model=name, skipped=f"{dl.left():.0f} s left")
            continue
        try:
            feats, lengths, padded = [], [], []
            step_fn, extra = one_step, {}
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
            elif setting == "flat":
                flat, agreement = _flat_probe(model, flat_impls, tried, cols, device, amp, loss_fn)
                if flat is None or (gpu and flat.impl == "sdpa_block_mask"):
                    emit(kind="train", tool="st", setting=setting, model=name, tried=tried,
                         skipped="no varlen / flex attention ran on this device (a dense [T, T] block mask over the "
                                 "flattened step would not fit)")
                    continue
                flat_impl = flat.impl
                for step_cols in cols:
                    f = flat.features(list(step_cols.values()))
                    feats.append(f)
                    lengths.append(f["lengths"].cpu().numpy())
                    padded.append([(1, int(f["lengths"].sum()))])
                step_fn = flat_step
                extra = {"attention": flat_impl, "tried": tried, "attention_dropout": "off: no dropout in "
                         "torch's varlen kernel" if flat_impl == "torch_varlen" else "as the model's config"}
                extra["agreement"] = agreement
                if a.get("check_varlen_wiring"):  # the device's varlen path, with the kernel's CPU stand-in
                    ref = Flat(model[0].auto_model, model.tokenizer, model.max_seq_length, "torch_varlen", device,
                                varlen_kernel=cpu_varlen_reference)
                    extra["varlen_wiring"] = dict(flat_agreement(ref, list(cols[0].values())),
                                                  kernel_ran=kernel_ran(ref))
            else:
                vocab = int(model[0].auto_model.config.vocab_size)
                K = len(cols[0]) - 1 if cols else 2  # the candidate columns

                def f_of(ids):
                    t = torch.as_tensor(ids, dtype=torch.long)
                    f = {"input_ids": t, "attention_mask": torch.ones_like(t)}
                    if with_tt:
                        f["token_type_ids"] = torch.zeros_like(t)
                    return to_dev(f)

                for i in range(int(a.get("fixed_steps", FIXED_STEPS))):  # as jaxembed's: back-to-back steps
                    q = H.synthetic_ids(B, lq, vocab, 1 + 2 * i)
                    d = H.synthetic_ids(B * K, ld, vocab, 2 + 2 * i)
                    feats.append([f_of(q)] + [f_of(d[j::K]) for j in range(K)])
                    lengths.append(np.array([lq] * B + [ld] * (B * K)))
                    padded.append([(B, lq)] + [(B, ld)] * K)
            n_cand = B * (len(cols[0]) - 1 if setting != "fixed" else len(feats[0]) - 1)
            if gpu:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            cm = flat if setting == "flat" else _null()
            attn_impl = flat.hf_impl if setting == "flat" else \
                getattr(model[0].auto_model.config, "_attn_implementation", None)
            with cm:
                loss, warm_s, times = torch_time(lambda: [step_fn(f) for f in feats][-1], a["rounds"], dl, gpu)
            real = int(sum(x.sum() for x in lengths))
            fl_real = sum(H.real_flops(cfg, x, B, n_cand, dim) for x in lengths)
            if setting == "flat":  # every text attends to itself alone: the computed slots are the real tokens
                slots, fl_comp = real, fl_real
            else:
                slots = int(sum(r * L for ps in padded for r, L in ps))
                fl_comp = sum(H.padded_flops(cfg, ps, B, n_cand, dim) for ps in padded)
            out = {"warmup_s": warm_s, "round_times_s": times, "loss": float(loss.detach()),
                   "finite": bool(torch.isfinite(loss.detach()).item()), "steps_per_round": len(feats),
                   "examples_per_round": B * len(feats), "real_tokens_per_round": real,
                   "token_slots_per_round": slots, "real_fraction": real / max(slots, 1), "flops_per_round": fl_comp,
                   "real_flops_per_round": fl_real, "shapes": [str(ps) for ps in padded[:4]],
                   "optimizer": opt_impl, "attention_implementation": attn_impl, **extra}
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
            if setting == "flat":
                out["kernel_ran"] = kernel_ran(flat)
            emit(kind="train", tool="st", setting=setting, model=name, **out)
        except Exception as e:  # noqa: BLE001
            emit(kind="train", tool="st", setting=setting, model=name, error=error_text(e))
        finally:
            feats = None
            if gpu:
                torch.cuda.empty_cache()


def _flat_probe(model, impls: list, tried: dict, cols: list, device: str, amp, loss_fn):
    """The first of ``impls`` whose flat path runs here: its agreement with the padded forward, then a forward and
    backward of the first step (gradients dropped) -> (Flat, agreement) or (None, None); ``tried`` says why each
    one before it failed."""
    for impl in impls:
        try:
            flat = Flat(model[0].auto_model, model.tokenizer, model.max_seq_length, impl, device)
            agreement = flat_agreement(flat, list(cols[0].values()))
            with flat, amp():
                loss = st_loss(loss_fn, flat.embed(flat.features(list(cols[0].values()))))
            loss.backward()
            model.zero_grad(set_to_none=True)
            if impl == "flex_attention" and not flex_compiled():
                raise RuntimeError("flex_attention ran without torch.compile (every score block materialised)")
            return flat, agreement
        except Exception as e:  # noqa: BLE001 -- the next one, and the record says why
            tried[impl] = "failed here: " + error_text(e).strip().splitlines()[-1][:300]
            model.zero_grad(set_to_none=True)
    return None, None


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


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
    emit(kind="setup", n_texts=len(texts), device=device_info(), torch_device=torch.cuda.get_device_name() if gpu
         else "cpu", batch_size=a["batch_size"])
    for name in a["models"]:
        if not dl.enough(10):
            emit(kind="encode", model=name, skipped=f"{dl.left():.0f} s left")
            continue
        try:
            folder = H.model_folder(name, root / "models")
            ours = load_encoder(str(folder), dtype="bfloat16", max_length=H.MAX_LEN)
            st = st_model(folder, device)
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
            emit(kind="encode", model=name, error=error_text(e))
