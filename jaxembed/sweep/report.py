"""``jaxembed sweep report DIR``: one row per run (its swept values, status, steps, final loss, best and final dev
metric), from a sweep root's ``sweep.json`` or any folder of run directories; as text, CSV, markdown, JSON and a
PNG (matplotlib, optional)."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import math
import os
from pathlib import Path
from typing import Any

from jaxembed.errors import UserError
from jaxembed.runs.rundir import RunDir
from jaxembed.sweep.expand import MANIFEST, short_keys
from jaxembed.sweep.run import read_json, run_status

REPORT = "sweep_report"


def _read_metrics(path: Path) -> tuple[dict[str, dict[int, dict]], int]:
    """metrics.jsonl -> {split: {step: record}} (a step logged again after a resume: the last record wins), and
    the number of unreadable lines."""
    out: dict[str, dict[int, dict]] = {}
    bad = 0
    if not path.exists():
        return out, 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            out.setdefault(rec.get("split", "train"), {})[int(rec["step"])] = rec
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            bad += 1
    return out, bad


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: json.dumps(d, sort_keys=True) if isinstance(d, (list, dict)) else d}


def _discover(root: Path) -> tuple[list[dict], list[str]]:
    """Runs of a sweep root (from sweep.json), or of any folder of run directories (keys: what differs)."""
    manifest = read_json(root / MANIFEST)
    if manifest:
        runs = [{"name": r["name"], "dir": root / r.get("dir", r["name"]), "overrides": r.get("overrides", {})}
                for r in manifest.get("runs", [])]
        return runs, list(manifest.get("keys", []))
    dirs = sorted(p for p in root.iterdir() if p.is_dir() and (RunDir(p).config_json.exists()
                                                               or RunDir(p).metrics_jsonl.exists()))
    if RunDir(root).metrics_jsonl.exists():
        dirs = [root]
    if not dirs:
        raise UserError(f"{root}: no {MANIFEST} and no run directories (config.json / metrics.jsonl) in it (fix: "
                        "give the --root of a sweep, or a folder of jaxembed runs)")
    flat = {d: _flatten(read_json(RunDir(d).config_json) or {}) for d in dirs}
    keys = sorted({k for f in flat.values() for k in f})
    ignore = ("export.dir", "data.store")
    varying = [k for k in keys if k not in ignore and len({repr(f.get(k)) for f in flat.values()}) > 1]
    runs = [{"name": d.name, "dir": d, "overrides": {k: str(flat[d].get(k)) for k in varying}} for d in dirs]
    return runs, varying


def _pick_metric(evals: list[dict[int, dict]], metric: str | None) -> str | None:
    if metric:
        return metric
    keys = sorted({k for e in evals for rec in e.values() for k in rec if k.endswith("/main_score")})
    return keys[0] if keys else None


def collect(root: str | os.PathLike, metric: str | None = None, mode: str | None = None) -> dict:
    """Everything the report shows, as a dict: metric, mode, keys and one row per run (with its curves)."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"{root}: no such folder (fix: the --root of a sweep)")
    runs, keys = _discover(root)
    cfgs = {r["name"]: read_json(RunDir(r["dir"]).config_json) or {} for r in runs}
    metrics = {r["name"]: _read_metrics(RunDir(r["dir"]).metrics_jsonl) for r in runs}
    if metric is None:
        configured = {c.get("eval", {}).get("best_metric") for c in cfgs.values()} - {None, ""}
        metric = min(configured) if configured else None
    metric = _pick_metric([m.get("eval", {}) for m, _ in metrics.values()], metric)
    if mode is None:
        modes = {c.get("eval", {}).get("best_mode") for c in cfgs.values()} - {None, ""}
        mode = modes.pop() if len(modes) == 1 else "max"
    rows = []
    for r in runs:
        name, cfg = r["name"], cfgs[r["name"]]
        (m, bad), st = metrics[name], run_status(r["dir"])
        train, evals = m.get("train", {}), m.get("eval", {})
        last = train[max(train)] if train else {}
        plan = read_json(RunDir(r["dir"]).plan_json) or {}
        row = {"run": name, **{k: r["overrides"].get(k, "") for k in keys}, "status": st["status"],
               "step": max(train) if train else None, "steps": plan.get("steps") or cfg.get("plan", {}).get("steps"),
               "loss": last.get("loss"), "accuracy": last.get("accuracy"), "best": None, "best_step": None,
               "final": None, "bad_lines": bad, "dir": str(r["dir"])}
        if st.get("status") == "failed" and st.get("error"):
            row["error"] = st["error"].strip().splitlines()[-1][:300]
        scored = [(s, rec[metric]) for s, rec in sorted(evals.items())
                  if metric and isinstance(rec.get(metric), (int, float)) and math.isfinite(rec[metric])]
        if scored:
            best = (max if mode == "max" else min)(scored, key=lambda x: x[1])  # ties: the earliest step
            row.update(best=best[1], best_step=best[0], final=scored[-1][1])
        row["loss_curve"] = [[s, rec["loss"]] for s, rec in sorted(train.items()) if "loss" in rec]
        row["metric_curve"] = [list(x) for x in scored]
        rows.append(row)
    ranked = [r for r in rows if r["best"] is not None]
    best_run = ((max if mode == "max" else min)(ranked, key=lambda r: r["best"])["run"] if ranked else None)
    return {"root": str(root), "metric": metric, "mode": mode, "keys": keys, "best_run": best_run, "runs": rows}


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _columns(rep: dict) -> list[tuple[str, str]]:
    metric = rep["metric"]
    cols = [("run", "run"), *[(k, short_keys(rep["keys"]).get(k, k)) for k in rep["keys"]], ("status", "status"),
            ("step", "step"), ("steps", "steps"), ("loss", "loss"), ("accuracy", "accuracy")]
    if metric:
        cols += [("best", f"best {metric}"), ("best_step", "best step"), ("final", f"final {metric}")]
    return cols


def format_report(rep: dict) -> str:
    """The report as a text table (the best run marked with *)."""
    cols = _columns(rep)
    body = [[_fmt(r.get(k)) + (" *" if k == "best" and r["run"] == rep["best_run"] else "") for k, _ in cols]
            for r in rep["runs"]]
    head = [h for _, h in cols]
    widths = [max(len(x) for x in [h] + [b[i] for b in body]) for i, h in enumerate(head)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    lines = [fmt(head), fmt(["-" * w for w in widths]), *[fmt(b) for b in body]]
    if rep["best_run"]:
        best = next(r for r in rep["runs"] if r["run"] == rep["best_run"])
        lines.append(f"best ({rep['mode']} {rep['metric']}): {best['run']}: {_fmt(best['best'])} at step "
                     f"{best['best_step']}")
    elif rep["metric"] is None:
        lines.append("no dev metric in any run (set config.eval.tasks / eval.every); the table shows the final "
                     "training loss")
    for r in rep["runs"]:
        if r.get("error"):
            lines.append(f"{r['run']}: failed: {r['error']}")
        if r.get("bad_lines"):
            lines.append(f"{r['run']}: {r['bad_lines']} unreadable line(s) in metrics.jsonl were skipped")
    return "\n".join(lines)


def _markdown(rep: dict) -> str:
    cols = _columns(rep)
    esc = lambda s: s.replace("|", "\\|")
    out = ["| " + " | ".join(esc(h) for _, h in cols) + " |", "|" + "---|" * len(cols)]
    for r in rep["runs"]:
        cells = [_fmt(r.get(k)) + (" **(best)**" if k == "best" and r["run"] == rep["best_run"] else "")
                 for k, _ in cols]
        out.append("| " + " | ".join(esc(c) for c in cells) + " |")
    return "\n".join(out) + "\n"


def _number(text: str) -> float | None:
    try:
        v = float(text)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def plot_report(rep: dict, path: Path) -> Path | None:
    """Training loss per run, and the best dev metric (else the final loss) against the first swept value (one line
    per combination of the other swept values). None when matplotlib is not installed."""
    if importlib.util.find_spec("matplotlib") is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    for r in rep["runs"]:
        if r["loss_curve"]:
            s, v = zip(*r["loss_curve"])
            ax1.plot(s, v, label=r["run"], marker="." if len(s) < 30 else None)
    ax1.set(title="training loss", xlabel="step", ylabel="loss")
    if any(r["loss_curve"] for r in rep["runs"]):
        ax1.legend(fontsize=7)
    y_key = "best" if rep["metric"] else "loss"
    y_label = f"best {rep['metric']}" if rep["metric"] else "final training loss"
    keys = rep["keys"]
    if keys:
        x_key, others = keys[0], keys[1:]
        xs = [r.get(x_key, "") for r in rep["runs"]]
        numeric = all(_number(x) is not None for x in xs) and len(set(xs)) > 4  # few values: one tick each
        order = sorted(set(xs), key=lambda x: (_number(x) is None, _number(x) or 0.0, x))
        series: dict[str, list] = {}
        for r in rep["runs"]:
            if r.get(y_key) is None:
                continue
            label = ",".join(f"{short_keys(keys)[k]}={r.get(k, '')}" for k in others) or y_label
            x = _number(r[x_key]) if numeric else order.index(r[x_key])
            series.setdefault(label, []).append((x, r[y_key]))
        for label, pts in series.items():
            pts.sort()
            ax2.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        if numeric and all(_number(x) > 0 for x in xs) and max(map(_number, xs)) / min(map(_number, xs)) >= 10:
            ax2.set_xscale("log")
        if not numeric:
            ax2.set_xticks(range(len(order)), order)
        ax2.set(title=f"{y_label} by {x_key}", xlabel=x_key, ylabel=y_label)
        if series:
            ax2.legend(fontsize=7)
    else:
        ax2.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(rep: dict, prefix: Path, plot: bool = True) -> dict[str, Path | None]:
    """CSV, markdown, JSON and (when matplotlib is importable) PNG next to each other: ``PREFIX.{csv,md,json,png}``."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    cols = _columns(rep)
    out: dict[str, Path | None] = {}
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow([k for k, _ in cols] + ["dir"])
    for r in rep["runs"]:
        w.writerow(["" if r.get(k) is None else r.get(k) for k, _ in cols] + [r["dir"]])
    out["csv"] = prefix.with_suffix(".csv")
    out["csv"].write_text(buf.getvalue())
    out["md"] = prefix.with_suffix(".md")
    out["md"].write_text(_markdown(rep))
    out["json"] = prefix.with_suffix(".json")
    out["json"].write_text(json.dumps(rep, indent=2, allow_nan=True) + "\n")
    out["png"] = plot_report(rep, prefix.with_suffix(".png")) if plot else None
    return out

