"""The training loop (``train``): the loader, the jitted step, checkpoints, logging, the dev evaluation, stop
signals, the summary and the run's export. What it runs is set up by jaxembed.train.run; the package docstring
(jaxembed/train/__init__.py) has the whole flow.

Read top to bottom: ``_train`` is the loop in the order things happen (start or resume, then per step: batch,
step, metrics, dev evaluation, checkpoint, stop signal; at the end: the last checkpoint, the summary, the export).
What it carries from step to step is one ``LoopState``; the parts it runs are one ``Parts``. Each feature's branch
is in that feature's helper below it (MoTE's one-task batches: ``mote_step_args``; packed rows: ``host_stats``;
skipped updates: ``check_nonfinite``; ...), not in the loop.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import Any, Callable

import jax
from flax import nnx

from jaxembed import config as cfglib
from jaxembed import parallel, pod
from jaxembed.runs import atomic_files
from jaxembed.runs import compile_cache
from jaxembed.errors import UserError
from jaxembed.runs.checkpoints import Checkpointer
from jaxembed.train.export import export_params, host_params
from jaxembed.train.metrics import best_step, dev_scores, host_metrics, step_flops
from jaxembed.runs.facts import export_line, skipped_note
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
    from jaxembed.runs.facts import eval_records

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


@dataclasses.dataclass
class Parts:
    """What the loop runs, made once at the start: the run, its checkpointer, monitor, step, loader, dev evaluator
    (None without eval.tasks), the steps (``start``: the restored checkpoint's, 0 for a new run) and the stop
    signals (set when the loop enters them)."""

    run: Run
    rd: RunDir
    ckpt: Checkpointer
    monitor: Monitor
    step_fn: Callable
    loader: Any
    rows_sharding: Any
    evaluator: Callable | None
    cache_dir: Path | None
    start: int
    total: int
    scores: dict  # step -> the dev metric (eval.best_metric) of every evaluation of this run directory
    sig: Any = None


@dataclasses.dataclass
class LoopState:
    """What the loop carries from step to step: the train state, the steps since the last metrics line
    (``pending``: (step, metrics, host stats); ``flops``), the non-finite steps in a row, the times of the last
    checkpoint and metrics line, the previous step's metrics (the progress line waits on them), and whether a stop
    signal ended the run (``stopped_in``: where it arrived, for the message)."""

    state: dict
    last_save: float
    t_interval: float
    pending: list = dataclasses.field(default_factory=list)
    flops: list = dataclasses.field(default_factory=list)
    consecutive: int = 0
    first_bad: int | None = None
    previous: Any = None
    preempted: bool = False
    stopped_in: str = ""


def _train(config, rd: RunDir, lock: WorkdirLock, t_begin: float) -> dict:
    run = setup(config, rd, lock=lock)
    p, state = start_parts(run, rd)
    now = time.time()
    ls = LoopState(state, last_save=now, t_interval=now)
    summary: dict = {}
    try:
        with StopSignals(pod.process_count() > 1) as sig:
            p.sig = sig
            evaluate_first(p, ls)
            if not ls.preempted and p.start < p.total:
                p.monitor.message(f"training: steps {p.start + 1}-{p.total}; compiling the train step first (the "
                                  "first step of each new batch shape takes longer)")
            with p.loader:
                for step in range(p.start, p.total if not ls.preempted else p.start):
                    run_step(p, ls, step)
                    done = step + 1
                    if log_due(p, done):
                        log_metrics(p, ls, done)
                    eval_metrics = evaluate_due(p, ls, done)
                    due = checkpoint_due(p, ls, done, eval_metrics)
                    stop = p.sig.stop_at(done)
                    if due or stop:
                        p.ckpt.save(done, ls.state, eval_metrics)
                        ls.last_save = time.time()
                    if stop:
                        stop_on_signal(p, ls, done)
                        break
            p.ckpt.wait()
            summary = end_summary(p, ls, t_begin)
            if not ls.preempted and run.config.export.at_end:
                export_at_end(p, ls, summary)
            p.monitor.record_summary(summary)
    finally:
        p.ckpt.close()
        p.monitor.close()
    if pod.is_main():
        with atomic_files.writing("writing the summary", rd.summary_json):
            atomic_files.write_json(rd.summary_json, summary)
    pod.barrier("train-end")  # no process leaves while process 0 still writes
    return summary


# --- the start: resume, monitor, step, loader, dev evaluator ------------------------------------------------------


def start_parts(run: Run, rd: RunDir) -> tuple[Parts, dict]:
    """The loop's Parts and the train state (restored from the latest checkpoint, if any); what was opened is
    closed again when a part fails (Orbax's threads, the metrics file)."""
    c = run.config
    cache_dir = compile_cache.use_for_run(rd, c.train.compile_cache)
    ckpt = Checkpointer(rd.checkpoints, keep_last=c.train.keep_checkpoints,
                        best_metric=c.eval.best_metric, best_mode=c.eval.best_mode,
                        async_save=c.train.async_checkpoints)
    monitor = None
    try:
        start, state, monitor = resume(run, rd, ckpt)
        step_fn = make_train_step(run)
        loader = make_run_loader(run, rd, start, monitor)
        parts = Parts(run, rd, ckpt, monitor, step_fn, loader, parallel.batch_sharding(run.mesh),
                      make_evaluator(run), cache_dir, start, run.plan.steps, {})
    except BaseException:
        ckpt.close()
        if monitor is not None:
            monitor.close()
        raise
    metric = c.eval.best_metric
    parts.scores = dev_scores(rd, metric) if metric and pod.is_main() else {}  # every invocation's evaluations
    return parts, state


def resume(run: Run, rd: RunDir, ckpt: Checkpointer) -> tuple[int, dict, Monitor]:
    """(the first step, the train state, the monitor): the latest checkpoint restored, else a new state; the
    monitor says which, and what the restore found."""
    c = run.config
    notes: list[str] = []
    state = init_state(run)
    start, state = ckpt.restore_latest(state, say=notes.append)
    if start:
        log.info("resumed from %s at step %d", rd.checkpoints, start)
    total = run.plan.steps
    monitor = Monitor(rd, total, start, progress=c.train.progress, is_main=pod.is_main(),
                      wandb=c.train.get("wandb"), run_config=cfglib.to_plain(c))
    try:
        for n in notes:
            monitor.message(n)
        if monitor.torn:
            monitor.message(f"{rd.metrics_jsonl}: cut off a line torn by a stopped run")
        if start:
            monitor.message(f"resuming at step {start} of {total} from {rd.checkpoints}")
        else:
            monitor.message(f"run directory: {rd.root} (a new run; the same command resumes it)")
    except BaseException:
        monitor.close()
        raise
    return start, state, monitor


def make_run_loader(run: Run, rd: RunDir, start: int, monitor: Monitor):
    """The run's loader from step ``start``, with the table of step shapes (packed rows, length buckets): its
    first window computed now by every process (each its share), the later ones as the loader reaches them."""
    from jaxembed.data.pipeline import STEP_TABLE_FILE, make_loader

    c = run.config
    # pow2: fewer padded shapes, fewer compilations, a little more padding
    table = step_table(run, rd.step_tables / STEP_TABLE_FILE, c.train.length_buckets)
    if start < run.plan.steps:
        w = start // table.window_steps
        if not table.cached(w):
            a, b = table.steps_of(w)
            monitor.message(f"plan: tokenising the texts of steps {a}-{b - 1} for the length table (the loader "
                            f"does each later window of {table.window_steps} steps as it reaches it)")

        def first_window():
            with atomic_files.writing("writing the length table", table.cache):
                table.window(w)

        pod.all_agree("lengths", first_window)
    return make_loader(run.store, run.plan, run.loaded.tokenizer, process_index=jax.process_index(),
                       process_count=jax.process_count(), start_step=start, workers=c.train.loader_workers,
                       num_candidates=run.K, packing=run.packing, step_table=table)


# --- one step: batch, step, metrics ----------------------------------------------------------------------------


def mote_step_args(run: Run, step: int) -> dict:
    """MoTE: a one-task batch takes the one-expert-per-call path (``single_task``, a static argument of the step:
    its own program); {} for a run without task experts."""
    if run.routes is None:
        return {}
    return {"single_task": bool(run.plan.task_ids[step] >= 0)}


def run_step(p: Parts, ls: LoopState, step: int) -> None:
    """Step ``step``: its batch from the loader, placed on the mesh, through the train step; its metrics and host
    figures kept for the next metrics line. The first call compiles the step (its dispatch returns at once): the
    progress line times a step of a new shape apart, waiting on the step before."""
    from jaxembed.data.pipeline import to_global

    host_batch = next(p.loader)
    batch = to_global(host_batch, p.rows_sharding)
    args = mote_step_args(p.run, step)
    p.monitor.before_step(batch_shapes(host_batch, args.get("single_task", False)), ls.previous)
    if step == p.start:
        t_call, hits0 = time.time(), compile_cache.hits()
    ls.state, m = p.step_fn(ls.state, batch, **args)
    if step == p.start:
        p.monitor.message(_compiled_message(time.time() - t_call, compile_cache.hits() > hits0, p.cache_dir))
    ls.pending.append((step, m, host_stats(p, step, host_batch)))
    ls.flops.append(step_flops(p.run, host_batch))
    p.monitor.advance(result=m)
    ls.previous = m


def host_stats(p: Parts, step: int, host_batch: dict) -> dict:
    """The batch's figures counted on the host (packed rows: over the loader's shards) and its task (-1: mixed
    or a plan without tasks)."""
    from jaxembed.data.pipeline import batch_stats

    run = p.run
    hs = batch_stats(host_batch, p.loader.batcher.shards if run.packing is not None else 1)
    hs["task"] = int(run.plan.task_ids[step]) if hasattr(run.plan, "task_ids") else -1
    return hs


def log_due(p: Parts, done: int) -> bool:
    """A metrics line every train.log_every steps, at the last step and when a stop signal came."""
    return done % p.run.config.train.log_every == 0 or done == p.total or p.sig.received is not None


def log_metrics(p: Parts, ls: LoopState, done: int) -> None:
    """The metrics line of the steps since the last one; a run of non-finite steps may stop the run."""
    metrics, rows = host_metrics(ls.pending, p.run, ls.t_interval, ls.flops)
    p.monitor.log(done, metrics)
    check_nonfinite(p, ls, rows)
    ls.pending, ls.flops = [], []
    ls.t_interval = time.time()


def check_nonfinite(p: Parts, ls: LoopState, rows) -> None:
    """Skipped updates: counts the non-finite steps in a row; train.max_nonfinite of them stop the run
    (TrainingStopped, naming the step and its task)."""
    limit = p.run.config.train.max_nonfinite
    for s, ok, h in rows:
        if ok:
            ls.consecutive, ls.first_bad = 0, None
            continue
        ls.consecutive += 1
        ls.first_bad = s if ls.first_bad is None else ls.first_bad
        if limit and ls.consecutive >= limit:
            raise TrainingStopped(_nonfinite_message(p.run, s, ls.first_bad, ls.consecutive, h["task"]))


# --- the dev evaluation ----------------------------------------------------------------------------------------


def eval_due(p: Parts, step: int) -> bool:
    return p.evaluator is not None and dev_eval_due(step, int(p.run.config.eval.every), p.total)


def evaluate_at(p: Parts, ls: LoopState, at: int) -> dict | None:
    """The dev metrics at step ``at`` (logged, ``p.scores`` updated); None when a stop signal interrupted it."""
    metric = p.run.config.eval.best_metric
    try:
        with p.sig.interruptible():
            metrics = p.evaluator(ls.state["params"])
    except Interrupted:
        return None
    p.monitor.log(at, metrics, prefix="eval")
    value = metrics.get(metric) if metric else None
    if value is None and metric:
        raise UserError(f"config.eval.best_metric = {metric!r} is not among the dev "
                        f"metrics: {', '.join(sorted(metrics))}")
    if value is not None and math.isfinite(value):
        p.scores[at] = float(value)
    return metrics


def evaluate_first(p: Parts, ls: LoopState) -> None:
    """Before the first step: the dev evaluation of the starting model (eval.before), or of the checkpoint's step
    when a stop signal interrupted it; a signal during it stops the run before any step."""
    c = p.run.config
    if p.evaluator and c.eval.before and p.start == 0 and not _eval_logged(p.rd, 0):
        if evaluate_at(p, ls, 0) is None:
            ls.preempted, ls.stopped_in = True, "the dev evaluation before training"
    elif p.start and eval_due(p, p.start) and not _eval_logged(p.rd, p.start):
        if evaluate_at(p, ls, p.start) is None:
            ls.preempted, ls.stopped_in = True, f"the dev evaluation at step {p.start}"
    if ls.preempted:
        p.monitor.message(f"signal {p.sig.received} during {ls.stopped_in}: stopped before any training step, "
                          "the checkpoints are as they were; run the same command to resume")


def evaluate_due(p: Parts, ls: LoopState, done: int) -> dict | None:
    """The dev metrics after step ``done`` when an evaluation is due (eval.every, the last step), else None."""
    if not eval_due(p, done):
        return None
    eval_metrics = evaluate_at(p, ls, done)
    if eval_metrics is None:
        ls.stopped_in = f"the dev evaluation at step {done}"
    ls.t_interval = time.time()
    return eval_metrics


# --- checkpoints and stop signals ------------------------------------------------------------------------------


def checkpoint_due(p: Parts, ls: LoopState, done: int, eval_metrics: dict | None) -> bool:
    """A checkpoint every train.checkpoint_every steps or train.checkpoint_minutes, at the last step, and at a
    new best dev step, so the best is always exportable."""
    t = p.run.config.train
    due = (t.checkpoint_every and done % t.checkpoint_every == 0) or done == p.total or (
        t.checkpoint_minutes and time.time() - ls.last_save >= 60 * t.checkpoint_minutes)
    return bool(due or (eval_metrics is not None and best_step(p.scores, p.run.config.eval.best_mode) == done))


def stop_on_signal(p: Parts, ls: LoopState, done: int) -> None:
    """A stop signal: the checkpoint of ``done`` (saved) is waited on and the run is said to be preempted."""
    ls.preempted = True
    p.ckpt.wait()
    where = f" during {ls.stopped_in}" if ls.stopped_in else ""
    p.monitor.message(f"signal {p.sig.received}{where}: checkpoint saved at step {done}; run the same command to "
                      "resume" + (" (the evaluation runs again then)" if ls.stopped_in else ""))


# --- the end: summary, export ----------------------------------------------------------------------------------


def end_summary(p: Parts, ls: LoopState, t_begin: float) -> dict:
    """The run's summary: status, step, skipped updates (a warning when any), the best dev step and the dev
    metric's course (a sentence when training made it worse); process 0: time, devices, the last evaluation."""
    c, state = p.run.config, ls.state
    metric = c.eval.best_metric
    best = best_step(p.scores, c.eval.best_mode)
    summary = {"status": "preempted" if ls.preempted else "completed", "step": int(jax.device_get(state["step"])),
               "skipped": int(jax.device_get(state["skipped"])), "workdir": str(p.rd.root), "best_step": best}
    note = skipped_note(summary["skipped"], summary["step"])
    if note:  # said at the end, in summary.json and in the export's model card
        summary["warnings"] = [note]
        p.monitor.message(f"warning: {note}")
    if p.scores:
        summary["dev"] = _dev_summary(metric, p.scores, best)
        worse = _worse_than_start(summary["dev"], c.eval.best_mode)
        if worse:
            p.monitor.message(worse + f" (export it: jaxembed export --workdir {p.rd.root} --step best --out DIR)")
    if pod.is_main():  # training time (every run on this workdir), devices, the last dev evaluation (for the card)
        from jaxembed.runs.facts import summary_facts

        summary.update(summary_facts(p.rd, t_begin))
    return summary


def export_at_end(p: Parts, ls: LoopState, summary: dict) -> None:
    """The export of the last step (export.step = 'best': of the best dev step), written whole by process 0; a
    stop signal during it leaves none and the run preempted."""
    run, c = p.run, p.run.config
    metric, best, out_dir = c.eval.best_metric, summary["best_step"], export_dir(c, p.rd)
    at = summary["step"]
    if c.export.step == "best" and best is not None and best != at:
        at = best
        p.monitor.message(f"export.step = 'best': exporting step {best} ({metric} {p.scores[best]:.4g}), "
                          f"not the last step {summary['step']}")
        params = host_params(params_at(run, p.ckpt, best, like=ls.state))
    else:
        params = host_params(ls.state["params"])  # every process (a collective), then process 0 writes

    def write_export():
        with p.sig.interruptible(), atomic_files.writing(
                "writing the export", out_dir,
                fix=f"run the same command again to write the export (training is complete, "
                    f"checkpoint {summary['step']} is saved)"):
            return export_params(run, params, out_dir, summary=summary, step=at)

    try:
        pod.main_first("export", write_export)
        summary["export"] = str(out_dir)
        p.monitor.message(export_line(out_dir, at, p.rd, metric))
    except Interrupted as e:
        summary["status"] = "preempted"
        p.monitor.message(f"signal {e.signum} during the export: stopped, nothing half-written (the export is "
                          f"written as a whole); checkpoint {summary['step']} is saved; run the same command to "
                          "write the export")


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
