"""The GPU benchmark's measurements, each run in a process of its own by benchmarks/gpu/bench.py
(``python benchmarks/gpu/bench.py --_worker NAME JSON``): one framework's memory never counts against the other's,
and a crash or an out-of-memory error ends one measurement, not the call. Every figure is printed as soon as it
is measured, one ``RESULT {json}`` line each, so a worker stopped at its deadline still reports what it has.

  smoke       versions, devices and one bf16 train step of a tiny BERT (is jaxembed usable here?)
  prepare     the model folders and the natural data, built on the CPU beside the smoke step
  train_jax   jaxembed's train step on fixed-length batches and natural-length batches (packed, padded), with a
              profile of where the step goes
  train_st    sentence-transformers (MultipleNegativesRankingLoss, bf16 autocast) on the same batches: its own
              padding, the fixed batches, and padding-free (flattened rows, varlen attention)
  batch       the largest global batch (1 positive + 5 hard negatives, gradient cache + tiled loss)
  encode      jaxembed's encode vs sentence-transformers' on the natural texts
  long        long documents in packed rows of 512-2,048 slots, each attention kernel in the full train step
  llm_jax     a 1.5B / 7B decoder (full fine-tuning or LoRA, remat, gradient cache) at 512-token documents
  llm_st      sentence-transformers' recipe on it (PEFT LoRA, gradient checkpointing): the largest batch
  serve       the dry run's one process for every job (imports once)
"""

from __future__ import annotations

import functools
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
    """The last frames and the message, the message's own first line last (JAX's note on filtered frames left
    out): what a record's one-line summary shows."""
    frames = traceback.format_tb(e.__traceback__)[-2:]
    msg = [x for x in "".join(traceback.format_exception_only(type(e), e)).strip().splitlines()
           if x.strip() and not x.startswith(("For simplicity, JAX", "-----"))]
    return ("".join(frames) + "\n".join(msg[1:] + msg[:1]))[-1500:]


# ------------------------------------------------------------------------------------------------ jaxembed


def _shape(b) -> tuple:
    return tuple(sorted((k, tuple(v.shape)) for k, v in b.items()))


def _lower(run, state, hosts: list[dict]) -> dict:
    """The run's train step lowered for each distinct shape of ``hosts`` (tracing happens here: do it inside a
    ``harness.forced_attention``, compile anywhere) -> {"dev": device batches, "keys": each batch's shape,
    "lowered": {shape: jax Lowered}}."""
    from jaxembed import parallel
    from jaxembed.data.pipeline import to_global
    from jaxembed.train import make_train_step

    step = make_train_step(run)
    fixed = {}
    if isinstance(step, functools.partial):  # LoRA: the frozen base weights (a guide model's) bound by keyword
        step, fixed = step.func, dict(step.keywords)
    sharding = parallel.batch_sharding(run.mesh)
    dev = [to_global(h, sharding) for h in hosts]
    keys = [_shape(b) for b in dev]
    lowered = {}
    for k, b in zip(keys, dev):
        if k not in lowered:
            lowered[k] = step.lower(state, b, **fixed)
    return {"dev": dev, "keys": keys, "lowered": lowered, "fixed": fixed}


def _compile(jobs: dict, threads: int = 1) -> tuple[dict, float]:
    """Compile every lowered program of ``jobs`` ({name: _lower's dict}), ``threads`` at a time (XLA compiles
    outside the GIL: on a 16-core device machine the settings of one model compile side by side) -> ({name:
    {"programs": [compiled per batch], "compile_s": seconds of its own programs, "memory": XLA's step buffers}},
    wall seconds). A program that fails to compile gives {"error": ...} for its job."""
    import concurrent.futures as cf

    flat = [(name, k, low) for name, j in jobs.items() for k, low in j["lowered"].items()]

    def one(item):
        t0 = time.perf_counter()
        try:
            return item, item[2].compile(), time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 -- a kernel that cannot compile is a finding
            return item, e, time.perf_counter() - t0

    t0 = time.perf_counter()
    if threads > 1 and len(flat) > 1:
        with cf.ThreadPoolExecutor(min(threads, len(flat))) as ex:
            done = list(ex.map(one, flat))
    else:
        done = [one(x) for x in flat]
    wall = time.perf_counter() - t0
    out = {name: {"compiled": {}, "compile_s": 0.0, "memory": {}} for name in jobs}
    for (name, k, _), c, dt in done:
        o = out[name]
        o["compile_s"] += dt
        if isinstance(c, Exception):
            o["error"] = _error(c)
            continue
        o["compiled"][k] = c
        for mk, v in H.xla_memory(c).items():
            o["memory"][mk] = max(o["memory"].get(mk, 0.0), v)
    for name, o in out.items():
        if "error" not in o:
            fixed = jobs[name].get("fixed") or {}
            o["programs"] = [functools.partial(o["compiled"][k], **fixed) if fixed else o["compiled"][k]
                             for k in jobs[name]["keys"]]
    return out, wall


#: steps timed back to back in each round of the fixed-length arms (one device sync per round, as the trainer
#: dispatches steps without waiting): a round of one step would count the device's idle time between dispatches
FIXED_STEPS = 4
#: jaxembed's optimizer as the record names it (jaxembed.train.optim: optax's AdamW, compiled into the step)
JAX_OPTIMIZER = "optax.adamw (jaxembed.train.optim, inside the compiled train step)"


def _time(progs: list, dev: list, state, rounds: int, dl: H.Deadline, sync_each: bool = False):
    """Run the compiled programs once (warm-up), then ``rounds`` timed rounds over all of them (one device sync
    per round: the loop's dispatch overlaps as in the trainer) -> (state, figures)."""
    import jax

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
    return state, {"warmup_s": warm_s, "round_times_s": times, "loss": float(m["loss"]),
                   "finite": bool(np.isfinite(float(m["loss"])))}


def _torch_time(round_fn, rounds: int, dl: H.Deadline, gpu: bool):
    """PyTorch's side of ``_time``: one warm-up round of ``round_fn`` (-> its last loss), then ``rounds`` timed
    rounds while the deadline allows two more, each ended by a device sync -> (loss, warm-up s, round times)."""
    import torch

    def one():
        t0 = time.perf_counter()
        loss = round_fn()
        if gpu:
            torch.cuda.synchronize()
        return loss, time.perf_counter() - t0

    loss, warm_s = one()
    times = []
    for _ in range(rounds):
        if times and not dl.enough(2 * max(times) + 2):
            break
        loss, t = one()
        times.append(t)
    return loss, warm_s, times


def _compile_and_time(run, state, hosts: list[dict], rounds: int, dl: H.Deadline, sync_each: bool = False,
                      keep: dict | None = None):
    """Compile the run's step for each distinct shape of ``hosts`` (ahead of time), run them once (warm-up), then
    ``rounds`` timed rounds over all of them. -> (state, figures). ``keep``: a dict that receives the compiled
    program of each batch ("programs") and the device batches ("batches"), for a caller that runs them again
    (benchmarks/gpu/diag.py)."""
    low = _lower(run, state, hosts)
    comp, _ = _compile({"x": low})
    c = comp["x"]
    if "error" in c:
        raise RuntimeError(c["error"])
    if keep is not None:
        keep.update(programs=c["programs"], batches=low["dev"])
    state, t = _time(c["programs"], low["dev"], state, rounds, dl, sync_each)
    return state, dict(t, compile_s=c["compile_s"], programs=len(c["compiled"]), **c["memory"])


def _profile(progs: list, dev: list, state, folder: Path, steps: int = 1):
    """One profiler trace of the first ``steps`` programs -> (state, {"top": the 15 costliest kernels,
    "categories": share of device time per kind of kernel (harness.KERNEL_CATEGORIES), "total_ms"}), from
    benchmarks/gpu/diag.py's kernel summary."""
    import jax

    import diag

    folder.mkdir(parents=True, exist_ok=True)
    jax.profiler.start_trace(str(folder), create_perfetto_trace=True)
    try:
        for p, b in list(zip(progs, dev))[:steps]:
            state, m = p(state, b)
        jax.block_until_ready(m["loss"])
    finally:
        jax.profiler.stop_trace()
    ks = diag.kernel_summary(folder, top=100_000)
    if "error" in ks:
        return state, {"error": ks["error"]}
    top = [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in x.items()} for x in ks["kernels"][:15]]
    return state, {"steps": min(steps, len(progs)), "total_ms": ks["total_us"] / 1e3, "processes": ks["processes"],
                   "categories": H.kernel_categories(ks), "top": top}


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
    """jaxembed on one model: the fixed-length batches (the control: every token real, the same work as ST's fixed arm;
    FIXED_STEPS of them back to back a round), then the plan's natural batches packed and padded, in a.waves (lists
    of settings; default: a.settings at once): a wave's programs compiled side by side (a.compile_threads at a
    time), then each timed (warm-up + a.rounds rounds), and the settings of a.profile get a profiler trace of one
    step (the kernels' time by kind: where the step goes); a later wave only when its compilation fits before the
    deadline."""
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
    lq, ld = _fixed_lengths(a, info)
    waves = a.get("waves") or [a["settings"]]
    walls = []
    for wave in waves:
        wave = [x for x in wave if x in a["settings"]]
        if walls and not dl.enough(1.3 * max(walls) + 10):  # the next wave's compilation would not fit
            for setting in wave:
                emit(kind="train", tool="jaxembed", setting=setting, model=name,
                     skipped=f"{dl.left():.0f} s left, ~{1.3 * max(walls) + 10:.0f} s needed")
            continue
        work, lowered = {}, {}
        for setting in wave:
            try:
                if setting == "fixed":  # FIXED_STEPS back-to-back steps a round (distinct ids, one program)
                    run = padded
                    tmpl, vocab = pad_loader.batch(steps[0]), int(run.loaded.hf_config["vocab_size"])
                    hosts = [H.fixed_batch(tmpl, B, run.K, lq, ld, vocab, seed=2 * i)
                             for i in range(int(a.get("fixed_steps", FIXED_STEPS)))]
                else:
                    run, loader = (packed, pack_loader) if setting == "packed" else (padded, pad_loader)
                    hosts = [loader.batch(s) for s in steps]
                work[setting] = (run, hosts)
                lowered[setting] = _lower(run, state, hosts)
            except Exception as e:  # noqa: BLE001 -- one setting's failure is a figure too
                emit(kind="train", tool="jaxembed", setting=setting, model=name, error=_error(e))
        comp, wall = _compile(lowered, int(a.get("compile_threads", 1)))
        walls.append(wall)
        emit(kind="compile", tool="jaxembed", model=name, setting="+".join(lowered), wave=list(lowered),
             threads=int(a.get("compile_threads", 1)), wall_s=wall,
             per_setting_s={k: v["compile_s"] for k, v in comp.items()})
        for setting in [x for x in wave if x in comp]:
            c_ = comp[setting]
            if "error" in c_:
                emit(kind="train", tool="jaxembed", setting=setting, model=name, error=c_["error"])
                continue
            if not dl.enough(5):
                emit(kind="train", tool="jaxembed", setting=setting, model=name, skipped=f"{dl.left():.0f} s left")
                continue
            run, hosts = work[setting]
            low = lowered[setting]
            try:
                state, res = _time(c_["programs"], low["dev"], state, a["rounds"], dl)
                res.update(compile_s=c_["compile_s"], programs=len(c_["compiled"]), **c_["memory"])
                out = _train_figures(res, run, hosts, B, peak)
                out["device_peak_gib_so_far"] = H.jax_device_peak_gib()
                out["optimizer"] = JAX_OPTIMIZER
                if setting == "fixed":
                    out.update(q_len=lq, d_len=ld)
                else:
                    out["shapes"] = sorted({str([list(v.shape) for k, v in h.items() if k.endswith("input_ids")])
                                            for h in hosts})
                emit(kind="train", tool="jaxembed", setting=setting, model=name, **out)
                if setting in a.get("profile", ()) and dl.enough(10):
                    state, prof = _profile(c_["programs"], low["dev"], state,
                                           root / "profiles" / f"{name}_{setting}")
                    emit(kind="profile", tool="jaxembed", setting=setting, model=name, **prof)
            except Exception as e:  # noqa: BLE001 -- one setting's failure (out of memory) is a figure too
                emit(kind="train", tool="jaxembed", setting=setting, model=name, error=_error(e))


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
    """sentence-transformers on every model of a.models ([name, global batch, deadline], one process: torch's
    start once), in a.settings' order: the fixed-length batches (the control, back to back), the same steps' texts
    as jaxembed's natural batches with ST's collator (each column padded to its longest text), and padding-free
    (``flat``: the same texts flattened into one row with per-text positions and the best varlen attention
    transformers reaches here, ``_flat_attention``); bf16 autocast around forward and backward (the HF Trainer's
    bf16=True), float32 master weights, AdamW (``st_adamw``: fused on CUDA), grad-norm clipping 1.0. Each model's
    deadline: the time left until a.until split by the weights of the models still to run, read as it starts (one
    that ends early leaves its time to the rest)."""
    weights = [float(m[2]) for m in a["models"]]
    for i, (name, B, _) in enumerate(a["models"]):
        left = a["until"] - time.time()
        try:
            _st_one(a, name, int(B), H.Deadline(time.time() + left * weights[i] / sum(weights[i:])))
        except Exception as e:  # noqa: BLE001 -- one model's failure must not lose the next
            emit(kind="train", tool="st", setting="setup", model=name, error=_error(e))
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


def _st_loss(loss_fn, cols):
    """ST's MultipleNegativesRankingLoss on embeddings per column (its compute_loss_from_embeddings; the same
    formula inline for a version without it)."""
    import torch

    if hasattr(loss_fn, "compute_loss_from_embeddings"):
        return loss_fn.compute_loss_from_embeddings(cols, None)
    q, d = torch.nn.functional.normalize(cols[0], dim=-1), torch.nn.functional.normalize(torch.cat(cols[1:]), dim=-1)
    return torch.nn.functional.cross_entropy(q @ d.T / H.TEMPERATURE, torch.arange(len(q), device=q.device))


#: the padding-free attentions tried for ST's flat arm, best first (transformers' attn_implementation names, or
#: ours): FlashAttention 2 / 3 read the packed sequences from position_ids / cu_seq_lens; torch_varlen is
#: PyTorch's own FlashAttention varlen kernel (torch.nn.attention.varlen, CUDA) registered in transformers'
#: AttentionInterface; flex_attention gets a block-diagonal BlockMask; sdpa a dense block-diagonal mask (the same
#: function with O(T^2) work: the CPU's data path only)
FLAT_ORDER = ("flash_attention_3", "flash_attention_2", "torch_varlen", "flex_attention", "sdpa_block_mask")


def _flat_attention(gpu: bool, prefer: list | None = None) -> tuple[list, dict]:
    """The padding-free attentions of FLAT_ORDER (or ``prefer``) that can run here, best first (the flat arm takes
    the first that also passes its probe, a forward and backward on the device) -> (names, what was tried:
    {name: "ok" or why not}); sdpa_block_mask when none."""
    import importlib.util

    import torch

    tried = {}
    for name in prefer or FLAT_ORDER:
        if name in ("flash_attention_2", "flash_attention_3"):
            mod = "flash_attn" if name.endswith("2") else "flash_attn_interface"
            if not gpu:
                tried[name] = "needs CUDA"
            elif importlib.util.find_spec(mod) is None:
                tried[name] = (f"not installed on the device image (no {mod} package; flash-attn ships no "
                               "manylinux wheel for this torch / CUDA: it must be built there, which the call's time "
                               "and offline machine rule out)")
            else:
                tried[name] = "ok"
        elif name == "torch_varlen":
            try:
                from torch.nn.attention.varlen import varlen_attn  # noqa: F401

                tried[name] = "ok" if gpu else \
                    "varlen kernel unavailable on CPU (torch.nn.attention.varlen is CUDA-only)"
            except ImportError as e:
                tried[name] = f"not in torch {torch.__version__}: {e}"
        elif name == "flex_attention":
            try:
                from torch.nn.attention.flex_attention import create_block_mask  # noqa: F401

                tried[name] = "ok" if gpu else "not tried on CPU (torch.compile of flex attention: minutes)"
            except ImportError as e:
                tried[name] = f"not in torch {torch.__version__}: {e}"
        else:
            tried[name] = "ok"
    ok = [n for n, v in tried.items() if v == "ok"]
    return ok or ["sdpa_block_mask"], tried


def _varlen_reference(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, -1),
                      enable_gqa=False):
    """torch.nn.attention.varlen.varlen_attn's function (its torch 2.13 signature) in plain torch, text by text:
    the CPU's stand-in, so that the dry run checks the flat arm's wiring through each architecture."""
    import torch

    out = torch.empty_like(query)
    causal = tuple(window_size) == (-1, 0)
    for i in range(len(cu_seq_q) - 1):
        a, b = int(cu_seq_q[i]), int(cu_seq_q[i + 1])
        q, k, v = (t[a:b].transpose(0, 1) for t in (query, key, value))  # [heads, n, D]
        if k.shape[0] != q.shape[0]:
            k, v = (t.repeat_interleave(q.shape[0] // k.shape[0], dim=0) for t in (k, v))
        out[a:b] = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                    scale=scale).transpose(0, 1)
    return out


#: what each registered varlen attention ran: {name: {"kernel": the function, "calls": n, "cast": {"q": "float32
#: -> bfloat16", ...}}}: the padding-free arm's record of the kernel that computed it
VARLEN_RAN: dict = {}


def _compute_dtype(value):
    """The dtype the attention computes in: autocast's on the tensor's device while autocast is on, else
    ``value``'s (the projections' output dtype)."""
    import torch

    dev = value.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return value.dtype


def _flex_compiled() -> bool:
    """Whether transformers' flex attention ran compiled (its singleton WrappedFlexAttention, made on the first
    call, holds a torch.compile'd flex_attention): uncompiled, flex materialises every score block and is no fair
    arm. False where this transformers has no such wrapper."""
    try:
        from transformers.integrations.flex_attention import WrappedFlexAttention
    except ImportError:
        return False
    return bool(getattr(getattr(WrappedFlexAttention, "_instance", None), "_is_flex_compiled", False))


def _register_torch_varlen(kernel=None, name: str = "jaxembed_torch_varlen") -> str:
    """transformers' AttentionInterface entry ``name``: torch.nn.attention.varlen.varlen_attn (or ``kernel``, the
    same function) on the flattened row (batch 1) with the cu_seq_lens_q / max_length_q the forward call passes
    down, causal for decoders, grouped-query heads expanded where the kernel has no enable_gqa. No attention
    dropout (the kernel has none). q / k / v are cast to the compute dtype first (autocast's): the kernel takes
    float16 / bfloat16 only, and RoPE under autocast returns float32 q / k. VARLEN_RAN[name] counts the calls."""
    import inspect

    import torch
    from transformers import AttentionInterface

    if kernel is None:
        from torch.nn.attention.varlen import varlen_attn as kernel
    varlen_attn = kernel
    params = inspect.signature(varlen_attn).parameters

    ran = VARLEN_RAN[name] = {"kernel": f"{kernel.__module__}.{kernel.__name__}", "calls": 0, "cast": {}}

    def fn(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kw):
        dtype = _compute_dtype(value)
        for role, t in (("q", query), ("k", key), ("v", value)):
            if t.dtype != dtype:  # RoPE under autocast leaves q / k in float32, which the kernel refuses
                ran["cast"][role] = f"{t.dtype} -> {dtype}".replace("torch.", "")
        q, k, v = (t[0].transpose(0, 1).to(dtype).contiguous() for t in (query, key, value))  # [T, heads, D]
        ran["calls"] += 1
        if k.shape[1] != q.shape[1] and "enable_gqa" not in params:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        causal = bool(module.is_causal if is_causal is None else is_causal)
        extra = {}
        if "enable_gqa" in params and k.shape[1] != q.shape[1]:
            extra["enable_gqa"] = True
        if "is_causal" in params:
            extra["is_causal"] = causal
        elif causal:
            extra["window_size"] = (-1, 0)
        if scaling is not None and "scale" in params:
            extra["scale"] = scaling
        cu, m = kw["cu_seq_lens_q"], int(kw["max_length_q"])
        out = varlen_attn(q, k, v, cu, cu, m, m, **extra)
        return out[None], None  # [1, T, heads, D]: what the model reshapes

    AttentionInterface.register(name, fn)
    return name


class _Flat:
    """A Hugging Face model (ST's ``model[0].auto_model``) run padding-free: every text of a step in one row
    [1, T] with positions restarting per text, mean-pooled per text (index_add over the row), the loss on the
    pooled columns. ``impl``: _flat_attention's choice; ``varlen_kernel``: torch_varlen's kernel instead of
    torch's (``_varlen_reference`` on the CPU)."""

    def __init__(self, auto, tokenizer, max_len: int, impl: str, device: str, varlen_kernel=None):
        import torch

        self.auto, self.tokenizer, self.max_len, self.impl, self.device = auto, tokenizer, max_len, impl, device
        self.causal = bool(getattr(self.auto.config, "is_decoder", False)) or \
            self.auto.config.model_type in ("qwen2", "qwen3", "llama", "mistral")
        self.hf_impl = {"torch_varlen": None, "sdpa_block_mask": "sdpa"}.get(impl, impl)
        if impl == "torch_varlen":
            self.hf_impl = _register_torch_varlen(varlen_kernel, "jaxembed_varlen_reference" if varlen_kernel
                                                  else "jaxembed_torch_varlen")
        self.saved = getattr(self.auto.config, "_attn_implementation", "sdpa")
        self.torch = torch

    def _set(self, name):
        try:
            self.auto.set_attn_implementation(name)
        except Exception:  # noqa: BLE001 -- older transformers / a registered custom name: the config field
            self.auto.config._attn_implementation = name

    def __enter__(self):
        self._set(self.hf_impl)
        return self

    def __exit__(self, *exc):
        self._set(self.saved)
        return False

    def features(self, columns: list[list[str]]) -> dict:
        """The flattened row of ``columns`` (lists of texts): input_ids / position_ids [1, T], the text of each
        token, cu_seq_lens, lengths, the column sizes."""
        torch = self.torch
        tok = self.tokenizer
        ids, sizes = [], []
        for texts in columns:
            enc = tok(list(texts), truncation=True, max_length=self.max_len, padding=False)
            ids += enc["input_ids"]
            sizes.append(len(texts))
        lengths = torch.tensor([len(x) for x in ids])
        flat = torch.tensor([t for x in ids for t in x], dtype=torch.long)
        pos = torch.cat([torch.arange(n) for n in lengths.tolist()])
        seg = torch.repeat_interleave(torch.arange(len(ids)), lengths)
        cu = torch.zeros(len(ids) + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(lengths, 0)
        f = {"input_ids": flat[None], "position_ids": pos[None], "seg": seg, "lengths": lengths, "cu": cu,
             "max_len": int(lengths.max()), "sizes": sizes}
        return {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in f.items()}

    def embed(self, f: dict) -> list:
        """Mean-pooled embeddings per column (float32)."""
        torch = self.torch
        kw = {"input_ids": f["input_ids"], "position_ids": f["position_ids"]}
        if "token_type_ids" in __import__("inspect").signature(self.auto.forward).parameters:
            kw["token_type_ids"] = torch.zeros_like(f["input_ids"])
        seg = f["seg"]
        if self.impl in ("flash_attention_2", "flash_attention_3", "torch_varlen"):
            kw.update(cu_seq_lens_q=f["cu"], cu_seq_lens_k=f["cu"], max_length_q=f["max_len"],
                      max_length_k=f["max_len"])
        elif self.impl == "flex_attention":
            from torch.nn.attention.flex_attention import create_block_mask

            causal = self.causal

            def mask_mod(b, h, q, k):
                same = seg[q] == seg[k]
                return same & (k <= q) if causal else same

            T = seg.shape[0]
            kw["attention_mask"] = create_block_mask(mask_mod, 1, None, T, T, device=seg.device)
        else:  # sdpa with a dense block-diagonal (causal) mask [1, 1, T, T]
            m = seg[:, None] == seg[None, :]
            if self.causal:
                m = m & torch.ones_like(m).tril()
            kw["attention_mask"] = m[None, None]
        h = self.auto(**kw).last_hidden_state[0].float()  # [T, hidden]
        pooled = torch.zeros(len(f["lengths"]), h.shape[-1], device=h.device).index_add_(0, seg, h)
        pooled = pooled / f["lengths"][:, None].to(h.dtype)
        return list(pooled.split(f["sizes"]))


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
    model = _st_model(folder, device)
    model.train()
    loss_fn = _st_loss_cls()(model, scale=1.0 / H.TEMPERATURE)
    opt, opt_impl = st_adamw(model, gpu)
    kind = torch.cuda.get_device_name() if gpu else "cpu"
    peak = H.peak_flops(kind, a.get("peak_flops"))
    flat_impls, tried = _flat_attention(gpu, a.get("flat_attention"))
    emit(kind="setup", tool="st", model=name, batch=B, device=kind, steps=steps, torch=torch.__version__,
         chosen_shape=info["chosen_shape"], flat_candidates=flat_impls, flat_tried=tried)
    with_tt = "token_type_ids" in inspect.signature(model[0].auto_model.forward).parameters
    amp = lambda: torch.autocast(device, dtype=torch.bfloat16, enabled=gpu)  # noqa: E731 (CPU: float32)

    def to_dev(f):  # the tensors to the device; other entries (sentence-transformers 6's "modality") as they are
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in f.items()}

    def one_step(f):  # bf16 autocast on the GPU; on the CPU (the dry run) float32: CPU autocast is very slow
        return st_step(model, loss_fn, opt, f, amp)

    flat = None  # the padding-free arm's _Flat, once one passed its probe

    def flat_step(f):  # the same step as st_step, on the flattened row
        with amp():
            loss = _st_loss(loss_fn, flat.embed(f))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    dim = int(model.get_sentence_embedding_dimension())
    lq, ld = _fixed_lengths(a, info)
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
                    ref = _Flat(model[0].auto_model, model.tokenizer, model.max_seq_length, "torch_varlen", device,
                                varlen_kernel=_varlen_reference)
                    extra["varlen_wiring"] = dict(_flat_agreement(ref, list(cols[0].values())),
                                                  kernel_ran=_kernel_ran(ref))
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
                loss, warm_s, times = _torch_time(lambda: [step_fn(f) for f in feats][-1], a["rounds"], dl, gpu)
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
                out["kernel_ran"] = _kernel_ran(flat)
            emit(kind="train", tool="st", setting=setting, model=name, **out)
        except Exception as e:  # noqa: BLE001
            emit(kind="train", tool="st", setting=setting, model=name, error=_error(e))
        finally:
            feats = None
            if gpu:
                torch.cuda.empty_cache()


def _flat_probe(model, impls: list, tried: dict, cols: list, device: str, amp, loss_fn):
    """The first of ``impls`` whose flat path runs here: its agreement with the padded forward, then a forward and
    backward of the first step (gradients dropped) -> (_Flat, agreement) or (None, None); ``tried`` says why each
    one before it failed."""
    for impl in impls:
        try:
            flat = _Flat(model[0].auto_model, model.tokenizer, model.max_seq_length, impl, device)
            agreement = _flat_agreement(flat, list(cols[0].values()))
            with flat, amp():
                loss = _st_loss(loss_fn, flat.embed(flat.features(list(cols[0].values()))))
            loss.backward()
            model.zero_grad(set_to_none=True)
            if impl == "flex_attention" and not _flex_compiled():
                raise RuntimeError("flex_attention ran without torch.compile (every score block materialised)")
            return flat, agreement
        except Exception as e:  # noqa: BLE001 -- the next one, and the record says why
            tried[impl] = "failed here: " + _error(e).strip().splitlines()[-1][:300]
            model.zero_grad(set_to_none=True)
    return None, None


def _kernel_ran(flat: _Flat) -> dict:
    """The attention kernel that computed the padding-free arm: the varlen function and its calls (with the
    casts to the compute dtype), flex attention and whether it ran compiled, or the model's own attention."""
    if flat.impl == "torch_varlen":
        return dict(VARLEN_RAN.get(flat.hf_impl, {}), cast=dict(VARLEN_RAN.get(flat.hf_impl, {}).get("cast", {})))
    if flat.impl == "flex_attention":
        return {"kernel": "torch.nn.attention.flex_attention", "compiled": _flex_compiled()}
    if flat.impl == "sdpa_block_mask":
        return {"kernel": "torch.nn.functional.scaled_dot_product_attention (dense block-diagonal mask)"}
    return {"kernel": flat.impl}


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _flat_agreement(flat: _Flat, columns: list, n: int = 8) -> dict:
    """The flat path's embeddings against the same model's padded forward (its default attention, each column
    padded to its longest text, mean pooling over the mask) on the first ``n`` texts of each column, dropout off,
    bf16 autocast on a GPU: the smallest cosine (the arm computes the same function; bf16: > 0.99)."""
    import torch

    cols = [list(t)[:n] for t in columns]
    auto = flat.auto
    was = auto.training
    auto.eval()
    gpu = str(flat.device).startswith("cuda")  # bf16 there, as the arm runs (the flash kernels take no float32)
    try:
        with torch.no_grad(), torch.autocast("cuda" if gpu else "cpu", dtype=torch.bfloat16, enabled=gpu):
            ref = []
            for c in cols:
                t = flat.tokenizer(c, truncation=True, max_length=flat.max_len, padding=True, return_tensors="pt")
                t = {k: v.to(flat.device) for k, v in t.items() if k in ("input_ids", "attention_mask")}
                h, m = auto(**t).last_hidden_state.float(), t["attention_mask"][..., None].float()
                ref.append((h * m).sum(1) / m.sum(1))
            with flat:
                got = flat.embed(flat.features(cols))
        cos = torch.nn.functional.cosine_similarity(torch.cat(ref), torch.cat(got), dim=-1)
        return {"attention": flat.impl + (" (reference kernel)" if "reference" in str(flat.hf_impl) else ""),
                "texts": int(cos.numel()), "min_cosine": float(cos.min())}
    finally:
        auto.train(was)


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

    kept: dict = {}  # (setting, B) -> its compiled program: the overhead's cached step at a size already timed

    def one(run_, B, label):
        nonlocal state
        host = H.fixed_batch(template, B, K, a["q_len"], a["d_len"], vocab)
        res = {"global_batch": B, "candidates": B * K, "setting": label}
        try:
            if (label, B) in kept:
                k = kept[(label, B)]
                state, r = _time(k["programs"], k["batches"], state, a["rounds"], dl)
                r.update(compile_s=0.0, programs=1, reused=True)
            else:
                k = kept.setdefault((label, B), {})
                state, r = _compile_and_time(run_, state, [host], a["rounds"], dl, keep=k)
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


# ------------------------------------------------------------------------------------------------ long texts


def _capacity_gib(a: dict) -> float | None:
    """The device memory the process may allocate (the allocator's bytes_limit), or a.capacity_gib (the dry run's
    stand-in on the CPU, which has no limit)."""
    import jax

    stats = jax.local_devices()[0].memory_stats() or {}
    if "bytes_limit" in stats:
        return stats["bytes_limit"] / 2**30
    return a.get("capacity_gib")


def _fit(mem: dict, batch: int, capacity: float | None) -> dict:
    """The largest global batch XLA's buffer analysis predicts to fit: the step's temporaries grow with the batch,
    its arguments (weights, optimizer state, the batch itself) mostly do not, so B x (capacity - arguments - outputs)
    / temporaries; a prediction (verified only where a record says so)."""
    if not capacity or not mem.get("xla_temp_gib"):
        return {}
    fixed = mem.get("xla_step_gib", 0.0) - mem["xla_temp_gib"]
    room = capacity - fixed
    return {"capacity_gib": capacity, "fixed_gib": fixed,
            "largest_batch_predicted": int(batch * room / mem["xla_temp_gib"]) if room > 0 else 0}


def long(a: dict) -> None:
    """Part 5: one model's train step on long documents (a.cap tokens at most, lengths drawn from the long-passage
    sample, harness.long_data_file), packed rows of each a.rows length, with each attention kernel of a.kernels
    (xla, cudnn with the row length as its segment bound as the model passes it, cudnn_bound with the batches'
    own bound, pallas, te) forced into the same model (harness.forced_attention); dropout off (the fused kernels
    have no attention dropout): step time, XLA's step buffers, the largest batch they predict, and the fastest
    kernel per row length (what model.attention=auto should take there)."""
    import jax

    from jaxembed.train import init_state

    dl = H.Deadline(a["deadline"])
    root, name, B, cap = Path(a["root"]), a["model"], int(a["batch"]), int(a["cap"])
    t0 = time.time()
    folder = H.model_folder(name, root / "models")
    data, stats = H.long_data_file(root, folder, rows=B * a["plan_steps"], cap=cap, K=2)
    c = H.run_config(folder, B, data=data, store=root / f"store_long_{name}_{cap}", max_len=cap,
                     max_query_len=a.get("query_cap", 64), dropout=False, plan_steps=a["plan_steps"], name="long")
    packed, _ = H.make_runs(c, Path(tempfile.mkdtemp(prefix=f"long_{name}_", dir=root)))
    state = init_state(packed)
    dev = _device()
    peak = H.peak_flops(dev["kind"], a.get("peak_flops"))
    capacity = _capacity_gib(a)
    emit(kind="setup", model=name, batch=B, cap=cap, device=dev, peak_flops=peak, capacity_gib=capacity,
         lengths=stats, setup_s=time.time() - t0,
         params=int(sum(x.size for x in jax.tree.leaves(state["params"]))))
    for L in a["rows"]:
        if not dl.enough(15):
            emit(kind="long", model=name, row_length=L, skipped=f"{dl.left():.0f} s left")
            continue
        try:
            run = H.with_row_length(packed, L)
            loader = H.loader_of(run, f"packed_L{L}")
            hosts = [loader.batch(s) for s in range(a["take"])]
            shapes = sorted({str([list(v.shape) for k, v in h.items() if k.endswith("input_ids")]) for h in hosts})
            bound = H.segment_bound(hosts)
            lowered, errors = {}, {}
            for k in a["kernels"]:
                kernel, m = ("cudnn", bound) if k == "cudnn_bound" else (k, None)
                try:
                    with H.forced_attention(kernel, m):
                        lowered[k] = _lower(run, state, hosts)
                except Exception as e:  # noqa: BLE001 -- a kernel that cannot run here (platform, package)
                    errors[k] = _error(e)
            comp, wall = _compile(lowered, int(a.get("compile_threads", 1)))
        except Exception as e:  # noqa: BLE001
            emit(kind="long", model=name, row_length=L, error=_error(e))
            continue
        emit(kind="rows", model=name, row_length=L, shapes=shapes, segment_bound=bound,
             compile_wall_s=wall, compile_threads=int(a.get("compile_threads", 1)))
        best = {}
        for k in a["kernels"]:
            res = {"row_length": L, "kernel": k, "shapes": shapes, "segment_bound": bound}
            if k in errors or "error" in comp.get(k, {}):
                emit(kind="long", model=name, error=errors.get(k) or comp[k]["error"], **res)
                continue
            if not dl.enough(5):
                emit(kind="long", model=name, skipped=f"{dl.left():.0f} s left", **res)
                continue
            c_ = comp[k]
            try:
                state, t = _time(c_["programs"], lowered[k]["dev"], state, a["rounds"], dl)
                t.update(compile_s=c_["compile_s"], programs=len(c_["compiled"]), **c_["memory"])
                out = _train_figures(t, run, hosts, B, peak)
                out.update(_fit(c_["memory"], B, capacity), device_peak_gib_so_far=H.jax_device_peak_gib())
                emit(kind="long", model=name, **res, **out)
                if "step_s" in out:
                    best[k] = out["step_s"]
            except Exception as e:  # noqa: BLE001 -- out of memory at this row length is a finding
                emit(kind="long", model=name, error=_error(e), **res)
        if best:
            fastest = min(best, key=best.get)
            emit(kind="choice", model=name, row_length=L, fastest=fastest, step_s=best,
                 over_xla={k: best["xla"] / v for k, v in best.items()} if "xla" in best else {})


# ------------------------------------------------------------------------------------------------ LLM at size


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
    dev = _device()
    peak = H.peak_flops(dev["kind"], a.get("peak_flops"))
    capacity = _capacity_gib(a)
    n_params = int(sum(x.size for x in jax.tree.leaves(state["params"])))
    emit(kind="setup", tool="jaxembed", model=name, mode=a["mode"], remat=bool(a.get("remat")), batch=B, chunk=chunk,
         device=dev, lengths=stats, trainable_params=n_params, setup_s=time.time() - t0, capacity_gib=capacity,
         device_peak_gib_after_init=H.jax_device_peak_gib())
    res = {"tool": "jaxembed", "model": name, "mode": a["mode"], "remat": bool(a.get("remat")), "global_batch": B,
           "chunk": chunk}
    try:
        loader = H.loader_of(packed, "packed")
        hosts = [loader.batch(s) for s in range(a["take"])]
        low = _lower(packed, state, hosts)
        comp, _ = _compile({"x": low})
        c_ = comp["x"]
        if "error" in c_:
            raise RuntimeError(c_["error"])
        state, t = _time(c_["programs"], low["dev"], state, a["rounds"], dl)
        t.update(compile_s=c_["compile_s"], programs=len(c_["compiled"]), **c_["memory"])
        out = _train_figures(t, packed, hosts, B, None)
        fl = _llm_flops(packed, hosts, lora)
        out.update(model_flops_per_round=fl, flops_convention="x3 forward (x2 LoRA), +1 with the gradient cache; "
                   "remat not counted", shapes=sorted({str([list(v.shape) for k, v in h.items()
                                                           if k.endswith("input_ids")]) for h in hosts}))
        if out.get("round_times_s"):
            tm = statistics.median(out["round_times_s"])
            out["model_tflops_per_s"] = fl / tm / 1e12
            if peak:
                out["mfu"] = fl / tm / peak
        fit = _fit(c_["memory"], chunk or B, capacity)
        if fit:
            fit["predicts"] = "queries per sub-batch (gradient cache)" if chunk else "global batch (no cache)"
        out.update(fit, device_peak_gib=H.jax_device_peak_gib())
        emit(kind="llm", **res, **out)
    except Exception as e:  # noqa: BLE001 -- out of memory is a finding
        emit(kind="llm", **res, error=_error(e))


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
        fl = _Flat(model, tok, cap, "torch_varlen", device, varlen_kernel=_varlen_reference)
        agree = _flat_agreement(fl, [[r["query"] for r in rows[:4]], [r["pos"][0] for r in rows[:4]]])
        emit(kind="wiring", tool="st", model=name, kernel_ran=_kernel_ran(fl), **agree)
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
        loss_fn = _st_loss_cls()(model, scale=1.0 / H.TEMPERATURE)
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
            loss = _st_loss(loss_fn, cols)
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
            loss, warm, times = _torch_time(lambda: step(feats), a["rounds"], dl, gpu)
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
            emit(kind="llm", **res, error=_error(e))
            break
        finally:
            feats = None
            opt.zero_grad(set_to_none=True)
            if gpu:
                torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------ plumbing


def _prepare_one(args) -> tuple[str, float]:
    root, name = args
    t0 = time.time()
    H.model_folder(name, Path(root) / "models")
    return name, time.time() - t0


def prepare(a: dict) -> None:
    """The call's model folders (random weights of real configs, built on the CPU) and the natural data file,
    a.processes at a time: run beside the smoke step on the device machine's 16 cores, so that part 2's workers
    find them built."""
    root = Path(a["root"])
    t0 = time.time()
    H.natural_data_file(root)
    names = list(dict.fromkeys(a["models"]))
    if int(a.get("processes", 0)) > 1 and len(names) > 1:
        import concurrent.futures as cf
        import multiprocessing as mp

        with cf.ProcessPoolExecutor(min(int(a["processes"]), len(names)), mp_context=mp.get_context("spawn")) as ex:
            done = dict(ex.map(_prepare_one, [(str(root), n) for n in names]))
    else:
        done = dict(_prepare_one((str(root), n)) for n in names)
    emit(kind="prepare", seconds=time.time() - t0, models=done)


def serve() -> None:
    """The dry run's one worker process (bench.py's Workers(shared=True)): jobs from stdin, one JSON line each
    ({"name", "payload", "log", "env"}); each job's output, RESULT lines included, goes to its log file, which ends
    with "JOB_END <rc>". One process instead of one per job: the imports (torch's above all) happen once."""
    import os

    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        os.environ.update(job.get("env") or {})
        sys.stdout.flush()
        sys.stderr.flush()
        fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        saved = os.dup(1), os.dup(2)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        rc = 0
        try:
            WORKERS[job["name"]](job["payload"])
        except BaseException as e:  # noqa: BLE001 -- the job's failure, not the server's
            emit(kind="fatal", error=_error(e))
            rc = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            print(f"JOB_END {rc}", flush=True)
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for x in (fd, *saved):
                os.close(x)


WORKERS = {"smoke": smoke, "train_jax": train_jax, "train_st": train_st, "batch": batch, "encode": encode,
           "long": long, "llm_jax": llm_jax, "llm_st": llm_st, "prepare": prepare}


def main(name: str, payload: str) -> None:
    if name == "serve":
        return serve()
    try:
        WORKERS[name](json.loads(payload))
    except Exception as e:  # noqa: BLE001 -- the parent reads this line; the exit status says it too
        emit(kind="fatal", error=_error(e))
        sys.exit(1)
