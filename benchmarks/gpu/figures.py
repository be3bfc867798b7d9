"""The GPU benchmark's arithmetic on measured figures, free of any framework: each jaxembed / sentence-transformers
pair split into slots saved x speed per computed slot, part 3's batch curve, part 5's fastest kernel, part 6's
largest batch, the targets met or not, the arms whose rounds are unsteady, the call that measures what did
not fit, and the --long / --llm specs. Read by bench.py (the summary), parts.py and record.py (the records).
"""

from __future__ import annotations

PARTS = {"1": "pytest", "2": "train", "3": "batch", "4": "encode", "5": "long", "6": "llm"}
FILES = {"pytest": "part1_pytest.json", "train": "part2_train.json", "batch": "part3_batch.json",
         "encode": "part4_encode.json", "long": "part5_long.json", "llm": "part6_llm.json"}
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


def long_specs(text: str) -> list[dict]:
    """--long: name:document cap:global batch:row lengths (+-separated), comma-separated."""
    out = []
    for item in filter(None, text.split(",")):
        name, cap, b, rows = item.split(":")
        out.append({"model": name, "cap": int(cap), "batch": int(b), "rows": [int(x) for x in rows.split("+")]})
    return out


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
