"""Optimizer: AdamW with warm-up and linear / cosine / constant decay, global-norm clipping, no weight decay on
norms and biases, and optionally frozen parameters (no update, no optimizer moments).

MoTE models (``routed=True``) use ``routed_adamw``: AdamW in which an expert that no row of the step was routed
to is left alone, as PyTorch's AdamW leaves a parameter without a gradient. Its weights, both moments and its
step count stay bit-for-bit unchanged, and it gets no weight decay. The step's routed experts come in as the
extra argument ``tx.update(grads, state, params, active=bool [E])``. An expert's bias correction counts the
steps it was trained in. ``routed_adamw`` performs ``optax.adamw``'s operations in the same order. When every
expert is active in every step, the two agree up to float rounding (XLA fuses the two programs differently;
test: 1e-6). Dense models keep ``optax.adamw`` itself.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from optax._src import numerics

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


def _is_expert(path) -> bool:
    """A leaf of a MoTE expert stack (leading axis = expert), by its key path (``...ffn.experts...``)."""
    return any(getattr(k, "key", None) == "experts" for k in path)


def _num_experts(tree) -> int:
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if _is_expert(path):
            return int(x.shape[0])
    return 0


def _expert_view(x: jax.Array, e: jax.Array) -> jax.Array:
    """An [E] array shaped to broadcast against an expert-stacked leaf x [E, ...]."""
    return e.reshape(e.shape + (1,) * (x.ndim - 1))


class RoutedAdamState(NamedTuple):
    count: jax.Array          # int32 []: steps taken (the non-expert parameters' bias correction)
    expert_count: jax.Array   # int32 [E]: steps each expert was routed to (its bias correction)
    mu: Any
    nu: Any


def scale_by_routed_adam(b1: float = 0.9, b2: float = 0.999,
                         eps: float = 1e-8) -> optax.GradientTransformationExtraArgs:
    """``optax.scale_by_adam`` (same operations in the same order) in which the expert slices of MoTE expert
    stacks that are not ``active`` keep their moments and step count and get a zero update."""

    def init_fn(params):
        return RoutedAdamState(count=jnp.zeros([], jnp.int32),
                               expert_count=jnp.zeros([_num_experts(params)], jnp.int32),
                               mu=optax.tree.zeros_like(params), nu=optax.tree.zeros_like(params))

    def update_fn(updates, state, params=None, *, active=None, **extra):
        del params, extra
        n = state.expert_count.shape[0]
        act = jnp.ones([n], bool) if active is None else jnp.asarray(active, bool).reshape(n)
        count = numerics.safe_increment(state.count)
        ecount = jnp.where(act, numerics.safe_increment(state.expert_count), state.expert_count)
        leaves, treedef = jax.tree_util.tree_flatten_with_path(updates)
        mus, nus = treedef.flatten_up_to(state.mu), treedef.flatten_up_to(state.nu)
        outs, new_mu, new_nu = [], [], []
        for (path, g), m, v in zip(leaves, mus, nus):
            m2 = (1 - b1) * (g ** 1) + b1 * m
            v2 = (1 - b2) * (g ** 2) + b2 * v
            if _is_expert(path):
                a = _expert_view(g, act)
                c = _expert_view(g, jnp.maximum(ecount, 1))  # 1 for a never-routed expert: its update is 0 anyway
                m2, v2 = jnp.where(a, m2, m), jnp.where(a, v2, v)
            else:
                a, c = None, count
            m_hat = m2 / (1 - b1 ** c).astype(m2.dtype)
            v_hat = v2 / (1 - b2 ** c).astype(v2.dtype)
            u = m_hat / (jnp.sqrt(v_hat + 0.0) + eps)
            outs.append(u if a is None else jnp.where(a, u, jnp.zeros_like(u)))
            new_mu.append(m2)
            new_nu.append(v2)
        unflat = lambda xs: jax.tree_util.tree_unflatten(treedef, xs)  # noqa: E731
        return unflat(outs), RoutedAdamState(count, ecount, unflat(new_mu), unflat(new_nu))

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def zero_idle_experts() -> optax.GradientTransformationExtraArgs:
    """Zero the updates of the expert slices that are not ``active`` (after weight decay: no decay for them)."""

    def update_fn(updates, state, params=None, *, active=None, **extra):
        del params, extra
        if active is None:
            return updates, state

        def f(path, u):
            if not _is_expert(path):
                return u
            return jnp.where(_expert_view(u, jnp.asarray(active, bool)), u, jnp.zeros_like(u))

        return jax.tree_util.tree_map_with_path(f, updates), state

    return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update_fn)


def routed_adamw(learning_rate, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, weight_decay: float = 1e-4,
                 mask=None) -> optax.GradientTransformationExtraArgs:
    """AdamW for MoTE (see the module docstring); the same chain as ``optax.adamw``: Adam, decoupled weight decay
    (``mask``), learning rate."""
    return optax.chain(scale_by_routed_adam(b1, b2, eps), optax.add_decayed_weights(weight_decay, mask),
                       zero_idle_experts(), optax.scale_by_learning_rate(learning_rate))


def keep_unless(ok: jax.Array, new_state: Any, old_state: Any) -> Any:
    """The optimizer state after a step whose update is applied only when ``ok`` (bool []): ``old_state`` when not
    ok, except the learning-rate schedule's step count (optax ``ScaleByScheduleState``), which always advances.

    The learning rate of step s is then schedule(s) whether or not earlier steps were skipped: the rate the trainer
    logs is the rate applied, and the schedule still ends at the run's last step. Adam's moments and its own count
    (bias correction) stay, as PyTorch's GradScaler skips the optimizer step but not the scheduler's."""
    is_schedule = lambda x: isinstance(x, optax.ScaleByScheduleState)  # noqa: E731

    def pick(new, old):
        if is_schedule(new):
            return new
        return jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)

    return jax.tree.map(pick, new_state, old_state, is_leaf=is_schedule)


def state_shardings(tx, params: Any, param_shardings: Any, other: Any) -> Any:
    """Shardings of ``tx.init(params)``'s leaves: a leaf shaped like a parameter at that parameter's path (Adam's
    moments, at ``...mu.<path>``, also inside ``multi_transform`` / MoTE states) takes that parameter's sharding
    (FSDP: the moments are sharded as the parameters), every other leaf (step counts, MoTE's [E] counts) ``other``.
    param_shardings: a tree like ``params`` of shardings."""
    abstract = jax.eval_shape(tx.init, params)
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    table = {_names(path): (tuple(x.shape), s) for (path, x), s in zip(flat, jax.tree.leaves(param_shardings))}

    def pick(path, leaf):
        names = _names(path)
        for i in range(len(names)):
            hit = table.get(names[i:])
            if hit is not None and hit[0] == tuple(leaf.shape):
                return hit[1]
        return other

    return jax.tree_util.tree_map_with_path(pick, abstract)


def _names(path) -> tuple:
    return tuple(getattr(p, "key", getattr(p, "name", getattr(p, "idx", p))) for p in path)


def make_optimizer(params: Any, *, lr: float, total_steps: int, warmup_steps: int, schedule_kind: str = "linear",
                   weight_decay: float = 0.01, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                   grad_clip: float | None = 1.0, freeze: tuple[str, ...] = (), end_factor: float = 0.0,
                   routed: bool = False):
    """(optax transformation, learning-rate schedule) for ``params`` (a pytree of arrays). routed: a MoTE model;
    ``update`` then takes ``active=`` (bool [E], the experts routed to in the step), see ``routed_adamw``."""
    sched = schedule(lr, total_steps, warmup_steps, schedule_kind, end_factor)
    parts = []
    if grad_clip:
        parts.append(optax.clip_by_global_norm(grad_clip))
    adamw = routed_adamw if routed else optax.adamw
    parts.append(adamw(sched, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=decay_mask))
    tx = optax.chain(*parts)
    if freeze:
        labels = jax.tree.map(lambda f: "frozen" if f else "train", frozen_mask(params, tuple(freeze)))
        tx = optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)
    return tx, sched
