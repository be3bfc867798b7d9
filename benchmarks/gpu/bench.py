"""jaxembed on one GPU, next to sentence-transformers (layout, engine speed, long texts, LLMs), in one or two calls.

    bash benchmarks/gpu/run.sh $OUT --parts 2 --budget 400   # on the device machine (benchmarks/gpu/README.md)
    python benchmarks/gpu/bench.py --out DIR --dry-run   # the same code on the CPU, tiny sizes (the test)
    python benchmarks/gpu/bench.py --record DIR     # here, afterwards: DIR's JSONs -> benchmarks/results/ + README
    python benchmarks/gpu/bench.py --record DIR1 DIR2   # two calls of one session (one part split): merged

Parts (--parts, run in the order given, by default 2,5,6,3,4,1; a smoke step first checks that jaxembed runs at
all, and falls back to the flax / optax / orbax versions jaxembed is tested with, carried in .whl/pins, when it
does not on the image's own; the model folders are built on the CPU beside it):
  1 pytest     the GPU-marked tests (`pytest -m gpu`): fused attention kernels against XLA, MFU and device memory
               in the trainer's metrics, a bf16 step against float32, an 80k-candidate step
  2 train      layout vs engine, bf16 compute / float32 master weights, per model: jaxembed fixed (q 32 / d 128,
               the control) / packed / padded and sentence-transformers fixed / natural (its collator's padding) /
               padding-free (flattened rows, per-text positions, a varlen attention), the same steps' texts; each
               pair split into slots saved x speed per computed slot; MFU, peak memory, a profile of the step
  3 batch      the largest global batch for BERT-base with 1 positive + 5 hard negatives (gradient cache + tiled
               loss), doubling up to >= 80,000 candidates, step time relative to B=1,024; the cache's overhead
  4 encode     encode throughput vs sentence-transformers
  5 long       long documents (the shared longest-passage set's lengths, cut at 512 / 1,024 tokens) in packed rows
               of 512-2,048 slots: each attention kernel (xla, pallas, cudnn with the batches' segment bound and
               with the row length, te) in the full train step: step time, XLA's buffers, the largest batch they
               predict, the fastest kernel per row length (model.attention=auto's rule to be)
  6 llm        Qwen2-1.5B full fine-tuning and Qwen2-7B LoRA + remat at 512-token documents with the gradient cache
               vs sentence-transformers' recipe (PEFT, gradient checkpointing): tokens/s, memory, the largest batch

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
PARTS = {"1": "pytest", "2": "train", "3": "batch", "4": "encode", "5": "long", "6": "llm"}
FILES = {"pytest": "part1_pytest.json", "train": "part2_train.json", "batch": "part3_batch.json",
         "encode": "part4_encode.json", "long": "part5_long.json", "llm": "part6_llm.json"}
#: the sizes of a full run (an H100 / H200) and of --dry-run (the CPU test: coverage, not timing, so its time caps
#: are 10x; "auto" lengths: the fixed batch takes the natural steps' padded shape, one program for both).
#: part 5 (--long): name:document cap:global batch:row lengths (+-separated); part 6 (--llm):
#: name:full|lora:global batch:gradient-cache queries per sub-batch[:remat]
FULL = dict(models="minilm:512,bert-base:256,bert-large:128,qwen2-0.5b:64", look=24, take=4, plan_steps=40, rounds=3,
            q_len=32, d_len=128, jax_settings=["fixed", "packed", "padded"], st_settings=["fixed", "natural", "flat"],
            waves=[["fixed", "packed"], ["padded"]], compile_threads=3, profile=["fixed", "packed"], st_share=0.33,
            batch_model="bert-base", sizes=[1024, 16384, 8192, 4096, 2048], chunk=128, batch_q_len=32,
            batch_d_len=64, batch_rounds=2, overhead_batch=256, encode_models="minilm,bert-base", encode_n=20000,
            encode_batch=256, encode_repeats=3, long="bert-base:512:64:512+1024+2048,qwen2-0.5b:1024:32:1024+2048",
            long_kernels="xla,pallas,cudnn_bound,cudnn,te", long_take=1, long_rounds=3, long_plan_steps=4,
            llm="qwen2-1.5b:full:128:32,qwen2-7b:lora:64:16:remat", llm_sizes=[8, 16, 32, 64, 128], llm_take=1,
            llm_rounds=2, llm_plan_steps=2, llm_cap=512, lora_rank=16, capacity_gib=None, prepare_processes=4,
            check_varlen_wiring=False, budget=530.0, cap_scale=1, jax_min_s=110)
DRY = dict(models="tiny-bert:8", look=6, take=2, plan_steps=8, rounds=2, q_len="auto", d_len="auto",
           jax_settings=["fixed", "packed", "padded"], st_settings=["fixed", "natural", "flat"],
           waves=[["fixed", "packed"], ["padded"]], compile_threads=2, profile=["packed"], st_share=0.3,
           batch_model="tiny-bert", sizes=[16], chunk=8, batch_q_len=8, batch_d_len=16, batch_rounds=1,
           overhead_batch=16, encode_models="tiny-bert", encode_n=64, encode_batch=16, encode_repeats=1,
           long="tiny-bert:64:8:64", long_kernels="xla,pallas", long_take=1, long_rounds=1, long_plan_steps=2,
           llm="tiny-qwen2:lora:16:8:remat", llm_sizes=[4, 8], llm_take=1, llm_rounds=1, llm_plan_steps=1,
           llm_cap=64, lora_rank=4, capacity_gib=1.0, prepare_processes=0, check_varlen_wiring=True,
           budget=3600.0, cap_scale=10, jax_min_s=20)
#: seconds: the most a part may take (cap) and the least left for it when an earlier part runs long (floor)
CAP = {"smoke": 150, "pytest": 150, "train": 420, "batch": 150, "encode": 60, "long": 200, "llm": 200}
FLOOR = {"pytest": 30, "train": 120, "batch": 60, "encode": 30, "long": 80, "llm": 60}
#: part 2: the share of the part's time each model may take (what one leaves goes to the next)
WEIGHT = {"minilm": 1.0, "bert-base": 1.5, "bert-large": 2.2, "qwen2-0.5b": 1.6}
#: part 6: each model's share (its jaxembed worker then ST's); part 5: each model's
LLM_WEIGHT = {"qwen2-1.5b": 1.0, "qwen2-7b": 1.6}
TARGETS = {
    "throughput": "natural lengths, jaxembed packed >= 1.5x sentence-transformers' examples/s (MiniLM, BERT-base)",
    "mfu": "MFU >= 40 % for BERT-base and BERT-large packed",
    "candidates": ">= 80,000 candidates per step on one GPU for BERT-base",
    "cache_overhead": "gradient-cache step <= 1.4x the plain step (same global batch)",
    # engine speed per computed token, MFU on computed slots, against ST's padding-free arm
    "engine_fixed": "fixed lengths (q 32 / d 128): jaxembed's speed per computed token >= 1.2x ST's, all four models",
    "engine_natural": "natural lengths: jaxembed packed's speed per computed slot >= 1.2x ST's (its own padding), "
                      "all four models",
    "mfu_computed": "MFU on computed slots, fixed and packed: >= 45 % BERT-large, >= 40 % BERT-base, >= 35 % "
                    "Qwen2-0.5B",
    "vs_padding_free": "natural lengths: jaxembed packed's real tokens/s >= 1.3x ST's padding-free arm, all four "
                       "models",
}
#: the four models of the engine targets and the MFU each must reach
ENGINE_MODELS = ("minilm", "bert-base", "bert-large", "qwen2-0.5b")
MFU_TARGET = {"bert-large": 0.45, "bert-base": 0.40, "qwen2-0.5b": 0.35}


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

    def _argv(self, name: str, payload: dict) -> list[str]:
        return [sys.executable, str(Path(__file__).resolve()), "--_worker", name, json.dumps(payload)]

    def _serve(self) -> subprocess.Popen:
        if self.server is None or self.server.poll() is not None:
            with open(self.root / "logs" / "server.log", "a", encoding="utf-8") as f:
                self.server = subprocess.Popen(self._argv("serve", {}), stdin=subprocess.PIPE, stdout=f,
                                               stderr=subprocess.STDOUT, env=self.env, cwd=str(ROOT), text=True,
                                               start_new_session=True)
        return self.server

    def close(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.stdin.close()
            try:
                self.server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._kill(self.server)
        self.server = None

    @staticmethod
    def _kill(p) -> None:
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
                p = subprocess.Popen(self._argv(name, payload), stdout=f, stderr=subprocess.STDOUT,
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
                self._kill(p)
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


def time_shares(weights: list[float], until: float):
    """(index, seconds left, share) for each item in turn: the seconds left until ``until`` split by weight over
    the items still to run, read when the item starts (an item that ends early leaves its time to the rest)."""
    for i in range(len(weights)):
        left = until - time.time()
        yield i, left, left * weights[i] / sum(weights[i:])


def part_train(w: Workers, cfg: dict, until: float, out_dir: Path, peak: float | None) -> dict:
    """Per model: jaxembed fixed (the control) / packed / padded and sentence-transformers fixed (the control) /
    natural / flat (padding-free), each over the same steps, warm-up + cfg.rounds timed rounds. ST first, every
    model in one process (torch starts once; a share st_share of the part's time), then one jaxembed process per
    model (its settings compiled side by side), each model a share of what is left by WEIGHT."""
    specs = [s.split(":") for s in cfg["models"].split(",") if s]
    res = {"setting": {k: cfg[k] for k in ("look", "take", "plan_steps", "rounds", "q_len", "d_len", "jax_settings",
                                          "st_settings", "waves", "compile_threads", "profile")},
           "data": "shared train snli_triplets + wikiqa (one JSONL, rows with a positive and a hard negative), 1 "
                   "positive + 1 hard negative per query, every text <= 128 tokens",
           "precision": "bfloat16 compute, float32 master weights (jaxembed model.dtype; ST torch.autocast)",
           "order": "controls first: every worker times the fixed-length arm before the natural ones; ST's three "
                    "arms for every model, then jaxembed's per model",
           "models": {}, "todo": []}
    path = out_dir / FILES["train"]
    base = dict(root=str(w.root), look=cfg["look"], take=cfg["take"], plan_steps=cfg["plan_steps"],
                rounds=cfg["rounds"], q_len=cfg["q_len"], d_len=cfg["d_len"], peak_flops=peak)
    for name, b in specs:
        res["models"].setdefault(name, {"batch": int(b), "jaxembed": {}, "st": {}})

    def keep(tool):
        def on(r):
            entry = res["models"].get(r.get("model"))
            if entry is None:
                return
            if r.get("kind") == "train":
                entry[tool][r["setting"]] = r
                log(f"  {tool} {r['model']} {r['setting']}: {brief(r)}")
            elif r.get("kind") == "setup":
                entry.setdefault("setup", {})[tool] = r
            elif r.get("kind") in ("profile", "compile"):
                entry.setdefault(r["kind"], {})[r.get("setting", tool)] = r
            entry.update(ratios(entry))
            write_json(path, res)
        return on

    t0 = time.time()
    total = max(until - t0, 0.0)
    weights = [WEIGHT.get(n, 1.0) for n, _ in specs]
    st_until = t0 + cfg["st_share"] * total
    # the worker splits its time by weight as each model starts, so torch's import and the first model's setup do
    # not eat the first model's share
    st_models = [[name, int(b), wt] for (name, b), wt in zip(specs, weights)]
    if cfg["st_settings"]:
        log(f"part 2: sentence-transformers, {len(specs)} models, {st_until - time.time():.0f} s")
        w.run("train_st", dict(base, models=st_models, until=st_until, settings=cfg["st_settings"],
                               flat_attention=cfg.get("flat_attention"),
                               check_varlen_wiring=cfg["check_varlen_wiring"]),
              timeout=st_until - time.time() + 30, on_result=keep("st"), env={"JAX_PLATFORMS": "cpu"})
    for i, left, share in time_shares(weights if cfg["jax_settings"] else [], until):
        name, b = specs[i]
        entry = res["models"][name]
        # a worker needs about jax_min_s to set up, compile and time its first wave (the setup and compile times
        # of the H200 record, benchmarks/gpu/README.md): a model gets at least that, so the first models finish
        # rather than all time out
        if left < cfg["jax_min_s"]:
            entry["skipped"] = f"{left:.0f} s left for the part, {cfg['jax_min_s']} s needed"
            write_json(path, res)
            continue
        share = max(share, cfg["jax_min_s"])
        log(f"part 2: jaxembed {name} B={b}, {share:.0f} s")
        dl = time.time() + share
        w.run("train_jax", dict(base, model=name, batch=int(b), deadline=dl, settings=cfg["jax_settings"],
                                waves=cfg["waves"], compile_threads=cfg["compile_threads"], profile=cfg["profile"]),
              timeout=dl - time.time() + 25, on_result=keep("jaxembed"),
              env={"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"})
    for name, b in specs:
        entry = res["models"][name]
        missing = [f"{tool} {s}" for tool, settings in (("jaxembed", cfg["jax_settings"]),
                                                         ("st", cfg["st_settings"]))
                   for s in settings if "step_s" not in entry[tool].get(s, {})
                   and not str(entry[tool].get(s, {}).get("skipped", "")).startswith("no varlen")]
        if missing:
            entry["missing"] = missing
            res["todo"].append(f"{name}:{b}")
    write_json(path, res)
    return res


#: (jaxembed setting, ST setting) pairs compared in part 2's summary
PAIRS = (("fixed", "fixed"), ("packed", "natural"), ("padded", "natural"), ("packed", "flat"))


def compare(j: dict, s: dict) -> dict | None:
    """jaxembed's arm over ST's on the same examples, split into slots saved x speed per computed slot (exact:
    examples/s ratio = (ST's slots per example / jaxembed's) x (jaxembed's slots/s / ST's)); the same split by
    FLOPs (computed FLOPs saved x FLOP/s, i.e. the MFU ratio), and real tokens/s."""
    need = ("examples_per_s", "examples_per_round", "token_slots_per_round", "flops_per_round", "real_tokens_per_s")
    if not all(d.get(k) for d in (j, s) for k in need):
        return None
    per_ex = lambda d, k: d[k] / d["examples_per_round"]  # noqa: E731
    rate = lambda d, k: d[k] * d["examples_per_s"] / d["examples_per_round"]  # noqa: E731 (per second)
    out = {"examples_ratio": j["examples_per_s"] / s["examples_per_s"],
           "slots_saved": per_ex(s, "token_slots_per_round") / per_ex(j, "token_slots_per_round"),
           "speed_per_slot": rate(j, "token_slots_per_round") / rate(s, "token_slots_per_round"),
           "flops_saved": per_ex(s, "flops_per_round") / per_ex(j, "flops_per_round"),
           "speed_per_flop": rate(j, "flops_per_round") / rate(s, "flops_per_round"),
           "real_tokens_ratio": j["real_tokens_per_s"] / s["real_tokens_per_s"],
           "real_fraction": [j.get("real_fraction"), s.get("real_fraction")]}
    out["summary"] = (f"{out['examples_ratio']:.2f}x = {out['slots_saved']:.2f}x slots saved x "
                      f"{out['speed_per_slot']:.2f}x speed per computed slot")
    return out


def ratios(entry: dict) -> dict:
    """jaxembed over sentence-transformers (examples/s) and packed over padded, where both were measured; the
    decomposition of each pair of PAIRS (``compare``)."""
    j, s = entry.get("jaxembed", {}), entry.get("st", {})
    ex = lambda d, k: d.get(k, {}).get("examples_per_s")  # noqa: E731
    out = {}
    for a, b, label in (("packed", "natural", "packed_over_st"), ("padded", "natural", "padded_over_st"),
                        ("fixed", "fixed", "fixed_over_st"), ("packed", "flat", "packed_over_st_flat")):
        if ex(j, a) and ex(s, b):
            out[f"ratio_{label}"] = ex(j, a) / ex(s, b)
    if ex(j, "packed") and ex(j, "padded"):
        out["ratio_packed_over_padded"] = ex(j, "packed") / ex(j, "padded")
    comp = {f"{a}_vs_st_{b}": c for a, b in PAIRS if (c := compare(j.get(a, {}), s.get(b, {})))}
    if comp:
        out["compare"] = comp
    return out


def brief(r: dict) -> str:
    if "skipped" in r:
        return f"skipped ({r['skipped']})"
    if "error" in r:
        return "error: " + r["error"].strip().splitlines()[-1][:200]
    if "examples_per_s" not in r:
        return "no timing" + (" (out of memory)" if r.get("oom") else "")
    s = f"{r.get('examples_per_s', 0):.0f} ex/s, {r.get('real_tokens_per_s', 0) / 1e3:.0f}k real tok/s"
    if r.get("attention"):
        s += f" [{r['attention']}]"
    if r.get("mfu") is not None and r.get("mfu_real_tokens") is None:
        s += f", MFU {100 * r['mfu']:.1f}%"
    elif r.get("mfu") is not None:
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


def long_specs(text: str) -> list[dict]:
    """--long: name:document cap:global batch:row lengths (+-separated), comma-separated."""
    out = []
    for item in filter(None, text.split(",")):
        name, cap, b, rows = item.split(":")
        out.append({"model": name, "cap": int(cap), "batch": int(b), "rows": [int(x) for x in rows.split("+")]})
    return out


def part_long(w: Workers, cfg: dict, until: float, out_dir: Path, peak: float | None) -> dict:
    """Part 5: long documents in packed rows, each attention kernel in the full train step (workers.long), one
    process per model, each a share of the part's time by its row lengths x kernels."""
    specs = long_specs(cfg["long"])
    kernels = cfg["long_kernels"].split(",")
    res = {"kernels": kernels, "rounds": cfg["long_rounds"], "take": cfg["long_take"], "models": {}, "todo": [],
           "precision": "bfloat16 compute, float32 master weights, dropout off (the fused kernels have no attention "
                        "dropout), 1 positive + 1 hard negative, queries <= 64 tokens",
           "kernel_names": {"xla": "XLA (the reference, model.attention=xla)",
                            "cudnn": "cuDNN flash attention, segment bound = the row length (what the model passes)",
                            "cudnn_bound": "cuDNN flash attention, segment bound = the batches' most runs per row",
                            "pallas": "Pallas / Triton flash attention with segment ids",
                            "te": "Transformer Engine fused attention (THD)"}}
    path = out_dir / FILES["long"]

    def on(r):
        e = res["models"].setdefault(r.get("model", "?"), {"rows": {}})
        if r.get("kind") == "setup":
            e["setup"] = r
        elif r.get("kind") == "rows":
            e["rows"].setdefault(str(r["row_length"]), {})["layout"] = r
        elif r.get("kind") == "long":
            row = e["rows"].setdefault(str(r["row_length"]), {})
            if "kernel" in r:
                row[r["kernel"]] = r
                log(f"  long {r['model']} rows {r['row_length']} {r['kernel']}: {brief(r)}")
            else:
                row["error"] = r
        elif r.get("kind") == "choice":
            e["rows"].setdefault(str(r["row_length"]), {})["choice"] = r
            log(f"  long {r['model']} rows {r['row_length']}: fastest {r['fastest']} ({r.get('over_xla')})")
        write_json(path, res)

    for i, _, share in time_shares([len(sp["rows"]) for sp in specs], until):
        sp = specs[i]
        if share < 20:
            res["todo"].append(sp)
            continue
        log(f"part 5: {sp['model']} documents <= {sp['cap']}, B={sp['batch']}, rows {sp['rows']}, {share:.0f} s")
        dl = time.time() + share
        w.run("long", dict(root=str(w.root), **sp, kernels=kernels, take=cfg["long_take"], rounds=cfg["long_rounds"],
                           plan_steps=cfg["long_plan_steps"], deadline=dl, compile_threads=cfg["compile_threads"],
                           peak_flops=peak, capacity_gib=cfg["capacity_gib"]),
              timeout=dl - time.time() + 20, on_result=on, env={"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"})
        rows = res["models"].get(sp["model"], {}).get("rows", {})
        missing = [L for L in sp["rows"] if "xla" not in rows.get(str(L), {}) or
                   "step_s" not in rows[str(L)]["xla"]]
        if missing:
            res["todo"].append(dict(sp, rows=missing))
    res["auto_rule"] = auto_rule(res)
    write_json(path, res)
    return res


def auto_rule(res: dict) -> dict:
    """What model.attention=auto should choose, per model and row length, from part 5's timings: the fastest
    kernel and its speed-up over XLA (a rule for jaxembed.models.attention.resolve, to be written once measured)."""
    out = {}
    for m, e in res.get("models", {}).items():
        for L, row in e.get("rows", {}).items():
            ch = row.get("choice")
            if ch:
                out.setdefault(m, {})[L] = {"fastest": ch["fastest"], "over_xla": ch.get("over_xla", {})}
    return out


def llm_specs(text: str) -> list[dict]:
    """--llm: name:full|lora:global batch:gradient-cache queries per sub-batch[:remat], comma-separated."""
    out = []
    for item in filter(None, text.split(",")):
        f = item.split(":")
        out.append({"model": f[0], "mode": f[1], "batch": int(f[2]), "chunk": int(f[3]),
                    "remat": len(f) > 4 and f[4] == "remat"})
    return out


def part_llm(w: Workers, cfg: dict, until: float, out_dir: Path, peak: float | None) -> dict:
    """Part 6: LLM embedders at size on one GPU, 512-token documents: jaxembed (full fine-tuning or LoRA, remat,
    gradient cache) then sentence-transformers' recipe (PEFT, gradient checkpointing) on the same model, one
    process each, each model a share of the part's time by LLM_WEIGHT (jaxembed 60 % of it)."""
    specs = llm_specs(cfg["llm"])
    res = {"cap": cfg["llm_cap"], "st_sizes": cfg["llm_sizes"], "lora_rank": cfg["lora_rank"],
           "precision": "bfloat16 compute; jaxembed float32 master weights (the LoRA base too: jaxembed refuses "
                        "bfloat16 parameters); ST float32 weights for full fine-tuning, a bfloat16 base for LoRA",
           "models": {}, "todo": []}
    path = out_dir / FILES["llm"]

    def on(r):
        e = res["models"].setdefault(r.get("model", "?"), {"jaxembed": {}, "st": {}})
        tool = r.get("tool", "jaxembed")
        if r.get("kind") == "setup":
            e.setdefault("setup", {})[tool] = r
        elif r.get("kind") == "wiring":
            e["varlen_wiring"] = r
        elif r.get("kind") == "llm":
            if tool == "st":
                e["st"][str(r["global_batch"])] = r
            else:
                e["jaxembed"] = r
            log(f"  llm {r['model']} {tool} B={r.get('global_batch')}: {brief(r)}")
        e.update(llm_figures(e))
        write_json(path, res)

    for i, _, share in time_shares([LLM_WEIGHT.get(sp["model"], 1.0) for sp in specs], until):
        sp = specs[i]
        if share < 30:
            res["todo"].append(sp)
            continue
        log(f"part 6: {sp}, {share:.0f} s")
        t0 = time.time()
        dl = t0 + 0.6 * share
        common = dict(root=str(w.root), cap=cfg["llm_cap"], plan_steps=cfg["llm_plan_steps"],
                      lora_rank=cfg["lora_rank"], peak_flops=peak)
        w.run("llm_jax", dict(common, **sp, take=cfg["llm_take"], rounds=cfg["llm_rounds"], deadline=dl,
                              capacity_gib=cfg["capacity_gib"]),
              timeout=dl - time.time() + 20, on_result=on, env={"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"})
        dl = max(t0 + share, time.time() + 20)
        w.run("llm_st", dict(common, model=sp["model"], mode=sp["mode"], batch=sp["batch"], sizes=cfg["llm_sizes"],
                             rounds=cfg["llm_rounds"], deadline=dl, check_varlen_wiring=cfg["check_varlen_wiring"]),
              timeout=dl - time.time() + 20, on_result=on, env={"JAX_PLATFORMS": "cpu"})
        e = res["models"].get(sp["model"], {})
        if "step_s" not in e.get("jaxembed", {}) or not any("step_s" in x for x in e.get("st", {}).values()):
            res["todo"].append(sp)
    write_json(path, res)
    return res


def llm_figures(e: dict) -> dict:
    """ST's largest batch that ran and its figures beside jaxembed's: tokens/s ratio (real tokens), memory."""
    st_ok = [r for r in e.get("st", {}).values() if "step_s" in r]
    out = {}
    if st_ok:
        best = max(st_ok, key=lambda r: r["global_batch"])
        out["st_largest_batch"] = best["global_batch"]
        out["st_best_tokens_per_s"] = max(r["real_tokens_per_s"] for r in st_ok)
    j = e.get("jaxembed", {})
    if j.get("real_tokens_per_s") and out.get("st_best_tokens_per_s"):
        out["tokens_ratio"] = j["real_tokens_per_s"] / out["st_best_tokens_per_s"]
    return out


# ------------------------------------------------------------------------------------------------ summary


def targets(parts: dict) -> dict:
    """Each target (TARGETS): the figures it reads and whether they meet it (None: not measured)."""
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

    def cmp(m, key, field):
        return (tr.get(m, {}).get("compare", {}).get(key) or {}).get(field)

    def verdict(values: dict, ok) -> bool | None:
        return None if None in values.values() else all(ok(k, v) for k, v in values.items())

    v = {m: cmp(m, "fixed_vs_st_fixed", "speed_per_slot") for m in ENGINE_MODELS}
    out["engine_fixed"] = {"target": TARGETS["engine_fixed"], "values": v, "met": verdict(v, lambda k, x: x >= 1.2)}
    v = {m: cmp(m, "packed_vs_st_natural", "speed_per_slot") for m in ENGINE_MODELS}
    out["engine_natural"] = {"target": TARGETS["engine_natural"], "values": v,
                             "values_padded": {m: cmp(m, "padded_vs_st_natural", "speed_per_slot")
                                               for m in ENGINE_MODELS},
                             "met": verdict(v, lambda k, x: x >= 1.2)}
    v = {f"{m} {s}": tr.get(m, {}).get("jaxembed", {}).get(s, {}).get("mfu") for m in MFU_TARGET
         for s in ("fixed", "packed")}
    out["mfu_computed"] = {"target": TARGETS["mfu_computed"], "values": v,
                           "met": verdict(v, lambda k, x: x >= MFU_TARGET[k.split()[0]])}
    v = {m: cmp(m, "packed_vs_st_flat", "real_tokens_ratio") for m in ENGINE_MODELS}
    out["vs_padding_free"] = {"target": TARGETS["vs_padding_free"], "values": v,
                              "st_flat_attention": {m: tr.get(m, {}).get("st", {}).get("flat", {}).get("attention")
                                                    for m in ENGINE_MODELS},
                              "met": verdict(v, lambda k, x: x >= 1.3)}
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
    if todo.get("long"):
        args.append("--long " + ",".join(f"{x['model']}:{x['cap']}:{x['batch']}:" + "+".join(map(str, x["rows"]))
                                         for x in todo["long"]))
    if todo.get("llm"):
        args.append("--llm " + ",".join(f"{x['model']}:{x['mode']}:{x['batch']}:{x['chunk']}" +
                                        (":remat" if x.get("remat") else "") for x in todo["llm"]))
    return "bash benchmarks/gpu/run.sh $OUT " + " ".join(args)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="folder for the JSON files (on the GPU machine: the run's output folder)")
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes (the CPU test): the same code paths")
    ap.add_argument("--parts", default="2,5,6,3,4,1", help="the parts, in the order to run them (README: the two "
                                                              "calls of a session)")
    ap.add_argument("--budget", type=float, help="seconds for the whole run (default 530; dry run 3600)")
    ap.add_argument("--models", help="part 2: name:global_batch,... (minilm, bert-base, bert-large, qwen2-0.5b, "
                                     "tiny-bert, tiny-qwen2)")
    ap.add_argument("--sizes", help="part 3: global batches, the reference first (default 1024,16384,8192,4096,2048)")
    ap.add_argument("--encode-models", help="part 4: model names (default minilm,bert-base)")
    ap.add_argument("--long", help="part 5: name:document cap:global batch:row lengths(+-separated),... (default "
                                   "bert-base:512:64:512+1024+2048,qwen2-0.5b:1024:32:1024+2048)")
    ap.add_argument("--long-kernels", help="part 5: attention kernels (default xla,pallas,cudnn_bound,cudnn,te: "
                                           "cuDNN after the others, whose failure may leave the CUDA context broken)")
    ap.add_argument("--llm", help="part 6: name:full|lora:global batch:cache sub-batch[:remat],... (default "
                                  "qwen2-1.5b:full:128:32,qwen2-7b:lora:64:16:remat)")
    ap.add_argument("--llm-sizes", help="part 6: sentence-transformers' global batches, tried in order until one "
                                        "does not fit (default 8,16,32,64,128)")
    ap.add_argument("--rounds", type=int, help="timed rounds per setting (default 3; the dry run 2)")
    ap.add_argument("--compile-threads", type=int, help="programs of one worker compiled side by side (default 3)")
    ap.add_argument("--flat-attention", help="part 2's ST padding-free arm: the attentions to try, comma-separated "
                                             "(default: workers.FLAT_ORDER, the first that runs)")
    ap.add_argument("--jax-settings", help="part 2: jaxembed's settings, comma-separated (default fixed,packed,padded; "
                                           "'none': no jaxembed worker)")
    ap.add_argument("--st-settings", help="part 2: sentence-transformers' settings, comma-separated (default "
                                          "fixed,natural,flat; 'none': no ST worker, e.g. when an earlier call of "
                                          "the session measured it)")
    ap.add_argument("--own-processes", action="store_true",
                    help="the dry run: a process per job, as on a device (default: one shared process)")
    ap.add_argument("--peak-flops", type=float, default=None,
                    help="peak FLOP/s for MFU instead of the device's datasheet entry (the CPU test sets one)")
    ap.add_argument("--root", default="/tmp/gpu_bench", help="scratch: model folders, stores, worker logs")
    ap.add_argument("--no-smoke", action="store_true")
    ap.add_argument("--record", metavar="DIR", nargs="+",
                    help="record DIR's results in benchmarks/results/ and the README (several DIRs: calls of one "
                         "session, merged arm by arm into one record)")
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

        record.record([Path(d) for d in args.record], results_dir=args.results_dir, readme=args.readme)
        return 0
    if not args.out:
        ap.error("--out is required")
    cfg = dict(DRY if args.dry_run else FULL)
    for k in ("models", "budget", "long", "llm", "rounds", "compile_threads"):
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    if args.sizes:
        cfg["sizes"] = [int(x) for x in args.sizes.split(",")]
    if args.encode_models:
        cfg["encode_models"] = args.encode_models
    if args.llm_sizes:
        cfg["llm_sizes"] = [int(x) for x in args.llm_sizes.split(",")]
    if args.long_kernels:
        cfg["long_kernels"] = args.long_kernels
    for k in ("jax_settings", "st_settings"):
        v = getattr(args, k)
        if v is not None:
            cfg[k] = [] if v == "none" else [x for x in v.split(",") if x]
            cfg["waves"] = [[s for s in wave if s in cfg["jax_settings"]] for wave in cfg["waves"]]
            cfg["waves"] = [wave for wave in cfg["waves"] if wave]
    if args.flat_attention:
        cfg["flat_attention"] = args.flat_attention.split(",")
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
    w = Workers(root, env, shared=args.dry_run and not args.own_processes)
    summary = {"benchmark": "gpu", "issue": 18, "date": datetime.date.today().isoformat(),
               "started": datetime.datetime.now().isoformat(timespec="seconds"), "dry_run": args.dry_run,
               "parts": parts, "budget_s": cfg["budget"], "config": cfg, "argv": sys.argv[1:],
               "device": {"nvidia_smi": nvidia_smi()}, "load_average_at_start": list(os.getloadavg())}
    spath = out_dir / "summary.json"
    write_json(spath, summary)
    log(f"gpu benchmark: parts {parts}, budget {cfg['budget']:.0f} s, device {summary['device']['nvidia_smi']}")

    prep = start_prepare(w, cfg, parts)
    if not args.no_smoke:
        ok = smoke(w, cfg, summary, spath, min(CAP["smoke"] * cfg["cap_scale"], deadline - time.time()))
        if not ok:
            log("jaxembed does not run here: stopping (summary.json says why)")
            summary["stopped"] = "the smoke step failed"
            write_json(spath, summary)
            return 1
    summary["prepare"] = finish_prepare(w, prep, cfg, deadline)
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
            if part == "long":
                todo[part] = long_specs(cfg["long"])
            if part == "llm":
                todo[part] = llm_specs(cfg["llm"])
            continue
        until = time.time() + allow
        t0 = time.time()
        try:
            if part == "pytest":
                r = part_pytest(env, allow, out_dir)
                if r["timed_out"]:
                    todo[part] = ["all"]
            elif part == "encode":
                r = part_encode(w, cfg, until, out_dir)
                todo[part] = r["todo"]
            else:  # the parts that report MFU against the device's peak
                part_fn = {"train": part_train, "batch": part_batch, "long": part_long, "llm": part_llm}[part]
                r = part_fn(w, cfg, until, out_dir, args.peak_flops)
                todo[part] = r["todo"]
        except Exception as e:  # noqa: BLE001 -- one part's failure must not lose the others
            import traceback

            r = {"error": traceback.format_exc()[-2000:]}
            log(f"part {part} failed: {e!r}")
            write_json(out_dir / FILES[part], r)
        results[part] = r
        summary.setdefault("part_seconds", {})[part] = time.time() - t0
        summary["targets"] = targets(results)
        summary["round_spread"] = round_spreads(results)
        write_json(spath, summary)
    summary["todo"] = {k: v for k, v in todo.items() if v}
    summary["next_command"] = next_command(summary["todo"])
    summary["targets"] = targets(results)
    summary["round_spread"] = round_spreads(results)
    summary["wall_s"] = time.time() - t_start
    summary["load_average_at_end"] = list(os.getloadavg())
    summary["workers"] = {"count": w.n, "shared_process": w.shared}
    w.close()
    write_json(spath, summary)
    print_table(summary, results)
    return 0


#: an arm whose timed rounds differ by more than this (max / min - 1) is flagged in the summary: its median is
#: not a steady figure (clocks, a neighbour, allocator growth) and wants more rounds or a rerun
SPREAD_LIMIT = 0.05


def round_spreads(results: dict, limit: float = SPREAD_LIMIT) -> dict:
    """Every measured arm's round-to-round spread (max / min - 1 of its round_times_s; arms with two or more
    rounds), keyed by its path in the results ("train/bert-base/st/fixed"), and those above ``limit``."""
    arms = {}

    def walk(x, path):
        if isinstance(x, dict):
            t = x.get("round_times_s")
            if isinstance(t, list) and len(t) >= 2 and min(t) > 0:
                arms["/".join(path)] = max(t) / min(t) - 1
            for k, v in x.items():
                walk(v, path + [str(k)])
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk(v, path + [str(i)])

    walk(results, [])
    return {"limit": limit, "arms": arms, "flagged": {k: v for k, v in arms.items() if v > limit}}


def prepare_models(cfg: dict, parts: list[str]) -> list[str]:
    """The model folders the call's parts load (built once, before they run)."""
    names = []
    if "train" in parts:
        names += [s.split(":")[0] for s in cfg["models"].split(",") if s]
    if "long" in parts:
        names += [x["model"] for x in long_specs(cfg["long"])]
    if "batch" in parts:
        names.append(cfg["batch_model"])
    if "encode" in parts:
        names += cfg["encode_models"].split(",")
    return list(dict.fromkeys(names))


def start_prepare(w: Workers, cfg: dict, parts: list[str]):
    """On a device: the model folders built on the CPU (JAX_PLATFORMS=cpu: no device memory taken) in a process
    of their own, cfg.prepare_processes at a time, while the smoke step runs. -> the process, or None (the dry
    run: built in the shared worker by finish_prepare)."""
    names = prepare_models(cfg, parts)
    if not cfg["prepare_processes"] or not names:
        return None
    logf = w.root / "logs" / "00_prepare.log"
    log(f"prepare: {names} in the background ({cfg['prepare_processes']} processes)")
    f = open(logf, "w", encoding="utf-8")
    p = subprocess.Popen(w._argv("prepare", dict(root=str(w.root), models=names,
                                                  processes=cfg["prepare_processes"])),
                         stdout=f, stderr=subprocess.STDOUT, env=dict(w.env, JAX_PLATFORMS="cpu"), cwd=str(ROOT),
                         start_new_session=True)
    return p, logf, time.time(), f


def finish_prepare(w: Workers, prep, cfg: dict, deadline: float) -> dict:
    """Wait for start_prepare's process (or, the dry run, build the folders in the worker now) -> its figures."""
    if prep is None:
        names = [n for n in prepare_models(cfg, ["train"]) if n]
        r = w.run("prepare", dict(root=str(w.root), models=names, processes=0), timeout=max(deadline - time.time(), 30))
        return {"seconds": r["seconds"], "results": r["results"], "rc": r["rc"]}
    p, logf, t0, f = prep
    try:
        p.wait(timeout=max(deadline - time.time() - 60, 10))
    except subprocess.TimeoutExpired:
        Workers._kill(p)
    f.close()
    res = [json.loads(x[7:]) for x in logf.read_text(encoding="utf-8", errors="replace").splitlines()
           if x.startswith("RESULT ")]
    out = {"rc": p.returncode, "wall_s": time.time() - t0, "results": res}
    if p.returncode:
        out["tail"] = tail(logf, 20)
    log(f"prepare: done after {out['wall_s']:.0f} s (rc {p.returncode})")
    return out


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
    """The short table a run prints last."""
    print("\n==== gpu benchmark:", summary["device"], flush=True)
    for m, e in results.get("train", {}).get("models", {}).items():
        for tool in ("jaxembed", "st"):
            for s, r in e.get(tool, {}).items():
                print(f"train {m:11s} {tool:8s} {s:8s} {brief(r)}")
        for k, v in e.items():
            if k.startswith("ratio_"):
                print(f"train {m:11s} {k}: {v:.2f}x")
        for key, c in e.get("compare", {}).items():
            print(f"train {m:11s} {key}: {c['summary']}")
    for m, e in results.get("long", {}).get("models", {}).items():
        for L, row in e.get("rows", {}).items():
            for k, r in row.items():
                if k not in ("layout", "choice", "error"):
                    print(f"long  {m:11s} rows {L:>5s} {k:12s} {brief(r)}")
            if "choice" in row:
                print(f"long  {m:11s} rows {L:>5s} fastest: {row['choice']['fastest']}")
    for m, e in results.get("llm", {}).get("models", {}).items():
        print(f"llm   {m:11s} jaxembed: {brief(e.get('jaxembed', {}))}")
        for B, r in e.get("st", {}).items():
            print(f"llm   {m:11s} ST B={B}: {brief(r)}")
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
    sp = summary.get("round_spread") or {}
    for k, v in sp.get("flagged", {}).items():
        print(f"SPREAD {k}: rounds differ by {v:.1%} (> {sp['limit']:.0%}): not a steady figure")
    print(f"todo: {summary.get('todo')}\nnext: {summary.get('next_command')}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
