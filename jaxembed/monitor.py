"""Training metrics: stdout, a JSON-lines file (metrics.jsonl), TensorBoard events, and a progress bar with ETA.

Only process 0 writes metrics.jsonl and tensorboard/ (``is_main``); a line torn by a killed run is cut off when
the run starts again."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from tqdm.auto import tqdm


def _fmt(k: str, v) -> str:
    if isinstance(v, float):
        if k in ("lr",) or (v != 0 and abs(v) < 1e-3):
            return f"{k}={v:.3e}"
        return f"{k}={v:.4g}"
    return f"{k}={v}"


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


class Monitor:
    """Writes ``metrics.jsonl`` and TensorBoard events under ``workdir``; prints a line per log step and keeps a
    progress bar (to stderr, only on a terminal unless ``progress=True``)."""

    STDOUT_KEYS = ("loss", "accuracy", "pos_sim", "hardest_neg_sim", "lr", "grad_norm", "examples_per_s",
                   "tokens_per_s", "step_time_s", "mfu", "skipped")

    def __init__(self, workdir: str | Path, total_steps: int, start_step: int = 0, *, tensorboard: bool = True,
                 progress: bool | None = None, is_main: bool = True):
        self.is_main = is_main
        self.workdir = Path(workdir)
        self.torn = _cut_torn_line(self.workdir / "metrics.jsonl") if is_main else 0
        self._jsonl = open(self.workdir / "metrics.jsonl", "a", encoding="utf-8") if is_main else None
        self._tb = None
        if tensorboard and is_main:
            try:
                from tensorboardX import SummaryWriter

                self._tb = SummaryWriter(str(self.workdir / "tensorboard"))
            except ImportError:  # optional
                self._tb = None
        show = sys.stderr.isatty() if progress is None else progress
        self._bar = tqdm(total=total_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True,
                         disable=not (show and is_main))
        self.t0 = time.time()

    def log(self, step: int, metrics: dict, prefix: str = "train") -> None:
        if not self.is_main:
            return
        clean = {k: (float(v) if not isinstance(v, (str, int)) else v) for k, v in metrics.items()}
        record = {"step": int(step), "split": prefix, "time": round(time.time() - self.t0, 3), **clean}
        try:
            self._jsonl.write(json.dumps(record, allow_nan=True) + "\n")
            self._jsonl.flush()
        except OSError as e:
            from jaxembed import runfiles

            raise runfiles.write_failed("writing the metrics", self.workdir / "metrics.jsonl", e) from None
        if self._tb is not None:
            for k, v in clean.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(f"{prefix}/{k}", v, step)
            self._tb.flush()
        keys = self.STDOUT_KEYS if prefix == "train" else sorted(clean)
        line = " ".join(_fmt(k, clean[k]) for k in keys if k in clean)
        tqdm.write(f"[{prefix} step {step}] {line}")
        self._bar.set_postfix({k: f"{clean[k]:.4g}" for k in ("loss", "accuracy") if k in clean}, refresh=False)

    def advance(self, n: int = 1) -> None:
        self._bar.update(n)

    def message(self, text: str) -> None:
        if self.is_main:
            tqdm.write(text)

    def close(self) -> None:
        self._bar.close()
        if self._jsonl:
            self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
