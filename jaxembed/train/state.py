"""The train state on the mesh: ``init_state`` places the initial state (parameters replicated or FSDP-sharded,
the optimizer's moments sharded like their parameters); ``step_table`` / ``pow2_lengths`` give the loader the
plan's per-step text lengths (and packed rows)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxembed import lora, parallel, pod
from jaxembed.runs import optim

if TYPE_CHECKING:
    from jaxembed.train.run import Run


def shardings(mesh, strategy: str, state, pure: bool = True) -> Any:
    """NamedShardings of an nnx state's variables from their logical axes (``parallel.param_specs``), as a pure
    dict (pure=True) or an nnx state."""
    specs = parallel.param_specs(state, mesh, strategy)
    shard = jax.tree.map(lambda s: jax.sharding.NamedSharding(mesh, s), specs,
                         is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    return nnx.to_pure_dict(shard) if pure and isinstance(shard, nnx.State) else shard


def param_shardings(run: Run, params_state) -> Any:
    return shardings(run.mesh, run.config.train.param_sharding, params_state)


def init_state(run: Run) -> dict:
    """The initial train state, placed on the mesh: params replicated or FSDP-sharded, and the optimizer's
    parameter-shaped leaves (Adam's moments) sharded like their parameters. LoRA: params = the adapters only."""
    _, params_state, _ = nnx.split(run.loaded.model, lora.TRAINABLE if run.lora is not None else nnx.Param, ...)
    pure = nnx.to_pure_dict(params_state)
    placement = param_shardings(run, params_state)
    pure = jax.device_put(pure, placement)
    rep = parallel.replicated(run.mesh)
    opt_state = jax.jit(run.tx.init, out_shardings=optim.state_shardings(run.tx, pure, placement, rep))(pure)
    state = {
        "params": pure,
        "opt_state": opt_state,
        "step": jnp.asarray(0, jnp.int32),
        "rng": jax.random.key_data(jax.random.key(run.config.train.seed)),
        "peg_t": jnp.asarray(0.0, jnp.float32),
        "nonfinite": jnp.asarray(0, jnp.int32),
        "skipped": jnp.asarray(0, jnp.int32),
    }
    return jax.tree.map(lambda x: x if isinstance(x, jax.Array) and len(x.sharding.device_set) > 1
                        else jax.device_put(x, rep), state)


def step_table(run: Run, cache: Path, round_lengths: str | None = None):
    """The loader's table of step shapes (``jaxembed.data.step_table.StepTable``): computed in windows of steps
    as the loader reaches them; process 0 writes the windows it computes to ``cache``, the others read them there.
    round_lengths: 'pow2' (padded batches: lengths rounded up to powers of two)."""
    from jaxembed.data.pipeline import StepTable

    return StepTable(run.store, run.plan, run.loaded.tokenizer, packing=run.packing, num_candidates=run.K,
                     cache=cache, write=pod.is_main(), round_lengths=round_lengths)


def pow2_lengths(lengths: np.ndarray, smallest: int = 16) -> np.ndarray:
    """Round each step's longest text up to a power of two (>= smallest): the loader then pads to one of
    16 / 32 / 64 / ... (or the maximum length), so a run compiles its step for a handful of shapes."""
    x = np.maximum(np.asarray(lengths), smallest)
    return (2 ** np.ceil(np.log2(x))).astype(np.int32)
