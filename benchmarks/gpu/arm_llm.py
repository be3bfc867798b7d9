"""Part 6's arms, an LLM embedder at size on one GPU: jaxembed (full fine-tuning or LoRA, remat, the gradient
cache) and sentence-transformers' recipe on the same model (PEFT LoRA, gradient checkpointing).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import harness as H
from arm_jax import capacity_gib, fit_batch
from arm_st import st_adamw, st_loss, st_loss_cls
from flat import Flat, cpu_varlen_reference, flat_agreement, kernel_ran
from timing import compile_programs, device_info, emit, error_text, lower_steps, time_rounds, torch_time, train_figures


def _llm_flops(run, hosts: list[dict], lora: bool) -> float:
    """Model FLOPs of the steps: the encoder forward x 3 (x 2 with LoRA: the frozen base has no weight gradients),
    + 1 forward with the gradient cache; remat's recomputation is not counted (model FLOPs, not hardware FLOPs);
    + the similarity matrix."""
    from jaxembed.flops import forward_flops

    cfg, dim, K = run.loaded.model.config, int(run.loaded.model.dim), run.K
    mult = (2.0 if lora else 3.0) + (1.0 if run.config.train.gradcache_chunk else 0.0)
    total = 0.0
    for h in hosts:
        b = int(h["query_prompt_length"].shape[0])
        packs = [h[k] for k in ("pack_input_ids", "query_pack_input_ids", "doc_pack_input_ids") if k in h]
        total += mult * sum(forward_flops(cfg, x.shape[0], x.shape[1]) for x in packs) + 6.0 * b * b * K * dim
    return total


def llm_jax(a: dict) -> None:
    """Part 6, jaxembed: a decoder at size (a config-only folder, random weights made on the device) on 512-token
    documents of the long-passage lengths, full fine-tuning or LoRA (a.mode), with rematerialisation (a.remat) and
    the gradient cache (a.chunk queries per sub-batch, tiled loss) at global batch a.batch: tokens/s, MFU, XLA's
    step buffers and the allocator's peak, and the largest sub-batch / plain batch the buffers predict."""
    import jax

    from jaxembed.train import init_state

    dl = H.Deadline(a["deadline"])
    root, name, B, cap, chunk = Path(a["root"]), a["model"], int(a["batch"]), int(a["cap"]), int(a["chunk"])
    lora = a["mode"] == "lora"
    t0 = time.time()
    folder = H.config_folder(name, root / "models")
    data, stats = H.long_data_file(root, folder, rows=B * a["plan_steps"], cap=cap, K=2)
    c = H.run_config(folder, B, data=data, store=root / f"store_llm_{name}_{cap}", max_len=cap,
                     max_query_len=a.get("query_cap", 64), dropout=False, plan_steps=a["plan_steps"], name="long",
                     chunk=chunk, tiled=bool(chunk), lora_rank=int(a.get("lora_rank", 16)) if lora else 0,
                     remat=bool(a.get("remat")))
    with H.random_weights():
        packed, _ = H.make_runs(c, Path(tempfile.mkdtemp(prefix=f"llm_{name}_", dir=root)))
    state = init_state(packed)
    dev = device_info()
    peak = H.peak_flops(dev["kind"], a.get("peak_flops"))
    capacity = capacity_gib(a)
    n_params = int(sum(x.size for x in jax.tree.leaves(state["params"])))
    emit(kind="setup", tool="jaxembed", model=name, mode=a["mode"], remat=bool(a.get("remat")), batch=B, chunk=chunk,
         device=dev, lengths=stats, trainable_params=n_params, setup_s=time.time() - t0, capacity_gib=capacity,
         device_peak_gib_after_init=H.jax_device_peak_gib())
    res = {"tool": "jaxembed", "model": name, "mode": a["mode"], "remat": bool(a.get("remat")), "global_batch": B,
           "chunk": chunk}
    try:
        loader = H.loader_of(packed, "packed")
        hosts = [loader.batch(s) for s in range(a["take"])]
        low = lower_steps(packed, state, hosts)
        comp, _ = compile_programs({"x": low})
        c_ = comp["x"]
        if "error" in c_:
            raise RuntimeError(c_["error"])
        state, t = time_rounds(c_["programs"], low["dev"], state, a["rounds"], dl)
        t.update(compile_s=c_["compile_s"], programs=len(c_["compiled"]), **c_["memory"])
        out = train_figures(t, packed, hosts, B, None)
        fl = _llm_flops(packed, hosts, lora)
        out.update(model_flops_per_round=fl, flops_convention="x3 forward (x2 LoRA), +1 with the gradient cache; "
                   "remat not counted", shapes=sorted({str([list(v.shape) for k, v in h.items()
                                                           if k.endswith("input_ids")]) for h in hosts}))
        if out.get("round_times_s"):
            tm = statistics.median(out["round_times_s"])
            out["model_tflops_per_s"] = fl / tm / 1e12
            if peak:
                out["mfu"] = fl / tm / peak
        fit = fit_batch(c_["memory"], chunk or B, capacity)
        if fit:
            fit["predicts"] = "queries per sub-batch (gradient cache)" if chunk else "global batch (no cache)"
        out.update(fit, device_peak_gib=H.jax_device_peak_gib())
        emit(kind="llm", **res, **out)
    except Exception as e:  # noqa: BLE001 -- out of memory is a finding
        emit(kind="llm", **res, error=error_text(e))


def llm_st(a: dict) -> None:
    """Part 6, sentence-transformers' recipe on the same model: the Hugging Face model built from the config
    (random weights; a 7B folder cannot be written within the call), PEFT LoRA (a.mode lora: bf16 base, float32
    adapters) or full fine-tuning (float32 weights), gradient checkpointing, bf16 autocast, mean pooling, ST's
    MultipleNegativesRankingLoss, AdamW: the same texts at each global batch of a.sizes until one does not fit
    (out of memory) or the deadline: the largest batch, tokens/s, the peak memory."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    dl = H.Deadline(a["deadline"])
    root, name, cap = Path(a["root"]), a["model"], int(a["cap"])
    lora = a["mode"] == "lora"
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    folder = H.config_folder(name, root / "models")
    data, _ = H.long_data_file(root, folder, rows=int(a["batch"]) * a["plan_steps"], cap=cap, K=2)
    rows = [json.loads(x) for x in open(data, encoding="utf-8")]
    cfg = AutoConfig.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token or tok.convert_ids_to_tokens(0)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if lora and gpu else torch.float32
    with torch.device(device):
        try:
            model = AutoModel.from_config(cfg, attn_implementation="sdpa", dtype=dtype)
        except TypeError:  # a transformers that still calls it torch_dtype
            model = AutoModel.from_config(cfg, attn_implementation="sdpa", torch_dtype=dtype)
    if a.get("check_varlen_wiring"):  # part 2's padding-free path on this architecture, the kernel's CPU stand-in
        fl = Flat(model, tok, cap, "torch_varlen", device, varlen_kernel=cpu_varlen_reference)
        agree = flat_agreement(fl, [[r["query"] for r in rows[:4]], [r["pos"][0] for r in rows[:4]]])
        emit(kind="wiring", tool="st", model=name, kernel_ran=kernel_ran(fl), **agree)
    peft_version = None
    if lora:
        import peft

        peft_version = peft.__version__
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        r = int(a.get("lora_rank", 16))
        model = peft.get_peft_model(model, peft.LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0,
                                                           target_modules=targets))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt, opt_impl = st_adamw(model, gpu)
    loss_fn = None
    try:
        loss_fn = st_loss_cls()(model, scale=1.0 / H.TEMPERATURE)
    except Exception:  # noqa: BLE001 -- its constructor wants a SentenceTransformer: the same formula inline
        pass
    amp = lambda: torch.autocast(device, dtype=torch.bfloat16, enabled=gpu)  # noqa: E731
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    emit(kind="setup", tool="st", model=name, mode=a["mode"], device=torch.cuda.get_device_name() if gpu else "cpu",
         torch=torch.__version__, peft=peft_version, trainable_params=trainable, gradient_checkpointing=True,
         base_dtype=str(dtype))

    def step(feats):
        with amp():
            cols = []
            for f in feats:
                h = model(**f).last_hidden_state.float()
                m = f["attention_mask"][..., None].float()
                cols.append((h * m).sum(1) / m.sum(1))
            loss = st_loss(loss_fn, cols)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for B in a["sizes"]:
        res = {"tool": "st", "model": name, "mode": a["mode"], "global_batch": B}
        if not dl.enough(10):
            emit(kind="llm", **res, skipped=f"{dl.left():.0f} s left")
            break
        feats = None
        try:
            part = rows[:B]
            cols = [[r["query"] for r in part], [r["pos"][0] for r in part], [r["neg"][0] for r in part]]
            feats = []
            for texts in cols:
                t = tok(texts, padding=True, truncation=True, max_length=cap, return_tensors="pt")
                feats.append({k: v.to(device) for k, v in t.items() if k in ("input_ids", "attention_mask")})
            real = int(sum(int(f["attention_mask"].sum()) for f in feats))
            slots = int(sum(f["attention_mask"].numel() for f in feats))
            if gpu:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            loss, warm, times = torch_time(lambda: step(feats), a["rounds"], dl, gpu)
            out = {"warmup_s": warm, "round_times_s": times, "loss": float(loss.detach()),
                   "finite": bool(torch.isfinite(loss.detach()).item()), "real_tokens_per_round": real,
                   "token_slots_per_round": slots, "real_fraction": real / max(slots, 1), "optimizer": opt_impl,
                   "attention_implementation": getattr(model.config, "_attn_implementation", None)}
            if times:
                tm = statistics.median(times)
                out.update(step_s=tm, examples_per_s=B / tm, real_tokens_per_s=real / tm)
            if gpu:
                out["device_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
            emit(kind="llm", **res, **out)
        except torch.cuda.OutOfMemoryError as e:
            emit(kind="llm", **res, oom=True, error=str(e)[:300])
            break
        except Exception as e:  # noqa: BLE001
            emit(kind="llm", **res, error=error_text(e))
            break
        finally:
            feats = None
            opt.zero_grad(set_to_none=True)
            if gpu:
                torch.cuda.empty_cache()
