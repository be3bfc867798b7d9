"""The benchmark's parts, each run through worker processes (procs.Workers) within its share of the time: part 1
pytest -m gpu, part 2 train, part 3 batch, part 4 encode, part 5 long, part 6 llm; every figure written to its
part's JSON as it arrives. Also the model folders built before the parts, and the smoke step.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from figures import FILES, auto_rule, batch_figures, brief, llm_figures, llm_specs, long_specs, ratios
from procs import ROOT, Workers, log, tail, write_json

#: part 2: the share of the part's time each model may take (what one leaves goes to the next)
WEIGHT = {"minilm": 1.0, "bert-base": 1.5, "bert-large": 2.2, "qwen2-0.5b": 1.6}
#: part 6: each model's share (its jaxembed worker then ST's); part 5: each model's
LLM_WEIGHT = {"qwen2-1.5b": 1.0, "qwen2-7b": 1.6}


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


def part_long(w: Workers, cfg: dict, until: float, out_dir: Path, peak: float | None) -> dict:
    """Part 5: long documents in packed rows, each attention kernel in the full train step (arm_jax.long), one
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
    p = subprocess.Popen(w.argv("prepare", dict(root=str(w.root), models=names,
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
        Workers.kill(p)
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
