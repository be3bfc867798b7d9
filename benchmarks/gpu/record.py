"""Record a GPU benchmark run (the files of its output folder) in benchmarks/results/ and
benchmarks/README.md: one result file per part, named by part and device (``gpu_<part>_<device>_<date>_<time>.json``,
benchmarks/_record.py), and one README line per part.

    python benchmarks/gpu/bench.py --record DIR     # DIR: a call's --out folder (summary.json, part*.json)
    python benchmarks/gpu/bench.py --record DIR1 DIR2   # runs on one device kind: one record

Several folders (runs on one machine that split the work: sentence-transformers' arms in one, jaxembed's in the
next) are merged arm by arm (``merge``): each measured arm comes from the last call that measured it and says which
(``call``), the ratios and targets are computed again over the merged arms, and the summary lists the calls.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from _record import record_line, save_result  # noqa: E402

from figures import FILES, ratios, targets  # noqa: E402


def device_name(summary: dict) -> str:
    smi = summary.get("device", {}).get("nvidia_smi")
    if smi:
        return smi.split(",")[0].strip()
    j = summary.get("device", {}).get("jax") or {}
    return j.get("kind") or "unknown"


def device_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; 'cpu' -> 'cpu'."""
    m = re.search(r"\b([A-Z]+\d{2,4}[A-Za-z]*)\b", name)
    return (m.group(1) if m else re.sub(r"[^A-Za-z0-9]+", "_", name)).lower()


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def line_pytest(r: dict) -> str:
    c = r.get("counts", {})
    if not any(k in c for k in ("passed", "failed", "skipped", "error", "errors")) and r.get("outcomes"):
        # stopped before pytest's summary (its header's "N deselected" is no summary): count the per-test lines
        c = {k: sum(v == k for v in r["outcomes"].values()) for k in ("passed", "failed", "skipped")}
    bad = [k for k, v in r.get("outcomes", {}).items() if v in ("failed", "error")]
    return (f"{c.get('passed', 0)} passed, {c.get('failed', 0)} failed, {c.get('skipped', 0)} skipped"
            + (f"; failing: {', '.join(bad)}" if bad else "") + (" (stopped at its time cap)" if r.get("timed_out")
                                                                  else ""))


def line_train(r: dict) -> str:
    parts = []
    for m, e in r.get("models", {}).items():
        j, s = e.get("jaxembed", {}), e.get("st", {})
        fj, fs = j.get("fixed", {}), s.get("fixed", {})
        both_fixed = "examples_per_s" in fj and "examples_per_s" in fs  # then compared below
        bits = []
        for k, d in (("fixed", None if both_fixed else j.get("fixed")), ("packed", j.get("packed")),
                     ("padded", j.get("padded")), ("ST", s.get("natural")),
                     (f"ST padding-free [{(s.get('flat') or {}).get('attention')}]", s.get("flat")),
                     ("ST fixed", None if both_fixed else s.get("fixed"))):
            if d and "examples_per_s" in d:
                mem = d.get("device_peak_gib", d.get("xla_step_gib"))
                bits.append(f"{k} {d['examples_per_s']:.0f} ex/s, {d['real_tokens_per_s'] / 1e3:.0f}k real tok/s, "
                            f"MFU {_pct(d.get('mfu'))} (real tokens {_pct(d.get('mfu_real_tokens'))})"
                            + (f", {mem:.1f} GiB" if mem is not None else ""))
            elif d:
                bits.append(f"{k} " + ("skipped" if "skipped" in d else "failed"))
        txt = f"{m} B={e.get('batch')}: " + "; ".join(bits)
        if "ratio_packed_over_st" in e:
            txt += f": packed/ST **{e['ratio_packed_over_st']:.2f}x**"
        if "ratio_packed_over_padded" in e:
            txt += f", packed/padded {e['ratio_packed_over_padded']:.2f}x"
        if both_fixed:
            txt += (f"; fixed {fj.get('q_len')}/{fj.get('d_len')}: {fj['examples_per_s']:.0f} vs "
                    f"{fs['examples_per_s']:.0f} ex/s ({e.get('ratio_fixed_over_st', 0):.2f}x, MFU "
                    f"{_pct(fj.get('mfu'))} vs {_pct(fs.get('mfu'))})")
        parts.append(txt)
    return "; ".join(parts) or "no figures"


def line_batch(r: dict) -> str:
    if "largest_global_batch" not in r:
        return "no figures"
    rel = r.get("relative_to_reference", {})
    curve = ", ".join(f"B={b}: {v['step_time_ratio']:.2f}x (ideal {v['ideal']:.0f}x)" for b, v in rel.items())
    ov = r.get("cache_overhead")
    return (f"largest global batch **{r['largest_global_batch']}** ({r['largest_candidates']} candidates); step time "
            f"relative to B={r['sizes'][0]}: {curve}"
            + (f"; gradient-cache overhead at B={r['overhead'][0]['global_batch']}: **{ov:.2f}x**" if ov else ""))


def line_encode(r: dict) -> str:
    out = []
    for m, e in r.get("models", {}).items():
        if "ratio" in e:
            out.append(f"{m}: jaxembed {e['jaxembed_texts_per_s']:.0f} texts/s vs ST {e['st_texts_per_s']:.0f}: "
                       f"**{e['ratio']:.2f}x** (embeddings' max abs difference {e['max_abs_diff']:.2g})")
        else:
            out.append(f"{m}: " + ("skipped" if "skipped" in e else "failed"))
    return "; ".join(out) or "no figures"


def line_train_compare(r: dict) -> str:
    """Each model's arms as slots saved x speed per computed slot (figures.compare)."""
    out = []
    for m, e in r.get("models", {}).items():
        c = e.get("compare", {})
        bits = [f"{k.replace('_vs_st_', ' vs ST ')} {v['summary']}" for k, v in c.items()]
        if bits:
            out.append(f"{m}: " + "; ".join(bits))
    return "; ".join(out)


def line_long(r: dict) -> str:
    out = []
    for m, e in r.get("models", {}).items():
        for L, row in e.get("rows", {}).items():
            bits = []
            for k, d in row.items():
                if k in ("layout", "choice", "error"):
                    continue
                if "step_s" in d:
                    fit = d.get("largest_batch_predicted")
                    bits.append(f"{k} {1e3 * d['step_s']:.0f} ms, {d.get('xla_step_gib', 0):.1f} GiB"
                                + (f", fits B~{fit}" if fit else ""))
                else:
                    bits.append(f"{k} " + ("skipped" if "skipped" in d else "failed"))
            ch = row.get("choice", {}).get("fastest")
            out.append(f"{m} rows {L}: " + ", ".join(bits) + (f" (fastest **{ch}**)" if ch else ""))
    return "; ".join(out) or "no figures"


def line_llm(r: dict) -> str:
    out = []
    for m, e in r.get("models", {}).items():
        j = e.get("jaxembed", {})
        bit = f"{m} {j.get('mode', '')}: jaxembed "
        if "step_s" in j:
            bit += (f"B={j['global_batch']} (cache {j.get('chunk')}): {j['real_tokens_per_s'] / 1e3:.1f}k tok/s, "
                    f"MFU {_pct(j.get('mfu'))}, {j.get('device_peak_gib') or j.get('xla_step_gib', 0):.1f} GiB")
        else:
            bit += "skipped" if "skipped" in j else ("failed" if j else "not run")
        if "st_largest_batch" in e:
            bit += (f"; ST + PEFT largest B={e['st_largest_batch']}, {e['st_best_tokens_per_s'] / 1e3:.1f}k tok/s"
                    + (f": **{e['tokens_ratio']:.2f}x**" if "tokens_ratio" in e else ""))
        out.append(bit)
    return "; ".join(out) or "no figures"


SETTINGS = {
    "pytest": "`pytest -m gpu` (attention kernels vs XLA, MFU / memory in the metrics, bf16 vs fp32, 80k candidates)",
    "train": "train step, bf16 compute / fp32 master weights, shared snli + wikiqa natural lengths (the plan's "
             "steps of its most common padded shape) and 4 fixed-length batches, back to back, one device sync a "
             "round, 1 pos + 1 hard neg, AdamW; random weights of real configs; ST: MultipleNegativesRankingLoss, "
             "bf16 autocast, the HF trainer's fused AdamW",
    "batch": "{model}, 1 pos + 5 hard negs, gradient cache + tiled loss, q {q_len} / d {d_len} tokens",
    "encode": "encode, bf16, snli + wikiqa texts, random weights of real configs",
    "long": "long documents (lengths of the shared 20 Newsgroups sample, cut at 512 / 1,024), packed rows of "
            "512-2,048 slots, each attention kernel in the full train step (dropout off), bf16",
    "llm": "LLM embedders at size, 512-token documents: jaxembed (full fine-tuning or LoRA + remat, gradient cache) "
           "vs sentence-transformers' recipe (PEFT LoRA, gradient checkpointing), random weights of real configs",
}
LINES = {"pytest": line_pytest, "train": line_train, "batch": line_batch, "encode": line_encode, "long": line_long,
         "llm": line_llm}


def _measured(d) -> bool:
    return isinstance(d, dict) and "examples_per_s" in d


def merge_train(results: list[dict]) -> dict:
    """Part 2 of several calls as one: per model and tool, each setting's arm from the last call that measured it
    (else the last that tried it, skipped or failed), tagged with its ``call`` (the index in ``results``); setup,
    compile and profile entries likewise; then the ratios (figures.ratios) and todo over the merged arms."""
    out = {k: v for k, v in results[-1].items() if k not in ("models", "todo")}
    out["models"], out["todo"] = {}, []
    for i, r in enumerate(results):
        for m, e in r.get("models", {}).items():
            dst = out["models"].setdefault(m, {"batch": e.get("batch"), "jaxembed": {}, "st": {}})
            for tool in ("jaxembed", "st"):
                for setting, arm in e.get(tool, {}).items():
                    if _measured(arm) or not _measured(dst[tool].get(setting)):
                        dst[tool][setting] = dict(arm, call=i)
            for k in ("setup", "compile", "profile"):
                for sub, v in (e.get(k) or {}).items():
                    dst.setdefault(k, {})[sub] = dict(v, call=i) if isinstance(v, dict) else v
    # every arm some call was asked for (its "setting"), measured or not
    asked = {tool: [s for r in results for s in (r.get("setting") or {}).get(key, [])]
             for tool, key in (("jaxembed", "jax_settings"), ("st", "st_settings"))}
    for m, e in out["models"].items():
        e.update(ratios(e))
        missing = [f"{tool} {s}" for tool in ("jaxembed", "st") for s in dict.fromkeys(asked[tool] + list(e[tool]))
                   if not _measured(e[tool].get(s))]
        if missing:
            e["missing"] = missing
            out["todo"].append(f"{m}:{e['batch']}")
    return out


def merge(folders: list[Path]) -> tuple[dict, dict]:
    """(summary, {part: result}) of several calls' folders: part 2 merged arm by arm (merge_train), any other part
    from the last call that ran it; the targets computed again; ``calls`` lists each call's start and arguments."""
    summaries = [json.loads((f / "summary.json").read_text(encoding="utf-8")) for f in folders]
    per_call = [_parts_of(f) for f in folders]
    parts: dict = {}
    for part in FILES:
        found = [p[part] for p in per_call if part in p]
        if found:
            parts[part] = merge_train(found) if part == "train" and len(found) > 1 else found[-1]
    summary = dict(summaries[-1], calls=[{k: s.get(k) for k in ("started", "argv", "device", "todo")}
                                         for s in summaries])
    summary["targets"] = targets(parts)
    summary["todo"] = {k: v for s in summaries for k, v in (s.get("todo") or {}).items()}
    if "train" in parts:
        summary["todo"]["train"] = parts["train"]["todo"]
    summary["todo"] = {k: v for k, v in summary["todo"].items() if v}
    return summary, parts


def command_of(summary: dict) -> str:
    """The call's command line (run.sh with its arguments, --out as $OUT), one per merged call."""
    def one(argv):
        args, skip = [], False
        for a in argv or []:
            if skip:
                skip = False
                continue
            if a == "--out":
                skip = True
                continue
            args.append(a)
        return "`" + " ".join(["bash benchmarks/gpu/run.sh $OUT"] + args) + "`"
    calls = summary.get("calls") or [summary]
    return "; then ".join(one(c.get("argv")) for c in calls)


def _parts_of(folder: Path) -> dict:
    """{part: result} of the part files one call wrote."""
    return {part: json.loads((folder / fname).read_text(encoding="utf-8"))
            for part, fname in FILES.items() if (folder / fname).is_file()}


def record(folder, results_dir=None, readme=None) -> list[str]:
    """Record one call's folder, or several calls' folders merged (``merge``)."""
    folders = [Path(f) for f in folder] if isinstance(folder, (list, tuple)) else [Path(folder)]
    if len(folders) > 1:
        summary, parts = merge(folders)
    else:
        summary = json.loads((folders[0] / "summary.json").read_text(encoding="utf-8"))
        parts = _parts_of(folders[0])
    return _record(summary, parts, results_dir, readme)


def _record(summary: dict, parts: dict, results_dir, readme) -> list[str]:
    name = device_name(summary)
    slug = device_slug(name)
    if summary.get("dry_run"):
        name += " (dry run, tiny sizes)"
    lines = []
    for part, r in parts.items():
        r = dict(r, device=name, summary={k: summary.get(k) for k in ("date", "device", "versions", "targets",
                                                                       "round_spread", "todo", "next_command",
                                                                       "dry_run", "calls")})
        save_result(f"gpu_{part}_{slug}", r, Path(results_dir) if results_dir else None)
        setting = SETTINGS[part].format(model=r.get("model"), q_len=r.get("q_len"), d_len=r.get("d_len"))
        result = LINES[part](r)
        if part == "train" and line_train_compare(r):
            result += "; " + line_train_compare(r)
        result = result.replace("|", "/")  # a table cell
        if len(summary.get("calls") or []) > 1:
            setting += (f" ({len(summary['calls'])} runs on one machine merged, each arm from the run that "
                        "measured it)")
        line = f"| {summary.get('date')} | gpu {part} | {name} | {setting} | {result} | {command_of(summary)} |"
        lines.append(record_line(line, readme=Path(readme) if readme else None))
    save_result(f"gpu_summary_{slug}", summary, Path(results_dir) if results_dir else None)
    return lines
