"""Run-directory files written by several writers at once (jaxembed/runs/atomic_files.py, jaxembed/pod.py): unique
temporary names, atomic replacement, whole-folder exports, one-line write errors; the plan and the length table
through them; one run per run directory (jaxembed/runs/workdir_lock.py)."""

from __future__ import annotations

import errno
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from jaxembed import pod
from jaxembed.runs import atomic_files
from jaxembed.errors import UserError
from jaxembed.runs.rundir import RunDir
from jaxembed.runs.workdir_lock import WorkdirLock


def _at_once(n: int, fn) -> list:
    """Run fn(i) on n threads released together; returns the exceptions raised."""
    gate, errors = threading.Barrier(n), []

    def run(i):
        gate.wait()
        try:
            fn(i)
        except Exception as e:  # collected for the assertion
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_unique_tmp_names_differ_for_one_pid(tmp_path):
    names = {atomic_files.unique_tmp(tmp_path / "plan.npz").name for _ in range(100)}
    assert len(names) == 100
    name = next(iter(names))
    assert name.startswith(".plan.npz.tmp-") and f"-{os.getpid()}-" in name


def test_concurrent_plan_saves_all_succeed(tmp_path):
    """Every host of a pod saves plan.npz: 4 savers at once all succeed (each through its own temporary name)."""
    from jaxembed.data.plan import Plan

    plan = _tiny_plan()
    path = tmp_path / "plan.npz"
    for _ in range(3):
        assert _at_once(4, lambda i: plan.save(path)) == []
        assert Plan.load(path).fingerprint() == plan.fingerprint()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "plan.npz"]  # no temporary file left


def _tiny_plan():
    from jaxembed.data.plan import Plan

    steps, b = 3, 2
    return Plan(np.zeros((steps, b), np.int32), np.arange(steps * b, dtype=np.int64).reshape(steps, b),
                np.zeros(steps, np.int32), np.ones((steps, b), np.float32), np.full(steps, np.nan, np.float32),
                ("t",), ("d",), np.zeros(1, np.int32), np.array([steps * b], np.int64), {}, 0, {},
                np.zeros((0, 2), np.int64), np.zeros(steps, np.int32))


def test_write_with_is_atomic_and_cleans_up(tmp_path):
    p = tmp_path / "a.json"
    atomic_files.write_text(p, "old")
    with pytest.raises(RuntimeError):
        atomic_files.write_with(p, lambda t: (t.write_text("half"), (_ for _ in ()).throw(RuntimeError("disk"))))
    assert p.read_text() == "old" and [x.name for x in tmp_path.iterdir()] == ["a.json"]
    assert _at_once(8, lambda i: atomic_files.write_text(p, f"writer {i}\n" * 1000)) == []
    lines = p.read_text().splitlines()
    assert len(lines) == 1000 and len(set(lines)) == 1  # one writer's whole file, never a mix


def test_atomic_dir_replaces_a_whole_folder_or_nothing(tmp_path):
    out = tmp_path / "export"
    with atomic_files.atomic_dir(out) as d:
        (d / "config.json").write_text("{}")
    with pytest.raises(KeyboardInterrupt):  # a stop half-way: the old folder stays, no temporary folder is left
        with atomic_files.atomic_dir(out) as d:
            (d / "config.json").write_text('{"new": 1}')
            raise KeyboardInterrupt
    assert (out / "config.json").read_text() == "{}" and [p.name for p in tmp_path.iterdir()] == ["export"]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(UserError, match="mine: exists and is not a model folder; it is not replaced"):
        with atomic_files.atomic_dir(tmp_path / "mine"):
            pass


def test_write_errors_are_one_line():
    e = atomic_files.write_failed("saving the checkpoint of step 8", "/w/checkpoints/8",
                              ValueError("OUT_OF_RANGE: Failed writing: [OS error: No space left on device]"))
    assert str(e) == ("/w/checkpoints/8: saving the checkpoint of step 8 failed: [Errno 28] No space left on device "
                      "(fix: free space on that disk (or raise the quota / file-size limit); then run the same "
                      "command again)")
    with pytest.raises(UserError, match=r"^/x: writing the export failed: \[Errno 13\] Permission denied \(fix: "
                                        r"check that the folder is writable"):
        with atomic_files.writing("writing the export", "/x"):
            raise PermissionError(errno.EACCES, "Permission denied")
    with pytest.raises(KeyError):  # not a write failure: passes through
        with atomic_files.writing("writing the export", "/x"):
            raise KeyError("k")


def test_single_process_coordination_is_a_no_op():
    assert pod.process_count() == 1 and pod.is_main()
    assert pod.main_first("x", lambda: 3) == 3 and pod.all_agree("y", lambda: 4) == 4
    assert pod.broadcast("z", "v") == "v"
    pod.barrier("b")


def test_length_table_cache_tmp_names_are_unique(tmp_path, monkeypatch):
    """The length cache used '<name>.<pid>.tmp.npz': two containers with the same pid shared it."""
    from jaxembed.data import pipeline

    seen = []
    real = atomic_files.write_with

    def spy(path, writer, suffix=""):
        seen.append(atomic_files.unique_tmp(Path(path), suffix).name)
        return real(path, writer, suffix)

    monkeypatch.setattr(atomic_files, "write_with", spy)
    monkeypatch.setattr(pipeline, "step_lengths", lambda *a, **k: (np.ones(3, np.int32), np.ones(3, np.int32)))

    class Tables:
        K, max_q, max_d, q_instr, d_instr = 1, 8, 8, (), ()

    plan = _tiny_plan()
    monkeypatch.setattr(pipeline, "tokenizer_id", lambda tok: "tok")
    q, d = pipeline.cached_step_lengths(None, plan, None, tmp_path / "plan_lengths.npz", tables=Tables())
    assert q.tolist() == [1, 1, 1] and seen and f"-{os.getpid()}-" in seen[0] and ".tmp-" in seen[0]
    assert [p.name for p in tmp_path.iterdir()] == ["plan_lengths.npz"]


def test_metrics_line_torn_by_a_kill_is_cut_off(tmp_path):
    from jaxembed.runs.monitor import Monitor

    (tmp_path / "metrics.jsonl").write_text('{"step": 2, "split": "train"}\n{"step": 4, "spl')
    m = Monitor(tmp_path, 8, 4, tensorboard=False, progress=False)
    m.log(6, {"loss": 1.0})
    m.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert m.torn == 1 and [json.loads(x)["step"] for x in lines] == [2, 6]


def test_workdir_lock_refuses_a_second_holder_and_tidies_up(tmp_path):
    """A second lock on the same run directory is refused naming the holder; released, the lock file is gone, and
    a run directory the lock created is removed when nothing else was written in it."""
    wd = tmp_path / "run"
    first = WorkdirLock(wd)
    first.acquire()
    info = json.loads((wd / "run.lock").read_text())
    assert info["pid"] == os.getpid() and info["host"] and info["started"]
    with pytest.raises(UserError, match=rf"^{wd}: another run is writing this run directory \(pid {os.getpid()} on "):
        WorkdirLock(wd).acquire()
    first.release()
    assert not wd.exists()  # created by the lock, nothing else in it
    wd.mkdir()
    with WorkdirLock(wd):
        (wd / "config.json").write_text("{}")
    assert [p.name for p in wd.iterdir()] == ["config.json"]
    with WorkdirLock(wd), pytest.raises(UserError):  # released above: taken again; held: refused
        WorkdirLock(wd).acquire()


def test_workdir_lock_dies_with_its_process(tmp_path):
    """kill -9 of the holder: no handler runs, its lock file stays, and the next start takes the lock."""
    import signal
    import subprocess
    import sys

    wd = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom jaxembed.runs.workdir_lock import WorkdirLock\n"
                               f"WorkdirLock({str(wd)!r}).acquire()\nprint('held', flush=True)\ntime.sleep(600)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=f"pid {holder.pid} on "):
            WorkdirLock(wd).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (wd / "run.lock").exists()
    with WorkdirLock(wd):
        assert json.loads((wd / "run.lock").read_text())["pid"] == os.getpid()


def test_compile_cache_follows_the_run_unless_the_user_set_one(tmp_path):
    """train.compile_cache: JAX's persistent compilation cache in WORKDIR/jax_cache (a jitted program written there
    and loaded back), a later run of the same process moves it to its own run directory, off turns it off, and a
    cache the user configured (here the suite's, tests/conftest.py) stays whatever the run says."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.compilation_cache import compilation_cache as cc

    from jaxembed.runs import compile_cache

    suite = jax.config.jax_compilation_cache_dir
    assert suite and compile_cache.use_for_run(RunDir(tmp_path / "a"), True) == Path(suite)  # the user's: kept
    assert compile_cache.use_for_run(RunDir(tmp_path / "a"), False) == Path(suite)
    min_time = jax.config.jax_persistent_cache_min_compile_time_secs
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        cc.reset_cache()
        assert compile_cache.use_for_run(RunDir(tmp_path / "a"), True) == (tmp_path / "a" / "jax_cache").absolute()
        f = lambda x: jnp.sin(x) * 3.0 + 1.0  # noqa: E731
        jax.jit(f)(jnp.arange(7.0)).block_until_ready()
        assert any((tmp_path / "a" / "jax_cache").iterdir())
        hits = compile_cache.hits()
        jax.clear_caches()  # the in-memory cache: the next call goes to the persistent one
        jax.jit(f)(jnp.arange(7.0)).block_until_ready()
        assert compile_cache.hits() > hits  # f (and arange) loaded from WORKDIR/jax_cache
        assert compile_cache.use_for_run(RunDir(tmp_path / "b"), True) == (tmp_path / "b" / "jax_cache").absolute()
        assert jax.config.jax_compilation_cache_dir == str((tmp_path / "b" / "jax_cache").absolute())
        assert compile_cache.use_for_run(RunDir(tmp_path / "c"), False) is None
        assert not jax.config.jax_compilation_cache_dir and not (tmp_path / "c").exists()
    finally:
        jax.config.update("jax_compilation_cache_dir", suite)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", min_time)
        cc.reset_cache()
        compile_cache._ours = None
