"""The MoTE expert block (MoTE 3.1, Fig. 2a/2b): a backbone's feed-forward sublayer, copied once per task expert.

``MoTEFeedForward`` is the block a MoTE layer's feed-forward becomes: the backbones build it through their
feed-forward interface (``jaxembed.models.layers.feed_forward`` calls ``MoTESpec.feed_forward``), with the dense
block's weights stacked [E, ...]. ``make_route`` turns a forward pass's ``experts`` into the route the block takes
(ids, active experts): MoTE's routing R: I -> E (3.1) applied to a batch. ``is_expert_path`` / ``dense_path`` name
the stacked parameters.

**What an expert is.** MoTE Fig. 2b draws an expert as LayerNorm -> MLP -> LayerNorm, "mirroring the standard
transformer feed-forward configuration". An expert here is a copy of the backbone's own feed-forward sublayer
(``layers[i].ffn``) with all its norms:

- BERT (post-LN): LN(attention residual) -> MLP -> residual -> LN: exactly the paper's LN -> MLP -> LN.
- Qwen2 (pre-RMSNorm) and T5 (pre-RMSNorm): RMSNorm -> MLP -> residual. These blocks have no second norm, and
  adding one would break up-cycling exactness: a norm after the residual cannot be the identity. So their
  experts carry the one norm the dense block has.

**Routing and cost.** The model takes ``experts``: one int for the whole call, an int per row [B], or an int per
token [B, L] (packed rows, ``jaxembed.packing``: a row holds several texts, each routed to its own expert, so
the route is per text, never per token within a text; padding is -1, routed nowhere).
- One expert per call (the fast path): the expert's weights are indexed out of the stack
  (``lax.dynamic_index_in_dim``). Compute, activation memory and compile time are the dense block's. The
  index is a traced value, so one compiled program serves every expert (no recompilation per task).
  Under TA-CL every batch holds one task, and the trainer encodes queries and documents in separate calls, so
  every call takes this path. So do ``Encoder.encode`` and the evaluators (one task per call).
- One expert per row or per token (mixed batches, e.g. the ``random`` strategy, and packed rows of texts of
  several experts): each expert runs under ``lax.cond(active[e], ...)`` on all the call's rows, and its rows
  (tokens) are picked with ``where``. The cost is the
  number of experts used x one dense pass; unused experts are skipped. Under autodiff, every ``cond`` keeps
  residuals for its expert, so activation memory grows to E x the feed-forward's, and the program compiles
  longer (docs/mote.md, training and cost, has a CPU measurement of both paths). This is why the trainer passes
  one expert per call whenever the plan says the batch holds one task.

In both paths an unrouted expert's gradient is exactly zero. ``jaxembed.runs.optim`` (``routed_adamw``) then leaves
its weights and moments untouched. Sorting rows by expert and running a grouped matmul (``lax.ragged_dot``)
would make mixed batches cost one pass. It would need per-architecture feed-forward code, and TA-CL never
builds mixed batches, so it is not done.

Parameters: a MoTE layer's feed-forward lives at ``layers[i].ffn.experts.<the dense block's own paths>``, each
with a leading expert axis named ``expert`` (logical sharding axis). ``jaxembed.parallel`` keeps that axis
replicated under every strategy (FSDP shards each expert's ``embed`` axis as usual).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

if TYPE_CHECKING:
    from jaxembed.mote.spec import MoTESpec


def stack_module(module: nnx.Module, num_experts: int) -> nnx.Module:
    """A copy of ``module`` whose every parameter is stacked ``num_experts`` times on a new leading axis (logical
    axis ``expert``): E identical experts, i.e. the dense block up-cycled."""
    graphdef, state = nnx.split(module)
    flat = []
    for path, var in nnx.to_flat_state(state):
        if isinstance(var, nnx.Param):
            axes = var.get_metadata().get("out_sharding")
            stacked = jnp.broadcast_to(var[...], (num_experts,) + tuple(var.shape))
            var = var.replace(stacked, out_sharding=("expert",) + tuple(axes or (None,) * len(var.shape)))
        flat.append((path, var))
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


class MoTEFeedForward(nnx.Module):
    """The MoTE block (MoTE Fig. 2): E experts, each a copy of the backbone's feed-forward sublayer (see the
    module docstring), weights stacked [E, ...] under ``experts``.

    build(rngs) -> the dense feed-forward module. ``__call__(x, route)``: x [B, L, H]; route = (ids, active [E]
    bool or None) with ids a scalar (one expert), [B] (per row) or [B, L] (per token; -1 = no expert, output 0)
    -> [B, L, H]. Each row (token) takes its expert's output."""

    routed = True  # jaxembed.models.layers.call_ffn passes the route to modules that set this

    def __init__(self, build: Callable[[nnx.Rngs], nnx.Module], num_experts: int, rngs: nnx.Rngs):
        self.num_experts = num_experts
        self.experts = stack_module(build(rngs), num_experts)

    def __call__(self, x: jax.Array, route, *, deterministic: bool = True, rngs: nnx.Rngs | None = None):
        if route is None:
            raise ValueError("a MoTE feed-forward block needs a route (expert ids, see jaxembed.mote.make_route)")
        ids, active = route
        graphdef, params, rest = nnx.split(self.experts, nnx.Param, ...)
        # One dropout key drawn here, outside the branches: an nnx.Rngs must not be advanced inside lax.cond.
        key = None if deterministic or rngs is None else rngs.dropout()

        def run(p, h):
            module = nnx.merge(graphdef, p, rest)
            return module(h, deterministic=deterministic, rngs=None if key is None else nnx.Rngs(dropout=key))

        if ids.ndim == 0:  # one expert for the whole call: index the stack (cost and memory of the dense block)
            return run(jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, ids, 0, keepdims=False), params), x)
        out = jnp.zeros_like(x)
        pick = (lambda e: (ids == e)[:, None, None]) if ids.ndim == 1 else (lambda e: (ids == e)[:, :, None])
        for e in range(self.num_experts):  # per-row / per-token routing: each expert some row uses, on all rows
            p = jax.tree.map(lambda a, e=e: a[e], params)
            y = jax.lax.cond(active[e], run, lambda p_, h: jnp.zeros_like(h), p, x)
            out = jnp.where(pick(e), y, out)
        return out


def active_experts(num_experts: int, *ids: jax.Array) -> jax.Array:
    """bool [E]: the experts that any row of ``ids`` (int arrays of expert indices) is routed to."""
    a = jnp.zeros((num_experts,), bool)
    for x in ids:
        a = a | jnp.any(x.reshape(-1)[:, None] == jnp.arange(num_experts)[None, :], axis=0)
    return a


def make_route(experts: jax.Array | None, spec: MoTESpec, batch: int):
    """The route of a forward pass. ``experts``: an int scalar (one expert for every row: the fast path), an
    int array [B] (an expert per row), an int array [B, L] (an expert per token: packed rows; -1 = padding), or
    None (the default expert). -> (ids, active [E] or None)."""
    if experts is None:
        return jnp.asarray(spec.index(spec.default), jnp.int32), None
    ids = jnp.asarray(experts, jnp.int32)
    if ids.ndim == 0:
        return ids, None
    ids = ids.reshape(batch, -1) if ids.ndim == 2 else ids.reshape(batch)
    return ids, active_experts(spec.num_experts, ids)


def is_expert_path(path: Sequence) -> bool:
    """Whether a parameter path (Flax state path or optax key path) lies inside a MoTE expert stack."""
    return any(getattr(k, "key", k) == "experts" for k in path)


def dense_path(path: tuple) -> tuple:
    """The dense model's path of a MoTE parameter path (the ``experts`` level removed)."""
    return tuple(k for k in path if k != "experts")
