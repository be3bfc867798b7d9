"""Peak memory of `jaxembed data prepare` on a large synthetic JSON Lines file: the current store writer against
an older revision of jaxembed (default: the commit before the streaming writer).

A file of --records triplet records is written once (varied texts, 1 % invalid records so that the skip report
has work, 1 % identical records), in two variants: every record with an "id" field (ids must be checked for
duplicates) and none (sentence-transformers / Hugging Face / BGE data: default ids). Each revision prepares each
file into a store, in its own Python process, --repeats times, with on_error=skip. Each run reports its own peak resident set size (getrusage ru_maxrss) and
wall time; the figure is the median. The old revision's code is taken with `git archive` (read-only on the repo)
and put first on PYTHONPATH. A process that only imports jaxembed's store module gives the fixed cost.

Writes benchmarks/results/prepare_memory_cpu.json and appends a line to benchmarks/README.md.

    python benchmarks/prepare_memory.py [--records 2000000] [--old-rev 6a38b76^] [--repeats 1] [--keep DIR]
                                        [--ids both|yes|no]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _harness.proc import source_at  # noqa: E402  (benchmarks/ is on sys.path)
from _record import record_line, save_result  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OLD_REV = "6a38b76^"  # the commit before "data: ... the store writer streams in bounded memory"

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec "
         "romeo sierra tango uniform victor whiskey xray yankee zulu").split()

# one prepare in a fresh process: prints {"maxrss_kib", "seconds", "written", "read"} as its last line
RUNNER = r"""
import json, resource, sys, time
from jaxembed.data import config as dc
from jaxembed.data.store import write_store
data, out = sys.argv[1], sys.argv[2]
cfg = dc.default_data_config()
cfg.on_error = "skip"
cfg.datasets = [dc.dataset_config(name="big", path=data, format="triplets", task_type="retrieval",
                                  num_negatives=1)]
kw = {"progress": False} if "progress" in write_store.__code__.co_varnames else {}
t0 = time.time()
rep = write_store(cfg, out, **kw)
dt = time.time() - t0
print(json.dumps({"maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "seconds": dt,
                  "written": rep.written, "read": rep.read, "invalid": rep.invalid}))
"""
IMPORT_ONLY = r"""
import json, resource
import jaxembed.data.store
print(json.dumps({"maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "module": jaxembed.data.store.__file__}))
"""


def write_data(path: Path, n: int, seed: int = 0, ids: bool = True) -> dict:
    """n triplet records: every 100th is invalid (empty query), every 100th (offset 50) repeats an earlier one;
    ``ids``: each record carries an "id"."""
    import random

    invalid = identical = 0
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            head = {"id": f"r{i}"} if ids else {}
            if i % 100 == 7:
                f.write(json.dumps({**head, "query": " ", "pos": ["x"]}) + "\n")
                invalid += 1
                continue
            j = i - 50 if i % 100 == 57 else i  # identical content to an earlier record (own id)
            identical += j != i
            r = random.Random(seed * 1_000_003 + j)
            words = lambda k: " ".join(r.choice(WORDS) for _ in range(k))  # noqa: E731
            f.write(json.dumps({**head, "query": f"{j} {words(6 + j % 7)}",
                                "pos": [words(12 + j % 11)], "neg": [words(10 + j % 9), words(8 + j % 5)]}) + "\n")
    return {"records": n, "invalid": invalid, "identical": identical, "bytes": path.stat().st_size}


def run(code: str, pythonpath: str | None, cwd: Path, *args) -> dict:
    """``code`` in a fresh Python process with ``pythonpath`` first on the path, run in ``cwd`` (not the repository:
    ``python -c`` puts its working folder before PYTHONPATH, which would import the current jaxembed)."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=cwd)
    if out.returncode != 0:
        raise SystemExit(f"prepare failed ({pythonpath or 'current'}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--old-rev", default=DEFAULT_OLD_REV, help="git revision of the old writer ('' to skip it)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--keep", default=None, help="folder for the data file (kept and reused), default: a temp dir")
    ap.add_argument("--ids", default="both", choices=["both", "yes", "no"],
                    help="data files with an id per record, without, or both")
    ap.add_argument("--name", default="prepare_memory_cpu")
    ap.add_argument("--no-readme", action="store_true")
    args = ap.parse_args()

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="prepare_memory_"))
    work.mkdir(parents=True, exist_ok=True)
    files = {}
    for variant in (("ids", "no_ids") if args.ids == "both" else ("ids",) if args.ids == "yes" else ("no_ids",)):
        data = work / f"triplets_{args.records}{'' if variant == 'ids' else '_noids'}.jsonl"
        meta_file = data.with_suffix(".json")
        if data.exists() and meta_file.exists():
            meta = json.loads(meta_file.read_text())
        else:
            meta = write_data(data, args.records, ids=variant == "ids")
            meta_file.write_text(json.dumps(meta))
        files[variant] = (data, meta)
        print(f"data ({variant}): {data} ({meta['bytes'] / 2**20:.0f} MiB, {meta['records']:,} records)", flush=True)

    revisions = {"new": None}
    old_dir = None
    if args.old_rev:
        label, old_dir = source_at(args.old_rev, ROOT)
        revisions = {label: str(old_dir), "new": None}
    results = {}
    try:
        for variant, (data, meta) in files.items():
            for label, path in revisions.items():
                base = run(IMPORT_ONLY, path, work)
                want = Path(path) if path else ROOT
                if not Path(base["module"]).resolve().is_relative_to(want.resolve()):
                    raise SystemExit(f"{label}: imported {base['module']}, not the code under {want}")
                runs = []
                for r in range(args.repeats):
                    out = work / f"store_{r}"
                    res = run(RUNNER, path, work, str(data), str(out))
                    shutil.rmtree(out, ignore_errors=True)
                    runs.append(res)
                    print(f"{variant}, {label}: peak RSS {res['maxrss_kib'] / 2**10:.0f} MiB, {res['seconds']:.0f} s,"
                          f" {res['written']:,} written of {res['read']:,}", flush=True)
                results.setdefault(variant, {})[label] = {
                    "import_maxrss_kib": base["maxrss_kib"], "runs": runs,
                    "maxrss_kib": statistics.median(x["maxrss_kib"] for x in runs),
                    "seconds": statistics.median(x["seconds"] for x in runs)}
    finally:
        if old_dir is not None:
            shutil.rmtree(old_dir, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    cmd = "python benchmarks/prepare_memory.py " + " ".join(sys.argv[1:])
    result = {"date": datetime.date.today().isoformat(), "benchmark": "prepare_memory",
              "device": f"cpu ({os.cpu_count()} cores)", "platform": platform.platform(),
              "python": platform.python_version(), "data": {v: m for v, (_, m) in files.items()},
              "old_rev": args.old_rev,
              "load_average": os.getloadavg()[0], "results": results, "command": cmd.strip()}
    save_result(args.name, result)
    mib = lambda k: k / 2**10  # noqa: E731  (MiB: the streaming writer's peaks are tens of MiB apart)
    parts = [f"{variant.replace('_', ' ')}: " + ", ".join(
        f"{label} peak RSS **{mib(r['maxrss_kib']):.0f} MiB** in {r['seconds']:.0f} s" for label, r in res.items())
        for variant, res in results.items()]
    imp = mib(next(iter(next(iter(results.values())).values()))["import_maxrss_kib"])
    meta = next(iter(files.values()))[1]
    line = (f"| {result['date']} | prepare_memory | cpu ({os.cpu_count()} cores) | `data prepare`, "
            f"{meta['records']:,} triplet records ({meta['bytes'] / 2**20:.0f} MiB JSONL), 1 % invalid, 1 % identical, "
            f"on_error=skip, load average {result['load_average']:.1f} | {'; '.join(parts)} (importing the store "
            f"module alone: {imp:.0f} MiB) | `{cmd.strip()}` |")
    record_line(line, append=not args.no_readme)


if __name__ == "__main__":
    main()
