"""Checkpoints with Orbax: async saves, keep the last K and the best by a metric, restore onto the current
shardings.

Faults (docs/reliability.md):
- A save is atomic: Orbax writes ``<step>.orbax-checkpoint-tmp-*`` and renames it to ``<step>`` when every array
  and its metadata are written, so a process killed during a save (kill -9, a lost node) leaves the previous
  checkpoints restorable. The unfinished folder is removed when the run starts again (and said so).
- ``restore_latest``: a latest checkpoint that cannot be read (truncated or corrupted files) is skipped with a
  message; the run resumes from the newest one that reads, and the unreadable ones are moved to
  ``checkpoints_unreadable/`` (kept for inspection, out of Orbax's way). None readable: a UserError, nothing
  moved.
- A save that fails (disk full, no permission) raises a one-line UserError naming the step, the reason and the
  checkpoints still intact.

Several processes (a pod): every process constructs the manager and calls save / restore / wait (Orbax: each
writes its shards, process 0 the metadata and the final rename, with barriers in between); the choice of the
checkpoint to resume from is agreed by all processes (jaxembed.pod).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as cm

from jaxembed import pod
from jaxembed.runs import atomic_files
from jaxembed.errors import UserError
from jaxembed.runs.rundir import NAMES

log = logging.getLogger(__name__)

TMP_MARK = ".orbax-checkpoint-tmp"
UNREADABLE = NAMES["checkpoints_unreadable"]


class Checkpointer:
    def __init__(self, directory: str | Path, keep_last: int = 2, best_metric: str = "", best_mode: str = "max",
                 async_save: bool = True, read_only: bool = False):
        """``read_only``: the checkpoints are read, nothing in the folder is written or removed (an export)."""
        self.directory = Path(directory).absolute()
        self.best_metric = best_metric
        self._pending: int | None = None  # step of the async save in flight
        self._failed = False
        # unfinished saves of a stopped run (kill -9 during a save); Orbax removes them (process 0) below
        self.leftovers = sorted(p.name for p in self.directory.glob(f"*{TMP_MARK}*")) \
            if self.directory.is_dir() and not read_only else []
        policies = [cm.LatestN(n=keep_last)]
        if best_metric:
            policies.append(cm.BestN(get_metric_fn=lambda m: m[best_metric], reverse=(best_mode == "min"), n=1,
                                     keep_checkpoints_without_metrics=False))
        opts = ocp.CheckpointManagerOptions(preservation_policy=cm.AnyPreservationPolicy(policies),
                                            enable_async_checkpointing=async_save, create=not read_only,
                                            cleanup_tmp_directories=not read_only)
        try:
            self.manager = ocp.CheckpointManager(self.directory, options=opts)
        except OSError as e:
            raise atomic_files.write_failed("creating the checkpoint folder", self.directory, e) from None

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    # ---- saving
    def save(self, step: int, state: Any, metrics: dict | None = None) -> None:
        """Start saving ``state`` as ``step`` (returns at once with async saves; ``wait()`` blocks). A failed save
        (this one, or the async one before it) raises a one-line UserError."""
        if metrics is not None and self.best_metric:
            value = metrics.get(self.best_metric)
            metrics = {self.best_metric: float(value)} if value is not None and math.isfinite(value) else None
        else:
            metrics = None
        try:
            self.manager.save(step, args=ocp.args.StandardSave(state), metrics=metrics, force=True)
        except Exception as e:
            raise self._save_failed(self._pending if self._pending is not None else step, e) from None
        self._pending = step

    def wait(self) -> None:
        try:
            self.manager.wait_until_finished()
        except Exception as e:
            raise self._save_failed(self._pending, e) from None
        self._pending = None

    def _save_failed(self, step: int | None, e: BaseException) -> UserError:
        self._failed = True
        log.debug("checkpoint save failed", exc_info=e)
        try:
            self.manager.reload()
            kept = ", ".join(str(s) for s in self.manager.all_steps()) or "none"
        except Exception:  # the listing itself fails (the disk is gone): say what is known
            kept = "unknown"
        where = self.directory / str(step) if step is not None else self.directory
        return atomic_files.write_failed(f"saving the checkpoint of step {step}", where, e,
                                     fix=f"run the same command again: it resumes from the latest intact "
                                         f"checkpoint (intact: {kept})")

    # ---- restoring
    def restore(self, step: int, like: Any) -> Any:
        """Restore ``step`` with the dtypes, shapes and shardings of ``like`` (a state of arrays)."""
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like)
        return self.manager.restore(step, args=ocp.args.StandardRestore(abstract))

    def restore_latest(self, like: Any, say: Callable[[str], None] = print) -> tuple[int, Any]:
        """(step, state) of the newest checkpoint that reads, or (0, like) when there is none. Unreadable newer
        ones are reported through ``say`` and moved to ``checkpoints_unreadable/``; if none reads, UserError."""
        if self.leftovers:
            say(f"checkpoints: removed {len(self.leftovers)} unfinished save(s) of a stopped run "
                f"({', '.join(self.leftovers)}); the completed checkpoints are kept")
        steps = sorted(self.all_steps(), reverse=True)
        bad: list[tuple[int, str]] = []
        for step in steps:
            try:
                state = pod.all_agree(f"restore-{step}", lambda: self.restore(step, like))
            except Exception as e:  # truncated / corrupted files: Orbax, tensorstore or JSON errors
                log.debug("restoring step %d failed", step, exc_info=e)
                reason = _short(e)
                bad.append((step, reason))
                older = [s for s in steps if s < step]
                say(f"checkpoints/{step}: unreadable ({reason}); "
                    + (f"trying the previous checkpoint, step {older[0]}" if older else "no older checkpoint"))
                continue
            if bad:
                self._move_aside([s for s, _ in bad])
                say(f"resuming from checkpoint {step} (the unreadable checkpoint(s) "
                    f"{', '.join(str(s) for s, _ in bad)} moved to {self.directory.parent / UNREADABLE})")
            return step, state
        if bad:
            raise UserError(f"{self.directory}: no checkpoint can be read ({'; '.join(f'{s}: {r}' for s, r in bad)})"
                            " (fix: move the folder away to start the run over, or restore it from a backup)")
        return 0, like

    def _move_aside(self, steps: list[int]) -> None:
        dest = self.directory.parent / UNREADABLE

        def move():
            dest.mkdir(parents=True, exist_ok=True)
            for s in steps:
                src = self.directory / str(s)
                if src.exists():
                    target = dest / f"{s}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
                    try:
                        os.rename(src, target)
                    except OSError:  # another file system: copy, then remove
                        shutil.copytree(src, target)
                        shutil.rmtree(src)

        pod.main_first("checkpoints-move-aside", move)  # the others wait until it is done
        self.manager.reload()

    def close(self) -> None:
        """Wait for a save in flight and close. After a failed save, only closes (its error was raised)."""
        try:
            if not self._failed:
                self.wait()
        finally:
            try:
                self.manager.close()
            except Exception:
                if not self._failed:
                    raise


def _short(e: BaseException, limit: int = 200) -> str:
    """One short line for a restore error (TensorStore's messages run to kilobytes)."""
    text = " ".join(str(e).split())
    for cut in (" See full TensorStore details", " [source locations="):
        text = text.split(cut)[0]
    text = text.rstrip(". ")
    if len(text) > limit:
        text = text[:limit - 3] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
