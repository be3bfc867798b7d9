"""The timing every worker shares: a ``RESULT`` line per figure (``emit``), the device and an error's one-line
form, jaxembed's train step lowered and compiled ahead of time (several programs side by side), warm-up +
timed rounds for JAX and for PyTorch, a profile of one step, and the figures of a timed arm (examples/s,
real tokens/s, MFU).
"""

from __future__ import annotations

import functools
import json
import statistics
import time
import traceback
from pathlib import Path

import numpy as np

import harness as H
from kernel_trace import kernel_categories, kernel_summary


def emit(**kw) -> None:
    print("RESULT " + json.dumps(kw, default=float), flush=True)


def device_info() -> dict:
    import jax

    d = jax.devices()[0]
    return {"platform": d.platform, "kind": d.device_kind, "count": jax.device_count()}


def error_text(e: BaseException) -> str:
    """The last frames and the message, the message's own first line last (JAX's note on filtered frames left
    out): what a record's one-line summary shows."""
    frames = traceback.format_tb(e.__traceback__)[-2:]
    msg = [x for x in "".join(traceback.format_exception_only(type(e), e)).strip().splitlines()
           if x.strip() and not x.startswith(("For simplicity, JAX", "-----"))]
    return ("".join(frames) + "\n".join(msg[1:] + msg[:1]))[-1500:]


def _shape(b) -> tuple:
    return tuple(sorted((k, tuple(v.shape)) for k, v in b.items()))


def lower_steps(run, state, hosts: list[dict]) -> dict:
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


def compile_programs(jobs: dict, threads: int = 1) -> tuple[dict, float]:
    """Compile every lowered program of ``jobs`` ({name: lower_steps's dict}), ``threads`` at a time (XLA compiles
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
            o["error"] = error_text(c)
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
#: jaxembed's optimizer as the record names it (jaxembed.runs.optim: optax's AdamW, compiled into the step)
JAX_OPTIMIZER = "optax.adamw (jaxembed.runs.optim, inside the compiled train step)"


def time_rounds(progs: list, dev: list, state, rounds: int, dl: H.Deadline, sync_each: bool = False):
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


def torch_time(round_fn, rounds: int, dl: H.Deadline, gpu: bool):
    """PyTorch's side of ``time_rounds``: one warm-up round of ``round_fn`` (-> its last loss), then ``rounds`` timed
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


def compile_and_time(run, state, hosts: list[dict], rounds: int, dl: H.Deadline, sync_each: bool = False,
                      keep: dict | None = None):
    """Compile the run's step for each distinct shape of ``hosts`` (ahead of time), run them once (warm-up), then
    ``rounds`` timed rounds over all of them. -> (state, figures). ``keep``: a dict that receives the compiled
    program of each batch ("programs") and the device batches ("batches"), for a caller that runs them again
    (benchmarks/gpu/diag.py)."""
    low = lower_steps(run, state, hosts)
    comp, _ = compile_programs({"x": low})
    c = comp["x"]
    if "error" in c:
        raise RuntimeError(c["error"])
    if keep is not None:
        keep.update(programs=c["programs"], batches=low["dev"])
    state, t = time_rounds(c["programs"], low["dev"], state, rounds, dl, sync_each)
    return state, dict(t, compile_s=c["compile_s"], programs=len(c["compiled"]), **c["memory"])


def profile_step(progs: list, dev: list, state, folder: Path, steps: int = 1):
    """One profiler trace of the first ``steps`` programs -> (state, {"top": the 15 costliest kernels,
    "categories": share of kernel time per kind of kernel (kernel_trace.KERNEL_CATEGORIES), "total_ms"}), from
    benchmarks/gpu/diag.py's kernel summary."""
    import jax

    folder.mkdir(parents=True, exist_ok=True)
    jax.profiler.start_trace(str(folder), create_perfetto_trace=True)
    try:
        for p, b in list(zip(progs, dev))[:steps]:
            state, m = p(state, b)
        jax.block_until_ready(m["loss"])
    finally:
        jax.profiler.stop_trace()
    ks = kernel_summary(folder, top=100_000)
    if "error" in ks:
        return state, {"error": ks["error"]}
    top = [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in x.items()} for x in ks["kernels"][:15]]
    return state, {"steps": min(steps, len(progs)), "total_ms": ks["total_us"] / 1e3, "processes": ks["processes"],
                   "categories": kernel_categories(ks), "top": top}


def train_figures(res: dict, run, hosts: list[dict], B: int, peak: float | None, cached: bool = False) -> dict:
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


def fixed_lengths(a: dict, info: dict) -> tuple[int, int]:
    """The fixed batch's query / document lengths: a.q_len / a.d_len, or with "auto" (the dry run) the natural
    steps' padded shape, so that the padded and the fixed settings (and the smoke step) run one program."""
    if a["q_len"] == "auto":
        return int(info["chosen_shape"][0]), int(info["chosen_shape"][1])
    return int(a["q_len"]), int(a["d_len"])
