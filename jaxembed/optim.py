"""Optimizer: AdamW with warm-up and linear / cosine / constant decay, global-norm clipping, no weight decay on
norms and biases, and optionally frozen parameters (no update, no optimizer moments)."""

from __future__ import annotations

import re
from typing import Any

import jax
import optax

SCHEDULES = ("linear", "cosine", "constant")


def schedule(lr: float, total_steps: int, warmup_steps: int, kind: str = "linear", end_factor: float = 0.0):
    """Learning rate per step: linear warm-up from 0 to ``lr`` over ``warmup_steps``, then ``kind`` decay to
    ``end_factor * lr`` at ``total_steps``."""
    warmup_steps = max(0, min(warmup_steps, total_steps))
    decay_steps = max(1, total_steps - warmup_steps)
    end = lr * end_factor
    if kind == "linear":
        decay = optax.linear_schedule(lr, end, decay_steps)
    elif kind == "cosine":
        decay = optax.cosine_decay_schedule(lr, decay_steps, alpha=end_factor)
    elif kind == "constant":
        decay = optax.constant_schedule(lr)
    else:
        raise ValueError(f"unknown schedule {kind!r}; allowed: {', '.join(SCHEDULES)}")
    if warmup_steps == 0:
        return decay
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup_steps), decay], [warmup_steps])


def _path_str(path) -> str:
    return ".".join(str(getattr(p, "key", getattr(p, "idx", p))) for p in path)


def decay_mask(params: Any) -> Any:
    """True where weight decay applies: matrices (kernels, embeddings), not norms' scales or biases."""

    def f(path, x):
        name = _path_str(path)
        return x.ndim >= 2 and not name.endswith(("bias", "scale"))

    return jax.tree_util.tree_map_with_path(f, params)


def frozen_mask(params: Any, patterns: tuple[str, ...]) -> Any:
    """True for parameters whose dotted path (e.g. ``backbone.embeddings.word_embeddings.embedding``) matches
    one of the regular expressions in ``patterns``."""
    regs = [re.compile(p) for p in patterns]
    return jax.tree_util.tree_map_with_path(lambda path, x: any(r.search(_path_str(path)) for r in regs), params)


def make_optimizer(params: Any, *, lr: float, total_steps: int, warmup_steps: int, schedule_kind: str = "linear",
                   weight_decay: float = 0.01, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                   grad_clip: float | None = 1.0, freeze: tuple[str, ...] = (), end_factor: float = 0.0):
    """(optax transformation, learning-rate schedule) for ``params`` (a pytree of arrays)."""
    sched = schedule(lr, total_steps, warmup_steps, schedule_kind, end_factor)
    parts = []
    if grad_clip:
        parts.append(optax.clip_by_global_norm(grad_clip))
    parts.append(optax.adamw(sched, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=decay_mask))
    tx = optax.chain(*parts)
    if freeze:
        labels = jax.tree.map(lambda f: "frozen" if f else "train", frozen_mask(params, tuple(freeze)))
        tx = optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)
    return tx, sched
