"""Scores of trained models: jaxembed's local evaluators (with Matryoshka views) and the mteb cross-check, and the
statistics over seeds that every comparison reports: per task, the average over the tasks, the STS average
(Data-CUBE's measure) and each task type's (MoTE's), as the mean over seeds with the seeds' spread; one arm against
a reference over the seeds both have (paired differences)."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from .proc import log

#: Data-CUBE's measure: the average over the STS tasks
STS_TASKS = ("STSBenchmark", "SICK-R")
DIMS = (256, 128, 64)  # the Matryoshka views every model is also scored at


def run_eval(rundir: Path, model_dir: str, tasks: str, max_examples: int, experts=None) -> dict:
    """The local evaluators on ``tasks`` (a sample of ``max_examples`` per task, 0 = all) at full width and at the
    Matryoshka views DIMS, with MoTE's routing table ``experts``; kept in rundir/eval.json and reused while the
    settings are the same."""
    out = rundir / "eval.json"
    key = f"{tasks}|{max_examples}|{DIMS}|{experts}"
    if out.exists():
        prev = json.loads(out.read_text())
        if prev.get("key") == key:
            return prev["results"]
    from jaxembed.evaluate import evaluate

    t0 = time.time()
    # a Path, not a str: jaxembed.evaluate's as_encoder takes anything with .encode for an encoder (str has one)
    res = evaluate(Path(model_dir), tasks, dims=list(DIMS), max_examples=max_examples or None, experts=experts)
    log(f"  evaluated {rundir.name} in {time.time() - t0:.0f}s: " +
        ", ".join(f"{t} {r['main_score']:.2f}" for t, r in res.items()))
    out.write_text(json.dumps({"key": key, "results": res}, indent=1) + "\n")
    return res


def mteb_check(runs: dict, task_names: str, max_examples: int, seed: int) -> dict:
    """mteb on ``task_names`` (comma list) for the base models of ``seed``: jaxembed's MTEB encoder for every tool's
    model, ST's own encoder for the sentence-transformers ones."""
    tasks = [t for t in task_names.split(",") if t]
    if not tasks:
        return {}
    import tempfile

    import mteb

    from jaxembed.evaluate import mteb_tasks, run_mteb
    from jaxembed.evaluate.mteb_adapter import scores_of

    out = {}
    for (tool, arm, s), r in runs.items():
        if arm != "base" or s != seed:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            mx = max_examples or None
            res = run_mteb(Path(r["model_dir"]), tasks, out=tmp, max_examples=mx)
            row = {t: {"local": r["eval"][t]["main_score"], "mteb_jaxembed_encoder": res[t]["main_score"]}
                   for t in tasks}
            if tool in ("st", "st_stock"):
                from sentence_transformers import SentenceTransformer

                st_model = SentenceTransformer(r["model_dir"], device="cpu")
                st_res = mteb.evaluate(st_model, mteb_tasks(tasks, max_examples=mx),
                                       cache=mteb.ResultCache(cache_path=tmp), overwrite_strategy="always",
                                       show_progress_bar=False, co2_tracker=False)
                for tr in st_res.task_results:
                    row[tr.task_name]["mteb_st_encoder"] = scores_of(tr)["main_score"]
        out[f"{tool}_s{s}"] = row
        log(f"  mteb {tool} seed {s}: {row}")
    return out


def summarize(runs: dict, tool: str, arm: str, seeds, dim: str | None = None) -> dict | None:
    """Per task: mean over seeds and the seeds' values; the average over tasks per seed, its mean and spread."""
    got = [runs[(tool, arm, s)] for s in seeds if (tool, arm, s) in runs]
    if not got:
        return None

    def score(r, t):
        e = r["eval"][t]
        return e["main_score"] if dim is None else e["dims"][dim]["main_score"]

    tasks = list(got[0]["eval"])
    per_task = {t: {"mean": statistics.mean(score(r, t) for r in got), "seeds": [score(r, t) for r in got]}
                for t in tasks}
    avgs = [statistics.mean(score(r, t) for t in tasks) for r in got]
    out = {"per_task": per_task, "average": statistics.mean(avgs), "average_seeds": avgs,
           "spread": (max(avgs) - min(avgs)) if len(avgs) > 1 else 0.0, "seeds": [s for s in seeds
                                                                                   if (tool, arm, s) in runs]}
    for key, group in task_groups(tasks).items():  # the STS average (Data-CUBE) and each task type's (MoTE)
        vals = [statistics.mean(score(r, t) for t in group) for r in got]
        out.setdefault("groups", {})[key] = {"tasks": group, "average": statistics.mean(vals), "seeds": vals,
                                             "spread": (max(vals) - min(vals)) if len(vals) > 1 else 0.0}
    return out


def task_groups(tasks) -> dict[str, list[str]]:
    """{"sts_average": the STS tasks of STS_TASKS (Data-CUBE's measure), "type:<Type>": the tasks of each MTEB task
    type (MoTE's per-type averages)}, over the evaluated tasks."""
    from jaxembed.evaluate.tasks import get_task

    out = {"sts_average": [t for t in tasks if t in STS_TASKS]} if any(t in STS_TASKS for t in tasks) else {}
    for t in tasks:
        out.setdefault(f"type:{get_task(t).type}", []).append(t)
    return out


def diff_row(runs, arm: str, ref: str, seeds, dim: str | None = None) -> dict | None:
    """arm vs ref over the seeds both have: averages, the difference per seed, its mean and spread, and the same for
    the STS average and each task type."""
    both = [s for s in seeds if ("jaxembed", arm, s) in runs and ("jaxembed", ref, s) in runs]
    a, b = (summarize(runs, "jaxembed", x, both, dim) for x in (arm, ref))
    if not both or a is None or b is None:
        return None

    def diff(x, y):
        d = [p - q for p, q in zip(x, y)]
        return {"difference": statistics.mean(d), "difference_seeds": d,
                "difference_spread": (max(d) - min(d)) if len(d) > 1 else 0.0}

    row = {"seeds": both, "reference": ref, "baseline_average": b["average"], "arm_average": a["average"],
           "baseline_average_seeds": b["average_seeds"], "arm_average_seeds": a["average_seeds"],
           "baseline_spread": b["spread"], "arm_spread": a["spread"], **diff(a["average_seeds"], b["average_seeds"]),
           "per_task": {t: {"baseline": b["per_task"][t]["mean"], "arm": a["per_task"][t]["mean"]}
                        for t in a["per_task"]}}
    row["groups"] = {k: {"baseline": b["groups"][k]["average"], "arm": g["average"], "tasks": g["tasks"],
                         "baseline_seeds": b["groups"][k]["seeds"], "arm_seeds": g["seeds"],
                         **diff(g["seeds"], b["groups"][k]["seeds"])}
                     for k, g in a.get("groups", {}).items()}
    return row
