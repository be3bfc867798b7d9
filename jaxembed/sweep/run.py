"""Running a sweep: locally (``run_local``: ``jaxembed train`` subprocesses or in this process, each run's output
in ``NAME/train.log``, its outcome in ``NAME/status.json``, completed runs skipped, SIGTERM / Ctrl-C passed on),
or as a SLURM array script / TPU command list (``slurm_script``, ``tpu_commands``); ``ROOT/sweep.json`` (the
manifest) is written before anything runs."""

from __future__ import annotations

import copy
import datetime
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from jaxembed import paths
from jaxembed.config.io import portable_spec
from jaxembed.errors import UserError
from jaxembed.runs.rundir import NAMES, RunDir, rundir
from jaxembed.runs.signals import StopSignals
from jaxembed.sweep.expand import MANIFEST, Sweep, SweepRun

STATUS = NAMES["status_json"]
SLURM_FILE = "sweep_slurm.sh"
TPU_FILE = "sweep_tpu.txt"


# ----------------------------------------------------------------------------------------- manifest


def _check_existing(sw: Sweep) -> None:
    """Before any run starts: the root's manifest and any existing run directory must match this sweep."""
    old_path = sw.root / MANIFEST
    if old_path.exists():
        try:
            old = json.loads(old_path.read_text())
        except json.JSONDecodeError as e:
            raise UserError(f"{old_path}: not valid JSON ({e}) (fix: delete it, or use a new --root)") from None
        if old.get("config") != sw.config_spec or old.get("fixed") != sw.fixed:
            raise UserError(f"{sw.root} holds a sweep of {old.get('config')} with fixed overrides {old.get('fixed')}"
                            f"; this one is {sw.config_spec} with {sw.fixed} (fix: use a new --root, or the same "
                            "--config and --set / --config.KEY values)")
    existing = [r for r in sw.runs if RunDir(r.workdir).config_json.exists()]
    if existing:
        from jaxembed.train import check_workdir

        for r in existing:
            check_workdir(r.config, r.workdir)


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def write_manifest(sw: Sweep, mode: str) -> Path:
    """``ROOT/sweep.json``: this expansion, plus the runs of an earlier expansion into the same root."""
    path = sw.root / MANIFEST
    m = sw.manifest()
    m["mode"] = mode
    m["updated"] = datetime.datetime.now().isoformat(timespec="seconds")
    if path.exists():
        old = json.loads(path.read_text())
        names = {r["name"] for r in m["runs"]}
        extra = [r for r in old.get("runs", []) if r["name"] not in names]
        m["runs"] += extra
        m["keys"] = list(dict.fromkeys(m["keys"] + old.get("keys", [])))
    _write_json(path, m)
    return path



# ------------------------------------------------------------------------------------------- status


def run_status(workdir: Path) -> dict:
    """What a run directory says about its run: completed / preempted / interrupted / failed / running / incomplete /
    pending."""
    rd = rundir(workdir)
    summary, status = read_json(rd.summary_json), read_json(rd.status_json)
    if summary and summary.get("status") == "completed":
        return {**(status or {}), "status": "completed", "step": summary.get("step")}
    if status:
        return status
    if summary:
        return {"status": summary.get("status", "incomplete"), "step": summary.get("step")}
    if rd.metrics_jsonl.exists() or rd.checkpoints.exists():
        return {"status": "incomplete"}
    return {"status": "pending"}


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def write_status(workdir: Path, **fields) -> None:
    fields.setdefault("updated", datetime.datetime.now().isoformat(timespec="seconds"))
    _write_json(rundir(workdir).status_json, fields)



# --------------------------------------------------------------------------------------- local runs


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, s):
        for st in self.streams:
            st.write(s)
        return len(s)

    def flush(self):
        for st in self.streams:
            st.flush()


class _StopSignals(StopSignals):
    """While a subprocess run is going: SIGTERM / SIGINT are passed on to it as SIGTERM (it saves a checkpoint and
    exits 143); the sweep then stops (a second signal is passed on too)."""

    def __init__(self):
        super().__init__()
        self.proc = None

    def on_signal(self, signum, again):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)


def train_command(sw: Sweep, run: SweepRun, launcher: str | None = None) -> list[str]:
    """The command that trains one run: ``python -m jaxembed.cli train --config C --workdir W --config.K=V ...``,
    or ``LAUNCHER C W --config.K=V ...`` (e.g. ``--launcher launch/local.sh``)."""
    if launcher:
        return [*shlex.split(launcher), sw.config_spec, str(run.workdir), *run.train_args()]
    return [sys.executable, "-m", "jaxembed.cli", "train", "--config", sw.config_spec, "--workdir",
            str(run.workdir), *run.train_args()]


def _run_subprocess(sw, run, launcher, quiet, stop: _StopSignals, env) -> tuple[int, str]:
    cmd = train_command(sw, run, launcher)
    run.workdir.mkdir(parents=True, exist_ok=True)
    tail: list[str] = []
    with open(RunDir(run.workdir).train_log, "a", encoding="utf-8") as log:
        log.write(f"\n=== {datetime.datetime.now().isoformat(timespec='seconds')} {shlex.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                env=env, start_new_session=True)
        stop.proc = proc
        if stop.received is not None:  # a signal that came while the child was starting
            proc.send_signal(signal.SIGTERM)
        try:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                tail = (tail + [line.rstrip("\n")])[-20:]
                if not quiet:
                    sys.stdout.write(f"  [{run.name}] {line}")
                    sys.stdout.flush()
            rc = proc.wait()
        finally:
            stop.proc = None
            if proc.poll() is None:  # an exception here: stop the child cleanly
                proc.send_signal(signal.SIGTERM)
                proc.wait()
    return rc, "\n".join(tail)


def _run_in_process(sw, run, quiet) -> tuple[int, str]:
    import traceback

    from jaxembed.train import train

    run.workdir.mkdir(parents=True, exist_ok=True)
    with open(RunDir(run.workdir).train_log, "a", encoding="utf-8") as log:
        log.write(f"\n=== {datetime.datetime.now().isoformat(timespec='seconds')} in process: "
                  f"{shlex.join(train_command(sw, run)[3:])}\n")
        out = log if quiet else _Tee(sys.stdout, log)
        old = sys.stdout
        sys.stdout = out
        try:
            summary = train(copy.deepcopy(run.config), run.workdir)
        except UserError as e:
            print(f"error: {e}", file=log)
            return 2, str(e)
        except Exception as e:  # a crash of one run must not end the sweep
            text = traceback.format_exc()
            log.write(text)
            return 1, f"{type(e).__name__}: {e}\n" + "\n".join(text.splitlines()[-8:])
        finally:
            sys.stdout = old
    return (0 if summary["status"] == "completed" else 143), ""


def run_local(sw: Sweep, *, in_process: bool = False, launcher: str | None = None, quiet: bool = False,
              compile_cache: bool = True) -> int:
    """Run every run of the sweep in turn; returns 0 (all completed), 1 (some failed), 143 (stopped at a
    checkpoint) or 130 (a run was interrupted: stopped at once)."""
    n = len(sw.runs)
    env = dict(os.environ)
    cache = sw.root / ".jax_cache"
    share = compile_cache and not env.get("JAX_COMPILATION_CACHE_DIR")
    if share:
        env["JAX_COMPILATION_CACHE_DIR"] = str(cache)  # runs that compile the same programs share them
    results = {}
    with _StopSignals() as stop:
        for run in sw.runs:
            head = f"sweep [{run.index + 1}/{n}] {run.name}"
            st = run_status(run.workdir)
            if st["status"] == "completed":
                print(f"{head}: already completed (step {st.get('step')}), skipped")
                results[run.name] = "completed"
                continue
            resuming = RunDir(run.workdir).checkpoints.exists()
            print(f"{head}: {'resuming' if resuming else 'starting'} in {run.workdir}", flush=True)
            attempts = int(st.get("attempts", 0)) + 1
            t0 = time.time()
            write_status(run.workdir, status="running", attempts=attempts, pid=os.getpid(),
                         started=datetime.datetime.now().isoformat(timespec="seconds"))
            if in_process:
                if share:  # effective when this process has compiled nothing yet (a `jaxembed sweep` process)
                    import jax

                    jax.config.update("jax_compilation_cache_dir", str(cache))
                    share = False
                rc, err = _run_in_process(sw, run, quiet)
            else:
                rc, err = _run_subprocess(sw, run, launcher, quiet, stop, env)
            if stop.received is not None and rc == 0 and run_status(run.workdir)["status"] != "completed":
                rc = 143
            # 143: stopped by a signal at a checkpoint; 130: stopped at once by a second signal (Ctrl-C twice) or
            # killed by SIGINT: the user's stop, not the run's failure
            status = ("completed" if rc == 0 else "preempted" if rc == 143 else
                      "interrupted" if rc in (130, -signal.SIGINT) else "failed")
            seconds = round(time.time() - t0, 1)
            write_status(run.workdir, status=status, returncode=rc, attempts=attempts, seconds=seconds,
                         error=err[-4000:] if status == "failed" else "")
            results[run.name] = status
            print(f"{head}: {status} in {seconds:.1f}s" + (f" (exit {rc}; log {RunDir(run.workdir).train_log})"
                                                         if status == "failed" else ""), flush=True)
            if status == "failed" and err:
                print("  " + "\n  ".join(err.splitlines()[-6:]), flush=True)
            if status == "interrupted":
                print(f"sweep: interrupted at {run.name} (from its latest checkpoint, if any); run the same command "
                      "to resume")
                return 130
            if status == "preempted" or stop.received is not None:
                print(f"sweep: stopped at {run.name} (checkpoint saved); run the same command to resume")
                return 143
    done = sum(1 for s in results.values() if s == "completed")
    failed = [k for k, s in results.items() if s == "failed"]
    print(f"sweep: {done} of {n} runs completed" + (f", {len(failed)} failed: {', '.join(failed)}" if failed else "")
          + f". Report: jaxembed sweep report {sw.root}")
    return 1 if failed else 0



def start_local(sw: Sweep, *, in_process: bool = False, launcher: str | None = None, quiet: bool = False,
                compile_cache: bool = True) -> int:
    """Check the root against this sweep, write the manifest, then ``run_local``."""
    _check_existing(sw)
    write_manifest(sw, "local")
    return run_local(sw, in_process=in_process, launcher=launcher, quiet=quiet, compile_cache=compile_cache)


# -------------------------------------------------------------------------------------- SLURM / TPU


def _sbatch_headers(script: Path) -> list[str]:
    """The ``#SBATCH`` lines of a batch script, less those an array job sets itself."""
    skip = re.compile(r"^#SBATCH\s+(--job-name|-J|--output|-o|--error|-e|--array|-a|--open-mode)\b")
    return [ln.rstrip() for ln in script.read_text().splitlines() if ln.startswith("#SBATCH") and not skip.match(ln)]


def slurm_script(sw: Sweep, launch_script: Path, parallel: int | None = None) -> str:
    """One SLURM array job: task i runs ``launch/slurm_gpu.sh CONFIG ROOT/NAME_i OVERRIDES_i`` (srun on every
    node, requeue on preemption); a task whose run already completed exits at once."""
    root = sw.root.absolute()
    launch_script = launch_script.absolute()
    config = portable_spec(sw.config_spec)
    n = len(sw.runs)
    job = re.sub(r"[^A-Za-z0-9_.-]", "_", f"sweep-{root.name}")
    lines = [
        "#!/bin/bash",
        f"# Generated by `jaxembed sweep --mode slurm` on {datetime.datetime.now():%Y-%m-%d %H:%M}: {n} runs of",
        f"# {config}. Submit all runs:  sbatch {root / SLURM_FILE}",
        f"#                some runs:     sbatch --array=0,2 {root / SLURM_FILE}",
        f"# Task i trains run i with {launch_script} (srun on every node, requeue on preemption, resume",
        "# from the last checkpoint). Resources: the #SBATCH lines below, copied from that script; edit them here or",
        "# override them on the sbatch command line. Report: jaxembed sweep report " + str(root),
        f"#SBATCH --job-name={job}",
        f"#SBATCH --array=0-{n - 1}" + (f"%{parallel}" if parallel else ""),
        f"#SBATCH --output={root / 'slurm_logs'}/%A_%a.out",
        "#SBATCH --open-mode=append",
        *_sbatch_headers(launch_script),
        "set -euo pipefail",
        "RUNS=(",
        *[f"  {shlex.quote(r.name)}" for r in sw.runs],
        ")",
        'TASK="${SLURM_ARRAY_TASK_ID:?submit this file with sbatch: it is a SLURM job array}"',
        'case "$TASK" in',
        *[f"  {r.index}) OVERRIDES=({' '.join(shlex.quote(a) for a in r.train_args())}) ;;" for r in sw.runs],
        f'  *) echo "sweep: no run number $TASK (runs 0-{n - 1})" >&2; exit 2 ;;',
        "esac",
        f'WORKDIR={shlex.quote(str(root))}/"${{RUNS[$TASK]}}"',
        "if grep -qs '\"status\": \"completed\"' \"$WORKDIR/summary.json\"; then",
        '  echo "sweep: $WORKDIR already completed"; exit 0',
        "fi",
        f"export JAXEMBED_REPO={shlex.quote(str(launch_script.parent.parent))}",
        (f'exec bash {shlex.quote(str(launch_script))} {shlex.quote(config)} "$WORKDIR" '
         '${OVERRIDES[@]+"${OVERRIDES[@]}"}'),
        "",
    ]
    return "\n".join(lines)


def tpu_commands(sw: Sweep) -> str:
    """One line per run: the arguments of ``launch/tpu_pod.sh train`` (CONFIG WORKDIR --config.K=V ...)."""
    lines = [(f"# jaxembed sweep: {len(sw.runs)} runs of {sw.config_spec}, generated "
              f"{datetime.datetime.now():%Y-%m-%d %H:%M}."),
             "# Run them one after another on every worker of a TPU VM pod (completed runs are skipped):",
             f"#   launch/tpu_pod.sh --name TPU_NAME --zone ZONE run-list {sw.root / TPU_FILE}",
             "# Each line: CONFIG WORKDIR [--config.KEY=VALUE ...], as for `launch/tpu_pod.sh train`."]
    for r in sw.runs:
        lines.append(shlex.join([sw.config_spec, str(r.workdir), *r.train_args()]))
    return "\n".join(lines) + "\n"



def slurm_launch_script(path: str | os.PathLike | None = None) -> Path:
    """The per-run batch script of a SLURM sweep: ``path``, else ``launch/slurm_gpu.sh`` of this repository."""
    script = Path(path) if path else paths.REPO_ROOT / "launch" / "slurm_gpu.sh"
    if not script.is_file():
        raise UserError(f"--slurm-script {script}: no such file (fix: give the path of launch/slurm_gpu.sh)")
    return script


def write_slurm(sw: Sweep, text: str) -> Path:
    """Write ``ROOT/sweep_slurm.sh`` (``text``: ``slurm_script``), its log folder and the manifest."""
    _check_existing(sw)
    out = sw.root / SLURM_FILE
    (sw.root / "slurm_logs").mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.chmod(0o755)
    write_manifest(sw, "slurm")
    return out


def write_tpu(sw: Sweep, text: str) -> Path:
    """Write ``ROOT/sweep_tpu.txt`` (``text``: ``tpu_commands``) and the manifest."""
    _check_existing(sw)
    out = sw.root / TPU_FILE
    sw.root.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    write_manifest(sw, "tpu")
    return out
