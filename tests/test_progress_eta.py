"""The plain progress line of `jaxembed train` (jaxembed/runs/monitor.py) on a simulated asynchronous device: a
fake clock, steps that the host dispatches at once and the device completes one after another, and new batch shapes
that compile on the host. The line times completed steps (it waits on a step's result), leaves the compiling steps
out of the rate, and its ETA is within 25 % of the time the run really has left from 10 % of the run on."""

import re

import numpy as np

from jaxembed.runs.monitor import Monitor, batch_shapes


class FakeDevice:
    """Host time ``now``; the device runs the dispatched steps in order, ``step_s`` each; compiling a new shape
    holds the host ``compile_s``; a dispatch waits while ``queue`` steps are in flight. ``sync(i)`` waits until
    step i is complete."""

    def __init__(self, step_s: float, compile_s: float, dispatch_s: float = 0.001, queue: int = 3):
        self.now, self.free_at, self.done = 0.0, 0.0, {}
        self.step_s, self.compile_s, self.dispatch_s = step_s, compile_s, dispatch_s
        self.syncs, self.queue = [], queue

    def clock(self) -> float:
        return self.now

    def dispatch(self, i: int, compiles: bool) -> int:
        self.now = max(self.now, self.done.get(i - self.queue, 0.0))
        self.now += self.dispatch_s + (self.compile_s if compiles else 0.0)
        self.free_at = max(self.free_at, self.now) + self.step_s
        self.done[i] = self.free_at
        return i

    def sync(self, result) -> None:
        self.syncs.append(result)
        if result is not None:
            self.now = max(self.now, self.done[result])


def _run(tmp_path, capsys, steps=200, new_shapes=(0, 3, 10, 40, 90), step_s=1.0, compile_s=20.0, before=True,
         bar=False):
    """-> (device, [(step, host time, the plain line)]); with ``bar``, the terminal bar's last drawing instead."""
    dev = FakeDevice(step_s, compile_s)
    m = Monitor(tmp_path, steps, tensorboard=False, progress=bar, clock=dev.clock, sync=dev.sync)
    m.PLAIN_EVERY_S = m.BAR_EVERY_S = 10.0
    lines, prev, shape = [], None, 0
    for i in range(steps):
        shape += i in new_shapes
        compiles = m.before_step(("rows", shape), prev) if before else i in new_shapes
        assert compiles == (i in new_shapes)
        prev = dev.dispatch(i, compiles)
        m.advance(result=prev)
        out = capsys.readouterr()
        if bar:
            drawn = [x for x in re.split(r"[\r\n]", out.err) if "ETA=" in x]
            lines += [(i + 1, dev.now, drawn[-1])] if drawn else []
        else:
            lines += [(i + 1, dev.now, x) for x in out.out.splitlines() if x.startswith("train: step")]
    m.close()
    return dev, lines


def _eta_s(line: str) -> float:
    h = re.search(r"ETA (\d+)h(\d+)m$", line)
    if h:
        return 3600 * int(h[1]) + 60 * int(h[2])
    mm = re.search(r"ETA (\d+)m(\d+)s$", line)
    return 60 * int(mm[1]) + int(mm[2])


def test_eta_times_completed_steps_without_the_compiling_ones(tmp_path, capsys):
    dev, lines = _run(tmp_path, capsys)
    end = dev.done[199]
    assert len(lines) >= 10 and lines[-1][0] == 200 and lines[-1][2].endswith("ETA 0m00s")
    assert lines[0][:2] == (1, 21.001) and lines[0][2] == ("train: step 1/200 (0 %), elapsed 0m21s, ETA not known "
                                                           "yet (each step so far compiled)")
    for step, now, line in lines[1:]:
        assert re.search(r", 1\.0\d* s/step, ", line) or ", 1 s/step, " in line, line  # the step, not its dispatch
        if step >= 20:  # from 10 % of the run on
            truth = end - now
            assert abs(_eta_s(line) - truth) <= 0.25 * truth + 1, (line, truth)
    # a wait before each compiling step (on the step before it) and after it, and one per progress line
    assert dev.syncs.count(None) == 1 and {2, 3, 9, 10, 39, 40, 89, 90} <= set(dev.syncs)
    assert len(dev.syncs) <= 2 * 5 + len(lines)


def test_the_terminal_bar_shows_the_rate_and_eta_of_completed_steps(tmp_path, capsys):
    """The bar on a terminal: tqdm's own rate would count dispatches (a thousand steps a second here); the bar shows
    the completed steps' rate and an ETA within 25 % of the truth from 10 % of the run on."""
    dev, lines = _run(tmp_path, capsys, bar=True)
    end = dev.done[199]
    assert len(lines) >= 10 and "it/s" not in lines[-1] and "step/s" not in lines[-1], lines[-1]
    for step, now, line in lines:
        if "s/step=" not in line:
            assert "ETA=not known yet" in line, line
            continue
        assert re.search(r"s/step=1(\.0\d*)?[,\]]", line), line
        if step >= 20:
            truth = end - now
            eta = re.search(r"ETA=(\d+)m(\d+)s", line)
            assert abs(60 * int(eta[1]) + int(eta[2]) - truth) <= 0.25 * truth + 1, (line, truth)


def test_without_before_step_the_rate_still_counts_completed_steps(tmp_path, capsys):
    """A caller that does not say which steps compile: the rate is of completed steps after the first one."""
    _, lines = _run(tmp_path, capsys, new_shapes=(0,), before=False)
    rates = [float(re.search(r", ([\d.]+) s/step", x)[1]) for _, _, x in lines if "s/step" in x]
    assert rates and np.allclose(rates, 1.0, atol=0.01)


def test_a_run_of_compiling_steps_only_falls_back_to_every_completed_step(tmp_path, capsys):
    _, lines = _run(tmp_path, capsys, steps=4, new_shapes=(0, 1, 2, 3), compile_s=5.0)
    assert lines and lines[-1][2].startswith("train: step 4/4 (100 %), ") and "ETA 0m00s" in lines[-1][2]
    assert float(re.search(r", ([\d.]+) s/step", lines[-1][2])[1]) > 5  # compilation included: no other steps


def test_batch_shapes_key_names_shapes_dtypes_and_extra():
    a = {"x": np.zeros((4, 8), np.int32), "y": np.zeros(4, np.float32), "n": 3}
    assert batch_shapes(a) == batch_shapes(dict(reversed(list(a.items()))))
    assert batch_shapes(a) != batch_shapes({**a, "x": np.zeros((4, 16), np.int32)})
    assert batch_shapes(a) != batch_shapes({**a, "x": np.zeros((4, 8), np.int64)})
    assert batch_shapes(a, True) != batch_shapes(a, False)
