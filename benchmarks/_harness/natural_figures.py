"""The natural-length figures of benchmarks/train_throughput.py: each tool's step, examples/s, CPU seconds and peak
memory over its rounds, the paired ratios (wall time and CPU time) between jaxembed packed / padded and
sentence-transformers, and their README phrases.
"""

from __future__ import annotations

import statistics

NATURAL_TOOLS = ("jaxembed-packed", "jaxembed-padded", "st")
BUSY_LOAD = 2.5  # a figure measured while the 1-minute load average was above this is labelled busy


def natural_ratios(row: dict, steps: int, B: int) -> None:
    """Each tool's step (median over its rounds of the mean step of the same batches), examples/s, CPU seconds
    per step, peak memory, and the ratios: per round of the same phase, the reference's time over the tool's for
    the same batches, the median over rounds; by wall time (``ratio_*``) and by each process's CPU time
    (``ratio_per_cpu_s_*``: on a busy machine a process waits for a core, which its CPU time does not count)."""
    ok = {}
    for t in NATURAL_TOOLS:
        r = row.get(t)
        if not r or not r.get("rounds") or "error" in r:
            continue
        per_round = [x["total_s"] / steps for x in r["rounds"]]
        r["step_s"] = statistics.median(per_round)
        r["step_s_rounds"] = per_round
        r["examples_per_s"] = B / r["step_s"]
        r["cpu_s_per_step"] = statistics.median(x["cpu_s"] / steps for x in r["rounds"])
        r["examples_per_cpu_s"] = B / r["cpu_s_per_step"] if r["cpu_s_per_step"] else None
        r["cpu_utilisation"] = sum(x["cpu_s"] for x in r["rounds"]) / sum(x["total_s"] for x in r["rounds"])
        r["load_average_max"] = max(x["load_average_after"] for x in r["rounds"])
        ok[t] = r

    def paired(a: str, b: str, key: str = "total_s") -> list[float]:
        """time(b) / time(a) per (phase, round) where both ran."""
        ta = {(x["phase"], x["round"]): x[key] for x in ok[a]["rounds"]}
        return [x[key] / ta[(x["phase"], x["round"])] for x in ok[b]["rounds"] if (x["phase"], x["round"]) in ta]

    for t in ("jaxembed-packed", "jaxembed-padded"):
        if t in ok and "st" in ok:
            for name, key in (("ratio", "total_s"), ("ratio_per_cpu_s", "cpu_s")):
                v = paired(t, "st", key)
                row[f"{name}_{t}_over_st_rounds"] = v
                row[f"{name}_{t}_over_st"] = statistics.median(v)
    if "jaxembed-packed" in ok and "jaxembed-padded" in ok:
        for name, key in (("ratio", "total_s"), ("ratio_per_cpu_s", "cpu_s")):
            v = paired("jaxembed-packed", "jaxembed-padded", key)
            if v:
                row[f"{name}_packed_over_padded_rounds"] = v
                row[f"{name}_packed_over_padded"] = statistics.median(v)
            elif f"{name}_jaxembed-packed_over_st" in row and f"{name}_jaxembed-padded_over_st" in row:
                row[f"{name}_packed_over_padded"] = (row[f"{name}_jaxembed-packed_over_st"]  # other phases:
                                                     / row[f"{name}_jaxembed-padded_over_st"])  # via ST
        row["peak_rss_packed_over_padded"] = (ok["jaxembed-packed"]["peak_rss_mib"]
                                              / ok["jaxembed-padded"]["peak_rss_mib"])
    if "jaxembed-packed" in ok and "st" in ok:
        row["peak_rss_packed_over_st"] = ok["jaxembed-packed"]["peak_rss_mib"] / ok["st"]["peak_rss_mib"]
    loads = [x[k] for x in row.get("rounds", []) for k in ("load_average_before", "load_average_after")]
    if loads:
        row["load_average_range"] = [min(loads), max(loads)]
        row["busy"] = max(loads) > BUSY_LOAD



def natural_ratio_text(r: dict) -> list[str]:
    out = []
    for key, label in (("jaxembed-packed_over_st", "packed/ST"), ("jaxembed-padded_over_st", "padded/ST"),
                       ("packed_over_padded", "packed/padded")):
        if f"ratio_{key}" in r:
            bold = "**" if key == "jaxembed-packed_over_st" else ""
            out.append(f"{label} {bold}{r[f'ratio_{key}']:.2f}x{bold}"
                       + (f" (per CPU-second {r[f'ratio_per_cpu_s_{key}']:.2f}x)"
                          if f"ratio_per_cpu_s_{key}" in r else ""))
    if "peak_rss_packed_over_padded" in r:
        out.append(f"peak RSS packed/padded {r['peak_rss_packed_over_padded']:.2f}")
    return out



def natural_figures(rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        threads = r["threads_per_tool"] if isinstance(r["threads_per_tool"], int) else 0
        model = r["model"] + (" (random weights)" if r.get("random_weights") else "")
        lo, hi = r.get("load_average_range", [float("nan")] * 2)
        head = (f"{model} {r['data']} B={r['global_batch']} ({threads_text(threads)}, load {lo:.1f}-{hi:.1f}"
                + (", busy" if r.get("busy") else "") + ")")
        parts = []
        for k, label in (("jaxembed-packed", "packed"), ("jaxembed-padded", "padded"), ("st", "ST")):
            v = r.get(k)
            if v is None:
                continue
            if "step_s" in v:
                parts.append(f"{label} {v['step_s']:.2f} s/step ({v['cpu_s_per_step']:.2f} CPU-s), real tokens "
                             f"{100 * v['real_fraction']:.0f}%, {v['peak_rss_mib'] / 1024:.2f} GiB peak RSS")
            else:
                parts.append(f"{label} failed ({v.get('error', '')[:80]})")
        out.append(f"{head}: {', '.join(parts)}: {', '.join(natural_ratio_text(r))}")
    return out



def threads_text(threads: int) -> str:
    return f"{threads} core(s) per tool" if threads else "all cores"
