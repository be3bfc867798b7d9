"""launch/: every script parses and prints the right commands; local.sh tees, records and forwards signals;
slurm_gpu.sh's USR1 trap checkpoints through `scancel --signal=TERM`, then requeues (with a guard); tpu_pod.sh's
gcloud commands (fake gcloud / srun / scancel / scontrol on PATH record their argv); jaxembed.parallel's cluster
plan for every environment, half-set ones included; and two real JAX processes joined from a SLURM environment
through slurm_gpu.sh -> srun -> parallel.initialize(), the path `jaxembed train` takes on a cluster."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxembed.errors import UserError
from jaxembed.parallel import cluster_plan

import runs

REPO = Path(__file__).resolve().parent.parent
LOCAL, SLURM, TPU = (str(REPO / "launch" / n) for n in ("local.sh", "slurm_gpu.sh", "tpu_pod.sh"))


def _bin(tmp_path, **scripts):
    """Fake commands in tmp_path/bin (first on PATH); returns (env, rec dir)."""
    d, rec = tmp_path / "bin", tmp_path / "rec"
    d.mkdir(exist_ok=True)
    rec.mkdir(exist_ok=True)
    for name, text in scripts.items():
        (d / name).write_text("#!/bin/bash\n" + text)
        (d / name).chmod(0o755)
    # the suite's compilation cache (tests/conftest.py) left out too: the scripts' own default is under test
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "JAXEMBED", "TPU_", "JAX_COMPILATION_CACHE_DIR"))}
    env.update(PATH=f"{d}:{os.environ['PATH']}", REC=str(rec), PYTHON=sys.executable)
    return env, rec


def _wait_for(path: Path, proc, timeout=30):
    t0 = time.time()
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.time() - t0 < timeout, f"{path} never appeared"
        time.sleep(0.02)


def test_scripts_parse_and_explain_themselves(tmp_path):
    for script in (LOCAL, SLURM, TPU):
        assert subprocess.run(["bash", "-n", script]).returncode == 0, script
        p = subprocess.run(["bash", script, "--help"], capture_output=True, text=True)
        assert p.returncode == 0 and "CONFIG" in p.stdout, script
    p = subprocess.run(["bash", LOCAL, "configs/demo.py"], capture_output=True, text=True)
    assert p.returncode == 2
    p = subprocess.run(["bash", LOCAL, "c.py", "w", "optim.lr=1"], capture_output=True, text=True)
    assert p.returncode == 2 and "'optim.lr=1' is not an override (fix: --config.KEY=VALUE)" in p.stderr


# ------------------------------------------------------------------------------------------ local.sh

FAKE_TRAINER = '''
printf '%s\\n' "$@" > "$REC/argv"
env | grep -E '^(JAXEMBED_DISTRIBUTED|TF_CPP_MIN_LOG_LEVEL|XLA_PYTHON_CLIENT_MEM_FRACTION)=' | sort > "$REC/env"
echo "step 1 loss 2.0"
if [[ -n "${SLOW:-}" ]]; then
  trap 'echo "saving a checkpoint"; kill $S; exit 143' TERM
  sleep 30 & S=$!; touch "$REC/started"; wait $S
fi
exit "${CODE:-0}"
'''


def test_local_sh_runs_tees_records_and_forwards_sigterm(tmp_path):
    env, rec = _bin(tmp_path, fake_jaxembed=FAKE_TRAINER)
    env.update(JAXEMBED="fake_jaxembed", MEM_FRACTION="0.9")
    wd = tmp_path / "run"
    p = subprocess.run(["bash", LOCAL, "--dry-run", "configs/demo.py:tiny", str(wd), "--config.optim.lr=5e-5"],
                       env=env, capture_output=True, text=True)
    assert p.returncode == 0
    assert "export JAXEMBED_DISTRIBUTED=off" in p.stdout and "export XLA_PYTHON_CLIENT_MEM_FRACTION=0.9" in p.stdout
    assert f"fake_jaxembed train --config configs/demo.py:tiny --workdir {wd} --config.optim.lr=5e-5" in p.stdout
    assert not wd.exists()

    p = subprocess.run(["bash", LOCAL, "configs/demo.py:tiny", str(wd), "--config.optim.lr=5e-5"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "step 1 loss 2.0" in p.stdout
    assert (rec / "argv").read_text().split() == ["train", "--config", "configs/demo.py:tiny", "--workdir", str(wd),
                                                  "--config.optim.lr=5e-5"]
    assert (rec / "env").read_text().split() == ["JAXEMBED_DISTRIBUTED=off", "TF_CPP_MIN_LOG_LEVEL=1",
                                                 "XLA_PYTHON_CLIENT_MEM_FRACTION=0.9"]
    assert "step 1 loss 2.0" in (wd / "train.log").read_text()
    assert json.loads((wd / "status.json").read_text())["status"] == "completed"

    p = subprocess.run(["bash", LOCAL, "c.py", str(wd)], env=dict(env, CODE="3"), capture_output=True, text=True)
    assert p.returncode == 3 and json.loads((wd / "status.json").read_text())["status"] == "failed"

    proc = subprocess.Popen(["bash", LOCAL, "c.py", str(wd)], env=dict(env, SLOW="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    _wait_for(rec / "started", proc)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=30)[0]
    assert proc.returncode == 143, out
    assert "saving a checkpoint" in out and "local.sh: preempted (exit 143)" in out
    assert json.loads((wd / "status.json").read_text())["status"] == "preempted"
    assert (wd / "train.log").read_text().count("=== ") == 3  # one header per start, appended


# ------------------------------------------------------------------------------------------ slurm_gpu.sh

FAKE_SRUN = '''
printf '%s\\n' "$@" > "$REC/srun.argv"
echo "fake srun: $*"
trap 'echo TERM >> "$REC/srun.signals"; kill $S 2>/dev/null; exit 143' TERM
sleep 30 & S=$!
echo $$ > "$REC/srun.pid"
wait $S
'''
FAKE_SCANCEL = '''
printf '%s\\n' "$@" >> "$REC/scancel.argv"
kill -TERM "$(cat "$REC/srun.pid")"    # what slurmd does: SIGTERM to the tasks of the job's steps
'''
FAKE_SCONTROL = '''
printf '%s\\n' "$@" >> "$REC/scontrol.argv"
'''
JOB = dict(SLURM_JOB_ID="4242", SLURM_JOB_NUM_NODES="2", SLURM_NTASKS_PER_NODE="1", SLURM_GPUS_ON_NODE="8",
           JAXEMBED="jaxembed")


def _slurm_env(tmp_path, **extra):
    env, rec = _bin(tmp_path, srun=FAKE_SRUN, scancel=FAKE_SCANCEL, scontrol=FAKE_SCONTROL)
    env.update(JOB, **extra)
    return env, rec


def test_slurm_dry_run_shows_layout_and_command(tmp_path):
    env, _ = _slurm_env(tmp_path)
    for extra, layout in ((dict(SLURM_NTASKS_PER_NODE="1"), "2 node(s), one process per node (all 8 GPUs)"),
                          (dict(SLURM_NTASKS_PER_NODE="8", SLURM_GPUS_ON_NODE="a100:8"), "one process per GPU"),
                          (dict(SLURM_NTASKS_PER_NODE="2"), "2 processes per node on 8 GPUs (expected 1 or 8)")):
        p = subprocess.run(["bash", SLURM, "--dry-run", "configs/demo.py", "/shared/r", "--config.optim.lr=1e-5"],
                           env=dict(env, **extra), capture_output=True, text=True)
        assert p.returncode == 0 and layout in p.stdout, p.stdout
    assert ("srun --label --unbuffered jaxembed train --config configs/demo.py --workdir /shared/r "
            "--config.optim.lr=1e-5 2>&1 | tee -a /shared/r/logs/slurm-4242.log") in p.stdout
    assert "export JAX_COMPILATION_CACHE_DIR=/shared/r/jax_cache" in p.stdout
    env.pop("SLURM_JOB_ID")
    p = subprocess.run(["bash", SLURM, "c.py", "w"], env=env, capture_output=True, text=True)
    assert p.returncode == 2 and "not inside a SLURM job" in p.stderr


def _start_job(env, wd):
    return subprocess.Popen(["bash", SLURM, "configs/demo.py", str(wd), "--config.optim.lr=1e-5"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_slurm_usr1_checkpoints_then_requeues(tmp_path):
    env, rec = _slurm_env(tmp_path)
    wd = tmp_path / "run"
    proc = _start_job(env, wd)
    _wait_for(rec / "srun.pid", proc)
    proc.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@300 sends before the time limit
    out = proc.communicate(timeout=30)[0]
    assert proc.returncode == 143, out
    assert (rec / "scancel.argv").read_text().split() == ["--signal=TERM", "4242"]
    assert (rec / "srun.signals").read_text().split() == ["TERM"]  # the step's tasks got SIGTERM: they checkpoint
    assert (rec / "scontrol.argv").read_text().split() == ["requeue", "4242"]
    assert (rec / "srun.argv").read_text().split()[:3] == ["--label", "--unbuffered", "jaxembed"]
    st = json.loads((wd / "status.json").read_text())
    assert st["status"] == "requeued" and st["returncode"] == 143 and st["job"] == "4242"
    assert "fake srun: --label" in (wd / "logs" / "slurm-4242.log").read_text()


@pytest.mark.parametrize("sig,extra,requeued", [
    (signal.SIGTERM, {}, False),                                  # scancel / preemption: stop, SLURM decides
    (signal.SIGTERM, {"REQUEUE_ON_TERM": "1"}, True),
    (signal.SIGUSR1, {"SLURM_RESTART_COUNT": "3", "MAX_REQUEUES": "3"}, False),  # the requeue guard
])
def test_slurm_term_and_the_requeue_guard(tmp_path, sig, extra, requeued):
    env, rec = _slurm_env(tmp_path, **extra)
    proc = _start_job(env, tmp_path / "run")
    _wait_for(rec / "srun.pid", proc)
    proc.send_signal(sig)
    out = proc.communicate(timeout=30)[0]
    assert proc.returncode == 143, out
    assert (rec / "srun.signals").read_text().split() == ["TERM"]
    assert (rec / "scontrol.argv").exists() == requeued
    if "MAX_REQUEUES" in extra:
        assert "not requeued: 3 restarts already (MAX_REQUEUES=3)" in out


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SPAWNING_SRUN = '''
# fake srun: start the command once per task with the variables srun sets (2 "nodes", 1 task each)
while [[ "$1" == -* ]]; do shift; done
n=2; pids=()
for ((i = 0; i < n; i++)); do
  SLURM_PROCID=$i SLURM_LOCALID=0 SLURM_NODEID=$i SLURM_NTASKS=$n SLURM_STEP_NUM_TASKS=$n SLURM_STEP_ID=0 \\
  SLURM_STEP_NODELIST=localhost SLURM_STEP_NUM_NODES=$n SLURM_STEP_TASKS_PER_NODE="1(x$n)" "$@" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
'''
WORKER = '''
import json, sys
from jaxembed import parallel
plan = parallel.initialize()          # what jaxembed train does first
import jax
out = {"mode": plan["mode"], "index": jax.process_index(), "count": jax.process_count(),
       "devices": jax.device_count(), "local": jax.local_device_count(), "argv": sys.argv[2:]}
json.dump(out, open(f"{sys.argv[1]}/proc{jax.process_index()}.json", "w"))
'''


def test_slurm_environment_joins_two_jax_processes(tmp_path):
    """slurm_gpu.sh -> srun (2 tasks) -> parallel.initialize() with JAX's SLURM detection: one 2-process run."""
    env, rec = _bin(tmp_path, srun=SPAWNING_SRUN)
    (tmp_path / "worker.py").write_text(WORKER)
    env.update(SLURM_JOB_ID="4242", SLURM_JOB_NUM_NODES="2", SLURM_NTASKS_PER_NODE="1", JAX_PLATFORMS="cpu",
               JAX_COORDINATOR_PORT=str(_free_port()), XLA_FLAGS=runs.xla_flags(2),
               CUDA_VISIBLE_DEVICES="", JAXEMBED=f"{sys.executable} {tmp_path / 'worker.py'} {rec}")
    wd = tmp_path / "run"
    p = subprocess.run(["bash", SLURM, "configs/demo.py", str(wd), "--config.optim.lr=1e-5"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    got = [json.loads((rec / f"proc{i}.json").read_text()) for i in range(2)]
    for i, g in enumerate(got):
        assert g == {"mode": "slurm", "index": i, "count": 2, "devices": 4, "local": 2, "argv": [
            "train", "--config", "configs/demo.py", "--workdir", str(wd), "--config.optim.lr=1e-5"]}
    log = (wd / "logs" / "slurm-4242.log").read_text()
    assert "jaxembed: process 1 of 2 (slurm: job 4242, task 1 of 2" in log
    assert "2 local / 4 global devices (cpu: " in log


# ------------------------------------------------------------------------------------------ tpu_pod.sh

FAKE_GCLOUD = '''
"$PYTHON" -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$REC/gcloud.jsonl"
if [[ "$*" == *" describe "* ]]; then echo 2; fi
if [[ "$4" == scp && "$5" == pod:* ]]; then echo "a worker log" > "$6"; fi
exit 0
'''


def _calls(rec):
    return [json.loads(x) for x in (rec / "gcloud.jsonl").read_text().splitlines()]


def test_tpu_pod_setup_train_logs_with_fake_gcloud(tmp_path):
    env, rec = _bin(tmp_path, gcloud=FAKE_GCLOUD)
    base = ["bash", TPU, "--name", "pod", "--zone", "us-central2-b", "--log-dir", str(tmp_path / "logs")]
    p = subprocess.run(base + ["setup"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    scp, ssh = _calls(rec)
    assert scp[:4] == ["compute", "tpus", "tpu-vm", "scp"] and scp[5:] == [
        "pod:jaxembed-src.tgz", "--zone", "us-central2-b", "--worker=all"]
    assert ssh[:5] == ["compute", "tpus", "tpu-vm", "ssh", "pod"] and "--worker=all" in ssh
    cmd = ssh[ssh.index("--command") + 1]
    assert "tar -xzf jaxembed-src.tgz -C jaxembed" in cmd and "python3 -m pip install -q -e '.[tpu]'" in cmd
    (rec / "gcloud.jsonl").unlink()

    wd = "/mnt/shared/runs/demo"
    p = subprocess.run(base + ["train", "configs/demo.py", wd, "--config.optim.lr=5e-5"], env=env,
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    ssh, describe, scp0, scp1 = _calls(rec)
    cmd = ssh[ssh.index("--command") + 1]
    assert "--worker=all" in ssh and ssh[-2:] == ["--output-directory", str(tmp_path / "logs/pod/demo/live")]
    assert "JAXEMBED_DISTRIBUTED=on" in cmd and "tee -a logs/demo.log" in cmd
    assert "python3 -m jaxembed.cli train --config configs/demo.py --workdir /mnt/shared/runs/demo " \
           "--config.optim.lr=5e-5" in cmd
    assert describe[3:5] == ["describe", "pod"] and "--format=value(networkEndpoints.len())" in describe
    assert scp0[4:7] == ["pod:jaxembed/logs/demo.log", str(tmp_path / "logs/pod/demo/worker-0.log"), "--zone"]
    assert scp1[-1] == "--worker=1"
    assert (tmp_path / "logs/pod/demo/worker-1.log").read_text() == "a worker log\n"

    p = subprocess.run(["bash", TPU, "--zone", "z", "setup"], env=env, capture_output=True, text=True)
    assert p.returncode == 2 and "no TPU name (fix: --name NAME or TPU_NAME=...)" in p.stderr


def test_tpu_pod_dry_run_prints_commands(tmp_path):
    env, rec = _bin(tmp_path, gcloud=FAKE_GCLOUD)
    p = subprocess.run(["bash", TPU, "--dry-run", "--name", "pod", "--zone", "z", "--project", "proj", "--workers",
                        "2", "--venv", "venvs/je", "--detach", "train", "configs/demo.py", "runs/x"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert not (rec / "gcloud.jsonl").exists()  # nothing ran
    lines = p.stdout.splitlines()
    ssh = next(x for x in lines if "ssh pod" in x)
    assert ssh.startswith("+ gcloud compute tpus tpu-vm ssh pod --zone z --project proj --worker=all --command ")
    assert "nohup setsid bash -c" in ssh and "$HOME/venvs/je/bin/python" in ssh
    assert "WORKDIR runs/x is relative" in p.stderr
    p = subprocess.run(["bash", TPU, "--dry-run", "--name", "pod", "--zone", "z", "--sync", "git", "--git-url",
                        "https://example.org/jaxembed.git", "--git-ref", "v1", "setup"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert "git clone -q https://example.org/jaxembed.git jaxembed" in p.stdout and "checkout -q v1" in p.stdout


# ------------------------------------------------------------------------------------------ cluster plan

SLURM_TASK = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "gpu[01-02]", "SLURM_NTASKS": "16", "SLURM_PROCID": "9",
              "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "8(x2)",
              "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "SLURMD_NODENAME": "gpu02"}


def test_cluster_plan_for_each_environment():
    assert cluster_plan({})["mode"] == "single"
    assert cluster_plan({"SLURM_JOB_ID": "7"})["detail"] == "SLURM job 7 with one task"
    assert cluster_plan({**SLURM_TASK, "JAXEMBED_DISTRIBUTED": "off"})["mode"] == "single"
    p = cluster_plan(SLURM_TASK)  # one task per GPU: JAX's default device, SLURM_LOCALID
    assert p["mode"] == "slurm" and p["kwargs"] == {"local_device_ids": None}
    assert p["detail"] == "job 7, task 9 of 16 on gpu02, devices: GPU number SLURM_LOCALID"
    per_node = {**SLURM_TASK, "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "0",
                "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}
    assert cluster_plan(per_node)["kwargs"] == {"local_device_ids": list(range(8))}  # all GPUs of the node
    bound = {**SLURM_TASK, "CUDA_VISIBLE_DEVICES": "5"}  # the site binds one GPU per task
    assert cluster_plan(bound)["kwargs"] == {"local_device_ids": [0]}
    assert cluster_plan({**SLURM_TASK, "JAX_LOCAL_DEVICE_IDS": "3"})["kwargs"] == {"local_device_ids": None}
    e = cluster_plan({}, "10.0.0.1:1234", 4, 2)
    assert e["mode"] == "explicit" and e["kwargs"]["process_id"] == 2
    e = cluster_plan({"JAXEMBED_COORDINATOR": "h:1", "JAXEMBED_NUM_PROCESSES": "2", "JAXEMBED_PROCESS_ID": "1"})
    assert e["kwargs"] == {"coordinator_address": "h:1", "num_processes": 2, "process_id": 1,
                           "local_device_ids": None}
    assert cluster_plan({"JAXEMBED_DISTRIBUTED": "on"})["mode"] == "auto"
    assert cluster_plan({"TPU_WORKER_HOSTNAMES": "a,b", "TPU_WORKER_ID": "1"})["mode"] == "tpu"
    assert cluster_plan({"OMPI_COMM_WORLD_SIZE": "4"})["mode"] == "ompi"


@pytest.mark.parametrize("env,match", [
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"},
     r"SLURM job 7 has 4 tasks but SLURM_STEP_NODELIST is not set: this process is not one of its srun tasks "
     r"\(fix: start `jaxembed train` with srun"),
    ({**SLURM_TASK, "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_NTASKS": "4"},
     r"2 tasks on this node but 8 GPUs visible: .*--ntasks-per-node=1 or 8"),
    ({"JAXEMBED_COORDINATOR": "h:1"},
     r"JAXEMBED_COORDINATOR=h:1 is set but JAXEMBED_NUM_PROCESSES, JAXEMBED_PROCESS_ID are not"),
    ({"JAXEMBED_COORDINATOR": "h", "JAXEMBED_NUM_PROCESSES": "2", "JAXEMBED_PROCESS_ID": "0"}, r"expected host:port"),
    ({"JAXEMBED_COORDINATOR": "h:1", "JAXEMBED_NUM_PROCESSES": "two", "JAXEMBED_PROCESS_ID": "0"},
     r"JAXEMBED_NUM_PROCESSES='two': not an integer"),
    ({"JAXEMBED_COORDINATOR": "h:1", "JAXEMBED_NUM_PROCESSES": "2", "JAXEMBED_PROCESS_ID": "2"},
     r"the id must be in \[0, 1\]"),
    ({"TPU_WORKER_HOSTNAMES": "a,b"}, r"TPU_WORKER_HOSTNAMES is set but TPU_WORKER_ID is not"),
    ({"JAXEMBED_DISTRIBUTED": "maybe"}, r"allowed: auto \(default\), on, off"),
])
def test_half_set_environments_are_named(env, match):
    with pytest.raises(UserError, match=match):
        cluster_plan(env)


# ------------------------------------------------------------------------------------------ sweep -> local.sh

SWEEP_CONFIG = '''
from jaxembed.config import default_config

def get_config(arg=None):
    c = default_config()
    c.model.name = {model!r}
    c.model.max_length = 32
    c.data.store = {store!r}
    c.plan.global_batch_size = 4
    c.plan.steps = 2
    c.train.dropout = False
    c.train.log_every = 1
    c.train.checkpoint_every = 0
    c.export.at_end = False
    return c
'''


def test_sweep_trains_through_the_real_local_sh(shared_data, tmp_path, capsys):
    """`jaxembed sweep --launcher launch/local.sh`: the real script starts the real `jaxembed train` for the run, with
    the run's override; local.sh's log header and status file and the trainer's summary are all there."""
    from jaxembed.cli import main
    from jaxembed.data.config import dataset_config, default_data_config
    from jaxembed.data.store import write_store
    from jaxembed.models.tiny import tiny_model_dir

    src = tmp_path / "stsb.jsonl"
    src.write_text("".join((shared_data / "train" / "stsb_pairs.jsonl").read_text(encoding="utf-8")
                           .splitlines(True)[:80]), encoding="utf-8")
    data = default_data_config()
    data.datasets = [dataset_config(name="stsb", path=str(src), format="scored_pairs", task_type="sts",
                                    score_threshold=2.0, num_negatives=0, max_query_length=16, max_doc_length=16)]
    write_store(data, tmp_path / "store")
    cfg = tmp_path / "exp.py"
    cfg.write_text(SWEEP_CONFIG.format(model=str(tiny_model_dir("bert", num_layers=1)), store=str(tmp_path / "store")))
    root = tmp_path / "sweep"
    assert main(["sweep", "--config", str(cfg), "--root", str(root), "--sweep", "optim.lr=0.001",
                 "--launcher", LOCAL, "-q"]) == 0
    assert "1 of 1 runs completed" in capsys.readouterr().out
    (run,) = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "completed" and status["returncode"] == 0
    log = (run / "train.log").read_text()
    assert f"{LOCAL} {cfg} {run} --config.optim.lr=0.001" in log  # the sweep's header: the command it ran
    trainer = str(Path(sys.executable).parent / "jaxembed")
    assert f": {trainer} train --config {cfg} --workdir {run} --config.optim.lr=0.001" in log  # local.sh's header
    assert "[train step 2]" in log
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["step"] == 2
    assert json.loads((run / "config.json").read_text())["optim"]["lr"] == 0.001
