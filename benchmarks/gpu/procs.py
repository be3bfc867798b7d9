"""The benchmark's processes: each worker (workers.py, started as ``bench.py --_worker NAME JSON``) in a process of
its own with a deadline, its RESULT lines collected as they appear; the log and JSON writers and the device's
nvidia-smi line. Standard library only: the entry imports no framework.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: the script a worker process runs (bench.py --_worker NAME JSON)
ENTRY = HERE / "bench.py"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def nvidia_smi() -> str | None:
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        return p.stdout.strip().splitlines()[0] if p.returncode == 0 and p.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


class Workers:
    """Runs workers (benchmarks/gpu/workers.py) in processes of their own, each with a deadline; collects their
    RESULT lines as they appear (``on_result``), and its log's tail when it fails. ``shared`` (the dry run): every
    job in one long-lived worker process (workers.serve), restarted only after a job is stopped at its deadline:
    the imports happen once; on a device each job keeps a process of its own (one framework's memory never counts
    against the other's)."""

    def __init__(self, root: Path, env: dict, shared: bool = False):
        self.root = root
        self.env = env
        self.shared = shared
        self.server = None
        (root / "logs").mkdir(parents=True, exist_ok=True)
        self.n = 0

    def argv(self, name: str, payload: dict) -> list[str]:
        return [sys.executable, str(ENTRY), "--_worker", name, json.dumps(payload)]

    def _serve(self) -> subprocess.Popen:
        if self.server is None or self.server.poll() is not None:
            with open(self.root / "logs" / "server.log", "a", encoding="utf-8") as f:
                self.server = subprocess.Popen(self.argv("serve", {}), stdin=subprocess.PIPE, stdout=f,
                                               stderr=subprocess.STDOUT, env=self.env, cwd=str(ROOT), text=True,
                                               start_new_session=True)
        return self.server

    def close(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.stdin.close()
            try:
                self.server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill(self.server)
        self.server = None

    @staticmethod
    def kill(p) -> None:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the worker and anything it started
        except ProcessLookupError:
            pass
        p.wait()

    def run(self, name: str, payload: dict, timeout: float, on_result=None, env: dict | None = None) -> dict:
        self.n += 1
        logf = self.root / "logs" / f"{self.n:02d}_{name}.log"
        results, t0, seen = [], time.time(), 0
        logf.write_text("", encoding="utf-8")
        if self.shared:
            p = self._serve()
            cpu0 = _proc_cpu_s(p.pid)
            p.stdin.write(json.dumps({"name": name, "payload": payload, "log": str(logf), "env": env or {}}) + "\n")
            p.stdin.flush()
        else:
            cpu0 = _children_cpu_s()
            with open(logf, "w", encoding="utf-8") as f:
                p = subprocess.Popen(self.argv(name, payload), stdout=f, stderr=subprocess.STDOUT,
                                     env=dict(self.env, **(env or {})), cwd=str(ROOT), start_new_session=True)
        timed_out, rc = False, None
        while True:
            if self.shared:
                time.sleep(0.25)
                seen = self._collect(logf, seen, results, on_result)
                m = re.search(r"^JOB_END (\d+)$", logf.read_text(encoding="utf-8", errors="replace"), re.M)
                if m:
                    rc = int(m.group(1))
                    break
                if p.poll() is not None:
                    rc = p.returncode
                    break
            else:
                try:
                    p.wait(timeout=1.0)
                    done = True
                except subprocess.TimeoutExpired:
                    done = False
                seen = self._collect(logf, seen, results, on_result)
                if done:
                    rc = p.returncode
                    break
            if time.time() - t0 > timeout:
                timed_out = True
                self.kill(p)
                self._collect(logf, seen, results, on_result)
                rc = p.returncode
                break
        cpu = (_proc_cpu_s(p.pid) - cpu0) if self.shared and p.poll() is None else \
            (_children_cpu_s() - cpu0 if not self.shared else None)
        out = {"worker": name, "rc": rc, "seconds": time.time() - t0, "cpu_s": cpu, "results": results,
               "timed_out": timed_out, "log": str(logf), "process": "shared" if self.shared else "own"}
        log(f"  worker {name}: {out['seconds']:.0f} s" + (f", {cpu:.0f} CPU-s" if cpu is not None else ""))
        if rc != 0 or timed_out:
            out["tail"] = tail(logf, 30)
            log(f"  worker {name}: {'stopped at its deadline' if timed_out else f'exit {rc}'}; log tail:\n"
                + out["tail"])
        return out

    @staticmethod
    def _collect(logf: Path, seen: int, results: list, on_result) -> int:
        lines = logf.read_text(encoding="utf-8", errors="replace").splitlines()
        for line in lines[seen:]:
            if line.startswith("RESULT "):
                try:
                    r = json.loads(line[7:])
                except json.JSONDecodeError:  # a line still being written: read it next time
                    return seen
                results.append(r)
                if on_result:
                    on_result(r)
            seen += 1
        return seen


def _proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a running process has used so far (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _children_cpu_s() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def tail(path: Path, n: int) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-n:])
    except OSError:
        return ""
