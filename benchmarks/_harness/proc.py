"""The process side of a measurement: a timestamped log, this process's CPU seconds and memory, thread pinning, worker
subprocesses and the command line a result records.

Workers: a benchmark runs each tool in a fresh process of its own script (so one tool's memory never counts against
the other's), either one-shot (``run_worker``: the worker prints ``RESULT <json>`` and exits) or long-lived
(``LineWorker``: READY after its warm-up, ``run [I]`` -> TIMES, ``end`` -> RESULT).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------------------ this process


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def rss_now_mib() -> float:
    """Resident memory now (VmRSS): after the timed steps, the steady-state footprint without the one-time peak
    of compilation that the high-water mark includes."""
    try:
        for line in open("/proc/self/status", encoding="utf-8"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def cpu_s() -> float:
    """CPU seconds of this process (all threads, user + system)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def pin_threads() -> None:
    """A worker pins itself to the first $BENCH_THREADS cores, before any framework starts its thread pools."""
    n = int(os.environ.get("BENCH_THREADS", "0"))
    if n and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:n]))


# ------------------------------------------------------------------------------------------------ workers


def worker_env(threads: int, cache: Path) -> dict:
    """A worker's environment: the store cache, and on CPU the same cores and compute threads for every tool
    (the worker pins itself to the first ``threads`` cores; 0 = all cores, framework defaults)."""
    env = dict(os.environ, BENCH_CACHE=str(cache))
    if threads:
        n = threads
        env.update(BENCH_THREADS=str(n), OMP_NUM_THREADS=str(n), MKL_NUM_THREADS=str(n))
        if n == 1:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
    return env


def script_argv(script: str | Path, *args: str) -> list[str]:
    """The command that runs ``script`` (a benchmark's own file) with ``args`` in this Python."""
    return [sys.executable, str(Path(script).resolve()), *args]


def run_worker(argv: list[str], env: dict, timeout: float | None = None) -> dict:
    """Run a one-shot worker; -> its RESULT (with its wall time), or {"error": ...} (out of memory, timeout,
    crash)."""
    t0 = time.time()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f}s"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
            res["wall_s"] = time.time() - t0
            return res
    tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
    return {"error": f"exit {p.returncode}: " + " | ".join(tail)}


class LineWorker:
    """The parent's handle on one long-lived worker (stdin / stdout lines; stderr to a file, its tail on error)."""

    def __init__(self, tool: str, argv: list[str], env: dict):
        import tempfile

        self.tool = tool
        self.err = tempfile.TemporaryFile(mode="w+")
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, text=True,
                                  bufsize=1, env=env)
        self.t0 = time.time()

    def _answer(self, prefix: str) -> dict:
        for line in self.p.stdout:
            if line.startswith(prefix + " "):
                return json.loads(line[len(prefix) + 1:])
        self.p.wait()
        self.err.seek(0)
        tail = self.err.read().strip().splitlines()[-3:]
        raise RuntimeError(f"{self.tool}: exit {self.p.returncode}: " + " | ".join(tail))

    def ready(self) -> dict:
        return self._answer("READY")

    def run(self, batch: int | None = None) -> dict:
        self.p.stdin.write("run\n" if batch is None else f"run {batch}\n")
        self.p.stdin.flush()
        return self._answer("TIMES")

    def end(self) -> dict:
        self.p.stdin.write("end\n")
        self.p.stdin.flush()
        out = self._answer("RESULT")
        self.p.wait()
        out["wall_s"] = time.time() - self.t0
        return out

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


# ------------------------------------------------------------------------------------------------ the record


def public_argv(argv: list[str], valued: tuple[str, ...] = (), flags: tuple[str, ...] = ("--no-readme",)) -> list[str]:
    """The command line without the options ``valued`` (with their values: machine-local or bookkeeping, e.g.
    --workdir) and the flags ``flags`` (--no-readme)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in valued:
            skip = True
            continue
        if a.startswith(tuple(v + "=" for v in valued)) or a in flags:
            continue
        out.append(a)
    return out


def device_info() -> dict:
    """The machine: CPU model and cores; the accelerator (from nvidia-smi, without starting a framework)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"cpu": cpu, "cpu_count": os.cpu_count(), "gpu": None}
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        if p.returncode == 0 and p.stdout.strip():
            info["gpu"] = p.stdout.strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return info


def source_at(rev: str, root: Path) -> tuple[str, Path]:
    """jaxembed's package as of git revision ``rev`` of the checkout at ``root``, unpacked into a new temporary
    folder (put it first on PYTHONPATH to run that revision). -> (a label 'old (SHORT_SHA)', the folder)."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="jaxembed_old_"))
    arch = subprocess.run(["git", "archive", rev, "jaxembed"], cwd=root, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=arch, check=True)
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=root, capture_output=True, text=True,
                         check=True).stdout.strip()
    return f"old ({sha})", folder

