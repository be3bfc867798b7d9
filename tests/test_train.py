"""The trainer: bad configs, a run directory with everything in it, non-finite steps, exact resume after SIGTERM /
SIGINT (bitwise-identical parameters on CPU), and the faults of docs/reliability.md (the end of this file): a
corrupted or truncated latest checkpoint, a full disk while writing a checkpoint, the export or the store, SIGTERM
during a dev evaluation and during the export. kill -9 during an async save, and resuming after it: tests/test_pod.py
(on a pod of two processes)."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxembed import config as cfglib
from jaxembed.errors import UserError


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, minilm_dir):
    """A 1-layer, 32-wide random BERT with MiniLM's tokenizer, as a sentence-transformers folder (tests/runs.py
    tiny_model; what is checked here -- run files, checkpoints, signals, resume, export -- does not depend on the
    depth, and each run traces and compiles half as much)."""
    import runs

    return runs.tiny_model(tmp_path_factory.mktemp("tiny_model"), minilm_dir, layers=1)


CONFIG_TEMPLATE = '''
from jaxembed.config import default_config
from jaxembed.data.config import dataset_config

def get_config(arg=None):
    c = default_config()
    c.model.name = {model!r}
    c.model.max_length = 64
    c.data.datasets = [
        dataset_config(name="stsb", path={stsb!r}, format="scored_pairs", task_type="sts", score_threshold=3.0,
                       num_negatives=0, max_query_length=16, max_doc_length=16),
        dataset_config(name="wikiqa", path={wikiqa!r}, task_type="retrieval", num_negatives=1,
                       query_instruction="Instruct: Given a question, retrieve answers \\n Query: ",
                       max_query_length=16, max_doc_length=16),
    ]
    c.plan.global_batch_size = 8
    c.plan.steps = 8
    c.optim.lr = 1e-3
    c.train.log_every = 2
    c.train.checkpoint_every = 3
    c.train.async_checkpoints = True
    c.export.at_end = True
    return c
'''


@pytest.fixture(scope="module")
def config_file(tmp_path_factory, tiny_model_dir, shared_data):
    p = tmp_path_factory.mktemp("cfg") / "tiny_train.py"
    p.write_text(CONFIG_TEMPLATE.format(model=str(tiny_model_dir), stsb=str(shared_data / "train/stsb_pairs.jsonl"),
                                        wikiqa=str(shared_data / "train/wikiqa.jsonl")))
    return p


def _params_at(workdir: Path, step: int):
    import orbax.checkpoint as ocp

    with ocp.CheckpointManager(workdir.absolute() / "checkpoints") as mgr:
        restored = mgr.restore(step, args=ocp.args.StandardRestore())
    return restored["params"], restored


def _assert_bitwise_equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def straight_run(config_file, tmp_path_factory):
    from jaxembed.train import train

    wd = tmp_path_factory.mktemp("straight")
    summary = train(cfglib.load_config_file(str(config_file)), wd)
    return wd, summary


def test_run_directory_holds_everything(straight_run):
    wd, summary = straight_run
    assert summary["status"] == "completed" and summary["step"] == 8 and summary["skipped"] == 0
    for name in ("config.json", "config.txt", "plan.npz", "metrics.jsonl", "summary.json", "store/manifest.json",
                 "export/model.safetensors", "export/modules.json"):
        assert (wd / name).exists(), name
    assert list((wd / "tensorboard").glob("events.out.tfevents.*"))
    assert sorted(int(p.name) for p in (wd / "checkpoints").iterdir() if p.name.isdigit()) == [6, 8]
    lines = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines()]
    train_lines = [x for x in lines if x["split"] == "train"]
    assert [x["step"] for x in train_lines] == [2, 4, 6, 8]
    for key in ("loss", "accuracy", "pos_sim", "hardest_neg_sim", "lr", "grad_norm", "examples_per_s",
                "tokens_per_s", "step_time_s"):
        assert all(np.isfinite(x[key]) for x in train_lines), key
    cfg = json.loads((wd / "config.json").read_text())
    assert cfg["plan"]["steps"] == 8
    # packed batches by default (data.packing): the table of packed shapes, most encoded slots hold a real token
    assert cfg["data"]["packing"] is True
    with np.load(wd / "plan_lengths.npz") as z:
        assert {"row_length", "pack_rows"} <= set(z.files)  # queries and candidates in one pack (dense model)
    assert all(0.6 < x["real_token_fraction"] <= 1.0 for x in train_lines), [x["real_token_fraction"]
                                                                              for x in train_lines]
    # the export loads in sentence-transformers, with the task prompts
    st = pytest.importorskip("sentence_transformers")
    m = st.SentenceTransformer(str(wd / "export"), device="cpu")
    assert m.prompts["wikiqa-query"].startswith("Instruct: Given a question")  # the task's instruction, mteb keys
    assert m.prompts["wikiqa"] == m.prompts["wikiqa-query"]
    from jaxembed.encode import load_encoder

    ours = load_encoder(str(wd / "export")).encode(["a test sentence", "another one"])
    np.testing.assert_allclose(ours, m.encode(["a test sentence", "another one"]), atol=1e-5)


def _start(config_file, wd, *extra, pause=None, own_cache=False):
    # texts are cut to 16 tokens (one length bucket) and compiled programs are shared through the suite's persistent
    # cache (tests/conftest.py), so each process compiles little. pause=(step, marker): tests/signal_pause.py.
    # own_cache: without the suite's cache, so the run keeps its programs in its own WORKDIR/jax_cache (every
    # program, however fast it compiled)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    if own_cache:
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    cmd = [str(Path(sys.executable).parent / "jaxembed")]
    if pause is not None:
        cmd = [sys.executable, str(Path(__file__).parent / "signal_pause.py"), str(pause[0]), str(pause[1])]
    return subprocess.Popen([*cmd, "train", "--config", str(config_file), "--workdir", str(wd), *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@contextlib.contextmanager
def _own_cache():
    """In this process, no compilation cache of the suite's (tests/conftest.py) while the block runs: a run then
    keeps its programs in WORKDIR/jax_cache, as a run does outside the suite (_start's own_cache)."""
    from jax.experimental.compilation_cache import compilation_cache

    suite = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)
    try:
        yield
    finally:
        jax.config.update("jax_compilation_cache_dir", suite)
        compilation_cache.reset_cache()


def _wait_paused(proc, marker, step):
    t0 = time.time()
    while not marker.exists():
        assert proc.poll() is None, f"the run ended before step {step}:\n" + proc.stdout.read()[-3000:]
        assert time.time() - t0 < 300, f"step {step} was never logged"
        time.sleep(0.02)


def _stopped_by(proc, sig, wd, step, logged) -> str:
    """Send ``sig`` to the paused run: it saves step ``step`` and exits 143, its metrics are the ``logged`` steps."""
    proc.send_signal(sig)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 143, out[-3000:]
    assert f"signal {int(sig)}: checkpoint saved at step {step}" in out, out[-3000:]
    assert json.loads((wd / "summary.json").read_text())["status"] == "preempted"
    assert [json.loads(x)["step"] for x in (wd / "metrics.jsonl").read_text().splitlines()] == logged
    assert not (wd / "run.lock").exists()
    return out


def test_signal_saves_then_resume_is_bitwise_identical(straight_run, config_file, tmp_path, capsys):
    """SIGTERM (preemption), then SIGINT (Ctrl-C), from outside, mid-run, on one run directory: the trainer pauses
    after logging step 2, then (resumed) step 4 (tests/signal_pause.py) until the signal has arrived, so the run can
    never finish first; neither is a checkpoint step (every 3), so each checkpoint is the signal's. The third start
    ends the run, bitwise equal to the uninterrupted one.

    While the first is paused, a second `jaxembed train` on the same workdir (no pod; called in this process: the
    refusal is the lock's, read from the run directory) is refused at once naming it, and it goes on alone (its
    metrics only). The runs' output: a visible start, one line per stage, and (no
    terminal: no progress bar) a plain progress line with the ETA. The runs use their own compilation cache
    (WORKDIR/jax_cache, the default outside the suite): the resumed runs load their train step from it. The two
    signalled runs are `jaxembed train` processes; the third start, which only resumes and ends the run, is called
    in this process (jaxembed.cli.main, the suite's cache set aside meanwhile)."""
    wd_straight, _ = straight_run
    wd = tmp_path / "run"
    proc = _start(config_file, wd, pause=(2, tmp_path / "at_step_2"), own_cache=True)
    _wait_paused(proc, tmp_path / "at_step_2", 2)
    from jaxembed.cli import main

    capsys.readouterr()
    rc = main(["train", "--config", str(config_file), "--workdir", str(wd)])
    second = capsys.readouterr()
    out = second.out + second.err
    assert rc == 2, out[-3000:]
    last = second.err.strip().splitlines()[-1]
    assert last.startswith(f"error: {wd}: another run is writing this run directory (pid {proc.pid} on ") and \
        "fix: wait for it to end or stop it, or use another --workdir" in last, out[-3000:]
    assert "Traceback" not in out and (wd / "run.lock").exists()
    out = _stopped_by(proc, signal.SIGTERM, wd, 2, [2])
    lines = out.splitlines()
    for start in ("model: ", "data: 2 datasets, ", "plan: 8 steps x 8 queries (positive + 1 hard negative per query",
                  f"run directory: {wd} (a new run", "training: steps 1-8; compiling the train step first"):
        assert any(x.startswith(start) for x in lines), (start, out[-3000:])
    assert "(bert, 1 layers, hidden 32, " in out and "stsb " in out and "wikiqa " in out
    assert any(x.startswith("train step: compiled in ") and x.endswith(f"(kept in {wd / 'jax_cache'})")
               for x in lines), out[-3000:]

    proc = _start(config_file, wd, pause=(4, tmp_path / "at_step_4"), own_cache=True)
    _wait_paused(proc, tmp_path / "at_step_4", 4)
    out = _stopped_by(proc, signal.SIGINT, wd, 4, [2, 4])
    assert "resuming at step 2 of 8" in out and "training: steps 3-8" in out, out[-3000:]
    assert f"train step: loaded from the compilation cache {wd / 'jax_cache'} in " in out, out[-3000:]

    capsys.readouterr()
    with _own_cache():
        rc = main(["train", "--config", str(config_file), "--workdir", str(wd)])
    third = capsys.readouterr()
    out = third.out + third.err
    assert rc == 0, out[-3000:]
    assert "resuming at step 4 of 8" in out and "training: steps 5-8" in out
    assert f"train step: loaded from the compilation cache {wd / 'jax_cache'} in " in out, out[-3000:]
    assert any(x.startswith("train: step 8/8 (100 %), ") and ", ETA 0m00s" in x for x in out.splitlines()), out[-3000:]
    a, _ = _params_at(wd, 8)
    b, _ = _params_at(wd_straight, 8)
    _assert_bitwise_equal(a, b)


def test_nonfinite_steps_are_skipped_then_stop(config_file, tmp_path):
    """Also: the step is built for K = 1 + the store's largest num_negatives, and the loader keeps that K when the
    plan never draws the dataset that has it (wikiqa at sampling weight 1e-9: the plan's own K would be 1; this was
    a shape error in the loss)."""
    from jaxembed.data.plan import Plan
    from jaxembed.train import TrainingStopped, train

    cfg = cfglib.load_config_file(str(config_file))
    cfg.data.sampling = "weights"
    cfg.data.datasets[1].weight = 1e-9
    cfg.plan.steps = 4
    cfg.train.inject_nonfinite_steps = (1,)  # step 1's loss and gradients are NaN
    cfg.train.checkpoint_every = 1
    cfg.train.keep_checkpoints = 4
    cfg.export.at_end = False
    s = train(cfg, tmp_path / "skip")
    assert s["status"] == "completed" and s["skipped"] == 1
    plan = Plan.load(tmp_path / "skip" / "plan.npz")
    assert set(plan.dataset_names[d] for d in plan.dataset_ids.ravel()) == {"stsb"}
    states = {k: _params_at(tmp_path / "skip", k)[1] for k in (1, 2, 3, 4)}  # the state after k steps
    assert [int(states[k]["skipped"]) for k in (1, 2, 3, 4)] == [0, 1, 1, 1]
    # the skipped step (the 2nd) changed no parameter and no optimizer state but the schedule's step count, which
    # advances with the step so that the applied learning rate is the logged schedule(step) and the schedule ends
    # at the last step; Adam's count (bias correction) stays behind by the skipped step
    _assert_bitwise_equal(states[2]["params"], states[1]["params"])
    before, after = (dict(jax.tree_util.tree_flatten_with_path(states[k]["opt_state"])[0]) for k in (1, 2))
    assert before.keys() == after.keys()
    changed = [p for p in before if not np.array_equal(np.asarray(before[p]), np.asarray(after[p]))]
    assert len(changed) == 1 and int(before[changed[0]]) == 1 and int(after[changed[0]]) == 2, changed
    counts = [p for p, v in before.items() if np.ndim(v) == 0 and "count" in jax.tree_util.keystr(p)]
    assert len(counts) == 2 and changed[0] in counts
    (adam_count,) = [p for p in counts if p != changed[0]]
    final = dict(jax.tree_util.tree_flatten_with_path(states[4]["opt_state"])[0])
    assert int(final[changed[0]]) == 4 and int(final[adam_count]) == 3
    assert not any(np.array_equal(np.asarray(a), np.asarray(b))  # the steps after the skip train again
                   for a, b in zip(jax.tree.leaves(states[3]["params"]), jax.tree.leaves(states[2]["params"]))
                   if np.size(a) > 1)
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(states[4]))
    cfg.train.inject_nonfinite_steps = (1, 2, 3)
    cfg.train.max_nonfinite = 3
    with pytest.raises(TrainingStopped, match=r"step 3: 3 non-finite losses or gradients in a row \(from step 1; "
                                              r"task '(stsb|wikiqa|sts|retrieval)'\)"):
        train(cfg, tmp_path / "stop")


@pytest.mark.parametrize("key,value,match", [
    ("loss.type", "focal", r"config.loss.type = 'focal' is not valid: allowed: infonce, peg"),
    ("optim.lr", -1.0, r"config.optim.lr = -1.0 is not valid: a positive number"),
    ("loss.temperature", 0.0, r"config.loss.temperature = 0.0 is not valid"),
    ("train.param_sharding", "zero3", r"allowed: replicate, fsdp, fsdp_tp"),
    ("model.dtype", "float8", r"config.model.dtype"),
    ("loss.matryoshka_dims", (64, 128), r"decreasing"),
    ("train.gradcache_chunk", 3, r"a divisor of plan.global_batch_size \(8\)"),
    ("data.packing", "yes", r"config.data.packing = 'yes' is not valid: True"),
])
def test_bad_config_values_are_named(config_file, key, value, match):
    cfg = cfglib.load_config_file(str(config_file))
    section, name = key.split(".")
    with cfg.ignore_type():  # e.g. a config file that sets data.packing after replacing config.data
        cfg[section][name] = value
    with pytest.raises(UserError, match=match):
        cfglib.validate(cfg)


def test_bad_overrides_and_config_files(config_file, tmp_path, capsys):
    from jaxembed.cli import main

    cfg = cfglib.load_config_file(str(config_file))
    with pytest.raises(UserError, match=r"unknown key \(keys here: .*lr"):
        cfglib.apply_overrides(cfg, ["optim.learning_rate=1e-4"])
    cfglib.apply_overrides(cfg, ["optim.lr=1e-4", "loss.symmetric=true", "loss.matryoshka_dims=(32,16)"])
    assert cfg.optim.lr == 1e-4 and cfg.loss.symmetric is True and cfg.loss.matryoshka_dims == (32, 16)
    assert main(["train", "--config", str(tmp_path / "none.py"), "--workdir", str(tmp_path / "w")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["train", "--config", str(config_file), "--workdir", str(tmp_path / "w"),
                 "--config.loss.type=focal"]) == 2
    err = capsys.readouterr().err
    assert "config.loss.type = 'focal' is not valid" in err
    assert not (tmp_path / "w" / "checkpoints").exists()  # nothing started


def test_export_command_from_workdir(straight_run, tmp_path):
    from jaxembed.cli import main
    from jaxembed.encode import load_encoder

    wd, _ = straight_run
    assert main(["export", "--workdir", str(wd), "--out", str(tmp_path / "e6"), "--step", "6"]) == 0
    assert main(["export", "--workdir", str(wd), "--out", str(tmp_path / "e8")]) == 0
    a = load_encoder(str(tmp_path / "e8")).encode(["hello there"])
    b = load_encoder(str(wd / "export")).encode(["hello there"])
    np.testing.assert_array_equal(a, b)
    c = load_encoder(str(tmp_path / "e6")).encode(["hello there"])
    assert not np.array_equal(a, c)


def _tree(folder: Path) -> dict:
    """Every file under ``folder`` with its bytes, and every folder: equal before and after = left untouched."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


def test_export_never_replaces_what_jaxembed_did_not_write(straight_run, tmp_path, capsys):
    """`jaxembed export --workdir W --out DIR` refuses, in one line and before any work, an --out that is or
    contains the run directory or lies inside its checkpoints, an application folder, a model folder it did not
    write, and an earlier export with the user's files added or changed; each is left byte for byte as it was.
    An unchanged earlier export is replaced."""
    from jaxembed.cli import main

    wd, _ = straight_run
    app = tmp_path / "app"
    (app / "src").mkdir(parents=True)
    (app / "src" / "main.py").write_text("print('my application')\n")
    (app / "config.json").write_text('{"app": true}\n')  # a config.json does not make it a model folder
    theirs = tmp_path / "their_model"
    theirs.mkdir()
    for name in ("config.json", "modules.json"):
        (theirs / name).write_text((wd / "export" / name).read_text())
    (theirs / "notes.md").write_text("my notes\n")
    cases = {wd: "is the run directory", wd.parent: "contains the run directory",
             wd / "checkpoints" / "8": "lies inside the run's checkpoints",
             wd / "checkpoints" / "new": "lies inside the run's checkpoints",
             wd / "store": "exists and is not a model folder",
             app: "holds files jaxembed did not write (config.json, src; no jaxembed_export.json",
             theirs: "holds files jaxembed did not write (config.json, modules.json, notes.md; no jaxembed_export.json"}
    before = {p: _tree(p) for p in cases if p.exists()} | {wd: _tree(wd)}
    for out, why in cases.items():
        assert main(["export", "--workdir", str(wd), "--out", str(out)]) == 2, out
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: --out {out}: {why}") and "fix:" in err[0], (out, err)
    assert {p: _tree(p) for p in before} == before
    assert not (wd / "checkpoints" / "new").exists()

    ours = tmp_path / "ours"
    assert main(["export", "--workdir", str(wd), "--out", str(ours), "--step", "6"]) == 0
    assert main(["export", "--workdir", str(wd), "--out", str(ours)]) == 0  # an unchanged export of jaxembed's
    exported = _tree(ours)
    (ours / "notes.md").write_text("added by the user\n")
    assert main(["export", "--workdir", str(wd), "--out", str(ours)]) == 2
    assert "holds files jaxembed did not write (notes.md)" in capsys.readouterr().err
    (ours / "notes.md").unlink()
    with open(ours / "README.md", "a") as f:
        f.write("edited by the user\n")
    assert main(["export", "--workdir", str(wd), "--out", str(ours)]) == 2
    assert "holds files changed since jaxembed wrote them (README.md)" in capsys.readouterr().err
    assert _tree(ours) != exported and (ours / "README.md").read_text().endswith("edited by the user\n")


def test_export_dir_of_a_run_is_checked_before_training(config_file, tmp_path, capsys):
    """`export.dir` naming a folder of the user's: refused at the start, before any step, nothing written."""
    from jaxembed.cli import main

    app = tmp_path / "app"
    app.mkdir()
    (app / "main.py").write_text("print('mine')\n")
    wd = tmp_path / "run"
    assert main(["train", "--config", str(config_file), "--workdir", str(wd), f"--config.export.dir={app}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: config.export.dir {app}: exists and is not a model folder"), err
    assert not wd.exists() and [p.name for p in app.iterdir()] == ["main.py"]
    assert main(["train", "--config", str(config_file), "--workdir", str(wd), f"--config.export.dir={wd}"]) == 2
    assert f"config.export.dir {wd}: is the run directory" in capsys.readouterr().err


def test_a_refused_config_writes_nothing_so_the_corrected_one_runs(config_file, tiny_model_dir, tmp_path, shared_data,
                                                                   capsys, monkeypatch):
    """A config refused at set-up (a model that does not exist, a bad record, a plan that cannot be built)
    leaves no config.json (nor the run directory it would have created), so the corrected config, another
    config, runs on the same workdir; a store left by a start that failed later is rebuilt for the new data."""
    from jaxembed.train import run as train_setup
    from jaxembed.cli import main

    wd = tmp_path / "run"
    args = ["train", "--config", str(config_file), "--workdir", str(wd)]
    assert main([*args, "--config.model.name=/nonexistent/model"]) == 2
    assert "/nonexistent/model: no such folder" in capsys.readouterr().err and not wd.exists()
    bad = tmp_path / "wikiqa_bad.jsonl"
    lines = (shared_data / "train/wikiqa.jsonl").read_text().splitlines()[:40]
    bad.write_text("\n".join(lines[:10] + ['{"query": "q", "pos": ["a"], "neg": ["b"], "negs": 1}'] + lines[10:]) + "\n")

    def config_with(wikiqa: Path) -> str:
        p = tmp_path / f"config_{wikiqa.stem}.py"
        p.write_text(CONFIG_TEMPLATE.format(model=str(tiny_model_dir), wikiqa=str(wikiqa),
                                            stsb=str(shared_data / "train/stsb_pairs.jsonl")))
        return str(p)

    assert main(["train", "--config", config_with(bad), "--workdir", str(wd)]) == 2
    assert f"{bad}:11" in capsys.readouterr().err and not wd.exists()

    def no_plan(*a, **k):
        raise UserError("the plan cannot be built (simulated)")

    monkeypatch.setattr(train_setup, "_build_plan", no_plan)
    good = tmp_path / "wikiqa_40.jsonl"
    good.write_text("\n".join(lines) + "\n")
    assert main(["train", "--config", config_with(good), "--workdir", str(wd)]) == 2
    assert "the plan cannot be built (simulated)" in capsys.readouterr().err
    assert not (wd / "config.json").exists() and (wd / "store" / "manifest.json").exists()  # the store was written
    monkeypatch.undo()
    assert main([*args, "--config.plan.steps=2", "--config.export.at_end=False"]) == 0  # other data than the store's
    capsys.readouterr()
    manifest = json.loads((wd / "store" / "manifest.json").read_text())
    assert manifest["datasets"][1]["size"] > 40
    assert json.loads((wd / "config.json").read_text())["data"]["datasets"][1]["path"] == str(
        shared_data / "train/wikiqa.jsonl")


def test_dev_evaluation_hook_and_best_checkpoint(config_file, tmp_path):
    from jaxembed.train import train

    cfg = cfglib.load_config_file(str(config_file))
    cfg.plan.steps = 4
    cfg.train.checkpoint_every = 1
    cfg.train.keep_checkpoints = 1
    cfg.eval.tasks = ("STSBenchmark-dev",)
    cfg.eval.every = 2
    cfg.eval.max_examples = 40
    cfg.eval.best_metric = "STSBenchmark-dev/main_score"
    cfg.eval.best_mode = "max"
    cfg.export.at_end = False
    wd = tmp_path / "eval"
    summary = train(cfg, wd)
    lines = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines()]
    evals = [x for x in lines if x["split"] == "eval"]
    assert [x["step"] for x in evals] == [2, 4]
    scores = {x["step"]: x["STSBenchmark-dev/main_score"] for x in evals}
    assert all(0 < v <= 100 for v in scores.values())
    top = max(scores.values())
    best = max(s for s, v in scores.items() if v == top)  # a tie goes to the later step (the one Orbax keeps)
    assert summary["best_step"] == best
    kept = sorted(int(p.name) for p in (wd / "checkpoints").iterdir() if p.name.isdigit())
    assert best in kept and 4 in kept  # the best by the dev metric, and the latest


def test_the_best_dev_step_is_always_exportable(config_file, tiny_model_dir, tmp_path, monkeypatch, capsys):
    """The best dev step is saved even between checkpoint steps, `jaxembed export --step best` exports it in one
    command (also when it is step 0, the starting model: `--step 0`), `export.step = 'best'` makes it the run's
    export, and the summary says plainly when training left the dev score below the start. The dev scores are
    scripted (the property is the bookkeeping, not the model)."""
    import runs

    from jaxembed.train import loop as trainlib
    from jaxembed.cli import main

    script = iter([0.5, 0.7, 0.6, 0.4])  # steps 0 (before training), 1, 2, 3: best at 1, the end below the start
    monkeypatch.setattr(trainlib, "make_evaluator",
                        lambda run: lambda params: {"STSBenchmark-dev/main_score": next(script)})
    cfg = cfglib.load_config_file(str(config_file))
    cfg.plan.steps = 3
    cfg.train.checkpoint_every = 3
    cfg.train.keep_checkpoints = 1
    cfg.eval.tasks = ("STSBenchmark-dev",)
    cfg.eval.every = 1
    cfg.eval.before = True
    cfg.eval.best_metric = "STSBenchmark-dev/main_score"
    cfg.export.step = "best"
    wd = tmp_path / "run"
    summary = trainlib.train(cfg, wd)
    out = capsys.readouterr().out
    assert summary["best_step"] == 1 and summary["dev"] == {
        "metric": "STSBenchmark-dev/main_score", "best_step": 1, "best": 0.7, "last_step": 3, "last": 0.4,
        "start": 0.5}
    assert ("dev STSBenchmark-dev/main_score: 0.5 before training, 0.4 at step 3: training made it worse; the best "
            "is step 1 (0.7)") in out
    assert sorted(int(p.name) for p in (wd / "checkpoints").iterdir() if p.name.isdigit()) == [1, 3]
    assert "export.step = 'best': exporting step 1 (STSBenchmark-dev/main_score 0.7), not the last step 3" in out
    assert main(["export", "--workdir", str(wd), "--step", "best", "--out", str(tmp_path / "best")]) == 0
    assert main(["export", "--workdir", str(wd), "--step", "3", "--out", str(tmp_path / "three")]) == 0
    assert main(["export", "--workdir", str(wd), "--step", "0", "--out", str(tmp_path / "zero")]) == 0
    best, three = runs.export_tensors(tmp_path / "best"), runs.export_tensors(tmp_path / "three")
    run_export = runs.export_tensors(wd / "export")  # export.step = 'best': step 1
    assert all(np.array_equal(best[k], run_export[k]) for k in best)
    assert not all(np.array_equal(best[k], three[k]) for k in best)
    zero, base = runs.export_tensors(tmp_path / "zero"), runs.export_tensors(tiny_model_dir)
    assert zero.keys() == base.keys() and all(np.array_equal(zero[k], base[k]) for k in base)
    assert main(["export", "--workdir", str(wd), "--step", "2", "--out", str(tmp_path / "two")]) == 2
    assert "--step 2: no such checkpoint (have: 1, 3; 0 = the model the run started from" in capsys.readouterr().err

    # the starting model scored best: --step best is step 0
    metrics = (wd / "metrics.jsonl").read_text()
    assert metrics.count('"STSBenchmark-dev/main_score": 0.5') == 1
    (wd / "metrics.jsonl").write_text(metrics.replace('"STSBenchmark-dev/main_score": 0.5',
                                                      '"STSBenchmark-dev/main_score": 0.9'))
    assert main(["export", "--workdir", str(wd), "--step", "best", "--out", str(tmp_path / "best0")]) == 0
    best0 = runs.export_tensors(tmp_path / "best0")
    assert all(np.array_equal(best0[k], base[k]) for k in base)
    # ... and a run whose starting model scores best exports it with export.step = 'best'
    script = iter([0.9, 0.8])
    cfg.plan.steps = 1
    summary = trainlib.train(cfg, tmp_path / "run0")
    assert summary["best_step"] == 0 and "the best is the starting model (step 0) (0.9)" in capsys.readouterr().out
    run0 = runs.export_tensors(tmp_path / "run0" / "export")
    assert all(np.array_equal(run0[k], base[k]) for k in base)


def test_init_from_chains_a_previous_run(straight_run, config_file, tmp_path):
    """model.init_from: a run's export/, a run without one (its latest checkpoint, exported once), a model
    folder; a missing folder is a config error."""
    import shutil

    from jaxembed.encode import load_encoder
    from jaxembed.train import init_source

    wd, _ = straight_run
    c = cfglib.load_config_file(str(config_file))
    c.model.init_from = str(wd)
    cfglib.validate(c)
    assert init_source(c, tmp_path / "next") == str(wd / "export")
    bare = tmp_path / "bare_run"  # the same run without its export/
    bare.mkdir()
    for name in ("checkpoints", "store"):
        shutil.copytree(wd / name, bare / name)
    shutil.copy(wd / "config.json", bare / "config.json")
    c.model.init_from = str(bare)
    src = init_source(c, tmp_path / "next")
    assert src == str(tmp_path / "next" / "init_from")
    a = load_encoder(src).encode(["hello there"])
    np.testing.assert_array_equal(a, load_encoder(str(wd / "export")).encode(["hello there"]))  # latest step
    c.model.init_from = str(wd / "export")
    assert init_source(c, tmp_path / "next") == str(wd / "export")
    c.model.init_from = str(tmp_path / "nowhere")
    with pytest.raises(UserError, match="model.init_from.*no such folder.*previous stage"):
        cfglib.validate(c)


# ------------------------------------------------------------------------------- faults (docs/reliability.md)


def _copy_run(src: Path, dst: Path, *drop: str) -> Path:
    import shutil

    shutil.copytree(src, dst)
    for name in drop:
        shutil.rmtree(dst / name)
    return dst


@pytest.mark.parametrize("mode", ["max", "min"])
def test_checkpointer_keeps_the_best_and_the_later_of_a_tie(tmp_path, mode):
    """keep_last=1 with a best metric: the best step is kept beside the latest; of two equal metrics the later
    checkpoint is kept, which is the step the trainer reports as best (jaxembed.train: ties go to the later)."""
    import jax.numpy as jnp

    from jaxembed.runs.checkpoints import Checkpointer

    sign = 1.0 if mode == "max" else -1.0

    def kept(values):
        d = tmp_path / f"{mode}_{len(list(tmp_path.iterdir()))}"
        ck = Checkpointer(d, keep_last=1, best_metric="m", best_mode=mode, async_save=False)
        for s, v in values.items():
            ck.save(s, {"w": jnp.full((4,), float(s))}, None if v is None else {"m": sign * v})
        ck.close()
        return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit())

    assert kept({2: 5.0, 3: None, 4: 4.0, 5: None}) == [2, 5]  # the best, the latest
    assert kept({2: 5.0, 3: None, 4: 5.0, 5: None}) == [4, 5]  # a tie: the later


def test_checkpointer_skips_unreadable_checkpoints(tmp_path):
    """Corrupted metadata (3) and a truncated array file (2): restore falls back to 1 and says so; the unreadable
    ones move to checkpoints_unreadable/; with none readable, a UserError and nothing moved."""
    import jax.numpy as jnp

    from jaxembed.runs.checkpoints import UNREADABLE, Checkpointer

    like = {"w": jnp.zeros((256, 64)), "step": jnp.asarray(0, jnp.int32)}
    ck = Checkpointer(tmp_path / "checkpoints", keep_last=3, async_save=False)
    noise = jax.random.normal(jax.random.key(0), (256, 64))  # incompressible: the array file is large
    for s in (1, 2, 3):
        ck.save(s, {"w": noise + s, "step": jnp.asarray(s, jnp.int32)})
    ck.close()
    (tmp_path / "checkpoints/3/default/_METADATA").write_text('{"tree_metadata": {"w": ')
    data = max((tmp_path / "checkpoints/2").rglob("d/*"), key=lambda p: p.stat().st_size)
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    notes = []
    ck = Checkpointer(tmp_path / "checkpoints", keep_last=3, async_save=False)
    step, state = ck.restore_latest(like, say=notes.append)
    ck.close()
    assert step == 1 and int(state["step"]) == 1
    np.testing.assert_array_equal(np.asarray(state["w"]), np.asarray(noise + 1))
    assert notes[0].startswith("checkpoints/3: unreadable (") and notes[0].endswith("trying the previous checkpoint, "
                                                                                    "step 2")
    assert notes[1].startswith("checkpoints/2: unreadable (") and "step 1" in notes[1]
    assert notes[2].startswith("resuming from checkpoint 1 (the unreadable checkpoint(s) 3, 2 moved to")
    assert sorted(p.name.split("-")[0] for p in (tmp_path / UNREADABLE).iterdir()) == ["2", "3"]
    assert Checkpointer(tmp_path / "checkpoints").all_steps() == [1]
    (tmp_path / "checkpoints/1/default/_METADATA").write_text("not json")
    with pytest.raises(UserError, match=r"checkpoints: no checkpoint can be read \(1: .*\(fix: move the folder"):
        Checkpointer(tmp_path / "checkpoints").restore_latest(like, say=notes.append)
    assert (tmp_path / "checkpoints/1").is_dir()  # nothing moved when nothing reads


def test_truncated_latest_checkpoint_resumes_from_previous(straight_run, config_file, tmp_path, capsys):
    """The latest checkpoint (8) of a finished run truncated: the run says so, resumes from 6, and ends equal to
    the uninterrupted run bit for bit."""
    from jaxembed.train import train

    wd_straight, _ = straight_run
    wd = _copy_run(wd_straight, tmp_path / "run", "export")
    data = max((wd / "checkpoints/8").rglob("d/*"), key=lambda p: p.stat().st_size)
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size // 3)
    summary = train(cfglib.load_config_file(str(config_file)), wd)
    out = capsys.readouterr().out
    assert summary["status"] == "completed" and summary["step"] == 8
    assert "checkpoints/8: unreadable (" in out and "trying the previous checkpoint, step 6" in out, out
    assert "resuming from checkpoint 6 (the unreadable checkpoint(s) 8 moved to" in out
    assert "resuming at step 6 of 8" in out
    assert [p.name.split("-")[0] for p in (wd / "checkpoints_unreadable").iterdir()] == ["8"]
    _assert_bitwise_equal(_params_at(wd, 8)[1], _params_at(wd_straight, 8)[1])


@contextlib.contextmanager
def _file_size_limit(limit: int):
    """RLIMIT_FSIZE in this process: every write past ``limit`` bytes of one file fails (EFBIG), as writes do on a
    full disk (SIGXFSZ ignored meanwhile, so the write fails instead of killing the process)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)


def test_disk_full_is_one_line_and_keeps_earlier_checkpoints(straight_run, config_file, tmp_path, capsys):
    """Writes past a size limit fail (what a full disk does to a writer) while the checkpoint of step 8, the
    export, or the dataset store is written: `jaxembed train` exits 2, its last line is one error line naming the
    path and the fix, the earlier checkpoints are intact and nothing half-written is left."""
    import runs

    from jaxembed.cli import main

    wd_straight, _ = straight_run
    cases = {  # run directory -> (size limit, the error line's start)
        _copy_run(wd_straight, tmp_path / "ckpt", "export", "checkpoints/8"): (
            1_000_000, "checkpoints/8: saving the checkpoint of step 8 failed: [Errno 27] File too large (fix: free "
                       "space on that disk"),
        _copy_run(wd_straight, tmp_path / "export", "export"): (
            1_000_000, "export: writing the export failed: [Errno 27] File too large (fix: free space on that disk"),
        tmp_path / "store": (500_000, "store: preparing the dataset store failed: [Errno 27] File too large"),
    }
    for wd, (limit, line) in cases.items():
        with _file_size_limit(limit):
            rc = main(["train", "--config", str(config_file), "--workdir", str(wd)])
        err = capsys.readouterr().err
        assert rc == 2, err[-3000:]
        last = err.strip().splitlines()[-1]
        assert last.startswith(f"error: {wd}/{line}"), last
        if wd.name == "ckpt":
            assert last.endswith("it resumes from the latest intact checkpoint (intact: 6))"), last
    ckpt, export, store = cases
    assert runs.steps_of(ckpt) == [6] and runs.steps_of(export) == [6, 8]
    _assert_bitwise_equal(_params_at(ckpt, 6)[1], _params_at(wd_straight, 6)[1])
    assert not (export / "export").exists() and runs.leftovers(export) == []
    assert not (store / "store").exists() and runs.leftovers(store) == []


def _sigterm_now(where: str):
    """Send SIGTERM to this process and wait: the trainer's handler must stop the caller within 60 s."""
    import os

    os.kill(os.getpid(), signal.SIGTERM)
    t0 = time.time()
    while time.time() - t0 < 60:
        time.sleep(0.01)
    raise AssertionError(f"SIGTERM during {where} did not stop it")


def test_sigterm_during_dev_evaluation_and_export(straight_run, config_file, tmp_path, monkeypatch, capsys):
    """SIGTERM while the dev evaluation of step 3 runs stops it at once, with checkpoint 3; the rerun evaluates step
    3 again and trains on; SIGTERM while it writes the export stops with no half export; the third run writes it.
    Every dev evaluation is logged once, and the result equals the uninterrupted run bit for bit (evaluation does
    not change the training). In this process: the signal comes from inside the evaluation / the export."""
    import runs

    from jaxembed import export as exportlib
    from jaxembed.train import loop as trainlib

    wd_straight, _ = straight_run
    wd = tmp_path / "run"
    cfg = cfglib.load_config_file(str(config_file))
    cfg.eval.tasks, cfg.eval.every, cfg.eval.max_examples = ("STSBenchmark-dev",), 3, 40
    real_make = trainlib.make_evaluator
    monkeypatch.setattr(trainlib, "make_evaluator",
                        lambda run: (lambda params: _sigterm_now("the evaluation")) if real_make(run) else None)
    for i, message in enumerate([
            "signal 15 during the dev evaluation at step 3: checkpoint saved at step 3; run the same command to "
            "resume (the evaluation runs again then)",
            "signal 15 during the export: stopped, nothing half-written (the export is written as a whole); "
            "checkpoint 8 is saved"]):
        s = trainlib.train(cfg, wd)
        out = capsys.readouterr().out
        assert s["status"] == "preempted" and message in out, out[-3000:]
        assert json.loads((wd / "summary.json").read_text())["status"] == "preempted"
        assert runs.steps_of(wd) == [[3], [6, 8]][i]
        assert not (wd / "export").exists() and runs.leftovers(wd) == []
        monkeypatch.setattr(trainlib, "make_evaluator", real_make)  # the rerun: a real evaluation; the export
        real_write = exportlib.write_safetensors                       # signals once its first file is written
        monkeypatch.setattr(exportlib, "write_safetensors",
                            lambda *a, **k: (real_write(*a, **k), _sigterm_now("the export")))
    monkeypatch.undo()
    assert trainlib.train(cfg, wd)["status"] == "completed"
    evals = [json.loads(x)["step"] for x in (wd / "metrics.jsonl").read_text().splitlines()
             if json.loads(x)["split"] == "eval"]
    assert evals == [3, 6, 8]
    _assert_bitwise_equal(_params_at(wd, 8)[1], _params_at(wd_straight, 8)[1])
    a, b = runs.export_tensors(wd / "export"), runs.export_tensors(wd_straight / "export")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_damaged_run_config_is_one_line(config_file, tmp_path):
    from jaxembed.train import check_workdir

    (tmp_path / "config.json").write_text('{"model": {"name": ')  # torn by a writer that was not atomic
    with pytest.raises(UserError, match=r"config.json: not a valid config \(.*\); the run directory's config is "
                                        r"damaged \(fix: restore it"):
        check_workdir(cfglib.load_config_file(str(config_file)), tmp_path)


def test_dev_evaluation_steps():
    """eval.every = N: every N steps and the last; eval.every = 0: the last step only (it once meant never)."""
    from jaxembed.train import dev_eval_due

    assert [s for s in range(1, 11) if dev_eval_due(s, 4, 10)] == [4, 8, 10]
    assert [s for s in range(1, 11) if dev_eval_due(s, 0, 10)] == [10]
    assert [s for s in range(1, 9) if dev_eval_due(s, 4, 8)] == [4, 8]
