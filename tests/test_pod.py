"""A pod on one shared workdir (docs/design.md, Architecture; docs/reliability.md): two real `jaxembed train`
processes (2 CPU devices each, gloo collectives, JAXEMBED_COORDINATOR / _NUM_PROCESSES / _PROCESS_ID) started at
the same moment, on a 1-layer tiny BERT (what is checked -- files, checkpoints, signals, resume -- does not depend on
the depth; each process compiles half as much).

- They finish, on a slow shared disk (tests/faults slow_writes: the first write to each run file stalls half-way,
  so a process that read a file before its writer was done would see half of it, e.g. a JSONDecodeError on
  config.json), and their export equals a
  single process on the same 4 devices (<= 1e-5).
- One interrupted pod run (the ``interrupted`` fixture) for the two faults: both processes killed (-9) while the
  async save of step 6 is in flight (its final rename held, tests/faults hold_save) and started again: they say
  so, resume from the previous complete checkpoint (3) and save step 6 bitwise equal to the uninterrupted pod
  run's; that resumed pod is stopped by SIGTERM after step 6 (JAX's preemption sync: both processes save step 6
  and exit 143), and the run resumes on other layouts, 1 process x 4 devices and 1 x 2, with the defaults (packed
  rows, dropout on): each logs the uninterrupted one-process run's losses and ends with its parameters. The
  one-process runs on 4 devices (the uninterrupted one, then the resume) are two commands of one process
  (``jaxembed.cli.main`` in turn: a process start and its imports fewer); every other run is the console script.
- Commands that run on one host only refuse a multi-host environment with one line.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys

import jax
import numpy as np
import pytest

import runs


@pytest.fixture(scope="module")
def pod(tmp_path_factory, shared_data, minilm_dir):
    """The uninterrupted pod run (shared by the tests below)."""
    root = tmp_path_factory.mktemp("pod")
    cfg = runs.tiny_config(root / "tiny_train.py", runs.tiny_model(root / "model", minilm_dir, layers=1), shared_data)
    wd = root / "pod"
    procs = runs.start_pod(2, 2, ["train", "--config", str(cfg), "--workdir", str(wd)], root / "pod",
                           fault="slow_writes=0.5")
    return {"root": root, "config": cfg, "wd": wd, "outs": runs.wait_all(procs)}


def test_pod_started_at_once_on_one_workdir_equals_one_process(pod, one_process):
    wd = pod["wd"]
    for out in pod["outs"]:
        assert "completed at step 8" in out, out[-2000:]
    assert "process 0 of 2" in pod["outs"][0] and "process 1 of 2" in pod["outs"][1]
    assert runs.steps_of(wd) == [6, 8]
    assert runs.leftovers(wd) == []  # every temporary file was renamed into place or removed
    # the same run in one process on the same total device count (4)
    single = one_process["single"]
    a, b = runs.export_tensors(wd / "export"), runs.export_tensors(single / "export")
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=0, atol=1e-5, err_msg=k)
    from jaxembed.encode import load_encoder

    texts = ["a test sentence", "what is the capital of France?", "fossils in the rocks"]
    np.testing.assert_allclose(load_encoder(str(wd / "export")).encode(texts),
                               load_encoder(str(single / "export")).encode(texts), rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def interrupted(pod):
    """One pod run interrupted twice: killed (-9) while the async save of step 6 is in flight, then started again
    (it resumes from step 3) and stopped by SIGTERM after logging step 6. The pod pauses there
    (tests/signal_pause.py) until the SIGTERM sent to both processes has reached JAX's preemption sync, so it stops
    at 6 however loaded the machine. -> the facts seen after each interruption."""
    root = pod["root"]
    wd, held, paused = root / "interrupted", root / "hold.marker", root / "sigterm.marker"
    args = ["train", "--config", str(pod["config"]), "--workdir", str(wd)]
    procs = runs.start_pod(2, 2, args, root / "killed", fault="hold_save=6", marker=held)
    runs.wait_for(held, procs)  # step 6's checkpoint is written but not yet renamed into place
    for p in procs:
        p.kill9()
    killed = {"steps": runs.steps_of(wd),
              "tmp": [p.name for p in (wd / "checkpoints").iterdir() if "tmp" in p.name]}
    procs = runs.start_pod(2, 2, args, root / "resumed", pause=(6, paused))
    runs.wait_for(paused, procs)
    for p in procs:
        p.signal(signal.SIGTERM)
    outs = runs.wait_ended(procs, timeout=300)
    return {"wd": wd, "killed": killed, "outs": outs, "returncodes": [p.returncode for p in procs],
            "describe": runs.describe(procs), "steps": runs.steps_of(wd), "leftovers": runs.leftovers(wd)}


def test_pod_killed_during_async_save_resumes_bitwise(pod, interrupted):
    """The restarted pod removes the unfinished save, resumes from step 3 and saves step 6 (the SIGTERM's) bitwise
    equal to the uninterrupted pod's step 6: the 3 steps trained after the resume are the uninterrupted ones."""
    assert interrupted["killed"]["steps"] == [3]
    assert interrupted["killed"]["tmp"] == ["6.orbax-checkpoint-tmp"]
    out = interrupted["outs"][0]
    assert "removed 1 unfinished save(s) of a stopped run (6.orbax-checkpoint-tmp)" in out, out[-2000:]
    assert "resuming at step 3 of 8" in out
    assert interrupted["steps"] == [3, 6] and interrupted["leftovers"] == []
    assert runs.steps_of(pod["wd"]) == [6, 8]
    runs.assert_bitwise_equal(runs.params_at(interrupted["wd"], 6)[1], runs.params_at(pod["wd"], 6)[1])


def _train_losses(workdir) -> dict[int, float]:
    """Each logged train step's loss as first logged: a run resumed between two log steps (the interrupted pod, from
    step 3) logs the next one (4) again, averaged over the steps since the resume only."""
    lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    out: dict[int, float] = {}
    for x in lines:
        if x["split"] == "train":
            out.setdefault(x["step"], x["loss"])
    return out


# one process running `jaxembed` commands in turn (argv[1]: a JSON list of argument lists), each command's output
# after a line START + its arguments; it stops at the first that fails, with its exit status
IN_TURN = r"""
import json, sys
from jaxembed.cli import main
for argv in json.loads(sys.argv[1]):
    print(sys.argv[2] + " ".join(argv), flush=True)
    rc = main(argv)
    if rc:
        sys.exit(rc)
"""
START = "=== jaxembed "


@pytest.fixture(scope="module")
def one_process(pod, interrupted):
    """The runs in one process: on 4 devices, the pod's run uninterrupted (``single``: the same total device
    count), then the interrupted pod run resumed from its SIGTERM checkpoint (two commands of one process); on 2
    devices, the same resume (the console script). -> the run directories and each resume's output."""
    root = pod["root"]
    single = root / "single"
    resumed = {d: root / f"sigterm_on_{d}" for d in (4, 2)}
    for w in resumed.values():
        shutil.copytree(interrupted["wd"], w)
    args = {w: ["train", "--config", str(pod["config"]), "--workdir", str(w)] for w in (single, *resumed.values())}
    procs = [runs.Proc([sys.executable, "-c", IN_TURN, json.dumps([args[single], args[resumed[4]]]), START],
                       runs.env(4), root / "on_4_devices.log"),
             runs.start(args[resumed[2]], runs.env(2), root / "sigterm_on_2.log")]
    on_4, on_2 = runs.wait_all(procs)
    outs = on_4.split(START)
    assert len(outs) == 3 and outs[2].startswith(" ".join(args[resumed[4]])), on_4[-2000:]
    return {"single": single, "resumed": resumed, "outs": {4: outs[2], 2: on_2}}


def test_pod_stopped_by_sigterm_resumes_on_other_layouts(pod, interrupted, one_process):
    """A layout with another device count packs the texts of steps 7-8 into other rows; each text's dropout masks
    are its own (its id in the step, its positions: jaxembed.models.dropout), so the run continues as the
    uninterrupted one."""
    single, resumed = one_process["single"], one_process["resumed"]
    assert interrupted["returncodes"] == [143, 143], interrupted["describe"]
    assert "signal 15: checkpoint saved at step 6" in interrupted["outs"][0], interrupted["outs"][0][-2000:]
    assert interrupted["steps"] == [3, 6] and interrupted["leftovers"] == []
    want = _train_losses(single)
    assert sorted(want) == [2, 4, 6, 8]
    b, _ = runs.params_at(single, 8)
    for devices, w in resumed.items():
        out = one_process["outs"][devices]
        assert "resuming at step 6 of 8" in out and "completed at step 8" in out, out[-2000:]
        got = _train_losses(w)
        assert sorted(got) == [2, 4, 6, 8]
        for step in got:
            assert got[step] == pytest.approx(want[step], rel=1e-5, abs=1e-6), (devices, step, got[step], want[step])
        a, _ = runs.params_at(w, 8)
        worst = max(float(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)).max())
                    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
        assert worst <= 1e-5, (devices, worst)


def test_an_error_on_one_process_stops_every_process(pod, tmp_path):
    """Process 1 started with another config than process 0: both stop at once with the same error line (neither
    waits for the other until a timeout), before any work."""
    args = ["train", "--config", str(pod["config"]), "--workdir", str(tmp_path / "w")]
    procs = runs.start_pod(2, 2, args, tmp_path / "pod", extra={1: ["--config.optim.lr=0.5"]})
    outs = runs.wait_ended(procs, timeout=300)
    assert [p.returncode for p in procs] == [2, 2], runs.describe(procs)
    for out in outs:
        last = out.strip().splitlines()[-1]
        # each differing key with both values: process 0's learning rate, then process 1's
        assert last.startswith("error: process 1 has another config than process 0: optim.lr "), last
        assert " -> 0.5 (process 0's value -> this process's)" in last, last
    assert not (tmp_path / "w" / "store").exists()


def test_dev_evaluation_is_refused_on_a_pod(shared_data, tmp_path, monkeypatch):
    """eval.tasks on several processes: one line, raised in process 0's config step (so every process stops with
    it). Here the process count is faked: the coordination is a no-op in one process."""
    from jaxembed import config as cfglib
    from jaxembed import pod
    from jaxembed.errors import UserError
    from jaxembed.train import setup

    cfg = cfglib.load_config_file(str(runs.tiny_config(tmp_path / "c.py", tmp_path / "model", shared_data)))
    cfg.eval.tasks = ("STSBenchmark-dev",)
    monkeypatch.setattr(pod, "process_count", lambda: 2)
    with pytest.raises(UserError, match=r"^config.eval.tasks = \('STSBenchmark-dev',\): dev evaluation during "
                                        r"training runs in a single process, not on 2 \(fix: set "):
        setup(cfg, tmp_path / "w")
    assert not (tmp_path / "w" / "config.json").exists()


@pytest.mark.parametrize("argv", [
    ["pretrain", "retromae", "--config", "configs/retromae.py:tiny", "--workdir", "{tmp}/r"],
    ["score", "--store", "{tmp}/store", "--model", "m", "--out", "{tmp}/s"],
    ["mine", "--input", "{tmp}/x.jsonl", "--model", "m", "--out", "{tmp}/m.jsonl"],
], ids=["pretrain", "score", "mine"])
def test_single_host_commands_refuse_a_pod(argv, tmp_path, monkeypatch, capsys):
    from jaxembed import paths
    from jaxembed.cli import main

    monkeypatch.chdir(paths.REPO_ROOT)
    monkeypatch.setenv("JAXEMBED_COORDINATOR", "127.0.0.1:1")
    monkeypatch.setenv("JAXEMBED_NUM_PROCESSES", "2")
    monkeypatch.setenv("JAXEMBED_PROCESS_ID", "1")
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "runs on one host" in err[0] and "JAXEMBED_COORDINATOR" in err[0], err
    assert not (tmp_path / "r").exists() and not (tmp_path / "s").exists()
