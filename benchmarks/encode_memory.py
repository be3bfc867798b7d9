"""Peak memory and time to the first progress of `jaxembed encode` as its input grows: the current code against
an older revision of jaxembed (default: the commit before the streaming encoder).

Plain-text inputs of short lines (a number and 1-6 words, like titles or queries) are written once for each size of
--lines. Each revision encodes each input with `jaxembed encode` in its own Python process; the process reports its
peak resident set size (getrusage ru_maxrss), and this script timestamps the process's standard error to find when
the first progress line (tqdm's bar) and the first line with a text done appeared. The ratio of peak RSS between the
largest and the smallest input is the figure to watch: flat memory is a ratio near 1. The old revision's code is
taken with `git archive` (read-only on the repository) and put first on PYTHONPATH; both revisions' outputs must
agree (<= 1e-5).

Writes benchmarks/results/encode_memory_cpu_<date>_<time>.json and appends a line to benchmarks/README.md.

    python benchmarks/encode_memory.py [--lines 20000 200000] [--model tiny|DIR] [--old-rev REV] [--keep DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from _harness.proc import source_at  # noqa: E402  (benchmarks/ is on sys.path)
from _record import record_line, save_result  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OLD_REV = "50b20d2^"  # the commit before "encode streams: ..."

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec "
         "romeo sierra tango uniform victor whiskey xray yankee zulu").split()

# one encode in a fresh process: prints {"maxrss_kib", "seconds", "rc"} as its last line
RUNNER = r"""
import json, resource, sys, time
t0 = time.time()
from jaxembed.cli import main
rc = main(["encode", "--model", sys.argv[1], "--input", sys.argv[2], "--out", sys.argv[3]])
print(json.dumps({"maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "seconds": time.time() - t0,
                  "rc": rc, "module": __import__("jaxembed").__file__}))
"""
_DONE = re.compile(rb"encode:\s+\d+%\|[^|]*\|\s*([\d,]+)/")


def write_lines(path: Path, n: int) -> dict:
    import random

    r = random.Random(0)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(f"{i} " + " ".join(r.choice(WORDS) for _ in range(1 + i % 6)) + "\n")
    return {"lines": n, "bytes": path.stat().st_size}


def run_encode(pythonpath: str | None, cwd: Path, model: str, data: Path, out: Path) -> dict:
    """One `jaxembed encode` in a fresh process; its result plus the seconds (from the process's start) to the
    first progress output and to the first text done."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, model, str(data), str(out)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen: dict = {}
    tail = bytearray()

    def read_err():
        while True:
            chunk = os.read(proc.stderr.fileno(), 65536)
            if not chunk:
                return
            tail.extend(chunk)
            del tail[:-20000]
            now = time.time() - t0
            if b"encode:" in chunk:
                seen.setdefault("first_progress_s", now)
            m = [int(x.replace(b",", b"")) for x in _DONE.findall(chunk)]
            if any(m):
                seen.setdefault("first_text_done_s", now)

    reader = threading.Thread(target=read_err, daemon=True)
    reader.start()
    stdout = proc.stdout.read().decode()
    proc.wait()
    reader.join()
    if proc.returncode != 0:
        raise SystemExit(f"encode failed ({pythonpath or 'current'}):\n{tail.decode(errors='replace')[-3000:]}")
    res = json.loads(stdout.strip().splitlines()[-1])
    res.update(seen)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, nargs="+", default=[20_000, 200_000])
    ap.add_argument("--model", default="tiny", help="model folder, or 'tiny' (the default): a random BERT of "
                    "all-MiniLM-L6-v2's width (384) and tokenizer with one layer, so that 200k lines take minutes")
    ap.add_argument("--old-rev", default=DEFAULT_OLD_REV, help="git revision of the old encoder ('' to skip it)")
    ap.add_argument("--keep", default=None, help="folder for the inputs (kept and reused), default: a temp dir")
    ap.add_argument("--name", default="encode_memory_cpu")
    ap.add_argument("--no-readme", action="store_true")
    args = ap.parse_args()
    if args.model == "tiny":
        from jaxembed.models.tiny import tiny_model_dir

        args.model = str(tiny_model_dir("bert", hidden_size=384, num_layers=1, num_heads=6))

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="encode_memory_"))
    work.mkdir(parents=True, exist_ok=True)
    files = {}
    for n in args.lines:
        data = work / f"lines_{n}.txt"
        meta = write_lines(data, n) if not data.exists() else {"lines": n, "bytes": data.stat().st_size}
        files[n] = (data, meta)
    revisions = {"new": None}
    old_dir = None
    if args.old_rev:
        label, old_dir = source_at(args.old_rev, ROOT)
        revisions = {label: str(old_dir), "new": None}
    results: dict = {}
    try:
        for n, (data, _) in files.items():
            outs = {}
            for label, path in revisions.items():
                out = work / f"out_{n}_{label.split()[0]}.npy"
                res = run_encode(path, work, args.model, data, out)
                want = Path(path) if path else ROOT
                if not Path(res["module"]).resolve().is_relative_to(want.resolve()):
                    raise SystemExit(f"{label}: imported {res['module']}, not the code under {want}")
                outs[label] = np.load(out)
                out.unlink()
                results.setdefault(label, {})[str(n)] = res
                print(f"{n:,} lines, {label}: peak RSS {res['maxrss_kib'] / 2**20:.2f} GiB, {res['seconds']:.0f} s, "
                      f"first progress {res.get('first_progress_s', float('nan')):.1f} s, first text done "
                      f"{res.get('first_text_done_s', float('nan')):.1f} s", flush=True)
            arrays = list(outs.values())
            diff = max(float(np.abs(a - arrays[0]).max()) for a in arrays)
            if diff > 1e-5:
                raise SystemExit(f"{n} lines: the revisions' embeddings differ by {diff}")
            for label in revisions:
                results[label][str(n)]["max_abs_diff_to_first"] = diff
    finally:
        if old_dir is not None:
            shutil.rmtree(old_dir, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    lo, hi = str(min(args.lines)), str(max(args.lines))
    model_name = "tiny BERT 1 x 384 (MiniLM's tokenizer)" if "tiny" in args.model else Path(args.model).name
    for label, res in results.items():
        res["rss_ratio_largest_to_smallest"] = res[hi]["maxrss_kib"] / res[lo]["maxrss_kib"]
    cmd = "python benchmarks/encode_memory.py " + " ".join(sys.argv[1:])
    result = {"date": datetime.date.today().isoformat(), "benchmark": "encode_memory",
              "device": f"cpu ({os.cpu_count()} cores)", "platform": platform.platform(), "model": args.model,
              "inputs": {str(n): m for n, (_, m) in files.items()}, "old_rev": args.old_rev,
              "load_average": os.getloadavg()[0], "results": results, "command": cmd.strip()}
    save_result(args.name, result)
    gib = lambda k: k / 2**20  # noqa: E731
    parts = []
    for label, res in results.items():
        sizes = ", ".join(f"{int(n):,} lines {gib(res[n]['maxrss_kib']):.2f} GiB ({res[n]['seconds']:.0f} s, first "
                          f"text done at {res[n].get('first_text_done_s', float('nan')):.0f} s)"
                          for n in map(str, args.lines))
        parts.append(f"{label}: {sizes}; ratio **{res['rss_ratio_largest_to_smallest']:.2f}x**")
    line = (f"| {result['date']} | encode_memory | cpu ({os.cpu_count()} cores) | `jaxembed encode`, "
            f"{model_name}, plain text of short lines (1-6 words), peak RSS per process, load average "
            f"{result['load_average']:.1f} | {'; '.join(parts)} | `{cmd.strip()}` |")
    record_line(line, append=not args.no_readme)


if __name__ == "__main__":
    main()
