"""The jaxembed arms: the smoke step, part 2's train step (fixed-length control, packed, padded; compiled side by
side, profiled), part 3's largest global batch with the gradient cache, and part 5's long documents under
each attention kernel.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import harness as H
from timing import (FIXED_STEPS, JAX_OPTIMIZER, compile_and_time, compile_programs, device_info, emit,
                    error_text, fixed_lengths, lower_steps, profile_step, time_rounds, train_figures)


def smoke(a: dict) -> None:
    """Versions and devices, then one bf16 train step of a tiny BERT (a fixed batch of 8 queries, a plan of
    a.plan_steps steps: in the dry run, the very program of part 2's padded and fixed settings, which then come
    from the compilation cache) through the harness."""
    emit(kind="versions", versions=H.versions(), device=device_info())
    root = Path(a["root"])
    from jaxembed.train import init_state

    t0 = time.time()
    folder = H.model_folder("tiny-bert", root / "models")
    c = H.run_config(folder, 8, data=H.natural_data_file(root), store=root / "store_k2", plan_steps=a["plan_steps"])
    _, padded = H.make_runs(c, Path(tempfile.mkdtemp(prefix="smoke_", dir=root)))
    loader = H.loader_of(padded, "padded")
    steps, info = H.choose_steps(loader, min(a["look"], padded.plan.steps), a["take"])
    lq, ld = fixed_lengths(a, info)
    host = H.fixed_batch(loader.batch(steps[0]), 8, padded.K, lq, ld, 30522)
    state = init_state(padded)
    _, res = compile_and_time(padded, state, [host], 1, H.Deadline(time.time() + 60))
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
    dev = device_info()
    peak = H.peak_flops(dev["kind"], a.get("peak_flops"))
    emit(kind="setup", model=name, batch=B, device=dev, peak_flops=peak, steps=steps, model_build_s=build_s,
         setup_s=time.time() - t0, params=int(sum(x.size for x in jax.tree.leaves(state["params"]))), **info)
    lq, ld = fixed_lengths(a, info)
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
                lowered[setting] = lower_steps(run, state, hosts)
            except Exception as e:  # noqa: BLE001 -- one setting's failure is a figure too
                emit(kind="train", tool="jaxembed", setting=setting, model=name, error=error_text(e))
        comp, wall = compile_programs(lowered, int(a.get("compile_threads", 1)))
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
                state, res = time_rounds(c_["programs"], low["dev"], state, a["rounds"], dl)
                res.update(compile_s=c_["compile_s"], programs=len(c_["compiled"]), **c_["memory"])
                out = train_figures(res, run, hosts, B, peak)
                out["device_peak_gib_so_far"] = H.jax_device_peak_gib()
                out["optimizer"] = JAX_OPTIMIZER
                if setting == "fixed":
                    out.update(q_len=lq, d_len=ld)
                else:
                    out["shapes"] = sorted({str([list(v.shape) for k, v in h.items() if k.endswith("input_ids")])
                                            for h in hosts})
                emit(kind="train", tool="jaxembed", setting=setting, model=name, **out)
                if setting in a.get("profile", ()) and dl.enough(10):
                    state, prof = profile_step(c_["programs"], low["dev"], state,
                                           root / "profiles" / f"{name}_{setting}")
                    emit(kind="profile", tool="jaxembed", setting=setting, model=name, **prof)
            except Exception as e:  # noqa: BLE001 -- one setting's failure (out of memory) is a figure too
                emit(kind="train", tool="jaxembed", setting=setting, model=name, error=error_text(e))


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
    dev = device_info()
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
                state, r = time_rounds(k["programs"], k["batches"], state, a["rounds"], dl)
                r.update(compile_s=0.0, programs=1, reused=True)
            else:
                k = kept.setdefault((label, B), {})
                state, r = compile_and_time(run_, state, [host], a["rounds"], dl, keep=k)
            res.update(train_figures(r, run_, [host], B, peak, cached=label == "cached"))
            res["device_peak_gib_so_far"] = H.jax_device_peak_gib()
        except Exception as e:  # noqa: BLE001 -- out of memory ends the search at this size
            res["error"] = error_text(e)
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




# ------------------------------------------------------------------------------------------------ long texts


def capacity_gib(a: dict) -> float | None:
    """The device memory the process may allocate (the allocator's bytes_limit), or a.capacity_gib (the dry run's
    stand-in on the CPU, which has no limit)."""
    import jax

    stats = jax.local_devices()[0].memory_stats() or {}
    if "bytes_limit" in stats:
        return stats["bytes_limit"] / 2**30
    return a.get("capacity_gib")


def fit_batch(mem: dict, batch: int, capacity: float | None) -> dict:
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
    dev = device_info()
    peak = H.peak_flops(dev["kind"], a.get("peak_flops"))
    capacity = capacity_gib(a)
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
                        lowered[k] = lower_steps(run, state, hosts)
                except Exception as e:  # noqa: BLE001 -- a kernel that cannot run here (platform, package)
                    errors[k] = error_text(e)
            comp, wall = compile_programs(lowered, int(a.get("compile_threads", 1)))
        except Exception as e:  # noqa: BLE001
            emit(kind="long", model=name, row_length=L, error=error_text(e))
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
                state, t = time_rounds(c_["programs"], lowered[k]["dev"], state, a["rounds"], dl)
                t.update(compile_s=c_["compile_s"], programs=len(c_["compiled"]), **c_["memory"])
                out = train_figures(t, run, hosts, B, peak)
                out.update(fit_batch(c_["memory"], B, capacity), device_peak_gib_so_far=H.jax_device_peak_gib())
                emit(kind="long", model=name, **res, **out)
                if "step_s" in out:
                    best[k] = out["step_s"]
            except Exception as e:  # noqa: BLE001 -- out of memory at this row length is a finding
                emit(kind="long", model=name, error=error_text(e), **res)
        if best:
            fastest = min(best, key=best.get)
            emit(kind="choice", model=name, row_length=L, fastest=fastest, step_s=best,
                 over_xla={k: best["xla"] / v for k, v in best.items()} if "xla" in best else {})
