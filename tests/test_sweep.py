"""``jaxembed sweep``: expansion (product, zip, get_hyper, naming), every config checked before any run starts,
the SLURM array script and the TPU command list, local runs (failures recorded, reruns resume), the report on
synthetic run folders, and one real 2 x 2 sweep of tiny runs end to end with its report."""

import csv
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxembed import sweep as sw
from jaxembed.cli import main
from jaxembed.errors import UserError

REPO = Path(__file__).resolve().parent.parent

BASE_CONFIG = '''
from jaxembed.config import default_config

def get_config(arg=None):
    c = default_config()
    c.model.name = "some/model"          # validate() only needs a name; nothing is trained here
    c.data.store = {store!r}
    c.plan.steps = 4
    c.eval.best_metric = "STSBenchmark-dev/main_score"
    return c
'''


@pytest.fixture()
def cfg(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    (store / "manifest.json").write_text("{}")
    p = tmp_path / "exp.py"
    p.write_text(BASE_CONFIG.format(store=str(store)))
    return p


def _plan(cfg, root, **kw):
    return sw.plan_sweep(str(cfg), root, **kw)


# ------------------------------------------------------------------------------------------ expansion


def test_product_names_and_order(cfg, tmp_path):
    s = _plan(cfg, tmp_path / "r", sweeps=["optim.lr=1e-5,2e-5 loss.temperature=0.01,0.02"],
              fixed=["train.log_every=1", "--config.plan.steps=3"])
    assert [r.name for r in s.runs] == ["lr=1e-05,temperature=0.01", "lr=1e-05,temperature=0.02",
                                        "lr=2e-05,temperature=0.01", "lr=2e-05,temperature=0.02"]
    assert s.keys == ["optim.lr", "loss.temperature"]
    r = s.runs[3]
    assert r.workdir == tmp_path / "r" / "lr=2e-05,temperature=0.02"
    assert r.args == ["train.log_every=1", "plan.steps=3", "optim.lr=2e-5", "loss.temperature=0.02"]
    assert r.config.optim.lr == 2e-5 and r.config.loss.temperature == 0.02 and r.config.plan.steps == 3
    assert r.values == {"optim.lr": 2e-5, "loss.temperature": 0.02}


def test_zip_crossed_with_product_brackets_and_quotes(cfg, tmp_path):
    s = _plan(cfg, tmp_path / "r", zips=["optim.lr=1e-5,3e-5 optim.warmup_steps=1,2"],
              sweeps=["loss.matryoshka_dims=(8,4),(16,8) loss.matryoshka_weights=(1,1) model.pooling='cls',mean"])
    assert len(s.runs) == 2 * 2 * 1 * 2
    pairs = {(r.config.optim.lr, r.config.optim.warmup_steps) for r in s.runs}
    assert pairs == {(1e-5, 1), (3e-5, 2)}  # zipped, never (1e-5, 2)
    assert {r.config.loss.matryoshka_dims for r in s.runs} == {(8, 4), (16, 8)}
    assert {r.config.model.pooling for r in s.runs} == {"cls", "mean"}
    # a key with one value is fixed: it is not part of the names
    assert s.runs[0].name == "matryoshka_dims=8-4,pooling=cls,lr=1e-05,warmup_steps=1"  # --sweep keys, then --zip
    assert all("matryoshka_weights" not in r.name for r in s.runs)


def test_get_hyper_list_dict_variant_and_no_hyper(tmp_path, cfg):
    text = cfg.read_text() + '''
def get_hyper(arg=None):
    if arg == "grid":
        return {"product": {"config.optim.lr": [1e-5, 2e-5]}, "zip": {"loss.symmetric": [True, False],
                                                                       "optim.freeze": [(), ("backbone.embeddings",)]}}
    return [{"optim.lr": 1e-5, "model.pooling": "cls"}, {"optim.lr": 5e-5, "model.pooling": "mean"}]
'''
    cfg.write_text(text)
    s = _plan(cfg, tmp_path / "r")
    assert [r.name for r in s.runs] == ["lr=1e-05,pooling=cls", "lr=5e-05,pooling=mean"]
    assert s.runs[1].args == ["optim.lr=5e-05", "model.pooling=mean"]  # command-line text, parsed back below
    assert s.runs[1].config.model.pooling == "mean" and s.runs[1].config.optim.lr == 5e-5
    g = sw.plan_sweep(f"{cfg}:grid", tmp_path / "g")
    assert len(g.runs) == 4
    assert {(r.config.loss.symmetric, r.config.optim.freeze) for r in g.runs} == {
        (True, ()), (False, ("backbone.embeddings",))}
    assert g.runs[0].name == "lr=1e-05,symmetric=true,freeze=none"
    # crossed with --sweep, or ignored
    c = _plan(cfg, tmp_path / "c", sweeps=["loss.temperature=0.1,0.2"])
    assert len(c.runs) == 4
    n = _plan(cfg, tmp_path / "n", sweeps=["loss.temperature=0.1,0.2"], use_hyper=False)
    assert len(n.runs) == 2


@pytest.mark.parametrize("kw,match", [
    (dict(sweeps=["optim.lrr=1e-5,2e-5"]), r"--sweep optim.lrr: unknown key 'optim.lrr' \(keys at optim: .*lr, "),
    (dict(sweeps=["optimm.lr=1"]), r"unknown key 'optimm.lr' \(keys at the top: data, eval, export, loss"),
    (dict(sweeps=["loss.temperature=0.05,-0.01"]),
     r"sweep run 2 of 2 \(loss.temperature=-0.01\): config.loss.temperature = -0.01 is not valid: a positive "
     r"number \(fix: change or drop that value"),
    (dict(sweeps=["loss.type=infonce,focal"]), r"config.loss.type = 'focal' is not valid: allowed: infonce, peg"),
    (dict(sweeps=["optim.lr=abc"]), r"sweep run 1 of 1 \(optim.lr=abc\): --config.optim.lr=abc"),
    (dict(zips=["optim.lr=1e-5,2e-5 loss.temperature=0.01"]),
     r"zipped keys need lists of one length, got optim.lr: 2, loss.temperature: 1"),
    (dict(sweeps=["optim.lr=1e-5", "optim.lr=2e-5"]), r"key optim.lr is swept twice"),
    (dict(sweeps=["optim.lr=1e-5,1e-05"]), r"runs 1 and 2 have the same values"),
    (dict(sweeps=["optim.lr"]), r"expected KEY=V1,V2"),
    (dict(sweeps=["optim.lr=1e-5,,2e-5"]), r"an empty value"),
    (dict(), r"nothing to sweep"),
    (dict(sweeps=["optim.lr=1e-5"], fixed=["optim.learning_rate=1"]), r"sweep --set: .*unknown key"),
])
def test_bad_sweeps_are_named_before_anything_runs(cfg, tmp_path, kw, match):
    with pytest.raises(UserError, match=match):
        _plan(cfg, tmp_path / "r", **kw)


def test_bad_get_hyper_value_and_cli_error_creates_nothing(cfg, tmp_path, capsys):
    cfg.write_text(cfg.read_text() + "\ndef get_hyper():\n    return [{'optim.lr': 'fast'}, {'optim.lr': 1e-5}]\n")
    with pytest.raises(UserError, match=r"get_hyper\(\) run 1: optim.lr='fast'"):
        _plan(cfg, tmp_path / "r")
    root = tmp_path / "cli"
    assert main(["sweep", "--config", str(cfg), "--root", str(root), "--no-hyper",
                 "--sweep", "optim.lr=1e-5,2e-5 loss.temperature=0.05,0"]) == 2
    err = capsys.readouterr().err
    assert "sweep run 2 of 4 (optim.lr=1e-5 loss.temperature=0): config.loss.temperature = 0.0 is not valid" in err
    assert not root.exists()  # validated before anything was written or run


def test_config_overrides_from_the_command_line_are_fixed_values(cfg, tmp_path, capsys):
    """`--config.KEY=VALUE` after `jaxembed sweep` (collected by cli.main into args.overrides) fixes a value."""
    from jaxembed.cli import build_parser

    args, unknown = build_parser().parse_known_args(["sweep", "--config", str(cfg), "--root", str(tmp_path / "r"),
                                                     "--sweep", "optim.lr=1e-5,2e-5", "--dry-run",
                                                     "--config.train.seed=3"])
    args.overrides = unknown
    assert sw.cmd_sweep(args) == 0
    out = capsys.readouterr().out
    assert "(fixed: train.seed=3)" in out and out.count("--config.train.seed=3 --config.optim.lr=") == 2
    assert not (tmp_path / "r").exists()


def test_names_short_keys_and_file_system_safety():
    assert sw.short_keys(["optim.lr", "foo.lr", "loss.temperature"]) == {
        "optim.lr": "optim.lr", "foo.lr": "foo.lr", "loss.temperature": "temperature"}
    names = sw.run_names([{"m": "org/model a", "x": 1}, {"m": "org/model a", "x": 2}, {"m": "b", "x": 1}], ["m", "x"])
    assert names == ["m=org_model_a,x=1", "m=org_model_a,x=2", "m=b,x=1"]
    assert sw.run_names([{"k": "a/b"}, {"k": "a_b"}], ["k"]) == ["k=a_b", "k=a_b-2"]  # unique after sanitising
    long = sw.run_names([{"k": "x" * 300}, {"k": "y"}], ["k"])[0]
    assert len(long) <= sw.NAME_MAX
    assert sw.split_top("a=(1,2),[3, 4] b='x,y'", None) == ["a=(1,2),[3, 4]", "b='x,y'"]


# ------------------------------------------------------------------------------------------ SLURM / TPU


FAKE_SRUN = '''#!/bin/bash
printf '%s\\n' "$@" > "$REC/srun.argv"
'''


def test_slurm_array_script_runs_each_task_through_slurm_gpu_sh(cfg, tmp_path, capsys):
    root = tmp_path / "sweep"
    assert main(["sweep", "--config", f"{cfg}", "--root", str(root), "--mode", "slurm", "--array-parallel", "2",
                 "--sweep", "optim.lr=1e-5,2e-5 model.name='a b',c", "--set", "train.log_every=5"]) == 0
    out = capsys.readouterr().out
    script = root / "sweep_slurm.sh"
    assert f"submit: sbatch {script}" in out
    text = script.read_text()
    assert "#SBATCH --array=0-3%2" in text
    assert f"#SBATCH --output={root.absolute()}/slurm_logs/%A_%a.out" in text and (root / "slurm_logs").is_dir()
    for header in ("#SBATCH --requeue", "#SBATCH --signal=B:USR1@300", "#SBATCH --nodes=2", "#SBATCH --gpus-per-node=8"):
        assert header in text  # copied from launch/slurm_gpu.sh
    assert "#SBATCH --job-name=jaxembed" not in text and "slurm-%x-%j.out" not in text  # the array sets its own
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    manifest = json.loads((root / "sweep.json").read_text())
    assert manifest["mode"] == "slurm" and [r["name"] for r in manifest["runs"]] == [
        "lr=1e-05,name=a_b", "lr=1e-05,name=c", "lr=2e-05,name=a_b", "lr=2e-05,name=c"]

    # array task 2 = run "lr=2e-05,name=a_b": the script execs slurm_gpu.sh, which calls srun (a fake here)
    rec, fake = tmp_path / "rec", tmp_path / "bin"
    rec.mkdir()
    fake.mkdir()
    (fake / "srun").write_text(FAKE_SRUN)
    (fake / "srun").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "JAXEMBED"))}
    env.update(PATH=f"{fake}:{os.environ['PATH']}", REC=str(rec), SLURM_JOB_ID="77", SLURM_ARRAY_TASK_ID="2",
               JAXEMBED="jaxembed-fake")
    p = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    argv = (rec / "srun.argv").read_text().splitlines()
    wd = root.absolute() / "lr=2e-05,name=a_b"
    assert argv[argv.index("jaxembed-fake"):] == [
        "jaxembed-fake", "train", "--config", str(cfg.absolute()), "--workdir", str(wd),
        "--config.train.log_every=5", "--config.optim.lr=2e-5", "--config.model.name=a b"]
    assert json.loads((wd / "status.json").read_text())["status"] == "completed"
    # a task whose run has completed exits without starting srun
    (rec / "srun.argv").unlink()
    (wd / "summary.json").write_text(json.dumps({"status": "completed", "step": 4}, indent=2))
    p = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "already completed" in p.stdout and not (rec / "srun.argv").exists()
    env["SLURM_ARRAY_TASK_ID"] = "9"
    p = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no run number 9 (runs 0-3)" in p.stderr


def test_tpu_command_list_feeds_tpu_pod_sh(cfg, tmp_path, capsys):
    root = tmp_path / "sweep"
    assert main(["sweep", "--config", f"{cfg}", "--root", str(root), "--mode", "tpu",
                 "--sweep", "optim.lr=1e-5,2e-5"]) == 0
    lines = [x for x in (root / "sweep_tpu.txt").read_text().splitlines() if x and not x.startswith("#")]
    assert [shlex.split(x) for x in lines] == [
        [str(cfg), str(root / "lr=1e-05"), "--config.optim.lr=1e-5"],
        [str(cfg), str(root / "lr=2e-05"), "--config.optim.lr=2e-5"]]
    p = subprocess.run(["bash", str(REPO / "launch/tpu_pod.sh"), "--dry-run", "--name", "pod", "--zone", "z",
                        "--workers", "2", "run-list", str(root / "sweep_tpu.txt")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    ssh = [x for x in p.stdout.splitlines() if "ssh pod" in x and "--worker=all" in x]
    assert len(ssh) == 2
    assert f"--workdir {root}/lr=2e-05 --config.optim.lr=2e-5" in ssh[1]
    assert "JAXEMBED_DISTRIBUTED=on" in ssh[0]


# ------------------------------------------------------------------------------------------ local runs


FAKE_TRAINER = '''#!/bin/bash
# fake launcher: CONFIG WORKDIR --config.K=V ...; the run with lr=2e-5 fails until $FIX exists
if [[ -n "${SLOW:-}" ]]; then trap 'echo got TERM; kill $S; exit 143' TERM; fi
wd=$2
echo "$wd" >> "$CALLS"
mkdir -p "$wd"
echo "training $wd with ${@:3}"
if [[ "$*" == *optim.lr=2e-5* && ! -e "$FIX" ]]; then echo "boom: out of memory" >&2; exit 3; fi
if [[ -n "${SLOW:-}" ]]; then sleep 30 & S=$!; wait $S; fi
echo '{"step": 2, "split": "train", "time": 1.0, "loss": 1.5, "accuracy": 0.5}' >> "$wd/metrics.jsonl"
printf '{\\n  "status": "completed",\\n  "step": 2\\n}\\n' > "$wd/summary.json"
'''


def _fake_launcher(tmp_path):
    p = tmp_path / "fake_train.sh"
    p.write_text(FAKE_TRAINER)
    p.chmod(0o755)
    return p


def test_local_sweep_records_failures_and_rerun_resumes(cfg, tmp_path, monkeypatch, capsys):
    launcher = _fake_launcher(tmp_path)
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("CALLS", str(calls))
    monkeypatch.setenv("FIX", str(tmp_path / "fixed"))
    root = tmp_path / "sweep"
    args = ["sweep", "--config", str(cfg), "--root", str(root), "--launcher", str(launcher),
            "--sweep", "optim.lr=1e-5,2e-5 loss.temperature=0.01,0.02"]
    assert main(args) == 1  # a run failed; the others went on
    out = capsys.readouterr().out
    assert "sweep [2/4] lr=1e-05,temperature=0.02: completed" in out
    assert "lr=2e-05,temperature=0.01: failed" in out and "boom: out of memory" in out
    assert "[lr=1e-05,temperature=0.01] training" in out  # the runs' output is echoed, prefixed
    st = json.loads((root / "lr=2e-05,temperature=0.01" / "status.json").read_text())
    assert st["status"] == "failed" and st["returncode"] == 3 and "out of memory" in st["error"]
    assert "boom" in (root / "lr=2e-05,temperature=0.01" / "train.log").read_text()
    assert len(calls.read_text().splitlines()) == 4
    (tmp_path / "fixed").touch()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.count("already completed") == 2
    assert len(calls.read_text().splitlines()) == 6  # only the two failed runs ran again
    assert json.loads((root / "lr=2e-05,temperature=0.02" / "status.json").read_text())["attempts"] == 2
    # a different fixed override into the same root is refused before anything runs
    assert main(args + ["--set", "train.seed=3"]) == 2
    assert "holds a sweep of" in capsys.readouterr().err


def test_sigterm_stops_the_sweep_at_a_checkpoint(cfg, tmp_path):
    launcher = _fake_launcher(tmp_path)
    root = tmp_path / "sweep"
    env = dict(os.environ, CALLS=str(tmp_path / "calls.txt"), FIX=str(tmp_path / "f"), SLOW="1")
    proc = subprocess.Popen([sys.executable, "-m", "jaxembed.cli", "sweep", "--config", str(cfg), "--root", str(root),
                             "--launcher", str(launcher), "--sweep", "optim.lr=1e-5,3e-5"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    t0 = time.time()
    while not (tmp_path / "calls.txt").exists() and time.time() - t0 < 60:
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 143, out
    assert "got TERM" in out and "stopped at lr=1e-05" in out
    assert json.loads((root / "lr=1e-05" / "status.json").read_text())["status"] == "preempted"
    assert not (root / "lr=3e-05").exists()  # the next run was not started


def test_a_run_stopped_at_once_is_interrupted_not_failed(cfg, tmp_path, capsys):
    """A run that exits 130 (a second signal stops `jaxembed train` at once) is the user's stop: the run is recorded
    'interrupted' (no error), the sweep stops there with 130 and says how to resume; the next run is not started."""
    launcher = tmp_path / "interrupted.sh"
    launcher.write_text("#!/bin/sh\necho 'error: interrupted (Ctrl-C)' >&2\nexit 130\n")
    launcher.chmod(0o755)
    root = tmp_path / "sweep"
    assert main(["sweep", "--config", str(cfg), "--root", str(root), "--launcher", str(launcher), "--sweep",
                 "optim.lr=1e-5,3e-5"]) == 130
    out = capsys.readouterr().out
    assert "lr=1e-05: interrupted in" in out and "sweep: interrupted at lr=1e-05" in out and "failed" not in out
    st = json.loads((root / "lr=1e-05" / "status.json").read_text())
    assert st["status"] == "interrupted" and st["returncode"] == 130 and st["error"] == ""
    assert not (root / "lr=3e-05").exists()


# ------------------------------------------------------------------------------------------ report


def _write_run(d: Path, name, records, *, summary=None, status=None, best_mode="max", steps=4, bad_line=False):
    run = d / name
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"plan": {"steps": steps}, "optim": {"lr": float(name[3:])},
                                                 "eval": {"best_metric": "T-dev/main_score", "best_mode": best_mode}}))
    lines = [json.dumps(r) for r in records] + (["{not json"] if bad_line else [])
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if summary:
        (run / "summary.json").write_text(json.dumps({"status": summary, "step": steps}))
    if status:
        (run / "status.json").write_text(json.dumps(status))


def _tr(step, loss):
    return {"step": step, "split": "train", "time": step, "loss": loss, "accuracy": 1 - loss / 4}


def _ev(step, score):
    return {"step": step, "split": "eval", "time": step, "T-dev/main_score": score, "T-dev/other": 1.0}


def test_report_tabulates_synthetic_runs(tmp_path, capsys):
    root = tmp_path / "sweep"
    _write_run(root, "lr=0.001", [_tr(2, 3.0), _ev(2, 50.0), _tr(4, 2.0), _ev(4, 60.0)], summary="completed")
    # resumed after step 2: steps 3-4 logged twice (the last record wins), and a torn last line
    _write_run(root, "lr=0.002", [_tr(2, 2.5), _ev(2, 70.0), _tr(4, 9.0), _tr(4, 1.5), _ev(4, 65.0)],
               summary="completed", bad_line=True)
    _write_run(root, "lr=0.003", [_tr(2, 4.0), _ev(2, 40.0)],
               status={"status": "failed", "returncode": 1, "error": "Traceback\nValueError: nan everywhere"})
    manifest = {"config": "x.py", "fixed": [], "keys": ["optim.lr"],
                "runs": [{"name": n, "dir": n, "overrides": {"optim.lr": n[3:]}}
                         for n in ("lr=0.001", "lr=0.002", "lr=0.003", "lr=0.004")]}
    (root / "sweep.json").write_text(json.dumps(manifest))
    assert main(["sweep", "report", str(root)]) == 0
    out = capsys.readouterr().out
    rows = {r["run"]: r for r in csv.DictReader((root / "sweep_report.csv").open())}
    assert rows["lr=0.001"]["status"] == "completed" and rows["lr=0.001"]["best"] == "60.0"
    assert rows["lr=0.001"]["best_step"] == "4" and rows["lr=0.002"]["best_step"] == "2"
    assert rows["lr=0.002"]["loss"] == "1.5" and rows["lr=0.002"]["final"] == "65.0"
    assert rows["lr=0.003"]["status"] == "failed" and rows["lr=0.003"]["step"] == "2"
    assert rows["lr=0.004"]["status"] == "pending" and rows["lr=0.004"]["loss"] == ""
    rep = json.loads((root / "sweep_report.json").read_text())
    assert rep["metric"] == "T-dev/main_score" and rep["best_run"] == "lr=0.002"
    assert rep["runs"][1]["loss_curve"] == [[2, 2.5], [4, 1.5]] and rep["runs"][1]["bad_lines"] == 1
    md = (root / "sweep_report.md").read_text()
    assert md.startswith("| run | lr | status |") and "70 **(best)**" in md
    assert "best (max T-dev/main_score): lr=0.002: 70 at step 2" in out
    assert "lr=0.003: failed: ValueError: nan everywhere" in out
    assert "lr=0.002: 1 unreadable line(s) in metrics.jsonl were skipped" in out
    try:
        import matplotlib  # noqa: F401

        assert (root / "sweep_report.png").stat().st_size > 10_000
    except ImportError:
        assert "plot skipped: matplotlib is not installed" in out
    # min mode, another metric, and a plain folder of runs without sweep.json (columns: what differs)
    (root / "sweep.json").unlink()
    rep = sw.collect(root, metric="T-dev/main_score", mode="min")
    assert rep["best_run"] == "lr=0.003" and rep["keys"] == ["optim.lr"]
    assert [r["run"] for r in rep["runs"]] == ["lr=0.001", "lr=0.002", "lr=0.003"]
    with pytest.raises(UserError, match="no sweep.json and no run directories"):
        sw.collect(tmp_path)


# ------------------------------------------------------------------------------------------ end to end

E2E_CONFIG = '''
from jaxembed.config import default_config

def get_config(arg=None):
    c = default_config()
    c.model.name = {model!r}
    c.model.max_length = 32
    c.data.store = {store!r}
    c.plan.global_batch_size = 4
    c.plan.steps = 2
    c.optim.lr = 1e-3
    c.train.dropout = False          # no dropout RNG in the step: half the compile time on CPU
    c.train.log_every = 1
    c.train.checkpoint_every = 0
    c.export.at_end = False
    c.eval.tasks = ("STSBenchmark-dev",)
    c.eval.every = 1
    c.eval.max_examples = 16
    c.eval.best_metric = "STSBenchmark-dev/main_score"
    return c
'''


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory, minilm_dir, shared_data):
    """A 1-layer, 16-wide random BERT with MiniLM's tokenizer, and a store of two small datasets."""
    from jaxembed import export, models
    from jaxembed.data.config import dataset_config, default_data_config
    from jaxembed.data.store import write_store
    from jaxembed.models.embedding import EmbeddingModel, HeadConfig
    from jaxembed.tokenizer import Tokenizer

    d = tmp_path_factory.mktemp("tiny_sweep")
    cfg = models.config_from_hf(dict(model_type="bert", vocab_size=30522, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32, max_position_embeddings=64))
    export.export(EmbeddingModel.init(cfg, HeadConfig("mean"), seed=0), Tokenizer.from_folder(minilm_dir, 32),
                  d / "model")
    data = default_data_config()
    data.datasets = [
        dataset_config(name="stsb", path=str(shared_data / "train/stsb_pairs.jsonl"), format="scored_pairs",
                       task_type="sts", score_threshold=3.0, num_negatives=0, max_query_length=16,
                       max_doc_length=16),
        dataset_config(name="wikiqa", path=str(shared_data / "train/wikiqa.jsonl"), task_type="retrieval",
                       num_negatives=1, max_query_length=16, max_doc_length=16)]
    write_store(data, d / "store")
    p = d / "tiny.py"
    p.write_text(E2E_CONFIG.format(model=str(d / "model"), store=str(d / "store")))
    return p


def test_tiny_sweep_2x2_end_to_end(tiny_setup, tmp_path, capsys):
    """Four real runs through `jaxembed sweep` (one process, in process: the runs differ only in data order, so they
    share one compilation through the sweep's persistent cache), then `jaxembed sweep report`."""
    root = tmp_path / "sweep"
    t0 = time.time()
    # XLA_FLAGS: the suite's fast compilation of small programs (tests/conftest.py FAST_XLA)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the sweep's own cache, ROOT/.jax_cache
    # JAX stores only programs that took >= 1 s to compile (its default); on a fast machine the tiny runs' programs
    # all compile faster, and the cache would stay empty however the sweep shares it: store every program here
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    p = subprocess.run([sys.executable, "-m", "jaxembed.cli", "sweep", "--config", str(tiny_setup), "--root",
                        str(root), "--sweep", "plan.seed=1,2 plan.negatives=first,sample", "--in-process", "-q"],
                       env=env, capture_output=True, text=True, timeout=600)
    took = time.time() - t0
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    names = ["seed=1,negatives=first", "seed=1,negatives=sample", "seed=2,negatives=first", "seed=2,negatives=sample"]
    assert "sweep: 4 of 4 runs completed" in p.stdout
    for n in names:
        s = json.loads((root / n / "summary.json").read_text())
        assert s["status"] == "completed" and s["step"] == 2
        assert json.loads((root / n / "status.json").read_text())["status"] == "completed"
        assert "[train step 2]" in (root / n / "train.log").read_text()
    assert list((root / ".jax_cache").iterdir())  # the runs shared compiled programs
    # rerun: everything is skipped
    assert main(["sweep", "--config", str(tiny_setup), "--root", str(root), "--sweep",
                 "plan.seed=1,2 plan.negatives=first,sample"]) == 0
    assert capsys.readouterr().out.count("already completed") == 4
    assert main(["sweep", "report", str(root)]) == 0
    out = capsys.readouterr().out
    rep = json.loads((root / "sweep_report.json").read_text())
    assert rep["metric"] == "STSBenchmark-dev/main_score" and rep["keys"] == ["plan.seed", "plan.negatives"]
    assert [r["run"] for r in rep["runs"]] == names
    metric = "STSBenchmark-dev/main_score"
    for r in rep["runs"]:  # the report holds what each run logged: its loss curve and its dev evaluations
        assert r["status"] == "completed" and r["step"] == 2 and r["steps"] == 2
        logged = [json.loads(x) for x in (root / r["run"] / "metrics.jsonl").read_text().splitlines()]
        train = {x["step"]: x["loss"] for x in logged if x["split"] == "train"}
        evals = {x["step"]: x[metric] for x in logged if x["split"] == "eval"}
        assert sorted(train) == sorted(evals) == [1, 2] and all(math.isfinite(v) for v in train.values())
        assert r["loss_curve"] == [[1, train[1]], [2, train[2]]] and r["loss"] == train[2]
        best_step = max(evals, key=lambda st: (evals[st], -st))  # the earliest of equal maxima
        assert (r["best_step"], r["best"], r["final"]) == (best_step, evals[best_step], evals[2])
        assert r["metric_curve"] == [[1, evals[1]], [2, evals[2]]]
    assert rep["best_run"] == max(rep["runs"], key=lambda r: r["best"])["run"]
    losses = {r["run"]: r["loss"] for r in rep["runs"]}
    assert len(set(losses.values())) > 1  # the seeds and negatives gave different batches
    assert rep["best_run"] in names and f"best (max STSBenchmark-dev/main_score): {rep['best_run']}" in out
    print(f"\n2 x 2 tiny sweep: {took:.1f}s for the sweep process")
