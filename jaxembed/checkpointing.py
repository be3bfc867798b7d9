"""Checkpoints with Orbax: async saves, keep the last K and the best by a metric, atomic (Orbax writes to a
temporary folder and renames it when complete, so a crash during a save leaves the previous checkpoint
restorable), restore onto the current shardings."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as cm

log = logging.getLogger(__name__)


class Checkpointer:
    def __init__(self, directory: str | Path, keep_last: int = 2, best_metric: str = "", best_mode: str = "max",
                 async_save: bool = True):
        self.best_metric = best_metric
        policies = [cm.LatestN(n=keep_last)]
        if best_metric:
            policies.append(cm.BestN(get_metric_fn=lambda m: m[best_metric], reverse=(best_mode == "min"), n=1,
                                     keep_checkpoints_without_metrics=False))
        opts = ocp.CheckpointManagerOptions(preservation_policy=cm.AnyPreservationPolicy(policies),
                                            enable_async_checkpointing=async_save, create=True)
        self.manager = ocp.CheckpointManager(Path(directory).absolute(), options=opts)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def save(self, step: int, state: Any, metrics: dict | None = None) -> None:
        """Start saving ``state`` as ``step`` (returns at once with async saves; ``wait()`` blocks)."""
        if metrics is not None and self.best_metric:
            value = metrics.get(self.best_metric)
            metrics = {self.best_metric: float(value)} if value is not None and math.isfinite(value) else None
        else:
            metrics = None
        self.manager.save(step, args=ocp.args.StandardSave(state), metrics=metrics, force=True)

    def restore(self, step: int, like: Any) -> Any:
        """Restore ``step`` with the dtypes, shapes and shardings of ``like`` (a state of arrays)."""
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like)
        return self.manager.restore(step, args=ocp.args.StandardRestore(abstract))

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
