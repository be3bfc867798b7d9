"""``jaxembed eval``: local evaluators on the shared dev / eval sets, or ``mteb.evaluate``.

``add_parsers(subparsers)`` adds the ``eval`` command (``func`` returns the exit status; a UserError is printed
on one line by the main CLI, exit status 2).

- ``jaxembed eval --model PATH_OR_WORKDIR [--tasks NAMES|all|dev|eval] [--task SPEC ...] [--split dev|eval|both]
  [--dims 64,128,...] [--out results.json]``: prints a table, writes ``{"Task": {"main_score": ..., ...}}``
  (points, 0-100). The entries are those of the trainer's ``eval.tasks`` (``jaxembed.evaluate.dev``): registered
  names, ``mteb:NAME`` (an MTEB task available offline, scored by mteb.evaluate), and a user's own sets
  (``jaxembed.evaluate.user_tasks``: an STS / pair / classification / clustering / reranking file, a BEIR
  folder), given with ``--task name=...,type=...,path=...`` (or a JSON object) or in a ``.json`` file of
  ``--tasks`` holding a list like ``eval.tasks``. Every entry is checked (names, keys, files, first rows, MTEB
  names and data) before the model loads.
- ``jaxembed eval --model PATH --mteb TASKS [--out DIR]``: runs ``mteb.evaluate``; local task names run offline
  as mteb custom tasks, other names (or ``mteb:NAME``) are MTEB tasks (their data from the hub or the local Hugging
  Face cache). Writes mteb's result files under DIR (default ``mteb_results``).
- ``jaxembed eval --list``: the registered tasks.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from jaxembed.errors import UserError


def add_parsers(subparsers) -> None:
    p = subparsers.add_parser(
        "eval", help="evaluate a model: fast local evaluators, or MTEB",
        description="Evaluate an embedding model on the local dev / eval sets (scores in points, 0-100, like "
                    "MTEB), or run mteb.evaluate (--mteb).")
    p.add_argument("--model", default=None, help="model folder (HF / sentence-transformers / jaxembed export), "
                                                  "training workdir (a folder holding export/) or hub id")
    p.add_argument("--tasks", default=None, metavar="NAMES|all|dev|eval",
                   help="comma-separated task names, or all (default without --task), dev (model selection sets), "
                        "eval (reporting sets); mteb:NAME (an MTEB task available offline); FILE.json (a list of "
                        "entries as the config's eval.tasks, your own sets as objects); see --list")
    p.add_argument("--task", action="append", default=[], metavar="SPEC",
                   help="your own set, as a dict of the config's eval.tasks: name=NAME,type=TYPE,path=PATH"
                        "[,split=S][,train=PATH][,main_score=M], or a JSON object (for columns, instructions, "
                        "score_range); repeatable. Types: sts, pair_classification, classification (train=), "
                        "clustering, reranking, retrieval (a BEIR folder)")
    p.add_argument("--split", default=None, choices=["dev", "eval", "both"],
                   help="map the named tasks to their dev / eval variants (NAME-dev is the dev/ file of NAME)")
    p.add_argument("--mteb", default=None, metavar="TASKS",
                   help="run mteb.evaluate instead: local task names (offline custom tasks) and / or MTEB task "
                        "names (mteb:NAME forces the MTEB task)")
    p.add_argument("--dims", default=None, metavar="D,D,...", help="Matryoshka dimensions to score as well")
    p.add_argument("--out", default=None, help="local: results JSON file; --mteb: results folder "
                                               "(default mteb_results)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-examples", type=int, default=None, metavar="N",
                   help="a seeded sample of at most N test examples per task (fast, not comparable with full-set "
                        "scores)")
    p.add_argument("--seed", type=int, default=42, help="MTEB's seed: classification undersampling, clustering "
                                                        "bootstrap (default 42)")
    p.add_argument("--instructions", action="store_true",
                   help="prefix each task's registered instruction (formatted with --instruction-template); "
                        "by default only the model's own prompts are used, looked up like mteb does")
    p.add_argument("--instruction-template", default=None, metavar="TEMPLATE",
                   help="how an instruction becomes a prompt (default 'Instruct: {instruction}\\nQuery: ')")
    p.add_argument("--prompts", default=None, metavar="FILE.json",
                   help="extra prompts, keyed like mteb (task name, task type, query, document, NAME-query, ...)")
    p.add_argument("--name", default=None, help="--mteb: model name in the result files (default: folder name)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--max-length", type=int, default=None, help="truncate texts to N tokens")
    p.add_argument("--pooling", default=None, choices=["mean", "cls", "lasttoken", "max", "mean_sqrt_len"],
                   help="override the folder's pooling")
    p.add_argument("--bidirectional", action="store_true", help="Qwen2/3 backbones: bidirectional attention")
    p.add_argument("--attention", default="auto", choices=["auto", "xla", "cudnn", "te", "pallas", "splash"],
                   help="attention kernel (model.attention; default auto: the platform's fused kernel where it fits)")
    p.add_argument("--no-packing", action="store_true", help="pad one text per row instead of packing several "
                   "texts per row (the same embeddings, slower; for comparison)")
    p.add_argument("--list", action="store_true", help="list the registered tasks and exit")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=cmd_eval)


def _read_json(flag: str, path: str):
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


def _prompts(path: str | None) -> dict | None:
    if path is None:
        return None
    obj = _read_json("--prompts", path)
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in obj.items()):
        raise UserError(f'--prompts {path}: expected a JSON object of strings, e.g. {{"STS": "...", "query": "..."}}')
    return obj


def _load(args):
    from jaxembed import hf
    from jaxembed.evaluate import resolve_model_path

    kw = {"dtype": args.dtype, "max_length": args.max_length, "pooling": args.pooling, "attention": args.attention}
    if args.bidirectional:
        kw["causal"] = False
    return hf.load(resolve_model_path(args.model), **kw)


def cmd_eval(args) -> int:
    from jaxembed.evaluate import DEFAULT_INSTRUCTION_TEMPLATE, format_table, tasks as task_mod

    if args.list:
        print(task_mod.describe())
        return 0
    if args.model is None:
        raise UserError("--model is required (a model folder, a training workdir or a hub id)")
    if args.batch_size <= 0:
        raise UserError(f"--batch-size must be positive, got {args.batch_size}")
    if args.max_examples is not None and args.max_examples <= 0:
        raise UserError(f"--max-examples must be positive, got {args.max_examples}")
    template = DEFAULT_INSTRUCTION_TEMPLATE
    if args.instruction_template is not None:
        template = args.instruction_template.replace("\\n", "\n")  # a shell-typed \n is a newline
    prompts = _prompts(args.prompts)
    common = dict(dims=args.dims, batch_size=args.batch_size, max_examples=args.max_examples, seed=args.seed,
                  prompts=prompts, task_instructions=args.instructions, instruction_template=template)
    if args.mteb is not None:
        if args.task:
            raise UserError("--task: your own sets run with the local evaluators, not with --mteb (fix: drop --mteb; "
                            "mteb:NAME entries can go in --tasks)")
        return _run_mteb(args, common)
    selected, mteb_names, user_prompts = _selected(args)  # every entry checked before the model loads
    out = Path(args.out) if args.out else None
    if out is not None and out.is_dir():
        raise UserError(f"--out {out}: is a folder; pass a .json file")
    mteb_eval = None
    if mteb_names:  # their data loaded now (an MTEB task not available offline stops here)
        from jaxembed.evaluate.dev import MTEB_PREFIX, DevEvaluator

        mteb_eval = DevEvaluator([MTEB_PREFIX + n for n in mteb_names], seed=args.seed, batch_size=args.batch_size,
                                 where="--tasks")
    if user_prompts:  # a user set's instructions are its prompts (--prompts may override them)
        common["prompts"] = dict(user_prompts, **(prompts or {}))
    from jaxembed.encode import Encoder
    from jaxembed.evaluate import evaluate

    loaded = _load(args)
    encoder = Encoder.from_loaded(loaded)
    encoder.packing = not args.no_packing
    times: dict[str, float] = {}

    def on_result(task, res, seconds):
        times[task.name] = seconds
        if not args.quiet:
            print(f"{task.name:<18} {task.main_score:<16} {res['main_score']:7.2f}  ({seconds:.1f}s)",
                  file=sys.stderr, flush=True)

    t0 = time.time()
    results = {}
    if selected:
        results = evaluate(encoder, selected, progress=not args.quiet and sys.stderr.isatty(), on_result=on_result,
                           **common)
        print(format_table(results, selected, times))
    if mteb_eval is not None:
        t1 = time.time()
        scores = mteb_eval(encoder)
        for name, res in scores.items():
            print(f"{name}  {res['main_score']:.2f}  (mteb.evaluate, {time.time() - t1:.1f}s)")
        results.update(scores)
    print(f"\n{loaded.source}: {len(results)} tasks in {time.time() - t0:.1f}s")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
            f.write("\n")
        print(f"wrote {out}")
    return 0


def _task_specs(items: list[str]) -> list[dict]:
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
    obj = _read_json("--tasks", path)
    if not isinstance(obj, list):
        raise UserError(f"--tasks {path}: expected a JSON list of tasks (names, \"mteb:NAME\", objects with name, "
                        f"type, path), got {type(obj).__name__}")
    return obj


def _selected(args):
    """-> (local Tasks, MTEB task names, the user sets' prompts), every entry checked (``parse_eval_tasks``: the
    trainer's eval.tasks rules) before the model loads. --split maps the registered tasks to their variants."""
    from jaxembed.evaluate import resolve_tasks
    from jaxembed.evaluate.dev import parse_eval_tasks

    tasks = args.tasks if args.tasks is not None else ("" if args.task else "all")
    items = [x.strip() for x in tasks.split(",") if x.strip()]
    groups = [([x for x in items if not x.endswith(".json")], "--tasks")]
    groups += [(_tasks_file(x), f"--tasks {x}") for x in items if x.endswith(".json")]
    groups.append((_task_specs(args.task), "--task"))
    local, mteb, seen = [], [], {}
    for entries, where in groups:
        dev = parse_eval_tasks(entries, where)
        for t in dev.local:
            for v in [t] if t.user or args.split is None else resolve_tasks([t], args.split):
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


def _run_mteb(args, common) -> int:
    out = Path(args.out or "mteb_results")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: is a file; --mteb writes a folder of mteb result files")
    # mteb creates its default result cache (~/.cache/mteb) when imported: point it at the output folder
    os.environ.setdefault("MTEB_CACHE", str(out))
    if args.quiet:
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    from jaxembed.evaluate.mteb_adapter import run_mteb

    loaded = _load(args)
    t0 = time.time()
    results = run_mteb(loaded, args.mteb, out=out, split=args.split, name=args.name, progress=not args.quiet,
                       packing=not args.no_packing, **common)
    width = max([len(n) for n in results] + [4])
    dims = sorted({d for r in results.values() for d in r.get("dims", {})}, key=int)
    print(f"{'task':<{width}}  {'main_score':>10}" + "".join(f"  {'@' + d:>8}" for d in dims))
    for name, r in results.items():
        print(f"{name:<{width}}  {r['main_score']:>10.2f}" +
              "".join(f"  {r['dims'][d]['main_score']:>8.2f}" if d in r.get("dims", {}) else " " * 10
                      for d in dims))
    print(f"\nmteb result files under {out / 'results'} ({time.time() - t0:.1f}s)")
    return 0
