"""The facts of a training run that its model card states: the dev evaluations (``eval_rows``, ``final_eval``,
``eval_at`` from metrics.jsonl, each task's MTEB metadata) and the run's summary facts (``summary_facts``:
training time over every invocation, devices, the last evaluation)."""

from __future__ import annotations

import json
import os

from jaxembed.runs.rundir import RunDir


def _task_meta(entry: str, eval_tasks) -> dict:
    """Type, dataset and split of one ``eval.tasks`` entry (its metric prefix)."""
    from jaxembed.evaluate.dev import MTEB_PREFIX
    from jaxembed.evaluate.tasks import TASKS

    if entry.startswith(MTEB_PREFIX):
        name = entry[len(MTEB_PREFIX):]
        try:
            import mteb

            md = mteb.get_task(name).metadata
            ds = dict(md.dataset or {})
            return dict(type=md.type, dataset_type=ds.get("path") or name, dataset_name=f"MTEB {name}",
                        split=(list(md.eval_splits) or [None])[0], config="default", revision=ds.get("revision"),
                        main=md.main_score, source="mteb")
        except Exception:  # noqa: BLE001 -- mteb missing or the task renamed: the name is still honest
            return dict(type="unknown", dataset_type=name, dataset_name=f"MTEB {name}", split=None, main=None,
                        source="mteb")
    t = TASKS.get(entry)
    if t is not None:
        return dict(type=t.type, dataset_type=entry, dataset_name=f"{entry} ({', '.join(t.files.values())})",
                    split=t.hf_split, main=t.main_score, source="jaxembed")
    from jaxembed.evaluate.user_tasks import TYPE_NAMES, is_spec

    for spec in eval_tasks or ():
        if is_spec(spec) and dict(spec).get("name") == entry:
            spec = dict(spec)
            path = str(spec.get("path", ""))
            kind = spec.get("type")
            return dict(type=TYPE_NAMES.get(kind, kind) or "unknown", dataset_type=entry,
                        dataset_name=f"{entry} ({os.path.basename(path.rstrip('/')) or path})",
                        split=spec.get("split") or "dev", main=None, source="user")
    return dict(type="unknown", dataset_type=entry, dataset_name=entry, split=None, main=None, source="unknown")


def eval_rows(metrics: dict[str, float], eval_tasks=()) -> list[dict]:
    """``{"Task/metric": value}`` (one evaluation, as logged) -> one row per task: its meta and ``metrics`` =
    [(name, value)], the task's main metric first, ``main_score`` left out when it repeats a named metric."""
    by_task: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        task, sep, metric = key.rpartition("/")
        if sep and isinstance(value, (int, float)) and value == value:
            by_task.setdefault(task, {})[metric] = float(value)
    rows = []
    for task, ms in by_task.items():
        meta = _task_meta(task, eval_tasks)
        main = meta.get("main")
        if main is None and "main_score" in ms:
            main = next((k for k, v in ms.items() if k != "main_score" and v == ms["main_score"]), None)
        named = [(k, v) for k, v in ms.items() if k != "main_score"]
        if not named:
            named = [("main_score", ms["main_score"])]
        named.sort(key=lambda kv: (kv[0] != main, kv[0]))
        rows.append({**meta, "task": task, "main": main, "metrics": named})
    return rows


def final_eval(rd: RunDir, summary: dict | None) -> dict | None:
    """The last evaluation of a run: ``summary['eval']`` ({"step", "metrics"}), else the last ``eval`` record of
    metrics.jsonl (the latest step; on a tie, the one written last)."""
    if summary and isinstance(summary.get("eval"), dict) and summary["eval"].get("metrics"):
        return summary["eval"]
    best = None
    for r in eval_records(rd):
        if best is None or r["step"] >= best["step"]:
            best = r
    return best


def eval_at(rd: RunDir, step: int) -> dict | None:
    """The dev evaluation of ``step`` in metrics.jsonl ({"step", "metrics"}; the one written last), or None. Step 0
    is the model the run started from, evaluated before training (``eval.before``)."""
    return _record_at(eval_records(rd), step)


def _record_at(records: list[dict], step: int) -> dict | None:
    """The last of ``records`` (``eval_records``) at ``step``, or None."""
    return next((r for r in reversed(records) if r["step"] == step), None)


def eval_records(rd: RunDir) -> list[dict]:
    """The ``eval`` records of metrics.jsonl, in order, as {"step", "metrics"}."""
    try:
        lines = rd.metrics_jsonl.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    out = []
    for line in lines:
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(r, dict) and r.get("split") == "eval" and isinstance(r.get("step"), int):
            out.append({"step": r["step"], "metrics": {k: v for k, v in r.items()
                                                       if k not in ("step", "split", "time")}})
    return out


def skipped_note(skipped: int, steps: int) -> str:
    """The sentence the end of a run, its summary.json (``warnings``) and its model card say when updates were
    skipped (a non-finite loss or gradient: jaxembed.train.step's guard); '' when none was."""
    if not skipped:
        return ""
    left = steps - skipped
    applied = ("none was applied: the parameters are the starting model's" if left <= 0 else
               f"only {left} {'was' if left == 1 else 'were'} applied")
    return (f"{skipped} of {steps} training updates were skipped (a non-finite loss or gradient), so {applied} "
            "(metrics.jsonl: 'skipped' at each logged step; fix: lower optim.lr or raise loss.temperature, use "
            "model.dtype=float32, or check the data of the steps that skipped)")


def export_line(out_dir: str | os.PathLike, step: int, rd: RunDir, metric: str = "") -> str:
    """The end-of-run line: the step the export holds and its dev score (``metric``, else each task's main
    score), beside the starting model's when it was evaluated (step 0, ``eval.before``)."""
    line = f"export: step {step} in {out_dir}"
    records = eval_records(rd)
    if not records:
        return line
    at, start = _record_at(records, step), _record_at(records, 0) if step else None
    if at is None:
        return line + " (that step has no dev evaluation)"
    keys = [metric] if metric in at["metrics"] else sorted(k for k in at["metrics"] if k.endswith("/main_score"))
    shown = []
    for k in keys:
        before = (start or {}).get("metrics", {}).get(k)
        shown.append(f"{k} {at['metrics'][k]:.4g}" + (f" (before training {before:.4g})" if before is not None
                                                          else ""))
    return line + (f"; dev {', '.join(shown)}" if shown else "")


def summary_facts(rd: RunDir, t_begin: float) -> dict:
    """What summary.json records for the card, at the end of ``jaxembed train`` (process 0):

    - ``time``: ``this_run_s`` (this invocation, wall clock), ``total_s`` and ``invocations`` (every invocation on
      this workdir that wrote a summary.json, this one included; one killed before writing it is not counted);
    - ``devices``: platform, device kind, device and process counts;
    - ``eval``: the last dev evaluation (``final_eval``: step and metrics), when there was one."""
    import time

    import jax

    now = time.time() - t_begin
    prev: dict = {}
    try:
        prev = json.loads(rd.summary_json.read_text(encoding="utf-8")).get("time") or {}
    except (OSError, ValueError, AttributeError):
        prev = {}
    try:
        total = float(prev.get("total_s", 0.0)) + now
        n = int(prev.get("invocations", 0)) + 1
    except (TypeError, ValueError):
        total, n = now, 1
    devs = jax.devices()
    out = {"time": {"this_run_s": round(now, 3), "total_s": round(total, 3), "invocations": n},
           "devices": {"platform": jax.default_backend(), "kind": devs[0].device_kind, "count": len(devs),
                       "processes": jax.process_count()}}
    ev = final_eval(rd, None)
    if ev:
        out["eval"] = ev
    return out


# ------------------------------------------------------------------------------------------------ cards
