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
from typing import TYPE_CHECKING, Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from jaxembed.errors import UserError

if TYPE_CHECKING:
    from flax import nnx

# flax and the losses are imported where they are used: a command that only joins a pod (``jaxembed data
# prepare``, through ``initialize``) never pays for them (~0.5 CPU-s and ~20 MiB per process)

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
    from flax import nnx

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
    from flax import nnx

    graphdef, state = nnx.split(model)
    specs = param_specs(state, mesh, strategy)
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))
    state = jax.device_put(state, shardings)
    return nnx.merge(graphdef, state)


_initialized = False
_cluster: dict | None = None

_OFF = ("off", "0", "false", "no")
_ON = ("on", "1", "true", "yes")
_SLURM_NEEDS = ("SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")  # what JAX's detector reads


def _env_int(env, name: str, example: str) -> int | None:
    text = env.get(name)
    if text is None or text.strip() == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise UserError(f"{name}={text!r}: not an integer (fix: e.g. {name}={example})") from None


def _slurm_tasks_on_node(env) -> int | None:
    """Tasks of this step on this node, from SLURM_STEP_TASKS_PER_NODE (e.g. '8(x2),4') and SLURM_NODEID."""
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if not spec:
        return None
    counts: list[int] = []
    try:
        for part in spec.split(","):
            n, _, rep = part.partition("(x")
            counts += [int(n)] * (int(rep.rstrip(")")) if rep else 1)
        node = int(env.get("SLURM_NODEID", "0"))
    except ValueError:
        return None
    return counts[node] if 0 <= node < len(counts) else None


def _visible_gpus(env) -> int | None:
    """GPUs this process may use, without starting JAX: CUDA_VISIBLE_DEVICES, else SLURM_GPUS_ON_NODE."""
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        ids = [x for x in cvd.split(",") if x.strip() and x.strip() != "NoDevFiles"]
        return len(ids)
    n = env.get("SLURM_GPUS_ON_NODE")
    return int(n) if n and n.isdigit() else None


def cluster_plan(env=None, coordinator_address: str | None = None, num_processes: int | None = None,
                 process_id: int | None = None, local_device_ids=None) -> dict:
    """Decide how this process joins a multi-host run, from arguments and the environment (no JAX call).

    Returns ``{"mode", "detail", "kwargs"}``: mode is ``single`` (one process, all local devices, nothing to start),
    ``explicit`` (coordinator / count / id given), ``slurm``, ``tpu``, ``ompi`` or ``auto`` (JAX's own detection);
    kwargs go to ``jax.distributed.initialize``. An environment that is half set raises a UserError naming the
    missing variables and the fix. Precedence:

    1. ``JAXEMBED_DISTRIBUTED=off``: single process, whatever the environment says (``launch/local.sh`` sets it).
    2. Explicit: the arguments, or JAXEMBED_COORDINATOR (host:port), JAXEMBED_NUM_PROCESSES, JAXEMBED_PROCESS_ID;
       all three or none (tests/test_multihost.py runs this form).
    3. SLURM (SLURM_JOB_ID): a step of one task is a single process. With more tasks, JAX reads the srun task
       variables SLURM_STEP_NODELIST / SLURM_NTASKS / SLURM_PROCID / SLURM_LOCALID (coordinator: the step's first
       node, port from the job id or JAX_COORDINATOR_PORT). Local devices: one task per node gets every visible GPU;
       a task that sees one GPU gets it; otherwise JAX's default, the GPU numbered SLURM_LOCALID.
       ``JAX_LOCAL_DEVICE_IDS`` (JAX's own variable) overrides this.
    4. TPU: ``JAXEMBED_DISTRIBUTED=on`` (``launch/tpu_pod.sh`` sets it; JAX reads the worker list from the TPU VM
       metadata server), or TPU_WORKER_HOSTNAMES / TPU_PROCESS_ADDRESSES (GKE) / MEGASCALE_COORDINATOR_ADDRESS.
    5. Open MPI (OMPI_COMM_WORLD_SIZE > 1).
    Otherwise: a single process."""
    env = os.environ if env is None else env
    switch = env.get("JAXEMBED_DISTRIBUTED", "auto").strip().lower() or "auto"
    if switch not in _OFF + _ON + ("auto",):
        raise UserError(f"JAXEMBED_DISTRIBUTED={switch!r}: allowed: auto (default), on, off")
    if switch in _OFF:
        return {"mode": "single", "detail": "JAXEMBED_DISTRIBUTED=off", "kwargs": {}}

    coord = coordinator_address or env.get("JAXEMBED_COORDINATOR") or None
    n = num_processes if num_processes is not None else _env_int(env, "JAXEMBED_NUM_PROCESSES", "2")
    pid = process_id if process_id is not None else _env_int(env, "JAXEMBED_PROCESS_ID", "0")
    given = {"JAXEMBED_COORDINATOR": coord, "JAXEMBED_NUM_PROCESSES": n, "JAXEMBED_PROCESS_ID": pid}
    if any(v is not None for v in given.values()):
        missing = [k for k, v in given.items() if v is None]
        if missing:
            have = ", ".join(f"{k}={v}" for k, v in given.items() if v is not None)
            raise UserError(f"multi-host: {have} is set but {', '.join(missing)} "
                            f"{'is' if len(missing) == 1 else 'are'} not (fix: set all three of "
                            "JAXEMBED_COORDINATOR=host:port, JAXEMBED_NUM_PROCESSES, JAXEMBED_PROCESS_ID on every "
                            "process, or none of them)")
        host, _, port = coord.rpartition(":")
        if not host or not port.isdigit():
            raise UserError(f"JAXEMBED_COORDINATOR={coord!r}: expected host:port (fix: e.g. node001:12355, the "
                            "address of process 0)")
        if not 0 <= pid < n:
            raise UserError(f"JAXEMBED_PROCESS_ID={pid} with JAXEMBED_NUM_PROCESSES={n}: the id must be in "
                            f"[0, {n - 1}] (fix: number the processes 0 .. {n - 1})")
        return {"mode": "explicit", "detail": f"coordinator {coord}",
                "kwargs": {"coordinator_address": coord, "num_processes": n, "process_id": pid,
                           "local_device_ids": local_device_ids}}

    if "SLURM_JOB_ID" in env:
        job = env["SLURM_JOB_ID"]
        ntasks = _env_int(env, "SLURM_STEP_NUM_TASKS", "8") or _env_int(env, "SLURM_NTASKS", "8")
        if ntasks is None or ntasks <= 1:
            return {"mode": "single", "detail": f"SLURM job {job} with one task", "kwargs": {}}
        missing = [k for k in _SLURM_NEEDS if k not in env]
        if missing:
            raise UserError(f"SLURM job {job} has {ntasks} tasks but {', '.join(missing)} "
                            f"{'is' if len(missing) == 1 else 'are'} not set: this process is not one of its srun "
                            "tasks (fix: start `jaxembed train` with srun on every task, as launch/slurm_gpu.sh "
                            "does, or set JAXEMBED_DISTRIBUTED=off to train in this one process)")
        tasks_here, gpus = _slurm_tasks_on_node(env), _visible_gpus(env)
        ids, how = local_device_ids, "given"
        if ids is None and not env.get("JAX_LOCAL_DEVICE_IDS"):
            if tasks_here == 1 and gpus:
                ids, how = list(range(gpus)), f"one task on this node: all {gpus} GPUs"
            elif gpus == 1:
                ids, how = [0], "the one GPU visible to this task"
            elif gpus and tasks_here and tasks_here != gpus:
                raise UserError(f"SLURM job {job}: {tasks_here} tasks on this node but {gpus} GPUs visible: use "
                                f"one task per node or one per GPU (fix: --ntasks-per-node=1 or {gpus}, or set "
                                "JAX_LOCAL_DEVICE_IDS for each task)")
            else:
                how = "GPU number SLURM_LOCALID" if gpus else "no GPU"
        elif ids is None:
            how = f"JAX_LOCAL_DEVICE_IDS={env['JAX_LOCAL_DEVICE_IDS']}"
        import socket

        node = env.get("SLURMD_NODENAME") or socket.gethostname()
        return {"mode": "slurm", "detail": f"job {job}, task {env['SLURM_PROCID']} of {ntasks} on {node}, "
                                           f"devices: {how}",
                "kwargs": {"local_device_ids": ids}}

    tpu_vars = [k for k in ("TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES", "MEGASCALE_COORDINATOR_ADDRESS")
                if env.get(k)]
    if tpu_vars:
        gke = env.get("TPU_WORKER_HOSTNAMES") or env.get("TPU_PROCESS_ADDRESSES")
        if gke and "TPU_WORKER_ID" not in env:
            raise UserError(f"TPU: {tpu_vars[0]} is set but TPU_WORKER_ID is not (fix: set TPU_WORKER_ID to "
                            "this worker's index on every worker, as GKE does)")
        return {"mode": "tpu", "detail": f"from {', '.join(tpu_vars)}", "kwargs": {}}
    if switch in _ON:
        return {"mode": "auto", "detail": "JAXEMBED_DISTRIBUTED=on (JAX detects the TPU VM pod)", "kwargs": {}}
    size = _env_int(env, "OMPI_COMM_WORLD_SIZE", "2")
    if size is not None and size > 1:
        return {"mode": "ompi", "detail": f"Open MPI, {size} ranks", "kwargs": {}}
    return {"mode": "single", "detail": "no cluster environment", "kwargs": {}}


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_device_ids=None, cpu_collectives: str | None = None) -> dict:
    """Start multi-host JAX once (``jax.distributed.initialize``), before any other JAX call; returns the plan.

    How the process joins is decided by ``cluster_plan`` (see there: explicit arguments / JAXEMBED_* variables,
    SLURM, TPU pods, Open MPI; a single process with nothing configured is a no-op). ``jaxembed train`` calls this
    with no arguments; the launch scripts only set the environment. ``cpu_collectives='gloo'`` enables
    cross-process collectives on CPU. Every process of a multi-host run prints one line to stderr: its index, the
    process count, its local / global devices and how it was configured."""
    global _initialized, _cluster
    if _initialized:
        return _cluster
    plan = cluster_plan(None, coordinator_address, num_processes, process_id, local_device_ids)
    if cpu_collectives:
        jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    if plan["mode"] == "single":
        log.info("single process (%s)", plan["detail"])
        _initialized, _cluster = True, plan
        return plan
    kwargs = {k: v for k, v in plan["kwargs"].items() if v is not None}
    try:
        jax.distributed.initialize(**kwargs)
    except (ValueError, TypeError, RuntimeError) as e:
        raise UserError(f"multi-host start failed ({plan['mode']}: {plan['detail']}): {e} (fix: every process must "
                        "start with the same settings and reach process 0's coordinator; to run one process, set "
                        "JAXEMBED_DISTRIBUTED=off)") from None
    _initialized, _cluster = True, plan
    import sys

    local, devices = jax.local_devices(), jax.devices()
    plan["process_index"], plan["process_count"] = jax.process_index(), jax.process_count()
    plan["local_devices"], plan["global_devices"] = len(local), len(devices)
    try:  # for the log line only: JAX keeps the address it settled on (also when it detected it)
        from jax._src import distributed as _distributed

        coord = _distributed.global_state.coordinator_address
    except (ImportError, AttributeError):
        coord = plan["kwargs"].get("coordinator_address")
    print(f"jaxembed: process {jax.process_index()} of {jax.process_count()} ({plan['mode']}: {plan['detail']}); "
          f"{len(local)} local / {len(devices)} global devices ({local[0].platform}: "
          f"{', '.join(str(d.id) for d in local)}); coordinator {coord}", file=sys.stderr, flush=True)
    return plan


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
    from jaxembed.losses.infonce import contrastive_loss

    def f(q, c, pos_index, weights, qi, ci, peg_t_prev, temperature=None):
        kw = dict(loss_kwargs)
        if temperature is not None:
            kw["temperature"] = temperature
        return contrastive_loss(q, c, pos_index, weights=weights, qi=qi, ci=ci, peg_t_prev=peg_t_prev, **kw)

    return jax.jit(f)


def shard_map_loss(mesh: Mesh, terms_fn: Callable | None = None, **loss_kwargs) -> Callable:
    """The global loss with explicit collectives: f(q, c, pos_index, weights, qi, ci, peg_t_prev) -> (loss, metrics).

    Inputs are global arrays sharded over the batch axes (pos_index holds *global* candidate columns, as
    ``layout_pos_index`` on the global batch gives). Each device gathers all candidates and their attributes.
    ``temperature`` (a scalar, e.g. the batch's task temperature) overrides the one in ``loss_kwargs``;
    ``terms_fn``: each device's query terms (default ``jaxembed.losses.infonce.query_terms``)."""
    from jaxembed.losses.core import CandidateInfo, QueryInfo
    from jaxembed.losses.infonce import contrastive_loss, query_terms

    terms_fn = query_terms if terms_fn is None else terms_fn
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
