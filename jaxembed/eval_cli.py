"""``jaxembed eval``: local evaluators on the shared dev / eval sets, or ``mteb.evaluate``.

``add_parsers(subparsers)`` adds the ``eval`` command (``func`` returns the exit status; a UserError is printed
on one line by the main CLI, exit status 2).

- ``jaxembed eval --model PATH_OR_WORKDIR [--tasks NAMES|all|dev|eval] [--split dev|eval|both]
  [--dims 64,128,...] [--out results.json]``: prints a table, writes ``{"Task": {"main_score": ..., ...}}``
  (points, 0-100).
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
    p.add_argument("--tasks", default="all", metavar="NAMES|all|dev|eval",
                   help="comma-separated task names, or all (default), dev (model selection sets), eval "
                        "(reporting sets); see --list")
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
    p.add_argument("--list", action="store_true", help="list the registered tasks and exit")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=cmd_eval)


def _prompts(path: str | None) -> dict | None:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except FileNotFoundError:
        raise UserError(f"--prompts {path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"--prompts {path}: is a folder (fix: pass a .json file)") from None
    except UnicodeDecodeError as e:
        raise UserError(f"--prompts {path}: not valid UTF-8 ({e.reason} at byte {e.start}) (fix: re-encode the "
                        "file as UTF-8)") from None
    except json.JSONDecodeError as e:
        raise UserError(f"--prompts {path}: invalid JSON at line {e.lineno}: {e.msg}") from None
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in obj.items()):
        raise UserError(f'--prompts {path}: expected a JSON object of strings, e.g. {{"STS": "...", "query": "..."}}')
    return obj


def _load(args):
    from jaxembed import hf
    from jaxembed.evaluate import resolve_model_path

    kw = {"dtype": args.dtype, "max_length": args.max_length, "pooling": args.pooling}
    if args.bidirectional:
        kw["causal"] = False
    return hf.load(resolve_model_path(args.model), **kw)


def cmd_eval(args) -> int:
    from jaxembed.evaluate import DEFAULT_INSTRUCTION_TEMPLATE, format_table, resolve_tasks, tasks as task_mod

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
        return _run_mteb(args, common)
    selected = resolve_tasks(args.tasks, args.split)  # validate names before loading the model
    out = Path(args.out) if args.out else None
    if out is not None and out.is_dir():
        raise UserError(f"--out {out}: is a folder; pass a .json file")
    from jaxembed.encode import Encoder
    from jaxembed.evaluate import evaluate

    loaded = _load(args)
    encoder = Encoder.from_loaded(loaded)
    times: dict[str, float] = {}

    def on_result(task, res, seconds):
        times[task.name] = seconds
        if not args.quiet:
            print(f"{task.name:<18} {task.main_score:<16} {res['main_score']:7.2f}  ({seconds:.1f}s)",
                  file=sys.stderr, flush=True)

    t0 = time.time()
    results = evaluate(encoder, selected, progress=not args.quiet and sys.stderr.isatty(), on_result=on_result,
                       **common)
    print(format_table(results, selected, times))
    print(f"\n{loaded.source}: {len(results)} tasks in {time.time() - t0:.1f}s")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
            f.write("\n")
        print(f"wrote {out}")
    return 0


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
                       **common)
    width = max([len(n) for n in results] + [4])
    dims = sorted({d for r in results.values() for d in r.get("dims", {})}, key=int)
    print(f"{'task':<{width}}  {'main_score':>10}" + "".join(f"  {'@' + d:>8}" for d in dims))
    for name, r in results.items():
        print(f"{name:<{width}}  {r['main_score']:>10.2f}" +
              "".join(f"  {r['dims'][d]['main_score']:>8.2f}" if d in r.get("dims", {}) else " " * 10
                      for d in dims))
    print(f"\nmteb result files under {out / 'results'} ({time.time() - t0:.1f}s)")
    return 0
