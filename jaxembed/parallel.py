"""Devices, meshes and shardings; multi-host initialisation; the contrastive loss across devices.

The mesh has three axes, built deliberately with ``AxisType.Auto`` (jax >= 0.9's ``jax.make_mesh`` makes Explicit
meshes): ``data`` (data parallel), ``fsdp`` (data parallel whose members also shard the parameters) and
``tensor`` (reserved for tensor parallelism). A batch is sharded over ``("data", "fsdp")``.

Two equivalent implementations of the global loss (tests: equal to a single-device reference):
- ``jit_loss``: the loss on global arrays under ``jax.jit`` with named shardings; XLA inserts the collectives.
- ``shard_map_loss``: explicit ``jax.shard_map``; each device keeps its queries, gathers every candidate of the
  global batch (``all_gather``), computes its queries' terms (plain or tiled) and ``psum``s the totals. The
  backward pass of ``all_gather`` is a reduce-scatter, so each device gets exactly its candidates' gradients.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from jaxembed.errors import UserError
from jaxembed.losses.core import CandidateInfo, QueryInfo
from jaxembed.losses.infonce import contrastive_loss, query_terms

log = logging.getLogger(__name__)

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, devices=None) -> Mesh:
    """A (data, fsdp, tensor) mesh over ``devices`` (default: all). ``-1`` for one axis takes the remaining devices.
    Axis types are Auto (GSPMD propagation under jit; shard_map is explicit anyway)."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = [data, fsdp, tensor]
    if sizes.count(-1) > 1:
        raise UserError("mesh: at most one of data / fsdp / tensor may be -1")
    known = int(np.prod([s for s in sizes if s != -1]))
    if -1 in sizes:
        if len(devices) % known:
            raise UserError(f"mesh: {len(devices)} devices are not divisible by {known} (the other axes)")
        sizes[sizes.index(-1)] = len(devices) // known
    if int(np.prod(sizes)) != len(devices):
        raise UserError(f"mesh: data x fsdp x tensor = {sizes[0]} x {sizes[1]} x {sizes[2]} = {int(np.prod(sizes))}"
                        f" but there are {len(devices)} devices")
    arr = np.array(devices, dtype=object).reshape(sizes)
    return Mesh(arr, AXES, axis_types=(AxisType.Auto,) * len(AXES))


def batch_sharding(mesh: Mesh, ndim: int = 1) -> NamedSharding:
    """Leading axis over the data-parallel axes, the rest replicated."""
    return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


# Logical parameter axes (jaxembed.models.layers) -> mesh axes, per strategy.
RULES = {
    "replicate": {},
    "fsdp": {"embed": "fsdp", "vocab": None},
    "fsdp_tp": {"embed": "fsdp", "mlp": "tensor", "qkv": "tensor", "heads": "tensor"},
}


def param_specs(state: Any, mesh: Mesh, strategy: str = "replicate") -> Any:
    """PartitionSpecs for every variable of an nnx state, from its logical ``out_sharding`` axes.

    An axis is only sharded when its size divides evenly over the mesh axis; otherwise it stays replicated."""
    if strategy not in RULES:
        raise UserError(f"param sharding {strategy!r} is not one of {', '.join(RULES)}")
    rules = RULES[strategy]

    def spec(var):
        axes = var.get_metadata().get("out_sharding") if hasattr(var, "get_metadata") else None
        shape = getattr(var, "shape", ())
        if not axes:
            return P()
        out, used = [], set()
        for size, name in zip(shape, axes):
            m = rules.get(name)
            if m is None or m in used or size % mesh.shape[m]:
                out.append(None)
            else:
                out.append(m)
                used.add(m)
        return P(*out)

    return jax.tree.map(spec, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def shard_model(model: nnx.Module, mesh: Mesh, strategy: str = "replicate") -> nnx.Module:
    """Place a model's parameters on ``mesh`` (replicated, or FSDP-sharded by their logical axes)."""
    graphdef, state = nnx.split(model)
    specs = param_specs(state, mesh, strategy)
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))
    state = jax.device_put(state, shardings)
    return nnx.merge(graphdef, state)


_initialized = False


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_device_ids=None, cpu_collectives: str | None = None) -> None:
    """Start multi-host JAX once (``jax.distributed.initialize``).

    With no arguments, JAX detects the cluster (TPU pods, SLURM, Open MPI); the environment variables
    JAXEMBED_COORDINATOR, JAXEMBED_NUM_PROCESSES, JAXEMBED_PROCESS_ID fill the explicit form. A single process
    with nothing configured is a no-op. ``cpu_collectives='gloo'`` enables cross-process collectives on CPU."""
    global _initialized
    if _initialized:
        return
    coordinator_address = coordinator_address or os.environ.get("JAXEMBED_COORDINATOR")
    if num_processes is None and os.environ.get("JAXEMBED_NUM_PROCESSES"):
        num_processes = int(os.environ["JAXEMBED_NUM_PROCESSES"])
    if process_id is None and os.environ.get("JAXEMBED_PROCESS_ID"):
        process_id = int(os.environ["JAXEMBED_PROCESS_ID"])
    if cpu_collectives:
        jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    cluster = any(k in os.environ for k in ("SLURM_JOB_ID", "TPU_WORKER_HOSTNAMES", "OMPI_COMM_WORLD_SIZE"))
    if coordinator_address is None and not cluster:
        _initialized = True
        return
    jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                               process_id=process_id, local_device_ids=local_device_ids)
    _initialized = True
    log.info("jax.distributed: process %d of %d, %d local / %d global devices", jax.process_index(),
             jax.process_count(), jax.local_device_count(), jax.device_count())


def host_local_to_global(batch: Any, sharding: Mesh | NamedSharding) -> Any:
    """Host-local numpy arrays (this process's rows) -> global jax Arrays via
    ``jax.make_array_from_process_local_data``.

    sharding: a Mesh (rows split over the batch axes) or a NamedSharding whose spec splits dim 0 (used for every
    row array; other dims replicated). 0-d entries (step, temperature) become replicated arrays. int64 entries
    become int32 when jax_enable_x64 is off (an error if a value does not fit)."""
    if isinstance(sharding, Mesh):  # jaxembed meshes: rows over (data, fsdp); any other mesh: over all its axes
        axes = BATCH_AXES if set(BATCH_AXES) <= set(sharding.axis_names) else tuple(sharding.axis_names)
        mesh, rows_spec = sharding, P(axes)
    else:
        mesh, rows_spec = sharding.mesh, sharding.spec
    x64 = bool(jax.config.jax_enable_x64)

    def one(x):
        x = np.asarray(x)
        if x.dtype == np.int64 and not x64:
            if x.size and (x.max() > np.iinfo(np.int32).max or x.min() < np.iinfo(np.int32).min):
                raise UserError("a batch array holds values beyond int32 (fix: enable jax_enable_x64)")
            x = x.astype(np.int32)
        if x.ndim == 0:
            return jax.make_array_from_process_local_data(replicated(mesh), x, x.shape)
        spec = P(rows_spec[0], *([None] * (x.ndim - 1)))
        return jax.make_array_from_process_local_data(NamedSharding(mesh, spec), x)

    return jax.tree.map(one, batch)


def jit_loss(mesh: Mesh, **loss_kwargs) -> Callable:
    """The global loss under jit with named shardings: f(q, c, pos_index, weights, qi, ci, peg_t_prev)."""

    def f(q, c, pos_index, weights, qi, ci, peg_t_prev, temperature=None):
        kw = dict(loss_kwargs)
        if temperature is not None:
            kw["temperature"] = temperature
        return contrastive_loss(q, c, pos_index, weights=weights, qi=qi, ci=ci, peg_t_prev=peg_t_prev, **kw)

    return jax.jit(f)


def shard_map_loss(mesh: Mesh, terms_fn: Callable = query_terms, **loss_kwargs) -> Callable:
    """The global loss with explicit collectives: f(q, c, pos_index, weights, qi, ci, peg_t_prev) -> (loss, metrics).

    Inputs are global arrays sharded over the batch axes (pos_index holds *global* candidate columns, as
    ``layout_pos_index`` on the global batch gives). Each device gathers all candidates and their attributes.
    ``temperature`` (a scalar, e.g. the batch's task temperature) overrides the one in ``loss_kwargs``."""
    axis = BATCH_AXES
    kwargs = dict(loss_kwargs)
    default_temperature = kwargs.pop("temperature", None)

    def local(q, c, pos_index, weights, qi, ci, peg_t_prev, temperature):
        gather = lambda x: None if x is None else jax.lax.all_gather(x, axis, tiled=True)
        c_all = gather(c)
        ci_all = CandidateInfo(*(gather(x) for x in ci))
        return contrastive_loss(q, c_all, pos_index, weights=weights, qi=qi, ci=ci_all, peg_t_prev=peg_t_prev,
                                temperature=temperature, terms_fn=terms_fn, axis_name=axis, **kwargs)

    spec = P(axis)

    def f(q, c, pos_index, weights, qi: QueryInfo, ci: CandidateInfo, peg_t_prev, temperature=None):
        in_specs = (spec, spec, spec, None if weights is None else spec,
                    QueryInfo(*(None if x is None else spec for x in qi)),
                    CandidateInfo(*(None if x is None else spec for x in ci)), P(), P())
        peg_t_prev = jnp.asarray(0.0 if peg_t_prev is None else peg_t_prev, jnp.float32)
        temperature = default_temperature if temperature is None else temperature
        if temperature is None:
            raise ValueError("shard_map_loss: no temperature (pass it to shard_map_loss or to the call)")
        temperature = jnp.asarray(temperature, jnp.float32)
        return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=P(), check_vma=False)(
            q, c, pos_index, weights, qi, ci, peg_t_prev, temperature)

    return jax.jit(f)
