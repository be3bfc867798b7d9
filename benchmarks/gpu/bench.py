"""jaxembed on one GPU, next to sentence-transformers (issue 18), in one call of at most ~9 minutes.

    bash benchmarks/gpu/run.sh $OUT                 # on the device machine (benchmarks/gpu/README.md)
    python benchmarks/gpu/bench.py --out DIR --dry-run   # the same code on the CPU, tiny sizes (the test)
    python benchmarks/gpu/bench.py --record DIR     # here, afterwards: DIR's JSONs -> benchmarks/results/ + README

Parts (--parts, run in the order given, by default 2,3,4,1: the figures first, the tests with what is left; the
first H200 call spent its pytest cap of 90 s on 7 of the 9 tests; a smoke step first checks that jaxembed runs at all, and falls back to the
flax / optax / orbax versions jaxembed is tested with, carried in .whl/pins, when it does not on the image's own):
  1 pytest     the GPU-marked tests (`pytest -m gpu`): fused attention kernels against XLA, MFU and device memory
               in the trainer's metrics, a bf16 step against float32, an 80k-candidate step
  2 train      training throughput, bf16 compute / float32 master weights, jaxembed (packed and padded) vs
               sentence-transformers (MultipleNegativesRankingLoss, bf16 autocast) on natural-length batches of the
               shared snli + wikiqa sets and on a fixed-length batch: examples/s, real tokens/s, MFU, peak memory
  3 batch      the largest global batch for BERT-base with 1 positive + 5 hard negatives (gradient cache + tiled
               loss), doubling up to >= 80,000 candidates, step time relative to B=1,024; the cache's overhead
  4 encode     encode throughput vs sentence-transformers

Time: a global budget (--budget seconds from the start); each part gets at most its cap and leaves the later
parts their minimum; a worker checks its deadline before every setting and round, and the parent stops it at the
deadline. Every figure is written to --out as soon as it is measured (one JSON per part, summary.json naming the
device); summary.json's "todo" lists what did not fit and the command that measures it in a second call.
"""

from __future__ import annotations

import argparse
import datetime
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
PARTS = {"1": "pytest", "2": "train", "3": "batch", "4": "encode"}
FILES = {"pytest": "part1_pytest.json", "train": "part2_train.json", "batch": "part3_batch.json",
         "encode": "part4_encode.json"}
#: the sizes of a full run (an H100 / H200) and of --dry-run (the CPU test: coverage, not timing, so its time caps
#: are 10x; "auto" lengths: the fixed batch takes the natural steps' padded shape, one program for both)
FULL = dict(models="minilm:512,bert-base:256,bert-large:128,qwen2-0.5b:64", look=24, take=4, plan_steps=40, rounds=3,
            q_len=32, d_len=128, batch_model="bert-base", sizes=[1024, 16384, 8192, 4096, 2048], chunk=128,
            batch_q_len=32, batch_d_len=64, batch_rounds=2, overhead_batch=256, encode_models="minilm,bert-base",
            encode_n=20000, encode_batch=256, encode_repeats=3, budget=530.0, cap_scale=1)
DRY = dict(models="tiny-bert:8", look=6, take=2, plan_steps=8, rounds=1, q_len="auto", d_len="auto",
           batch_model="tiny-bert",
           sizes=[16], chunk=8, batch_q_len=8, batch_d_len=16, batch_rounds=1, overhead_batch=16,
           encode_models="tiny-bert", encode_n=64, encode_batch=16, encode_repeats=1, budget=3600.0, cap_scale=10)
#: seconds: the most a part may take (cap) and the least left for it when an earlier part runs long (floor)
CAP = {"smoke": 150, "pytest": 150, "train": 280, "batch": 150, "encode": 60}
FLOOR = {"pytest": 30, "train": 120, "batch": 60, "encode": 30}
#: part 2: the share of the part's time each model may take (what one leaves goes to the next)
WEIGHT = {"minilm": 1.0, "bert-base": 1.5, "bert-large": 2.0, "qwen2-0.5b": 2.0}
TARGETS = {
    "throughput": "natural lengths, jaxembed packed >= 1.5x sentence-transformers' examples/s (MiniLM, BERT-base)",
    "mfu": "MFU >= 40 % for BERT-base and BERT-large packed",
    "candidates": ">= 80,000 candidates per step on one GPU for BERT-base",
    "cache_overhead": "gradient-cache step <= 1.4x the plain step (same global batch)",
}


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


# ------------------------------------------------------------------------------------------------ processes


class Workers:
    """Runs workers (benchmarks/gpu/workers.py) in processes of their own, each with a deadline; collects their
    RESULT lines as they appear (``on_result``), and its log's tail when it fails."""

    def __init__(self, root: Path, env: dict):
        self.root = root
        self.env = env
        (root / "logs").mkdir(parents=True, exist_ok=True)
        self.n = 0

    def run(self, name: str, payload: dict, timeout: float, on_result=None, env: dict | None = None) -> dict:
        self.n += 1
        logf = self.root / "logs" / f"{self.n:02d}_{name}.log"
        argv = [sys.executable, str(Path(__file__).resolve()), "--_worker", name, json.dumps(payload)]
        results, t0, seen = [], time.time(), 0
        cpu0 = _children_cpu_s()
        with open(logf, "w", encoding="utf-8") as f:
            p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=dict(self.env, **(env or {})),
                                 cwd=str(ROOT), start_new_session=True)
            timed_out = False
            while True:
                try:
                    p.wait(timeout=1.0)
                    done = True
                except subprocess.TimeoutExpired:
                    done = False
                seen = self._collect(logf, seen, results, on_result)
                if done:
                    break
                if time.time() - t0 > timeout:
                    timed_out = True
                    try:
                        os.killpg(p.pid, signal.SIGKILL)  # the worker and anything it started
                    except ProcessLookupError:
                        pass
                    p.wait()
                    self._collect(logf, seen, results, on_result)
                    break
        out = {"worker": name, "rc": p.returncode, "seconds": time.time() - t0, "cpu_s": _children_cpu_s() - cpu0,
               "results": results, "timed_out": timed_out, "log": str(logf)}
        log(f"  worker {name}: {out['seconds']:.0f} s, {out['cpu_s']:.0f} CPU-s")
        if p.returncode != 0 or timed_out:
            out["tail"] = tail(logf, 30)
            log(f"  worker {name}: {'stopped at its deadline' if timed_out else f'exit {p.returncode}'}; log tail:\n"
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


def _children_cpu_s() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def tail(path: Path, n: int) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-n:])
    except OSError:
        return ""


# ------------------------------------------------------------------------------------------------ parts


def gpu_test_files() -> list[str]:
    """Test files with a module- or function-level ``gpu`` marker (not the ones that only mention it in a
    string, as tests/test_ci_policy.py does)."""
    pat = re.compile(r"^(@pytest\.mark\.gpu\b|pytestmark\s*=.*pytest\.mark\.gpu\b)", re.M)
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                  if pat.search(p.read_text(encoding="utf-8")))


def pytest_outcomes(text: str) -> dict:
    """test id -> passed / failed / error / skipped / xfail / xpass, from pytest -v's per-test lines and -rA's
    summary (the summary wins where both are there)."""
    outcomes = {}
    for m in re.finditer(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", text, re.M):
        outcomes[m.group(1)] = m.group(2).lower()
    for m in re.finditer(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(?:\[\d+\]\s+)?(\S+)", text, re.M):
        outcomes[m.group(2).rstrip(":")] = m.group(1).lower()
    return outcomes


def part_pytest(env: dict, timeout: float, out_dir: Path) -> dict:
    files = gpu_test_files()
    # -v: a line per test as it ends ("path::name PASSED"), so a run stopped at its cap keeps the outcomes so far
    argv = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-m", "gpu", "-rA", *files]
    log(f"part 1: {' '.join(argv[1:])}")
    t0 = time.time()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=str(ROOT),
                           env=dict(env, JAXEMBED_REQUIRE_SHARED_DATA="1", XLA_PYTHON_CLIENT_PREALLOCATE="false"))
        text, rc, timed_out = p.stdout + p.stderr, p.returncode, False
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        rc, timed_out = None, True
    outcomes = pytest_outcomes(text)
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed)", text)}
    res = {"command": " ".join(["python"] + argv[1:]), "files": files, "rc": rc, "timed_out": timed_out,
           "seconds": time.time() - t0, "counts": counts, "outcomes": outcomes,
           "output_tail": "\n".join(text.splitlines()[-150:])}
    print("\n".join(text.splitlines()[-25:]), flush=True)
    write_json(out_dir / FILES["pytest"], res)
    return res


def part_train(w: Workers, cfg: dict, until: float, out_dir: Path, peak: float | None) -> dict:
    specs = [s.split(":") for s in cfg["models"].split(",") if s]
    res = {"setting": {k: cfg[k] for k in ("look", "take", "plan_steps", "rounds", "q_len", "d_len")},
           "data": "shared train snli_triplets + wikiqa (one JSONL, rows with a positive and a hard negative), 1 "
                   "positive + 1 hard negative per query, every text <= 128 tokens",
           "precision": "bfloat16 compute, float32 master weights (jaxembed model.dtype; ST torch.autocast)",
           "models": {}, "todo": []}
    path = out_dir / FILES["train"]
    base = dict(root=str(w.root), look=cfg["look"], take=cfg["take"], plan_steps=cfg["plan_steps"],
                rounds=cfg["rounds"], q_len=cfg["q_len"], d_len=cfg["d_len"], peak_flops=peak)
    for i, (name, b) in enumerate(specs):
        left = until - time.time()
        weights = [WEIGHT.get(n, 1.0) for n, _ in specs[i:]]
        share = left * weights[0] / sum(weights)
        entry = res["models"].setdefault(name, {"batch": int(b), "jaxembed": {}, "st": {}})
        if share < 20:
            res["todo"].append(f"{name}:{b}")
            entry["skipped"] = f"{left:.0f} s left for the part"
            write_json(path, res)
            continue
        log(f"part 2: {name} B={b}, {share:.0f} s")

        def keep(tool):
            def on(r):
                if r.get("kind") == "train":
                    entry[tool][r["setting"]] = r
                    log(f"  {tool} {r['setting']}: {brief(r)}")
                elif r.get("kind") == "setup":
                    entry.setdefault("setup", {})[tool] = r
                entry.update(ratios(entry))
                write_json(path, res)
            return on

        t_model = time.time()
        dl = t_model + 0.72 * share
        w.run("train_jax", dict(base, model=name, batch=int(b), deadline=dl, settings=["packed", "padded", "fixed"]),
              timeout=dl - time.time() + 25, on_result=keep("jaxembed"), env={"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"})
        dl = max(t_model + share, time.time() + 25)
        w.run("train_st", dict(base, model=name, batch=int(b), deadline=dl, settings=["natural", "fixed"]),
              timeout=dl - time.time() + 20, on_result=keep("st"), env={"JAX_PLATFORMS": "cpu"})
        missing = [f"{tool} {s}" for tool, settings in (("jaxembed", ("packed", "padded", "fixed")),
                                                         ("st", ("natural", "fixed")))
                   for s in settings if "step_s" not in entry[tool].get(s, {})]
        if missing:
            entry["missing"] = missing
            res["todo"].append(f"{name}:{b}")
        write_json(path, res)
    return res


def ratios(entry: dict) -> dict:
    """jaxembed over sentence-transformers (examples/s) and packed over padded, where both were measured."""
    j, s = entry.get("jaxembed", {}), entry.get("st", {})
    ex = lambda d, k: d.get(k, {}).get("examples_per_s")
    out = {}
    for a, b, label in (("packed", "natural", "packed_over_st"), ("padded", "natural", "padded_over_st"),
                        ("fixed", "fixed", "fixed_over_st")):
        if ex(j, a) and ex(s, b):
            out[f"ratio_{label}"] = ex(j, a) / ex(s, b)
    if ex(j, "packed") and ex(j, "padded"):
        out["ratio_packed_over_padded"] = ex(j, "packed") / ex(j, "padded")
    return out


def brief(r: dict) -> str:
    if "skipped" in r:
        return f"skipped ({r['skipped']})"
    if "error" in r:
        return "error: " + r["error"].strip().splitlines()[-1][:200]
    s = f"{r.get('examples_per_s', 0):.0f} ex/s, {r.get('real_tokens_per_s', 0) / 1e3:.0f}k real tok/s"
    if r.get("mfu") is not None:
        s += f", MFU {100 * r['mfu']:.1f}% (real tokens {100 * r['mfu_real_tokens']:.1f}%)"
    mem = r.get("device_peak_gib", r.get("xla_step_gib"))
    if mem is not None:
        s += f", {mem:.2f} GiB"
    return s + f", real {100 * r.get('real_fraction', 0):.0f}% of slots"


def part_batch(w: Workers, cfg: dict, until: float, out_dir: Path, peak: float | None) -> dict:
    res = {"model": cfg["batch_model"], "K": 6, "chunk": cfg["chunk"], "q_len": cfg["batch_q_len"],
           "d_len": cfg["batch_d_len"], "sizes": cfg["sizes"], "trials": [], "overhead": [], "todo": []}
    path = out_dir / FILES["batch"]

    def on(r):
        if r.get("kind") == "batch":
            res["trials"].append(r)
            log(f"  B={r['global_batch']} ({r['candidates']} candidates): {brief(r)}")
        elif r.get("kind") == "overhead":
            res["overhead"].append(r)
            log(f"  overhead B={r['global_batch']} {r['setting']}: {brief(r)}")
        elif r.get("kind") == "setup":
            res["setup"] = r
        res.update(batch_figures(res))
        write_json(path, res)

    log(f"part 3: {cfg['batch_model']}, K=6, sizes {cfg['sizes']}, {until - time.time():.0f} s")
    w.run("batch", dict(root=str(w.root), model=cfg["batch_model"], sizes=cfg["sizes"], chunk=cfg["chunk"],
                        q_len=cfg["batch_q_len"], d_len=cfg["batch_d_len"], rounds=cfg["batch_rounds"],
                        overhead_batch=cfg["overhead_batch"], deadline=until - 10, peak_flops=peak),
          timeout=until - time.time(), on_result=on, env={"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.95"})
    done = {t["global_batch"] for t in res["trials"] if "step_s" in t}
    res["todo"] = [b for b in cfg["sizes"] if b not in done]
    write_json(path, res)
    return res


def batch_figures(res: dict) -> dict:
    ok = [t for t in res["trials"] if "step_s" in t]
    out = {}
    if not ok:
        return out
    best = max(ok, key=lambda t: t["global_batch"])
    out.update(largest_global_batch=best["global_batch"], largest_candidates=best["candidates"])
    ref = next((t for t in ok if t["global_batch"] == res["sizes"][0]), None)
    if ref:
        out["relative_to_reference"] = {str(t["global_batch"]): {
            "step_time_ratio": t["step_s"] / ref["step_s"], "ideal": t["global_batch"] / ref["global_batch"],
            "per_example_ratio": (t["step_s"] / t["global_batch"]) / (ref["step_s"] / ref["global_batch"])}
            for t in sorted(ok, key=lambda t: t["global_batch"])}
    ov = {t["setting"]: t for t in res.get("overhead", []) if "step_s" in t}
    if "plain" in ov and "cached" in ov:
        out["cache_overhead"] = ov["cached"]["step_s"] / ov["plain"]["step_s"]
    return out


def part_encode(w: Workers, cfg: dict, until: float, out_dir: Path) -> dict:
    res = {"models": {}, "n": cfg["encode_n"], "batch_size": cfg["encode_batch"], "todo": []}
    path = out_dir / FILES["encode"]

    def on(r):
        if r.get("kind") == "encode":
            res["models"][r["model"]] = r
            if "ratio" in r:
                log(f"  encode {r['model']}: jaxembed {r['jaxembed_texts_per_s']:.0f} texts/s vs ST "
                    f"{r['st_texts_per_s']:.0f}: {r['ratio']:.2f}x (max |diff| {r['max_abs_diff']:.3g})")
            else:
                log(f"  encode {r['model']}: {brief(r)}")
        elif r.get("kind") == "setup":
            res["setup"] = r
        write_json(path, res)

    models = cfg["encode_models"].split(",")
    log(f"part 4: encode {models}, {until - time.time():.0f} s")
    w.run("encode", dict(root=str(w.root), models=models, n=cfg["encode_n"], batch_size=cfg["encode_batch"],
                         repeats=cfg["encode_repeats"], deadline=until - 5),
          timeout=until - time.time(), on_result=on, env={"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.45"})
    res["todo"] = [m for m in models if "ratio" not in res["models"].get(m, {})]
    write_json(path, res)
    return res


# ------------------------------------------------------------------------------------------------ summary


def targets(parts: dict) -> dict:
    """Each issue-18 target: the figures it reads and whether they meet it (None: not measured)."""
    out = {}
    tr = parts.get("train", {}).get("models", {})
    vals = {m: tr.get(m, {}).get("ratio_packed_over_st") for m in ("minilm", "bert-base")}
    out["throughput"] = {"target": TARGETS["throughput"], "values": vals,
                         "met": None if None in vals.values() else all(v >= 1.5 for v in vals.values())}
    mfu = {m: tr.get(m, {}).get("jaxembed", {}).get("packed", {}).get("mfu") for m in ("bert-base", "bert-large")}
    out["mfu"] = {"target": TARGETS["mfu"], "values": mfu,
                  "values_real_tokens": {m: tr.get(m, {}).get("jaxembed", {}).get("packed", {}).get("mfu_real_tokens")
                                         for m in mfu},
                  "met": None if None in mfu.values() else all(v >= 0.40 for v in mfu.values())}
    b = parts.get("batch", {})
    cand = b.get("largest_candidates")
    out["candidates"] = {"target": TARGETS["candidates"], "value": cand, "met": None if cand is None else
                         cand >= 80_000}
    ov = b.get("cache_overhead")
    out["cache_overhead"] = {"target": TARGETS["cache_overhead"], "value": ov, "met": None if ov is None else
                             ov <= 1.4}
    return out


def next_command(todo: dict) -> str | None:
    """The call that measures what did not fit (run.sh takes bench.py's arguments after $OUT)."""
    args = []
    parts = [p for p, k in PARTS.items() if todo.get(k)]
    if not parts:
        return None
    args.append("--parts " + ",".join(parts))
    if todo.get("train"):
        args.append("--models " + ",".join(todo["train"]))
    if todo.get("batch"):
        args.append("--sizes " + ",".join(str(x) for x in todo["batch"]))
    if todo.get("encode"):
        args.append("--encode-models " + ",".join(todo["encode"]))
    return "bash benchmarks/gpu/run.sh $OUT " + " ".join(args)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="folder for the JSON files (the device call's $OUT)")
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes (the CPU test): the same code paths")
    ap.add_argument("--parts", default="2,3,4,1")
    ap.add_argument("--budget", type=float, help="seconds for the whole run (default 530; dry run 3600)")
    ap.add_argument("--models", help="part 2: name:global_batch,... (minilm, bert-base, bert-large, qwen2-0.5b, "
                                     "tiny-bert, tiny-qwen2)")
    ap.add_argument("--sizes", help="part 3: global batches, the reference first (default 1024,16384,8192,4096,2048)")
    ap.add_argument("--encode-models", help="part 4: model names (default minilm,bert-base)")
    ap.add_argument("--peak-flops", type=float, default=None,
                    help="peak FLOP/s for MFU instead of the device's datasheet entry (the CPU test sets one)")
    ap.add_argument("--root", default="/tmp/gpu_bench", help="scratch: model folders, stores, worker logs")
    ap.add_argument("--no-smoke", action="store_true")
    ap.add_argument("--record", metavar="DIR", help="record DIR's results in benchmarks/results/ and the README")
    ap.add_argument("--results-dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--readme", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args._worker:
        sys.path.insert(0, str(HERE))
        import workers

        workers.main(*args._worker)
        return 0
    if args.record:
        import record

        record.record(Path(args.record), results_dir=args.results_dir, readme=args.readme)
        return 0
    if not args.out:
        ap.error("--out is required")
    cfg = dict(DRY if args.dry_run else FULL)
    for k in ("models", "budget"):
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    if args.sizes:
        cfg["sizes"] = [int(x) for x in args.sizes.split(",")]
    if args.encode_models:
        cfg["encode_models"] = args.encode_models
    t_start = time.time()
    deadline = t_start + float(cfg["budget"])
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    parts = [PARTS[p] for p in args.parts.split(",") if p]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # one persistent compilation cache for the call: a program two workers compile (the dry run's smoke step and
    # part 2's fixed setting; part 3's overhead run at its reference size) compiles once
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(root / "jax_cache"))
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT)] + [x for x in env.get("PYTHONPATH", "").split(
        os.pathsep) if x])
    w = Workers(root, env)
    summary = {"benchmark": "gpu", "issue": 18, "date": datetime.date.today().isoformat(),
               "started": datetime.datetime.now().isoformat(timespec="seconds"), "dry_run": args.dry_run,
               "parts": parts, "budget_s": cfg["budget"], "config": cfg, "argv": sys.argv[1:],
               "device": {"nvidia_smi": nvidia_smi()}, "load_average_at_start": list(os.getloadavg())}
    spath = out_dir / "summary.json"
    write_json(spath, summary)
    log(f"gpu benchmark: parts {parts}, budget {cfg['budget']:.0f} s, device {summary['device']['nvidia_smi']}")

    if not args.no_smoke:
        ok = smoke(w, cfg, summary, spath, min(CAP["smoke"] * cfg["cap_scale"], deadline - time.time()))
        if not ok:
            log("jaxembed does not run here: stopping (summary.json says why)")
            summary["stopped"] = "the smoke step failed"
            write_json(spath, summary)
            return 1
    results, todo = {}, {}
    for i, part in enumerate(parts):
        later = sum(FLOOR[p] for p in parts[i + 1:])
        allow = min(CAP[part] * cfg["cap_scale"], deadline - time.time() - later)
        if allow < 10:
            log(f"part {part}: no time left ({deadline - time.time():.0f} s)")
            todo[part] = ["all"] if part != "train" else [s for s in cfg["models"].split(",")]
            if part == "batch":
                todo[part] = cfg["sizes"]
            if part == "encode":
                todo[part] = cfg["encode_models"].split(",")
            continue
        until = time.time() + allow
        t0 = time.time()
        try:
            if part == "pytest":
                r = part_pytest(env, allow, out_dir)
                if r["timed_out"]:
                    todo[part] = ["all"]
            elif part == "train":
                r = part_train(w, cfg, until, out_dir, args.peak_flops)
                todo[part] = r["todo"]
            elif part == "batch":
                r = part_batch(w, cfg, until, out_dir, args.peak_flops)
                todo[part] = r["todo"]
            else:
                r = part_encode(w, cfg, until, out_dir)
                todo[part] = r["todo"]
        except Exception as e:  # noqa: BLE001 -- one part's failure must not lose the others
            import traceback

            r = {"error": traceback.format_exc()[-2000:]}
            log(f"part {part} failed: {e!r}")
            write_json(out_dir / FILES[part], r)
        results[part] = r
        summary.setdefault("part_seconds", {})[part] = time.time() - t0
        summary["targets"] = targets(results)
        write_json(spath, summary)
    summary["todo"] = {k: v for k, v in todo.items() if v}
    summary["next_command"] = next_command(summary["todo"])
    summary["targets"] = targets(results)
    summary["wall_s"] = time.time() - t_start
    summary["load_average_at_end"] = list(os.getloadavg())
    write_json(spath, summary)
    print_table(summary, results)
    return 0


def smoke(w: Workers, cfg: dict, summary: dict, spath: Path, timeout: float) -> bool:
    """One tiny bf16 step: on the image's flax / optax / orbax, then, if that fails and .whl/pins holds them,
    on the pinned versions (installed into a folder put first on PYTHONPATH for every later process)."""
    log("smoke: versions, devices, one tiny bf16 step")
    payload = {"root": str(w.root), **{k: cfg[k] for k in ("plan_steps", "q_len", "d_len", "look", "take")}}
    r = w.run("smoke", payload, timeout=timeout)
    summary["smoke"] = [r]
    good = any(x.get("kind") == "step" and x.get("ok") for x in r["results"])
    pins = sorted((ROOT / ".whl" / "pins").glob("*.whl"))
    if not good and pins:
        log(f"smoke failed on the image's versions: installing {[p.name for p in pins]} and trying again")
        target = w.root / "pins"
        p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                            "--no-cache-dir", "--upgrade", "--target", str(target), *map(str, pins)],
                           capture_output=True, text=True)
        summary["pins_install"] = {"rc": p.returncode, "output": (p.stdout + p.stderr)[-2000:]}
        w.env["PYTHONPATH"] = os.pathsep.join([str(target), w.env["PYTHONPATH"]])
        r = w.run("smoke", payload, timeout=timeout)
        summary["smoke"].append(r)
        good = any(x.get("kind") == "step" and x.get("ok") for x in r["results"])
        summary["pins_used"] = good
    for x in r["results"]:
        if x.get("kind") == "versions":
            summary["versions"] = x["versions"]
            summary["device"].update(jax=x["device"])
    write_json(spath, summary)
    log(f"smoke: {'ok' if good else 'FAILED'}; device {summary['device']}")
    return good


def print_table(summary: dict, results: dict) -> None:
    """The short table the device call's reply ends with."""
    print("\n==== gpu benchmark:", summary["device"], flush=True)
    for m, e in results.get("train", {}).get("models", {}).items():
        for tool in ("jaxembed", "st"):
            for s, r in e.get(tool, {}).items():
                print(f"train {m:11s} {tool:8s} {s:8s} {brief(r)}")
        for k, v in e.items():
            if k.startswith("ratio_"):
                print(f"train {m:11s} {k}: {v:.2f}x")
    b = results.get("batch", {})
    if b:
        print(f"batch: largest {b.get('largest_global_batch')} ({b.get('largest_candidates')} candidates), "
              f"cache overhead {b.get('cache_overhead')}")
    for m, r in results.get("encode", {}).get("models", {}).items():
        print(f"encode {m}: ratio {r.get('ratio')}")
    p = results.get("pytest")
    if p:
        print(f"pytest -m gpu: {p.get('counts')}")
    for k, t in summary.get("targets", {}).items():
        print(f"target {k}: met={t['met']} {t.get('values', t.get('value'))}")
    print(f"todo: {summary.get('todo')}\nnext: {summary.get('next_command')}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
