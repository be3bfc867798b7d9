"""Training metrics: stdout, a JSON-lines file (metrics.jsonl), TensorBoard events, optionally Weights & Biases,
and a progress bar with ETA.

Only process 0 writes metrics.jsonl, tensorboard/ and the W&B run (``is_main``); a line torn by a killed run is cut
off when the run starts again.

Weights & Biases (``train.wandb``, the optional extra ``pip install 'jaxembed[wandb]'``; wandb is imported only
when enabled): the same metrics as TensorBoard (``train/loss``, ``eval/TASK/metric``, ... at the training step),
the resolved config, and the run summary. The W&B run id is kept in ``<workdir>/wandb.json``, so a restarted run
continues the same W&B run (``resume='allow'``). Its files go to ``<workdir>/wandb/`` (or ``WANDB_DIR``);
``WANDB_MODE``, when set, overrides ``train.wandb.mode`` (e.g. offline on compute nodes; ``wandb sync`` later)."""

from __future__ import annotations

import json
import math
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Hashable

from tqdm.auto import tqdm

from jaxembed.runs.rundir import NAMES, RunDir, rundir


def _fmt(k: str, v) -> str:
    if isinstance(v, float):
        if k in ("lr",) or (v != 0 and abs(v) < 1e-3):
            return f"{k}={v:.3e}"
        return f"{k}={v:.4g}"
    return f"{k}={v}"


def summary_writer_class():
    """tensorboardX's SummaryWriter. Its module imports torch, where torch is installed, only to name a type in its
    annotations (~2 CPU-s, in a process that imports nothing else of torch): unless torch is imported already, it
    is imported with torch hidden (only protobuf and tensorboardX's own modules load with it)."""
    if "torch" in sys.modules or "tensorboardX" in sys.modules:
        from tensorboardX import SummaryWriter

        return SummaryWriter
    sys.modules["torch"] = None  # `import torch` raises ImportError: tensorboardX falls back to numpy's type
    try:
        from tensorboardX import SummaryWriter
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
    return SummaryWriter


def _cut_torn_line(path: Path) -> int:
    """A run killed while writing a line leaves it without its newline: cut it off (returns 1), so that the
    next record starts on a line of its own."""
    try:
        with open(path, "rb+") as f:
            data = f.read()
            if not data or data.endswith(b"\n"):
                return 0
            f.truncate(data.rfind(b"\n") + 1)
            return 1
    except FileNotFoundError:
        return 0


def _block_until_ready(x):
    import jax

    return jax.block_until_ready(x)


def batch_shapes(batch: dict, *extra) -> tuple:
    """What decides a train step's compiled program: its batch's array names, shapes and dtypes (and ``extra``, e.g.
    MoTE's one-task path). A step whose key was not seen before compiles."""
    return tuple((k, tuple(v.shape), str(v.dtype)) for k, v in sorted(batch.items()) if hasattr(v, "shape")) + extra


def _duration(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Monitor:
    """Writes ``metrics.jsonl`` and TensorBoard events under ``workdir``; prints a line per log step and keeps a
    progress bar with ETA (to stderr, only on a terminal unless ``progress=True``). Without the bar (a log file, a
    batch job), a plain progress line with the ETA is printed every ``PLAIN_EVERY_S`` seconds instead. Both are
    timed on completed steps: dispatch is asynchronous, so the rate waits on the last step's result before reading
    the clock (the bar every ``BAR_EVERY_S``, its rate and ETA in place of tqdm's rate of dispatches), and the steps
    that compile a new shape (``before_step``) are waited for on their own and left out of the rate.
    clock / sync: the time and the wait on a step's result (tests pass fakes)."""

    PLAIN_EVERY_S = 60.0
    BAR_EVERY_S = 10.0
    # tqdm's own rate and remaining time count dispatches: the bar shows the rate of completed steps instead
    BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"

    STDOUT_KEYS = ("loss", "accuracy", "pos_sim", "hardest_neg_sim", "lr", "grad_norm", "examples_per_s",
                   "tokens_per_s", "step_time_s", "mfu", "device_memory_peak_gib", "skipped")

    def __init__(self, workdir: str | Path | RunDir, total_steps: int, start_step: int = 0, *,
                 tensorboard: bool = True,
                 progress: bool | None = None, is_main: bool = True, wandb=None, run_config: dict | None = None,
                 clock: Callable[[], float] | None = None, sync: Callable[[Any], Any] | None = None):
        self.is_main = is_main
        self.rundir = rundir(workdir)
        self.workdir = self.rundir.root
        self.torn = _cut_torn_line(self.rundir.metrics_jsonl) if is_main else 0
        self._jsonl = open(self.rundir.metrics_jsonl, "a", encoding="utf-8") if is_main else None
        self._tb = None
        if tensorboard and is_main:
            try:
                self._tb = summary_writer_class()(str(self.rundir.tensorboard))
            except ImportError:  # optional
                self._tb = None
        self._wb = None
        self._status = None
        if is_main and wandb is not None and wandb.get("enabled"):
            try:
                self._wb = start_wandb(self.rundir, wandb, run_config or {})
            except BaseException:  # close what was opened (the caller has no Monitor to close)
                if self._jsonl:
                    self._jsonl.close()
                if self._tb is not None:
                    self._tb.close()
                raise
        show = sys.stderr.isatty() if progress is None else progress
        self._bar = tqdm(total=total_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True,
                         disable=not (show and is_main), bar_format=self.BAR_FORMAT)
        self._postfix: dict[str, str] = {}
        self._plain = is_main and not (show and is_main)
        self.total, self.step = total_steps, start_step
        self._clock = clock or time.time
        self._sync = sync or _block_until_ready
        self.t0 = self._clock()
        self._last_plain = self.t0
        # the rate of completed steps: time and steps between two waits on a step's result, without the steps that
        # compiled a new shape (each one waited for on its own: the interval before it is closed first)
        self._shapes: set = set()
        self._compiling = False
        self._mark: tuple[float, int] | None = None  # (time, step) of the last wait, None before the first
        self._timed = [0.0, 0]  # seconds, steps
        self._all = [0.0, 0]  # the same with the steps that compiled

    def log(self, step: int, metrics: dict, prefix: str = "train") -> None:
        if not self.is_main:
            return
        clean = {k: (float(v) if not isinstance(v, (str, int)) else v) for k, v in metrics.items()}
        record = {"step": int(step), "split": prefix, "time": round(self._clock() - self.t0, 3), **clean}
        try:
            self._jsonl.write(json.dumps(record, allow_nan=True) + "\n")
            self._jsonl.flush()
        except OSError as e:
            from jaxembed.runs import atomic_files

            raise atomic_files.write_failed("writing the metrics", self.rundir.metrics_jsonl, e) from None
        if self._tb is not None:
            for k, v in clean.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(f"{prefix}/{k}", v, step)
            self._tb.flush()
        if self._wb is not None:
            self._wb.log({f"{prefix}/{k}": v for k, v in clean.items()
                          if isinstance(v, (int, float)) and math.isfinite(v)}, step=int(step))
        keys = self.STDOUT_KEYS if prefix == "train" else sorted(clean)
        line = " ".join(_fmt(k, clean[k]) for k in keys if k in clean)
        tqdm.write(f"[{prefix} step {step}] {line}")
        self._postfix.update({k: f"{clean[k]:.4g}" for k in ("loss", "accuracy") if k in clean})
        self._bar.set_postfix(self._postfix, refresh=False)

    def before_step(self, shapes: Hashable, previous: Any = None) -> bool:
        """Called before a step is dispatched, with what decides its compiled program (``batch_shapes``) and the
        previous step's result. -> True when the shapes are new: the step compiles. Then (for the plain progress
        line) the steps before it are waited for and timed, so that the compiling step is left out of the rate."""
        new = shapes not in self._shapes
        self._shapes.add(shapes)
        self._compiling = new
        if new and self.is_main:
            self._wait(previous, timed=True)
        return new

    def advance(self, n: int = 1, result: Any = None) -> None:
        """``n`` steps were dispatched, the last one returning ``result`` (its metrics: waited for when a progress
        line is written, and after a step that compiled, so that the rate counts completed steps)."""
        self._bar.update(n)
        self.step += n
        if not self.is_main:
            return
        # a compiling step is waited for on its own and left out of the rate; so is the first step when the caller
        # does not say which steps compile (no before_step)
        timed = not self._compiling and self._mark is not None
        self._compiling = False
        now = self._clock() if timed else self._wait(result, timed=False)
        if now - self._last_plain >= (self.PLAIN_EVERY_S if self._plain else self.BAR_EVERY_S) \
                or self.step == self.total:
            self._last_plain = self._wait(result, timed=True) if timed else now
            if self._plain:
                tqdm.write(self.progress_line(self._last_plain))
            else:
                self._postfix.update(self.rate_and_eta())
                self._bar.set_postfix(self._postfix)

    def _wait(self, result: Any, timed: bool) -> float:
        """Wait for ``result`` (every step dispatched so far is then complete) and count the time and steps since
        the last wait: into the rate when ``timed``. -> the time after the wait."""
        self._sync(result)
        now = self._clock()
        if self._mark is not None and self.step > self._mark[1]:
            dt, k = now - self._mark[0], self.step - self._mark[1]
            for acc in (self._timed, self._all) if timed else (self._all,):
                acc[0] += dt
                acc[1] += k
        self._mark = (now, self.step)
        return now

    @property
    def seconds_per_step(self) -> float | None:
        """The mean time of a completed step that compiled nothing (None before one was timed)."""
        return self._timed[0] / self._timed[1] if self._timed[1] else None

    def progress_line(self, now: float | None = None) -> str:
        """``train: step 40/200 (20 %), 1.23 s/step, elapsed 0m52s, ETA 3m17s``: the rate of the completed steps of
        this invocation that compiled no new shape (``before_step``), the ETA that rate times the steps left. Before
        such a step the line says so (a rate of compiling steps would put the ETA far off); at the last step, the
        rate is of every completed step."""
        now = self._clock() if now is None else now
        line = f"train: step {self.step}/{self.total} ({100 * self.step / max(self.total, 1):.0f} %)"
        rate = self.seconds_per_step
        if rate is None and self.step >= self.total and self._all[1]:
            rate = self._all[0] / self._all[1]
        if rate is None:
            return line + f", elapsed {_duration(now - self.t0)}, ETA not known yet (each step so far compiled)"
        return line + (f", {rate:.3g} s/step, elapsed {_duration(now - self.t0)}, "
                       f"ETA {_duration(rate * (self.total - self.step))}")

    def rate_and_eta(self) -> dict[str, str]:
        """The bar's share of ``progress_line``: {'s/step': ..., 'ETA': ...} of the completed steps that compiled
        nothing ({'ETA': 'not known yet'} before one was timed)."""
        rate = self.seconds_per_step
        if rate is None:
            return {"ETA": "not known yet"}
        return {"s/step": f"{rate:.3g}", "ETA": _duration(rate * (self.total - self.step))}

    def message(self, text: str) -> None:
        if self.is_main:
            tqdm.write(text)

    def record_summary(self, summary: dict) -> None:
        """The run's summary (status, step, time, ...) into the W&B run's summary; its status decides the exit code
        W&B records at ``close`` (without one, the run ended with an error)."""
        self._status = summary.get("status")
        if self._wb is not None:
            for k, v in summary.items():
                if isinstance(v, (int, float, str)) and not isinstance(v, bool):
                    self._wb.summary[f"run/{k}"] = v

    def close(self) -> None:
        self._bar.close()
        if self._jsonl:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wb is not None:
            wb, self._wb = self._wb, None
            wb.finish(exit_code=0 if self._status in ("completed", "preempted") else 1)


WANDB_EXTRA = "pip install 'jaxembed[wandb]'"
WANDB_ID_FILE = NAMES["wandb_json"]


def start_wandb(rd: RunDir, settings, run_config: dict):
    """``wandb.init`` for the run in ``workdir`` (process 0 only): the run id of ``<workdir>/wandb.json``, created
    (and written atomically) on the first start, so a restart resumes the same W&B run. Any failure is one
    UserError line."""
    from jaxembed.runs import atomic_files
    from jaxembed.errors import UserError

    try:
        import wandb
    except ImportError:
        raise UserError(f"config.train.wandb.enabled = True needs the wandb package (fix: {WANDB_EXTRA}, or "
                        "--config.train.wandb.enabled=False)") from None
    id_file = rd.wandb_json
    run_id = None
    if id_file.is_file():
        try:
            run_id = json.loads(id_file.read_text(encoding="utf-8"))["id"]
        except (OSError, ValueError, KeyError, TypeError):
            raise UserError(f"{id_file}: unreadable (fix: delete it to start a new W&B run, or restore "
                            '{"id": "<the W&B run id>"})') from None
    if not run_id:
        run_id = uuid.uuid4().hex[:12]
        with atomic_files.writing("writing the W&B run id", id_file):
            atomic_files.write_json(id_file, {"id": run_id, "project": settings.get("project") or None,
                                          "entity": settings.get("entity") or None})
    kw = dict(project=settings.get("project") or None, entity=settings.get("entity") or None,
              name=settings.get("name") or rd.root.resolve().name, tags=list(settings.get("tags") or ()) or None,
              id=run_id, resume="allow", config=run_config)
    if not os.environ.get("WANDB_MODE"):
        kw["mode"] = settings.get("mode") or "online"
    if not os.environ.get("WANDB_DIR"):
        kw["dir"] = str(rd.root)
    try:
        return wandb.init(**kw)
    except Exception as e:  # noqa: BLE001 -- no login, no network, a refused project: one line
        msg = " ".join(str(e).split())[:300]
        raise UserError(f"config.train.wandb: wandb.init failed ({type(e).__name__}: {msg}) (fix: `wandb login` or "
                        "WANDB_API_KEY; or --config.train.wandb.mode=offline and `wandb sync` later; or "
                        "--config.train.wandb.enabled=False)") from None
