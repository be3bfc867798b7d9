"""One run on several processes (a pod): every process runs the same command on one shared run directory; each
file has one writer (process 0, or each process its own file), and the others wait for it through the
coordinator that ``jax.distributed.initialize`` starts (its key-value store and barriers). Every call is a no-op
in a single process.

- ``main_first(name, fn)``: process 0 runs ``fn``; the others wait for its outcome and fail with process 0's
  error if it failed, so no process reads a file before its writer is done, and no process hangs on a barrier
  that an error on process 0 will never reach.
- ``all_agree(name, fn)``: every process runs ``fn``; each waits for all outcomes; if any failed, all fail with
  the first error (so an error on one host never leaves the others waiting).
- ``broadcast(name, value)``: process 0's string, on every process; ``barrier(name)``: all wait for all;
  ``gather(name, value)``: every process's string, on every process.
- ``exchange(name, fn)``: every process runs ``fn`` (-> a string) and gets every process's result, or all raise the
  first error, like ``all_agree``; for a name used once (it carries what makes it unique), so the processes may
  call several such names in any order and from a background thread (the coordinator's key-value store is no
  device collective); ``forget(name)`` removes this process's value once every process has read it.
- ``join()``: a command that works without devices (``data prepare``) joins the pod its environment describes.
- ``single_host_only(command)``: a command that runs on one host refuses a pod in one line.
Names must be the same on every process and called in the same order (a counter per name makes each use
unique). The wait is ``JAXEMBED_SYNC_TIMEOUT_S`` seconds at most (default 7200: a process may be preparing a large
dataset of the store). How a file is written whole: jaxembed.runs.atomic_files.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable

from jaxembed.errors import UserError

_ERR = "error:"
_counters: dict[str, int] = {}
_lock = threading.Lock()
#: the coordinator ``join`` started without JAX: {"client", "service", "count", "index"}
_joined: dict = {}


def process_count() -> int:
    """Processes of the run (1 unless jax.distributed was started, or ``join`` joined a pod)."""
    if _joined:
        return _joined["count"]
    client = _client()
    if client is None:
        return 1
    import jax

    return jax.process_count()


def process_index() -> int:
    if _joined:
        return _joined["index"]
    client = _client()
    if client is None:
        return 0
    import jax

    return jax.process_index()


def is_main() -> bool:
    return process_index() == 0


def _client():
    if _joined:
        return _joined["client"]
    if "jax" not in sys.modules:  # JAX never imported: no coordinator (and no import of JAX just to ask)
        return None
    try:
        from jax._src import distributed
    except ImportError:  # pragma: no cover
        return None
    return distributed.global_state.client


def timeout_s() -> float:
    text = os.environ.get("JAXEMBED_SYNC_TIMEOUT_S", "")
    try:
        return float(text) if text.strip() else 7200.0
    except ValueError:
        raise UserError(f"JAXEMBED_SYNC_TIMEOUT_S={text!r}: not a number of seconds (fix: e.g. 600)") from None


def _key(name: str) -> str:
    with _lock:
        n = _counters.get(name, 0)
        _counters[name] = n + 1
    return f"jaxembed/{name}/{n}"


def _get(client, key: str, what: str) -> str:
    ms = int(timeout_s() * 1000)
    try:
        return client.blocking_key_value_get(key, ms)
    except Exception as e:  # the coordinator's DEADLINE_EXCEEDED, or process 0 went away
        raise UserError(f"waited {timeout_s():.0f}s for {what} and gave up ({' '.join(str(e).split())[:200]}) "
                        "(fix: check the log of that process; JAXEMBED_SYNC_TIMEOUT_S sets the wait)") from None


def error_text(e: BaseException) -> str:
    """How the other processes are told of an error: a UserError's line, else the exception's type and message
    (a bug or an I/O error) on one line."""
    if isinstance(e, UserError):
        return str(e)
    return f"{type(e).__name__}: {' '.join(str(e).split())[:500]}"


def _outcome(fn: Callable[[], Any]) -> tuple[Any, str, BaseException | None]:
    try:
        return fn(), "ok", None
    except Exception as e:
        return None, _ERR + error_text(e), e


def main_first(name: str, fn: Callable[[], Any]) -> Any:
    """Process 0 runs ``fn`` and returns its result; the other processes wait until it is done and return None,
    or raise process 0's error as a UserError."""
    client = _client()
    if client is None or process_count() == 1:
        return fn()
    key = _key(name)
    if is_main():
        result, status, err = _outcome(fn)
        client.key_value_set(key, status)
        if err is not None:
            raise err
        return result
    status = _get(client, key, f"process 0 ({name})")
    if status.startswith(_ERR):
        raise UserError(status[len(_ERR):])
    return None


def all_agree(name: str, fn: Callable[[], Any]) -> Any:
    """Every process runs ``fn``; all wait for every outcome; if one failed, all raise the first error (with the
    failing process's index). Returns this process's result."""
    client = _client()
    if client is None or process_count() == 1:
        return fn()
    key = _key(name)
    me, n = process_index(), process_count()
    result, status, err = _outcome(fn)
    client.key_value_set(f"{key}/{me}", status)
    for i in range(n):
        s = status if i == me else _get(client, f"{key}/{i}", f"process {i} ({name})")
        if s.startswith(_ERR):
            if err is not None and i == me:
                raise err
            msg = s[len(_ERR):]
            raise UserError(msg if msg.startswith(f"process {i} ") else f"process {i}: {msg}")
    return result


def broadcast(name: str, value: str | None = None) -> str:
    """Process 0's ``value`` on every process (the others pass nothing)."""
    client = _client()
    if client is None or process_count() == 1:
        return value
    key = _key(name)
    if is_main():
        client.key_value_set(key, value)
        return value
    return _get(client, key, f"process 0 ({name})")


def gather(name: str, value: str) -> list[str]:
    """Every process's ``value``, in process order, on every process (each waits for all)."""
    client = _client()
    if client is None or process_count() == 1:
        return [value]
    key = _key(name)
    me = process_index()
    client.key_value_set(f"{key}/{me}", value)
    return [value if i == me else _get(client, f"{key}/{i}", f"process {i} ({name})") for i in range(process_count())]


def exchange(name: str, fn: Callable[[], str], stopped: Callable[[], bool] | None = None) -> list[str]:
    """Every process runs ``fn``; returns every process's string in process order; if one failed, all raise the
    first error (as ``all_agree``). ``name`` must be used once per run (no counter): the values stay with the
    coordinator until each process calls ``forget(name)``. stopped: polled while waiting (every
    ``POLL_S``); once true, the wait ends in a UserError (a background thread whose run is ending: a process
    that stopped will never send its value)."""
    client = _client()
    if client is None or process_count() == 1:
        return [fn()]
    me, n = process_index(), process_count()
    result, status, err = _outcome(fn)
    client.key_value_set(f"jaxembed/{name}/{me}", result if err is None else status)
    values = [result if i == me else _poll(client, f"jaxembed/{name}/{i}", f"process {i} ({name})", stopped)
              for i in range(n)]
    for i, v in enumerate(values):
        if i == me and err is not None:
            raise err
        if v.startswith(_ERR):
            msg = v[len(_ERR):]
            raise UserError(msg if msg.startswith(f"process {i} ") else f"process {i}: {msg}")
    return values


#: seconds between two looks at ``exchange``'s stopped while it waits
POLL_S = 1.0


def _poll(client, key: str, what: str, stopped: Callable[[], bool] | None) -> str:
    """``_get``, in waits of POLL_S that end early once ``stopped()``."""
    if stopped is None:
        return _get(client, key, what)
    deadline = time.monotonic() + timeout_s()
    while True:
        wait = min(POLL_S, max(deadline - time.monotonic(), 0.001))
        try:
            return client.blocking_key_value_get(key, int(wait * 1000))
        except Exception as e:
            if "DEADLINE_EXCEEDED" not in str(e) or time.monotonic() >= deadline:
                raise UserError(f"waited for {what} and gave up ({' '.join(str(e).split())[:200]}) (fix: check "
                                "the log of that process; JAXEMBED_SYNC_TIMEOUT_S sets the wait)") from None
        if stopped():
            raise UserError(f"stopped waiting for {what}: this process is ending its run")


def forget(name: str) -> None:
    """Remove this process's value of ``exchange(name)`` from the coordinator (none there: nothing)."""
    client = _client()
    if client is None or process_count() == 1:
        return
    try:
        client.key_value_delete(f"jaxembed/{name}/{process_index()}")
    except Exception:  # already gone: nothing to free
        pass


#: the variables by which ``jaxembed.parallel.cluster_plan`` tells a process of a multi-host run; none set: one
#: process, decided without importing JAX
_CLUSTER_VARS = ("JAXEMBED_DISTRIBUTED", "JAXEMBED_COORDINATOR", "JAXEMBED_NUM_PROCESSES", "JAXEMBED_PROCESS_ID",
                 "SLURM_JOB_ID", "TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES", "MEGASCALE_COORDINATOR_ADDRESS",
                 "OMPI_COMM_WORLD_SIZE")


def join() -> None:
    """Join the multi-host run this process's environment describes, for a command that shares work among the
    processes of a pod without using their devices (``data prepare``). Without any of the cluster variables:
    nothing (JAX is not imported). Given explicitly (JAXEMBED_COORDINATOR, JAXEMBED_NUM_PROCESSES,
    JAXEMBED_PROCESS_ID, all valid): the coordinator of ``jax.distributed`` (jaxlib's distributed runtime) is
    started without importing JAX itself (``_join_explicit``); otherwise ``jaxembed.parallel.initialize``."""
    if not any(os.environ.get(k) for k in _CLUSTER_VARS):
        return
    if _join_explicit(os.environ):
        return
    from jaxembed import parallel

    parallel.initialize()


def _explicit(env) -> tuple[str, int, int] | None:
    """(coordinator, processes, this process's index) when the environment gives a valid explicit pod that
    ``jaxembed.parallel.cluster_plan`` would take as it is; else None (it decides, and words any error)."""
    if (env.get("JAXEMBED_DISTRIBUTED", "auto").strip().lower() or "auto") not in ("auto", "on", "1", "true", "yes"):
        return None
    coord, n, pid = (env.get(k, "").strip() for k in ("JAXEMBED_COORDINATOR", "JAXEMBED_NUM_PROCESSES",
                                                        "JAXEMBED_PROCESS_ID"))
    host, _, port = coord.rpartition(":")
    if not (host and port.isdigit() and n.isdigit() and pid.isdigit() and int(pid) < int(n)):
        return None
    return coord, int(n), int(pid)


def _join_explicit(env) -> bool:
    """Start (process 0) and join the pod's coordinator as ``jax.distributed.initialize`` does, through jaxlib
    alone: importing JAX costs a pod process of ``data prepare`` ~1.5 CPU-s and ~60 MiB it never uses. False when
    the environment is not an explicit pod or jaxlib lacks the runtime (``join`` then starts JAX)."""
    given = _explicit(env)
    if given is None or _joined:
        return bool(_joined)
    try:
        from jaxlib import _jax
        service_of, client_of = _jax.get_distributed_runtime_service, _jax.get_distributed_runtime_client
    except (ImportError, AttributeError):  # pragma: no cover -- another jaxlib: JAX's own initialize
        return False
    coord, n, pid = given
    bind = env.get("JAX_COORDINATOR_BIND_ADDRESS") or "[::]:" + coord.rpartition(":")[2]
    try:
        service = service_of(bind, n, heartbeat_timeout=100, shutdown_timeout=300) if pid == 0 else None
        client = client_of(coord, pid, init_timeout=300, use_compression=True, heartbeat_timeout=100)
        client.connect()
    except Exception as e:  # noqa: BLE001 -- the coordinator's own error, in one line
        raise UserError(f"multi-host start failed (explicit: coordinator {coord}): {' '.join(str(e).split())[:300]} "
                        "(fix: every process must start with the same settings and reach process 0's coordinator; "
                        "to run one process, set JAXEMBED_DISTRIBUTED=off)") from None
    _joined.update(client=client, service=service, count=n, index=pid)
    import atexit

    atexit.register(_leave)
    print(f"jaxembed: process {pid} of {n} (explicit: coordinator {coord}; no devices: JAX not started)",
          file=sys.stderr, flush=True)
    return True


def _leave() -> None:
    """At exit: leave the coordinator (each client waits for the others, then process 0 stops the service)."""
    client, service = _joined.pop("client", None), _joined.pop("service", None)
    _joined.clear()
    if client is not None:
        client.shutdown()
    if service is not None:
        service.shutdown()


def barrier(name: str) -> None:
    """Every process waits here until all have arrived."""
    client = _client()
    if client is None or process_count() == 1:
        return
    key = _key(name).replace("/", "_")
    try:
        client.wait_at_barrier(key, int(timeout_s() * 1000))
    except Exception as e:
        raise UserError(f"waited {timeout_s():.0f}s at '{name}' for the other processes and gave up "
                        f"({' '.join(str(e).split())[:200]}) (fix: check their logs)") from None


def single_host_only(command: str) -> None:
    """Refuse, in one line, to run ``command`` as one process of a multi-host run (it would run once per host,
    each on its own, all writing the same outputs). Decided from the environment (parallel.cluster_plan), before
    any JAX call."""
    from jaxembed import parallel

    plan = parallel.cluster_plan()
    if plan["mode"] == "single":
        return
    hints = {"explicit": "unset JAXEMBED_COORDINATOR / JAXEMBED_NUM_PROCESSES / JAXEMBED_PROCESS_ID",
             "slurm": "run it as a single SLURM task (srun --ntasks=1)",
             "ompi": "run it without mpirun"}
    fix = hints.get(plan["mode"], "run it on one machine")
    raise UserError(f"{command} runs on one host (all its local devices), but this process is one of a multi-host "
                    f"run ({plan['mode']}: {plan['detail']}) (fix: start it once, on one host: {fix}, or set "
                    "JAXEMBED_DISTRIBUTED=off)")
