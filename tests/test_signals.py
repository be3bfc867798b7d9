"""jaxembed.runs.signals in this process (no training): the handlers come and go with the block, the first signal is
kept, a second Ctrl-C stops at once, ``interruptible()`` raises at once, a subclass's ``on_signal`` replaces both.
The trainer's, the sweep's and the launcher's signal tests (test_train.py, test_sweep.py, test_launch.py) run the
real commands."""

from __future__ import annotations

import os
import signal

import pytest

from jaxembed.runs.signals import Interrupted, StopSignals


def _send(signum: int) -> None:
    os.kill(os.getpid(), signum)  # the handler runs before os.kill returns (same thread, next bytecode)


def test_handlers_record_the_first_signal_and_are_restored():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with StopSignals() as sig:
        assert signal.getsignal(signal.SIGTERM).__self__ is sig  # what tests/signal_pause.py relies on
        assert sig.received is None and not sig.stop_at(1)
        _send(signal.SIGTERM)
        assert sig.received == signal.SIGTERM and sig.stop_at(1)
        _send(signal.SIGTERM)  # a second SIGTERM: still the first one, no exception
        assert sig.received == signal.SIGTERM
    assert {s: signal.getsignal(s) for s in before} == before


def test_second_sigint_raises_keyboard_interrupt():
    with StopSignals() as sig:
        _send(signal.SIGINT)
        assert sig.received == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            _send(signal.SIGINT)


def test_interruptible_raises_at_once():
    with StopSignals() as sig:
        with pytest.raises(Interrupted) as e, sig.interruptible():
            _send(signal.SIGTERM)
        assert e.value.signum == signal.SIGTERM and sig.received == signal.SIGTERM
        with pytest.raises(Interrupted), sig.interruptible():  # a signal that came before: raises on entry
            raise AssertionError("not reached")
    with StopSignals() as sig:
        with sig.interruptible():
            pass
        _send(signal.SIGTERM)  # outside the block: only recorded
        assert sig.received == signal.SIGTERM


def test_multi_process_installs_nothing():
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals(multi=True) as sig, sig.interruptible():
        assert signal.getsignal(signal.SIGTERM) is before


def test_subclass_on_signal_replaces_the_default():
    seen = []

    class Passing(StopSignals):
        def on_signal(self, signum, again):
            seen.append((signum, again))

    with Passing() as sig:
        _send(signal.SIGINT)
        _send(signal.SIGINT)  # no KeyboardInterrupt
    assert seen == [(signal.SIGINT, False), (signal.SIGINT, True)] and sig.received == signal.SIGINT
