"""Run ``jaxembed`` with a pause at one train step, so that a signal test never races the run's end.

    python tests/signal_pause.py STEP MARKER [jaxembed arguments ...]

After it logs train step STEP, the trainer writes the file MARKER and waits (at most 300 s) until its own SIGTERM /
SIGINT handler has received a signal. The test sends the signal from outside once MARKER exists: the signal then
always arrives mid-run, at step STEP, however slow or loaded the machine. Everything else is the real
``jaxembed`` command (signal handling, checkpoint, exit status).

Several processes (a pod): SIGTERM goes to JAX's preemption service, not to a Python handler. After a SIGTERM to
any process, the service's sync protocol (TSL's PreemptionSyncManager) has every process send the step of its last
``reached_preemption_sync_point`` call to the coordination service, under PREEMPTION_CURRENT_COUNTER/, and holds
that call until all have; every process then stops at the largest step + 1. Each process waits here until its
own step is sent: paused before step STEP's call, the pod then stops at STEP.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    step, marker, rest = int(argv[0]), Path(argv[1]), argv[2:]
    from jaxembed.runs import monitor
    from jaxembed.cli import main as jaxembed_main

    log = monitor.Monitor.log

    def paused_log(self, at, metrics, prefix="train"):
        log(self, at, metrics, prefix)
        if prefix != "train" or at != step:
            return
        marker.write_text(str(at))
        handler = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)  # jaxembed.runs.signals.StopSignals
        t0 = time.time()
        if handler is None and _pod():
            while not _step_sent() and time.time() - t0 < 300:
                time.sleep(0.01)
        while handler is not None and handler.received is None and time.time() - t0 < 300:
            time.sleep(0.01)

    monitor.Monitor.log = paused_log
    return jaxembed_main(rest)


def _pod() -> bool:
    import jax

    return jax.process_count() > 1


def _step_sent() -> bool:
    """Whether the preemption sync protocol has this process's step (module docstring)."""
    import jax
    from jax._src import distributed

    entries = distributed.global_state.client.key_value_dir_get("PREEMPTION_CURRENT_COUNTER/")
    me = jax.process_index()
    return any(k.rsplit("/", 1)[-1] in (str(me), f"task:{me}") for k, _ in entries)  # the key ends with the task


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
