"""Stop requests: SIGTERM (a scheduler's preemption, ``scancel``, a sweep passing it on) and SIGINT (Ctrl-C).

``with StopSignals() as sig:`` installs one handler for both signals that records the first one in
``sig.received``, and puts the previous handlers back at the end of the block (outside the main thread, where
Python installs no handler, nothing is installed). A long job checks ``sig.stop_at(step)`` at every step boundary,
saves a checkpoint and stops; its command then exits 143. A second SIGINT (Ctrl-C pressed again) raises
KeyboardInterrupt at once. Inside ``sig.interruptible()`` a signal raises ``Interrupted`` at once instead (work
that a rerun does again anyway: a dev evaluation, an export), so a preemption's grace period is not spent on it.

Users: the trainer (jaxembed.train, also with several processes: ``multi``), RetroMAE pre-training
(jaxembed.pretrain.retromae) and a local sweep (jaxembed.sweep.run, which passes the signal on to its running
child instead: ``on_signal``). tests/signal_pause.py finds the object through ``signal.getsignal`` and waits on
its ``received``.
"""

from __future__ import annotations

import contextlib
import logging
import signal

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(BaseException):
    """A stop signal inside ``StopSignals.interruptible()`` (a BaseException, like KeyboardInterrupt, so that no
    ``except Exception`` on the way swallows it)."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


class StopSignals:
    """Stop requests (SIGTERM from a scheduler's preemption, SIGINT): the loop saves a checkpoint and stops at the
    next step boundary.

    One process: a Python handler sets a flag. Inside ``interruptible()`` (a dev evaluation, the export) the signal
    raises ``Interrupted`` at once instead, so a preemption's grace period is not spent on work that the rerun
    does again. Several processes (``multi``): JAX's preemption service (started by jax.distributed) receives
    SIGTERM on any host, and ``stop_at(step)`` becomes true on every process at the same step
    (``multihost_utils.reached_preemption_sync_point``), so all save the same checkpoint and stop together; no
    Python handler is installed then (it would take SIGTERM from that service)."""

    def __init__(self, multi: bool = False):
        self.multi = multi
        self.received: int | None = None  # the first signal
        self._old = {}
        self._raise = False
        self._warned = False

    def __enter__(self):
        if not self.multi:
            for s in SIGNALS:
                try:
                    self._old[s] = signal.signal(s, self._handle)
                except ValueError:  # not the main thread
                    pass
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}

    def _handle(self, signum, frame):
        again = self.received is not None
        if not again:
            self.received = signum
        self.on_signal(signum, again)

    def on_signal(self, signum: int, again: bool) -> None:
        """What a signal does besides being recorded (``again``: one came before): inside ``interruptible()``
        raise Interrupted; a second SIGINT raises KeyboardInterrupt. A subclass may do something else."""
        if self._raise:
            self._raise = False
            raise Interrupted(signum)
        if again and signum == signal.SIGINT:
            raise KeyboardInterrupt

    def stop_at(self, step: int) -> bool:
        """Whether to save and stop after ``step`` (call it at every step, on every process)."""
        if not self.multi:
            return self.received is not None
        from jax.experimental import multihost_utils

        try:
            hit = bool(multihost_utils.reached_preemption_sync_point(step))
        except RuntimeError as e:  # jax_enable_preemption_service is off
            if not self._warned:
                log.warning("no preemption sync (%s): a SIGTERM stops the processes without a checkpoint", e)
                self._warned = True
            return False
        if hit:
            self.received = signal.SIGTERM
        return hit

    @contextlib.contextmanager
    def interruptible(self):
        """A signal inside raises Interrupted at once (one process; several: the block runs to its end)."""
        if self.multi:
            yield
            return
        if self.received is not None:
            raise Interrupted(self.received)
        self._raise = True
        try:
            yield
        finally:
            self._raise = False
