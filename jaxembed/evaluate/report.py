"""What ``jaxembed eval`` runs and prints (``jaxembed/evaluate/cli.py`` parses the arguments and calls
``evaluate_and_report``): the model loaded, the entries selected and checked before it loads, the local evaluators
and ``mteb:NAME`` tasks scored with a table on stdout (per-task lines on stderr), or ``mteb.evaluate`` with its own
table; the scores written as JSON.

- ``select_tasks``: ``--tasks`` (names, ``all`` / ``dev`` / ``eval``, ``mteb:NAME``, ``FILE.json`` lists) and
  ``--task`` (a user's own sets, ``parse_task_specs``) -> local tasks, MTEB names, the user sets' prompts; every
  entry checked by the trainer's ``eval.tasks`` rules (``jaxembed.evaluate.dev.parse_eval_tasks``).
- ``read_prompts``: the ``--prompts`` file; ``load_model``: the model folder / workdir / hub id.
- ``report_local`` / ``report_mteb``: score and print; ``format_mteb_table``: the ``--mteb`` table.

Import order of jaxembed.evaluate: ``prompts`` <- ``tasks`` <- ``runner`` (and ``dev``, ``mteb_adapter``) <-
``report``; nothing imports this module but the CLI.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from jaxembed.errors import UserError
from jaxembed.evaluate.prompts import DEFAULT_INSTRUCTION_TEMPLATE


def read_json(flag: str, path: str):
    """The JSON file given to ``flag``: every way it can be wrong is one line naming the flag and the file."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise UserError(f"{flag} {path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{flag} {path}: is a folder (fix: pass a .json file)") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{flag} {path}: not valid UTF-8 ({e.reason} at byte {e.start}) (fix: re-encode the "
                        "file as UTF-8)") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{flag} {path}: invalid JSON at line {e.lineno}: {e.msg}") from None


def read_prompts(path: str | None) -> dict | None:
    """The ``--prompts`` file: a JSON object of strings keyed like mteb (None: no file)."""
    if path is None:
        return None
    obj = read_json("--prompts", path)
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in obj.items()):
        raise UserError(f'--prompts {path}: expected a JSON object of strings, e.g. {{"STS": "...", "query": "..."}}')
    return obj


def load_model(model: str, **load_kwargs):
    """``jaxembed.loading.load`` of a model folder, a training workdir (its ``export/``) or a hub id."""
    from jaxembed import loading
    from jaxembed.evaluate.prompts import resolve_model_path

    return loading.load(resolve_model_path(model), **load_kwargs)


def parse_task_specs(items: Sequence[str]) -> list[dict]:
    """``--task`` values -> user set specs: ``key=value,key=value`` or a JSON object."""
    out = []
    for i, text in enumerate(items):
        w = f"--task[{i}]"
        if text.lstrip().startswith("{"):
            try:
                spec = json.loads(text)
            except json.JSONDecodeError as e:
                raise UserError(f"{w}: invalid JSON at column {e.colno}: {e.msg}") from None
            if not isinstance(spec, dict):
                raise UserError(f"{w}: expected a JSON object of the set's keys, got {type(spec).__name__}")
        else:
            spec = {}
            for part in text.split(","):
                key, eq, value = part.partition("=")
                if not eq or not key.strip():
                    raise UserError(f"{w}: {part!r} is not KEY=VALUE (fix: name=my-sts,type=sts,path=dev/sts.csv; "
                                    "a JSON object for values with commas)")
                spec[key.strip()] = value.strip()
        out.append(spec)
    return out


def _tasks_file(path: str) -> list:
    """A ``--tasks`` JSON file: a list of eval.tasks entries."""
    obj = read_json("--tasks", path)
    if not isinstance(obj, list):
        raise UserError(f"--tasks {path}: expected a JSON list of tasks (names, \"mteb:NAME\", objects with name, "
                        f"type, path), got {type(obj).__name__}")
    return obj


def select_tasks(tasks: str | None, task_specs: Sequence[str] = (), split: str | None = None):
    """-> (local Tasks, MTEB task names, the user sets' prompts), every entry checked (``parse_eval_tasks``: the
    trainer's eval.tasks rules) before the model loads. ``tasks``: the ``--tasks`` text (None: ``all``, or none
    when ``task_specs`` are given); ``task_specs``: the ``--task`` values; ``split`` maps the registered tasks to
    their variants."""
    from jaxembed.evaluate.dev import parse_eval_tasks
    from jaxembed.evaluate.tasks import resolve_tasks

    tasks = tasks if tasks is not None else ("" if task_specs else "all")
    items = [x.strip() for x in tasks.split(",") if x.strip()]
    groups = [([x for x in items if not x.endswith(".json")], "--tasks")]
    groups += [(_tasks_file(x), f"--tasks {x}") for x in items if x.endswith(".json")]
    groups.append((parse_task_specs(task_specs), "--task"))
    local, mteb, seen = [], [], {}
    for entries, where in groups:
        dev = parse_eval_tasks(entries, where)
        for t in dev.local:
            for v in [t] if t.user or split is None else resolve_tasks([t], split):
                if v.name in seen and seen[v.name] != where:
                    raise UserError(f"{where}: task {v.name!r} is also in {seen[v.name]} (fix: list each task "
                                    "once)")
                seen[v.name] = where
                if v not in local:
                    local.append(v)
        for n in dev.mteb:
            if n in mteb:
                raise UserError(f"{where}: mteb:{n} appears twice (fix: list each task once)")
            mteb.append(n)
    if not local and not mteb:
        raise UserError("--tasks: no tasks selected")
    prompts: dict[str, str] = {}
    for t in local:
        if t.user:
            prompts.update(t.instruction_prompts("{instruction}"))
    return local, mteb, prompts


def write_results(results: Mapping, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
        f.write("\n")
    print(f"wrote {out}")


def report_local(model: str, *, tasks: str | None = None, task_specs: Sequence[str] = (), split: str | None = None,
                 out: str | None = None, load_kwargs: Mapping[str, Any] | None = None, packing: bool = True,
                 quiet: bool = False, compare: str | None = None, **common) -> dict[str, dict]:
    """The local evaluators (and ``mteb:NAME`` entries, through the trainer's DevEvaluator): prints a table and a
    summary line on stdout, one line per task on stderr (unless ``quiet``), writes ``out`` (JSON) when given.
    ``common``: dims, batch_size, max_examples, seed, prompts, task_instructions, instruction_template (see
    ``jaxembed.evaluate.evaluate``). ``compare``: a base model scored on the same tasks, then both side by side
    (``out``: ``{"base": ..., "model": ...}``, each with its name, folder and results). -> {"Task": {"main_score":
    points, ...}} of ``model``."""
    from jaxembed.evaluate.prompts import model_label
    from jaxembed.evaluate.runner import format_comparison, format_table

    selected, mteb_names, user_prompts = select_tasks(tasks, task_specs, split)  # all checked before the model
    out_path = Path(out) if out else None
    if out_path is not None and out_path.is_dir():
        raise UserError(f"--out {out_path}: is a folder; pass a .json file")
    mteb_eval = None
    if mteb_names:  # their data loaded now (an MTEB task not available offline stops here)
        from jaxembed.evaluate.dev import MTEB_PREFIX, DevEvaluator

        mteb_eval = DevEvaluator([MTEB_PREFIX + n for n in mteb_names], seed=common.get("seed", 42),
                                 batch_size=common.get("batch_size", 64), where="--tasks")
    if user_prompts:  # a user set's instructions are its prompts (--prompts may override them)
        common["prompts"] = dict(user_prompts, **(common.get("prompts") or {}))
    from jaxembed.encode import Encoder
    from jaxembed.evaluate.runner import evaluate

    def score(name: str):
        """-> (the loaded model, its results): the table on stdout, a line per task on stderr."""
        loaded = load_model(name, **(load_kwargs or {}))
        encoder = Encoder.from_loaded(loaded)
        encoder.packing = packing
        times: dict[str, float] = {}

        def on_result(task, res, seconds):
            times[task.name] = seconds
            if not quiet:
                print(f"{task.name:<18} {task.main_score:<16} {res['main_score']:7.2f}  ({seconds:.1f}s)",
                      file=sys.stderr, flush=True)

        results: dict[str, dict] = {}
        if selected:
            results = evaluate(encoder, selected, progress=not quiet and sys.stderr.isatty(), on_result=on_result,
                               **common)
            print(format_table(results, selected, times))
        if mteb_eval is not None:
            t1 = time.time()
            scores = mteb_eval(encoder)
            for entry, res in scores.items():
                print(f"{entry}  {res['main_score']:.2f}  (mteb.evaluate, {time.time() - t1:.1f}s)")
            results.update(scores)
        return loaded, results

    t0 = time.time()
    base = None
    if compare is not None:
        print(f"base: {model_label(compare)}")
        base = score(compare)
        print(f"\nmodel: {model_label(model)}")
    loaded, results = score(model)
    label = model_label(model)
    print(f"\n{label} ({loaded.source}): {len(results)} tasks in {time.time() - t0:.1f}s")
    if base is not None:
        print(f"\nbase:  {model_label(compare)} ({base[0].source})\nmodel: {label} ({loaded.source})\n")
        print(format_comparison(base[1], results, selected, labels=("base", "model")))
    if out_path is not None:
        write_results(results if base is None else {
            "base": {"name": model_label(compare), "source": str(base[0].source), "results": base[1]},
            "model": {"name": label, "source": str(loaded.source), "results": results}}, out_path)
    return results


def format_mteb_table(results: Mapping[str, Mapping]) -> str:
    """The ``--mteb`` table: task, main score, then one column per Matryoshka dimension."""
    width = max([len(n) for n in results] + [4])
    dims = sorted({d for r in results.values() for d in r.get("dims", {})}, key=int)
    lines = [f"{'task':<{width}}  {'main_score':>10}" + "".join(f"  {'@' + d:>8}" for d in dims)]
    for name, r in results.items():
        lines.append(f"{name:<{width}}  {r['main_score']:>10.2f}" +
                     "".join(f"  {r['dims'][d]['main_score']:>8.2f}" if d in r.get("dims", {}) else " " * 10
                             for d in dims))
    return "\n".join(lines)


def report_mteb(model: str, tasks: str, *, out: str | None = None, split: str | None = None, name: str | None = None,
                load_kwargs: Mapping[str, Any] | None = None, packing: bool = True, quiet: bool = False,
                **common) -> dict[str, dict]:
    """``mteb.evaluate`` (``run_mteb``) on local task names (offline custom tasks) and / or MTEB tasks: mteb's
    result files under ``out`` (default ``mteb_results``), the table on stdout."""
    out_dir = Path(out or "mteb_results")
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out {out_dir}: is a file; --mteb writes a folder of mteb result files")
    # mteb creates its default result cache (~/.cache/mteb) when imported: point it at the output folder
    os.environ.setdefault("MTEB_CACHE", str(out_dir))
    if quiet:
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    from jaxembed.evaluate.mteb_adapter import run_mteb

    loaded = load_model(model, **(load_kwargs or {}))
    t0 = time.time()
    results = run_mteb(loaded, tasks, out=out_dir, split=split, name=name, progress=not quiet, packing=packing,
                       **common)
    print(format_mteb_table(results))
    print(f"\nmteb result files under {out_dir / 'results'} ({time.time() - t0:.1f}s)")
    return results


def evaluate_and_report(model: str, *, tasks: str | None = None, task_specs: Sequence[str] = (),
                        split: str | None = None, mteb: str | None = None, dims=None, out: str | None = None,
                        batch_size: int = 64, max_examples: int | None = None, seed: int = 42,
                        instructions: bool = False, instruction_template: str = DEFAULT_INSTRUCTION_TEMPLATE,
                        prompts_file: str | None = None, name: str | None = None,
                        load_kwargs: Mapping[str, Any] | None = None, packing: bool = True,
                        quiet: bool = False, compare: str | None = None) -> dict[str, dict]:
    """``jaxembed eval``: the local evaluators (``report_local``), or ``mteb.evaluate`` when ``mteb`` names tasks
    (``report_mteb``; ``task_specs`` are local only). Arguments as the command's flags (``prompts_file``:
    ``--prompts``; ``load_kwargs``: ``jaxembed.loading.load``'s dtype / max_length / pooling / attention / causal)."""
    common = dict(dims=dims, batch_size=batch_size, max_examples=max_examples, seed=seed,
                  prompts=read_prompts(prompts_file), task_instructions=instructions,
                  instruction_template=instruction_template)
    if mteb is not None:
        if compare is not None:
            raise UserError("--compare: runs with the local evaluators, not with --mteb (fix: drop --mteb, or run "
                            "--mteb once per model: each has its own result folder)")
        if task_specs:
            raise UserError("--task: your own sets run with the local evaluators, not with --mteb (fix: drop --mteb; "
                            "mteb:NAME entries can go in --tasks)")
        return report_mteb(model, mteb, out=out, split=split, name=name, load_kwargs=load_kwargs, packing=packing,
                           quiet=quiet, **common)
    return report_local(model, tasks=tasks, task_specs=task_specs, split=split, out=out, load_kwargs=load_kwargs,
                        packing=packing, quiet=quiet, compare=compare, **common)
