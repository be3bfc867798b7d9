"""The ablation comparisons of benchmarks/quality_parity.py: each arm against the baseline (every Matryoshka view)
and against its references (the curriculum arms vs Vanilla, the balanced walk vs the cyclic one, MoTE with clustering
data vs the baseline with it); the README phrases and the markdown table of them.
"""

from __future__ import annotations

from .scoring import DIMS, diff_row

#: arms compared with another arm than the baseline too: arm -> [(key prefix, reference arm)]
REFERENCES = {**{a: [("vanilla", "curriculum_vanilla")] for a in ("curriculum", "curriculum_shuffled",
                                                                   "curriculum_masked")},
              "curriculum_balanced": [("vanilla", "curriculum_vanilla"), ("cyclic", "curriculum")],
              "mote_clustering": [("ic_clustering", "ic_clustering")]}


def ablation_rows(runs: dict, arms, seeds) -> dict:
    """Each arm vs the baseline ('base'; at 384 dims and every Matryoshka view), plus its REFERENCES (the curriculum
    arms vs Vanilla, the balanced walk vs the cyclic one, MoTE with clustering data vs the baseline with it) as
    ``difference_vs_<key>`` / ``vs_<key>``. Arms or references without a finished run are left out."""
    out = {}
    dims = DIMS if all("dims" in e for r in runs.values() for e in r["eval"].values()) else ()
    for a in arms:
        row = diff_row(runs, a, "base", seeds)
        if row is None:
            continue
        for d in dims:
            x = diff_row(runs, a, "base", seeds, str(d))
            row[f"dim{d}"] = {"baseline_average": x["baseline_average"], "arm_average": x["arm_average"],
                              "difference": x["difference"]}
        for key, ref in REFERENCES.get(a, []):
            v = diff_row(runs, a, ref, seeds)
            if v is not None:
                row[f"{key}_average"] = v["baseline_average"]
                row[f"difference_vs_{key}"] = v["difference"]
                row[f"difference_vs_{key}_seeds"] = v["difference_seeds"]
                row[f"vs_{key}"] = v
        out[a] = row
    return out



def ablation_parts(ablation: dict) -> list[str]:
    """One phrase per arm for the README line: vs base at every dimension, then vs its references."""
    return [f"{a} vs base (seeds {row['seeds']}): {row['difference']:+.2f} at 384"
            + "".join(f", {row[f'dim{d}']['difference']:+.2f} at {d}" for d in DIMS if f"dim{d}" in row)
            + "".join(f"; vs {ref} {row[f'difference_vs_{key}']:+.2f}" for key, ref in REFERENCES.get(a, [])
                      if f"difference_vs_{key}" in row)
            for a, row in ablation.items()]



def markdown_table(ablation: dict) -> str:
    """The comparisons as a markdown table: the average over the eval tasks, the STS average and each task type,
    difference as mean over seeds (spread over seeds), per seed."""
    lines = []
    for a, row in ablation.items():
        for key, r in [("base", row)] + [(k, row[f"vs_{k}"]) for k, _ in REFERENCES.get(a, [])
                                         if f"vs_{k}" in row]:
            if not lines:
                groups = list(r["groups"])
                lines.append("| arm | vs | seeds | all tasks | " + " | ".join(
                    g.replace("type:", "") for g in groups) + " | all tasks per seed |")
                lines.append("|" + "---|" * (len(groups) + 5))
            cell = lambda x: f"{x['difference']:+.2f} ({x['difference_spread']:.2f})"  # noqa: E731
            lines.append(f"| {a} | {r['reference']} | {len(r['seeds'])} | {cell(r)} | "
                         + " | ".join(cell(r["groups"][g]) if g in r["groups"] else "" for g in groups)
                         + " | " + " / ".join(f"{x:+.2f}" for x in r["difference_seeds"]) + " |")
    return "\n".join(lines)
