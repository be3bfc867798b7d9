"""The training loop (``train``): the loader, the jitted step, checkpoints, logging, the dev evaluation, stop
signals, the summary and the run's export. What it runs is set up by jaxembed.train.run; the package docstring
(jaxembed/train/__init__.py) has the whole flow."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import jax
from flax import nnx

from jaxembed import config as cfglib
from jaxembed import atomic_files, parallel, pod
from jaxembed.runs import compile_cache
from jaxembed.errors import UserError
from jaxembed.runs.checkpoints import Checkpointer
from jaxembed.train.export import export_params, host_params
from jaxembed.train.metrics import best_step, dev_scores, host_metrics, step_flops
from jaxembed.run_facts import export_line, skipped_note
from jaxembed.runs.monitor import Monitor, batch_shapes
from jaxembed.train.run import Run, export_dir, params_at, setup
from jaxembed.train.state import init_state, step_table
from jaxembed.runs.signals import Interrupted, StopSignals
from jaxembed.train.step import make_train_step
from jaxembed.runs.rundir import RunDir, rundir
from jaxembed.runs.workdir_lock import WorkdirLock

log = logging.getLogger(__name__)


class TrainingStopped(UserError):
    """The run stopped on purpose (non-finite steps); the message names step and task."""


def dev_eval_due(step: int, every: int, total: int) -> bool:
    """Whether the dev evaluation runs after ``step`` (of ``total``): every ``every`` steps and at the last step;
    ``every = 0``: at the last step only (``eval.every``)."""
    return bool((every and step % every == 0) or step == total)


def _eval_logged(rd: RunDir, step: int) -> bool:
    """Whether metrics.jsonl holds the dev evaluation of ``step`` (a stop during it leaves none)."""
    from jaxembed.run_facts import eval_records

    return any(r["step"] == step for r in eval_records(rd))


def train(config, workdir: str | Path | RunDir) -> dict:
    """Run (or resume) training; returns a summary dict. Raises UserError for bad input before any work."""
    t_begin = time.time()
    rd = rundir(workdir)  # the run directory's layout, derived once and passed on
    lock = WorkdirLock(rd)
    try:
        return _train(config, rd, lock, t_begin)
    finally:
        lock.release()


def _train(config, rd: RunDir, lock: WorkdirLock, t_begin: float) -> dict:
    run = setup(config, rd, lock=lock)
    c = run.config
    workdir = rd.root
    cache_dir = compile_cache.use_for_run(rd, c.train.compile_cache)
    is_main = pod.is_main()
    multi = pod.process_count() > 1
    ckpt = Checkpointer(rd.checkpoints, keep_last=c.train.keep_checkpoints,
                        best_metric=c.eval.best_metric, best_mode=c.eval.best_mode,
                        async_save=c.train.async_checkpoints)
    notes: list[str] = []
    monitor = None
    try:
        state = init_state(run)
        start, state = ckpt.restore_latest(state, say=notes.append)
        if start:
            log.info("resumed from %s at step %d", rd.checkpoints, start)
        total = run.plan.steps
        monitor = Monitor(rd, total, start, progress=c.train.progress, is_main=is_main,
                          wandb=c.train.get("wandb"), run_config=cfglib.to_plain(c))
        for n in notes:
            monitor.message(n)
        if monitor.torn:
            monitor.message(f"{rd.metrics_jsonl}: cut off a line torn by a stopped run")
        if start:
            monitor.message(f"resuming at step {start} of {total} from {rd.checkpoints}")
        else:
            monitor.message(f"run directory: {workdir} (a new run; the same command resumes it)")
        step_fn = make_train_step(run)
        from jaxembed.data.pipeline import STEP_TABLE_FILE, batch_stats, make_loader, to_global

        # pow2: fewer padded shapes, fewer compilations, a little more padding
        table = step_table(run, rd.step_tables / STEP_TABLE_FILE, c.train.length_buckets)
        if start < total:  # the first window of the table: every process computes (or reads) it, each its share
            w = start // table.window_steps
            if not table.cached(w):
                a, b = table.steps_of(w)
                monitor.message(f"plan: tokenising the texts of steps {a}-{b - 1} for the length table (the loader "
                                f"does each later window of {table.window_steps} steps as it reaches it)")

            def first_window():
                with atomic_files.writing("writing the length table", table.cache):
                    table.window(w)

            pod.all_agree("lengths", first_window)
        loader = make_loader(run.store, run.plan, run.loaded.tokenizer, process_index=jax.process_index(),
                             process_count=jax.process_count(), start_step=start, workers=c.train.loader_workers,
                             num_candidates=run.K, packing=run.packing, step_table=table)
        rows_sharding = parallel.batch_sharding(run.mesh)
        evaluator = make_evaluator(run)
    except BaseException:  # set-up failed: close what was opened (Orbax's threads, the metrics file)
        ckpt.close()
        if monitor is not None:
            monitor.close()
        raise
    eval_due = lambda s: evaluator is not None and dev_eval_due(s, int(c.eval.every), total)
    pending, flops_per_step = [], []
    consecutive, first_bad = 0, None
    last_save_time = time.time()
    t_interval = time.time()
    status = "completed"
    metric = c.eval.best_metric
    scores = dev_scores(rd, metric) if metric and is_main else {}  # every invocation's dev evaluations
    step = start
    stopped_in = ""  # where a stop signal arrived, for the message

    def evaluate_at(at: int, sig) -> dict | None:
        """The dev metrics at step ``at`` (logged, ``scores`` updated); None when a stop signal interrupted it."""
        try:
            with sig.interruptible():
                metrics = evaluator(state["params"])
        except Interrupted:
            return None
        monitor.log(at, metrics, prefix="eval")
        value = metrics.get(metric) if metric else None
        if value is None and metric:
            raise UserError(f"config.eval.best_metric = {metric!r} is not among the dev "
                            f"metrics: {', '.join(sorted(metrics))}")
        if value is not None and math.isfinite(value):
            scores[at] = float(value)
        return metrics

    summary: dict = {}
    try:
        with StopSignals(multi) as sig:
            if evaluator and c.eval.before and start == 0 and not _eval_logged(rd, 0):
                if evaluate_at(0, sig) is None:
                    status, stopped_in = "preempted", "the dev evaluation before training"
            elif start and eval_due(start) and not _eval_logged(rd, start):
                # the evaluation of the checkpoint's step was stopped by a signal: run it now
                if evaluate_at(start, sig) is None:
                    status, stopped_in = "preempted", f"the dev evaluation at step {start}"
            if status == "preempted":
                monitor.message(f"signal {sig.received} during {stopped_in}: stopped before any training step, "
                                "the checkpoints are as they were; run the same command to resume")
            if status == "completed" and start < total:
                monitor.message(f"training: steps {start + 1}-{total}; compiling the train step first (the first "
                                "step of each new batch shape takes longer)")
            with loader:
                for step in range(start, total if status == "completed" else start):
                    host_batch = next(loader)
                    batch = to_global(host_batch, rows_sharding)
                    # a step of a new shape compiles: the progress line times it apart (waiting on the step before)
                    one_task = run.routes is not None and bool(run.plan.task_ids[step] >= 0)  # MoTE's other path
                    monitor.before_step(batch_shapes(host_batch, one_task), None if step == start else m)
                    if step == start:  # this call compiles the step (its dispatch returns at once)
                        t_call, hits0 = time.time(), compile_cache.hits()
                    if run.routes is not None:  # MoTE: a one-task batch takes the one-expert-per-call path
                        state, m = step_fn(state, batch, single_task=bool(run.plan.task_ids[step] >= 0))
                    else:
                        state, m = step_fn(state, batch)
                    if step == start:
                        monitor.message(_compiled_message(time.time() - t_call, compile_cache.hits() > hits0,
                                                          cache_dir))
                    hs = batch_stats(host_batch, loader.batcher.shards if run.packing is not None else 1)
                    hs["task"] = int(run.plan.task_ids[step]) if hasattr(run.plan, "task_ids") else -1
                    pending.append((step, m, hs))
                    flops_per_step.append(step_flops(run, host_batch))
                    monitor.advance(result=m)
                    done = step + 1
                    last = done == total
                    if done % c.train.log_every == 0 or last or sig.received is not None:
                        metrics, rows = host_metrics(pending, run, t_interval, flops_per_step)
                        monitor.log(done, metrics)
                        for s, ok, h in rows:
                            if ok:
                                consecutive, first_bad = 0, None
                                continue
                            consecutive += 1
                            first_bad = s if first_bad is None else first_bad
                            if c.train.max_nonfinite and consecutive >= c.train.max_nonfinite:
                                raise TrainingStopped(_nonfinite_message(run, s, first_bad, consecutive, h["task"]))
                        pending, flops_per_step = [], []
                        t_interval = time.time()
                    eval_metrics = None
                    if eval_due(done):
                        eval_metrics = evaluate_at(done, sig)
                        if eval_metrics is None:
                            stopped_in = f"the dev evaluation at step {done}"
                        t_interval = time.time()
                    due = (c.train.checkpoint_every and done % c.train.checkpoint_every == 0) or last or (
                        c.train.checkpoint_minutes and time.time() - last_save_time >= 60 * c.train.checkpoint_minutes)
                    # a new best dev step between checkpoint steps is saved too, so the best is always exportable
                    due = due or (eval_metrics is not None and best_step(scores, c.eval.best_mode) == done)
                    stop = sig.stop_at(done)
                    if due or stop:
                        ckpt.save(done, state, eval_metrics)
                        last_save_time = time.time()
                    if stop:
                        status = "preempted"
                        ckpt.wait()
                        where = f" during {stopped_in}" if stopped_in else ""
                        monitor.message(f"signal {sig.received}{where}: checkpoint saved at step {done}; run the "
                                        "same command to resume" + (" (the evaluation runs again then)"
                                                                    if stopped_in else ""))
                        break
            ckpt.wait()
            best = best_step(scores, c.eval.best_mode)
            summary = {"status": status, "step": int(jax.device_get(state["step"])),
                       "skipped": int(jax.device_get(state["skipped"])), "workdir": str(workdir), "best_step": best}
            note = skipped_note(summary["skipped"], summary["step"])
            if note:  # said at the end, in summary.json and in the export's model card
                summary["warnings"] = [note]
                monitor.message(f"warning: {note}")
            if scores:
                summary["dev"] = _dev_summary(metric, scores, best)
                worse = _worse_than_start(summary["dev"], c.eval.best_mode)
                if worse:
                    monitor.message(worse + f" (export it: jaxembed export --workdir {workdir} --step best --out DIR)")
            if is_main:  # training time (every run on this workdir), devices, the last dev evaluation (for the card)
                from jaxembed.run_facts import summary_facts

                summary.update(summary_facts(rd, t_begin))
            if status == "completed" and c.export.at_end:
                out_dir = export_dir(c, rd)
                at = summary["step"]
                if c.export.step == "best" and best is not None and best != at:
                    at = best
                    monitor.message(f"export.step = 'best': exporting step {best} ({metric} {scores[best]:.4g}), "
                                    f"not the last step {summary['step']}")
                    params = host_params(params_at(run, ckpt, best, like=state))
                else:
                    params = host_params(state["params"])  # every process (a collective), then process 0 writes

                def write_export():
                    with sig.interruptible(), atomic_files.writing(
                            "writing the export", out_dir,
                            fix=f"run the same command again to write the export (training is complete, "
                                f"checkpoint {summary['step']} is saved)"):
                        return export_params(run, params, out_dir, summary=summary, step=at)

                try:
                    pod.main_first("export", write_export)
                    summary["export"] = str(out_dir)
                    monitor.message(export_line(out_dir, at, rd, metric))
                except Interrupted as e:
                    summary["status"] = "preempted"
                    monitor.message(f"signal {e.signum} during the export: stopped, nothing half-written (the "
                                    f"export is written as a whole); checkpoint {summary['step']} is saved; run the "
                                    "same command to write the export")
            monitor.record_summary(summary)
    finally:
        ckpt.close()
        monitor.close()
    if is_main:
        with atomic_files.writing("writing the summary", rd.summary_json):
            atomic_files.write_json(rd.summary_json, summary)
    pod.barrier("train-end")  # no process leaves while process 0 still writes
    return summary


def _dev_summary(metric: str, scores: dict[int, float], best: int | None) -> dict:
    """The dev metric at the start (step 0, when evaluated), at its best step and at the last evaluation."""
    last = max(scores)
    out = {"metric": metric, "best_step": best, "best": scores.get(best), "last_step": last, "last": scores[last]}
    if 0 in scores:
        out["start"] = scores[0]
    return out


def _worse_than_start(dev: dict, mode: str) -> str:
    """A plain sentence when training left the dev metric worse than the model it started from, else ''."""
    start, last = dev.get("start"), dev["last"]
    if start is None or dev["last_step"] == 0 or not (last < start if mode == "max" else last > start):
        return ""
    best = "the starting model (step 0)" if dev["best_step"] == 0 else f"step {dev['best_step']}"
    return (f"dev {dev['metric']}: {start:.4g} before training, {last:.4g} at step {dev['last_step']}: training made "
            f"it worse; the best is {best} ({dev['best']:.4g})")


def _compiled_message(seconds: float, hit: bool, cache_dir: Path | None) -> str:
    """What the first step's call said about the train step's program: compiled, or loaded from the cache."""
    if hit:
        return f"train step: loaded from the compilation cache {cache_dir} in {seconds:.1f}s"
    kept = cache_dir is not None and seconds >= jax.config.jax_persistent_cache_min_compile_time_secs
    return f"train step: compiled in {seconds:.1f}s" + (f" (kept in {cache_dir})" if kept else "")


def _nonfinite_message(run: Run, step: int, first: int, count: int, task: int) -> str:
    names = getattr(run.plan, "task_names", None)
    task_name = names[task] if names is not None and 0 <= task < len(names) else "mixed"
    return (f"step {step}: {count} non-finite losses or gradients in a row (from step {first}; task "
            f"'{task_name}'); the updates were skipped. Fix: lower optim.lr or raise loss.temperature, use "
            "model.dtype=float32, or check that task's data")


def make_evaluator(run: Run):
    """A callable params -> {"Task/metric": value} on the configured dev tasks, or None."""
    c = run.config
    if not c.eval.tasks:
        return None
    from jaxembed.encode import Encoder
    from jaxembed.evaluate.dev import DevEvaluator

    # registered names, the user's own sets, mteb:NAME: every set is read now, before the first training step
    dev = DevEvaluator(c.eval.tasks, max_examples=c.eval.max_examples or None)
    enc = Encoder(run.loaded.model, run.loaded.tokenizer, run.loaded.st.prompts)  # compiled once, weights swapped

    def evaluator(params):
        enc.set_model(nnx.merge(run.graphdef, params, run.rest))
        res = dev(enc)
        return {f"{task}/{k}": float(v) for task, scores in res.items() for k, v in scores.items()
                if isinstance(v, (int, float))}

    return evaluator
