"""The store's ArrayRecord reader as the file grows: the memory its chunk index takes and the random-batch read
throughput, with the index held in memory (``index_storage_option:in_memory``, ArrayRecord's default) or left in
the file (``offloaded``).

Synthetic files are written with the store's writer (``jaxembed.data.store.record_writer``: ``GROUP_SIZE``
records a chunk), one per size in --sizes and record kind in --kinds:

- ``tiny``: a record of ~20 bytes (its number as JSON): the file is mostly chunk headers, so the reader's
  index is what grows;
- ``triplet``: a JSON triplet of ~1 KB (a query of ~10 words, a positive and a negative of ~70), as the store
  holds them.

Each (file, option) is measured in a fresh Python process: the resident set size (``/proc/self/statm``) before
and after opening the reader and reading its record count (the index), then the reader's read of --batches batches
of --batch random record indices (as the loader's ``Store.examples`` reads a step; each read in calls of 512
indices, and stopped after --cap CPU-s: a reader that is slow reads part of a batch), timed in CPU and wall
seconds after a warm-up read. The files stay in the page cache between runs (the second option reads warm pages as the
first did; the first run of each file is repeated so both options see a warm cache).

    python benchmarks/store_reader.py [--sizes 1e6,1e7] [--kinds tiny,triplet] [--batch 4096] [--batches 20]
                                      [--cap 10] [--keep DIR] [--no-readme]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _record import record_line, save_result  # noqa: E402  (benchmarks/ is on sys.path)

ROOT = Path(__file__).resolve().parent.parent
OPTIONS = ("in_memory", "offloaded")

# one (file, option) in a fresh process: prints {"index_bytes", "cpu_s", "wall_s", ...} as its last line
RUNNER = r"""
import json, os, resource, sys, time
import numpy as np
from array_record.python.array_record_module import ArrayRecordReader

path, option, batch, batches, cap = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
page = os.sysconf("SC_PAGE_SIZE")
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * page
cpu = lambda: (lambda r: r.ru_utime + r.ru_stime)(resource.getrusage(resource.RUSAGE_SELF))
rng = np.random.default_rng(0)
before = rss()
reader = ArrayRecordReader(path, f"readahead_buffer_size:0,index_storage_option:{option}"
                         + (",footer_prefetch_bytes:0" if option == "offloaded" else ""))
n = reader.num_records()
opened = rss()
reader.read(rng.integers(0, n, 16).tolist())  # warm-up
idx = [rng.integers(0, n, batch).tolist() for _ in range(batches)]
t, c = time.perf_counter(), cpu()
size = done = 0
for b in idx:  # in pieces of 512 records, so that a slow reader stops after cap CPU-s
    for k in range(0, len(b), 512):
        size += sum(len(r) for r in reader.read(b[k:k + 512]))
        done += len(b[k:k + 512])
        if cpu() - c > cap:
            break
    if cpu() - c > cap:
        break
wall, cpu_s = time.perf_counter() - t, cpu() - c
print(json.dumps({"records": n, "index_bytes": opened - before, "rss_after_reads": rss() - before,
                  "wall_s": wall, "cpu_s": cpu_s, "records_read": done, "bytes_read": size,
                  "records_per_cpu_s": done / cpu_s}))
"""


def _triplet(i: int) -> bytes:
    words = [f"w{(i * 7 + k) % 997}" for k in range(150)]
    ex = {"id": str(i), "query": " ".join(words[:10]), "pos": [" ".join(words[10:80])],
          "neg": [" ".join(words[80:150])]}
    return json.dumps(ex).encode()


def write_file(path: Path, n: int, kind: str) -> None:
    """n records of ``kind`` with the store's writer options."""
    from jaxembed.data.store import record_writer

    w = record_writer(path)
    try:
        for i in range(n):
            w.write(_triplet(i) if kind == "triplet" else json.dumps({"id": i}).encode())
    finally:
        w.close()


def measure(path: Path, option: str, batch: int, batches: int, cap: float) -> dict:
    out = subprocess.run([sys.executable, "-c", RUNNER, str(path), option, str(batch), str(batches), str(cap)],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1e6,1e7")
    ap.add_argument("--kinds", default="tiny,triplet")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--cap", type=float, default=10.0, help="stop reading after this many CPU-s (a slow reader)")
    ap.add_argument("--keep", default=None, help="write (and reuse) the files in this folder")
    ap.add_argument("--no-readme", action="store_true")
    args = ap.parse_args(argv)
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    kinds = args.kinds.split(",")
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="store_reader_"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for kind in kinds:
        for n in sizes:
            path = work / f"{kind}_{n}.array_record"
            if not path.exists():
                t = time.perf_counter()
                write_file(path, n, kind)
                print(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t:.0f} s",
                      flush=True)
            measure(path, OPTIONS[0], args.batch, 1, args.cap)  # the file's pages into the cache
            for opt in OPTIONS:
                r = dict(measure(path, opt, args.batch, args.batches, args.cap), kind=kind, size=n, option=opt,
                         file_bytes=path.stat().st_size)
                rows.append(r)
                print(f"{kind:8s} {n:>11,} {opt:9s} index {r['index_bytes'] / 2**20:7.2f} MiB  "
                      f"{r['records_per_cpu_s']:>9,.0f} records/CPU-s  {r['wall_s']:.2f} s wall", flush=True)
    result = {"command": "python benchmarks/store_reader.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "batch": args.batch, "batches": args.batches, "rows": rows}
    save_result("store_reader_cpu", result)
    cells = []
    for kind in kinds:
        for n in sizes:
            got = {r["option"]: r for r in rows if r["kind"] == kind and r["size"] == n}
            cells.append(f"{kind} {n:,}: index " + " / ".join(
                f"{got[o]['index_bytes'] / 2**20:.1f}" for o in OPTIONS) + " MiB, " + " / ".join(
                f"{got[o]['records_per_cpu_s']:,.0f}" for o in OPTIONS) + " records/CPU-s")
    line = (f"| {time.strftime('%Y-%m-%d')} | store_reader | cpu (2 cores, shared) | ArrayRecord reader of the store's "
            f"files (16 records a chunk), in_memory / offloaded index; {args.batches} batches of {args.batch} "
            f"random records (at most {args.cap:g} CPU-s a reader); RSS of opening the reader | " + "; ".join(cells) +
            f" | `{result['command']}` |")
    record_line(line, append=not args.no_readme)


if __name__ == "__main__":
    main()
