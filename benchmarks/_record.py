"""What every benchmark does with its figures: a JSON file under benchmarks/results/ and a line in
benchmarks/README.md (the table of results with date, device, figures, command and the JSON file).

- A result file is named by benchmark, date and run: ``<name>_<YYYY-MM-DD>_<HHMMSS>.json``, so a second run never
  overwrites the record of the first (a README figure keeps pointing at the run that produced it).
- Every result carries ``run`` (that date and time) and ``environment``: the machine's load average and the thread
  settings (OMP / MKL / XLA flags, the process's CPU affinity, torch's threads when torch is loaded), taken when the
  script started (this module's import) and when the result was saved. On a shared machine the load average says
  how far to trust a time.
- The README line ends with the result file, so each figure in the table traces to its record.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TOKENIZERS_PARALLELISM", "XLA_FLAGS",
               "JAX_PLATFORMS", "BENCH_THREADS")


def environment() -> dict:
    """Load average (1 / 5 / 15 min), CPU count and affinity, thread-related environment, torch's thread count."""
    env = {"load_average": [round(x, 2) for x in os.getloadavg()], "cpu_count": os.cpu_count(),
           "threads_env": {k: os.environ[k] for k in THREAD_VARS if k in os.environ}}
    if hasattr(os, "sched_getaffinity"):
        env["cpu_affinity"] = sorted(os.sched_getaffinity(0))
    torch = sys.modules.get("torch")
    if torch is not None:
        env["torch_threads"] = torch.get_num_threads()
    return env


STARTED = datetime.datetime.now()
START_ENV = environment()
_SAVED: list[Path] = []


def run_id(when: datetime.datetime | None = None) -> str:
    return (when or STARTED).strftime("%Y-%m-%d_%H%M%S")


def save_result(name: str, result: dict, results_dir: Path | None = None) -> Path:
    """Write ``result`` to benchmarks/results/<name>_<date>_<time>.json (never over an existing file) with the run
    and its environment; return the path."""
    out_dir = Path(results_dir) if results_dir is not None else RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    rid = run_id()
    path = out_dir / f"{name}_{rid}.json"
    k = 1
    while path.exists():  # two results of one name in one second
        k += 1
        path = out_dir / f"{name}_{rid}_{k}.json"
    result = dict(result)
    result.setdefault("run", rid)
    result["environment"] = {"at_start": START_ENV, "at_save": environment(), "python": platform.python_version()}
    path.write_text(json.dumps(result, indent=2) + "\n")
    _SAVED.append(path)
    return path


def record_line(line: str, append: bool = True, readme: Path | None = None) -> str:
    """Print the README table line, ending it with the result file this run saved last, and, unless told not to,
    append it to benchmarks/README.md. Returns the line."""
    if _SAVED:
        line = line.rstrip() + f" `results/{_SAVED[-1].name}` |"
    print(line)
    if append:
        with open(readme or HERE / "README.md", "a", encoding="utf-8") as f:
            f.write(line + "\n")
    return line
