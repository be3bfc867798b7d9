"""`jaxembed data prepare` by 1 process against N processes of a pod on one machine (jaxembed.data.store_pod: the
processes share the datasets of the config and write one store).

Synthetic triplet records with text lengths like retrieval data (a query of 6-14 words, a positive and a negative of
30-90 words), split into --datasets JSON Lines files of equal size (a pod shares datasets, and parts of a large
one), are prepared into a store once per process count, each time by real `jaxembed data prepare` processes started
at the same moment with the pod environment (JAXEMBED_COORDINATOR / _NUM_PROCESSES / _PROCESS_ID, as tests/runs.py
start_pod does). Per run: the wall time from the start to the last exit, and per process its CPU seconds and peak
resident memory (os.wait4). The same process counts on 10 records a dataset give the fixed cost (starting Python and
the command, joining the coordinator, which `data prepare` does without importing JAX). The stores of every run are
checked equal in content (the manifest's counts and a digest of every record, in order, per dataset). With --single,
the same records as one dataset are prepared too: every process reads a part of it (jaxembed.data.store_split), and
the process of the first part merges them; with --datasets 1 that is the only arm.

--format parquet / csv writes the same records as Parquet files (row groups of 10,000 rows: a part is a run of
them) or CSV files (columns anchor, positive, negative: a part is a byte range cut at a line start, reading the
header), and the single dataset as one such file.

On a machine with C cores, N processes cannot go faster than min(N, C) times one; each pod process also pays for
its start and the coordinator (a fixed cost in seconds). The record states the cores and the load average.

Writes benchmarks/results/prepare_pod_<date>_<time>.json and appends a line to benchmarks/README.md.

    python benchmarks/prepare_pod.py [--records 400000] [--datasets 8] [--processes 1 4] [--single] [--keep DIR]
                                     [--format jsonl|parquet|csv]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _record import record_line, save_result  # noqa: E402  (benchmarks/ is on sys.path)

JAXEMBED = str(Path(sys.executable).parent / "jaxembed")
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec "
         "romeo sierra tango uniform victor whiskey xray yankee zulu river stone cloud market garden window "
         "engine paper light summer winter valley").split()

CONFIG = '''
from jaxembed.data import config as dc


def get_config():
    c = dc.default_data_config()
    c.datasets = [dc.dataset_config(name=f"d{{i}}", path=p, format={fmt!r}, task_type="retrieval",
                                    num_negatives=1) for i, p in enumerate({paths!r})]
    return c
'''


def _text(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


#: the record format each file format is read as (CSV rows: sentence-transformers' anchor, positive, negative)
RECORD_FORMAT = {"jsonl": "triplets", "parquet": "triplets", "csv": "st"}
ROW_GROUP = 10_000


def write_data(folder: Path, records: int, datasets: int, fmt: str = "jsonl") -> list[Path]:
    """``records`` synthetic triplets in ``datasets`` files of format ``fmt`` (the same records, in the same order,
    whatever the number of files)."""
    rng = random.Random(0)
    per = records // datasets
    paths = []
    for d in range(datasets):
        rows = ((_text(rng, 6, 14), _text(rng, 30, 90), _text(rng, 30, 90)) for _ in range(per))
        p = folder / f"part{d}.{fmt}"
        if fmt == "parquet":
            _write_parquet(p, rows)
        else:
            with open(p, "w", encoding="utf-8", newline="") as f:
                if fmt == "csv":
                    import csv

                    w = csv.writer(f)
                    w.writerow(["anchor", "positive", "negative"])
                    w.writerows(rows)
                else:
                    for q, pos, neg in rows:
                        f.write(json.dumps({"query": q, "pos": [pos], "neg": [neg]}) + "\n")
        paths.append(p)
    return paths


def write_data_apart(folder: Path, records: int, datasets: int, fmt: str) -> list[Path]:
    """``write_data`` in a process of its own: this one stays small, so the prepare processes it starts do not
    report its pages as theirs (a child's peak RSS, from os.wait4, starts from its parent's at the fork)."""
    import multiprocessing

    p = multiprocessing.get_context("spawn").Process(target=write_data, args=(folder, records, datasets, fmt))
    p.start()
    p.join()
    if p.exitcode != 0:
        raise SystemExit(f"writing the data failed (exit {p.exitcode})")
    return [folder / f"part{d}.{fmt}" for d in range(datasets)]


def _write_parquet(path: Path, rows) -> None:
    """One row group at a time, in bounded memory."""
    import itertools

    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("query", pa.string()), ("pos", pa.list_(pa.string())), ("neg", pa.list_(pa.string()))])
    with pq.ParquetWriter(str(path), schema) as w:
        while chunk := list(itertools.islice(rows, ROW_GROUP)):
            w.write_table(pa.table({"query": [r[0] for r in chunk], "pos": [[r[1]] for r in chunk],
                                    "neg": [[r[2]] for r in chunk]}, schema=schema), row_group_size=ROW_GROUP)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_prepare(config: Path, out: Path, n: int, log: Path) -> dict:
    """``n`` `jaxembed data prepare` processes started together (a pod when n > 1): wall seconds, per-process CPU
    seconds and peak RSS."""
    coord = f"127.0.0.1:{_free_port()}"
    base = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    for k in ("JAXEMBED_COORDINATOR", "JAXEMBED_NUM_PROCESSES", "JAXEMBED_PROCESS_ID"):
        base.pop(k, None)
    procs = []
    t0 = time.time()
    for i in range(n):
        env = dict(base) if n == 1 else dict(base, JAXEMBED_COORDINATOR=coord, JAXEMBED_NUM_PROCESSES=str(n),
                                             JAXEMBED_PROCESS_ID=str(i))
        with open(f"{log}.p{i}.log", "w") as f:
            procs.append(subprocess.Popen([JAXEMBED, "data", "prepare", "--config", str(config), "--out", str(out),
                                           "-q"], env=env, stdout=f, stderr=subprocess.STDOUT))
    per = {}
    while len(per) < n:
        pid, status, ru = os.wait4(-1, 0)
        i = next(k for k, p in enumerate(procs) if p.pid == pid)
        procs[i].returncode = os.waitstatus_to_exitcode(status)
        per[i] = {"exit": procs[i].returncode, "cpu_s": round(ru.ru_utime + ru.ru_stime, 2),
                  "maxrss_mib": round(ru.ru_maxrss / 1024, 1), "ended_s": round(time.time() - t0, 2)}
    wall = time.time() - t0
    if any(per[i]["exit"] != 0 for i in per):
        raise SystemExit(f"a prepare failed: {per}; logs {log}.p*.log")
    for i in per:  # what each process of a pod prepared (its line: datasets, or parts of one)
        said = [x for x in Path(f"{log}.p{i}.log").read_text().splitlines() if " prepares " in x]
        per[i]["prepared"] = said[0].split(" prepares ", 1)[1] if said else "all (one process)"
    return {"processes": n, "wall_s": round(wall, 2), "per_process": [per[i] for i in range(n)]}


def content(store: Path) -> dict:
    """Per dataset: the manifest's counts and the SHA-256 of its records in order."""
    import hashlib

    from array_record.python.array_record_module import ArrayRecordReader

    m = json.loads((store / "manifest.json").read_text())
    out = {}
    for d in m["datasets"]:
        digest = hashlib.sha256()
        reader = ArrayRecordReader(str(store / d["file"]))
        n = reader.num_records()
        for b in range(0, n, 4096):
            for rec in reader.read(b, min(n, b + 4096)):
                digest.update(len(rec).to_bytes(8, "little") + rec)
        reader.close()
        out[d["name"]] = dict(d["counts"], records_sha256=digest.hexdigest())
    return out


def figures(r: dict) -> dict:
    """Ratios of 1 process to the largest count: wall time (on this machine, as loaded as it was); the busiest
    process's CPU seconds (what as many idle cores as processes would give); the same without the pod's fixed start
    (the busiest process of the 10-records run: starting Python and the command, joining the coordinator), the
    bound for inputs large enough to amortise it."""
    lo, hi = r["processes"][0], r["processes"][-1]
    fixed = max(p["cpu_s"] for p in r["fixed_cost_runs"][str(hi)]["per_process"])
    out = {"fixed_cpu_s": fixed, "speedup_wall": {}, "speedup_busiest_cpu": {}, "speedup_busiest_work": {}}
    for layout in sorted({k.split("/")[0] for k in r["runs"]}):
        one, many = r["runs"][f"{layout}/{lo}"], r["runs"][f"{layout}/{hi}"]
        cpu1 = max(p["cpu_s"] for p in one["per_process"])
        busiest = max(p["cpu_s"] for p in many["per_process"])
        out["speedup_wall"][layout] = round(one["wall_s"] / many["wall_s"], 2)
        out["speedup_busiest_cpu"][layout] = round(cpu1 / busiest, 2)
        out["speedup_busiest_work"][layout] = round(cpu1 / max(busiest - fixed, 1e-9), 2)
    return out


_FORMAT_NAME = {"jsonl": "JSONL", "parquet": "Parquet", "csv": "CSV"}


def readme_line(r: dict) -> str:
    lo, hi = r["processes"][0], r["processes"][-1]
    load = r["environment"]["at_save"]["load_average"][0] if "environment" in r else os.getloadavg()[0]
    parts = []
    for layout in sorted({k.split("/")[0] for k in r["runs"]}, key=lambda x: x != "split"):
        one, many = r["runs"][f"{layout}/{lo}"], r["runs"][f"{layout}/{hi}"]
        cpus = [p["cpu_s"] for p in many["per_process"]]
        n = r["datasets"] if layout == "split" else 1
        parts.append(f"{n} dataset{'s' if n > 1 else ' (read in parts)'}: wall {one['wall_s']} s -> {many['wall_s']} s "
                     f"(**{r['speedup_wall'][layout]}x** here), CPU {one['per_process'][0]['cpu_s']} s -> busiest "
                     f"process {max(cpus)} s ({sum(cpus):.2f} s in all): **{r['speedup_busiest_cpu'][layout]}x** by "
                     f"the busiest process's CPU (the bound with {hi} idle cores, not measured), "
                     f"{r['speedup_busiest_work'][layout]}x without the fixed start")
    fixed = r["fixed_cost_runs"][str(hi)]
    parts.append(f"fixed start of a pod process (10 records a dataset): {r['fixed_cpu_s']} CPU-s, "
                 f"{max(p['maxrss_mib'] for p in fixed['per_process'])} MiB (starting Python and the command, joining "
                 "the coordinator), "
                 f"{fixed['wall_s']} s wall for {hi} at once here")
    line = (f"| {r['run'][:10]} | prepare_pod | cpu ({r['cores']} cores, shared: load average {load:.1f}) | "
            f"`data prepare`, {r['records']:,} synthetic triplets ({r['input_mib']:.0f} MiB "
            f"{_FORMAT_NAME[r.get('format', 'jsonl')]}), {lo} vs {hi} pod "
            f"processes on one machine, stores equal in content | {'; '.join(parts)} | `{r['command'].strip()}` |")
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=400_000)
    ap.add_argument("--datasets", type=int, default=8)
    ap.add_argument("--processes", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--single", action="store_true", help="also prepare the records as one dataset")
    ap.add_argument("--format", choices=sorted(RECORD_FORMAT), default="jsonl", help="the files' format")
    ap.add_argument("--keep", default=None, help="work folder to keep (default: a temporary one, removed)")
    ap.add_argument("--no-readme", action="store_true")
    ap.add_argument("--line-from", default=None, metavar="RESULT",
                    help="print (and append) the README line of a saved result instead of running")
    args = ap.parse_args()
    if args.line_from:
        r = json.loads(Path(args.line_from).read_text())
        r.setdefault("processes", [int(k.split("/")[1]) for k in r["runs"] if k.startswith("split/")])
        r.setdefault("command", "python benchmarks/prepare_pod.py --records 400000 --datasets 8 --processes 1 4 "
                                "--single")
        r.update(figures(r))
        line = readme_line(r) + f" `results/{Path(args.line_from).name}` |"
        print(line)
        if not args.no_readme:
            with open(Path(__file__).parent / "README.md", "a", encoding="utf-8") as f:
                f.write(line + "\n")
        return
    work = Path(args.keep or tempfile.mkdtemp(prefix="prepare_pod_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.time()
        paths = write_data_apart(work, args.records, args.datasets, args.format)
        mib = sum(p.stat().st_size for p in paths) / 2**20
        print(f"data: {args.records} records in {args.datasets} files, {mib:.0f} MiB ({time.time() - t0:.0f}s)")
        layouts = {"split": paths}
        if args.single and args.datasets > 1:
            (work / "all").mkdir(exist_ok=True)
            layouts["single"] = write_data_apart(work / "all", args.records, 1, args.format)
        runs, stores = {}, {}
        for layout, ps in layouts.items():
            cfg = work / f"{layout}.py"
            cfg.write_text(CONFIG.format(paths=[str(p) for p in ps], fmt=RECORD_FORMAT[args.format]))
            for n in args.processes:
                out = work / f"store_{layout}_{n}"
                shutil.rmtree(out, ignore_errors=True)
                r = run_prepare(cfg, out, n, work / f"{layout}_{n}")
                runs[f"{layout}/{n}"] = r
                stores[f"{layout}/{n}"] = content(out)
                print(f"{layout}, {n} process(es): {r['wall_s']} s; " +
                      ", ".join(f"p{i} {p['cpu_s']} cpu-s {p['maxrss_mib']} MiB" for i, p in enumerate(r["per_process"])))
            first = stores[f"{layout}/{args.processes[0]}"]
            assert all(stores[f"{layout}/{n}"] == first for n in args.processes), "stores differ in content"
        # the fixed cost of a pod: the same process counts on 10 records per dataset
        tiny = work / "tiny"
        tiny.mkdir(exist_ok=True)
        cfg = work / "tiny.py"
        tiny_paths = write_data_apart(tiny, 10 * args.datasets, args.datasets, args.format)
        cfg.write_text(CONFIG.format(paths=[str(p) for p in tiny_paths], fmt=RECORD_FORMAT[args.format]))
        fixed = {}
        for n in args.processes:
            fixed[n] = run_prepare(cfg, work / f"store_tiny_{n}", n, work / f"tiny_{n}")
            print(f"fixed cost, {n} process(es): {fixed[n]['wall_s']} s")
        result = {"benchmark": "prepare_pod", "format": args.format, "records": args.records,
                  "datasets": args.datasets,
                  "processes": args.processes, "input_mib": round(mib, 1), "cores": os.cpu_count(), "runs": runs,
                  "fixed_cost_runs": {str(n): r for n, r in fixed.items()}, "stores_equal_in_content": True,
                  "command": "python benchmarks/prepare_pod.py " + " ".join(sys.argv[1:])}
        result.update(figures(result))
        result = json.loads(save_result("prepare_pod", result).read_text())  # with its run id and environment
        print(json.dumps({k: result[k] for k in ("speedup_wall", "speedup_busiest_cpu", "speedup_busiest_work")}))
        record_line(readme_line(result), append=not args.no_readme)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
