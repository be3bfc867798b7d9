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
- ``jaxembed eval --model PATH --compare BASE ...``: BASE scored on the same tasks as well, then both side by
  side (the demo's before / after table: each main score and the change); results are named after the model (a
  hub id, or an export's base model and run: ``jaxembed.evaluate.prompts.model_label``).
- ``jaxembed eval --model PATH --mteb TASKS [--out DIR]``: runs ``mteb.evaluate``; local task names run offline
  as mteb custom tasks, other names (or ``mteb:NAME``) are MTEB tasks (their data from the hub or the local Hugging
  Face cache). Writes mteb's result files under DIR (default ``mteb_results``).
- ``jaxembed eval --list``: the registered tasks.

This module parses and checks the arguments; the work and what it prints are ``jaxembed.evaluate.report``.
"""

from __future__ import annotations

from jaxembed.choices import ATTENTION_KERNELS, DTYPES, POOLING_MODES
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
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--max-length", type=int, default=None, help="truncate texts to N tokens")
    p.add_argument("--pooling", default=None, choices=POOLING_MODES,
                   help="override the folder's pooling")
    p.add_argument("--bidirectional", action="store_true", help="Qwen2/3 backbones: bidirectional attention")
    p.add_argument("--attention", default="auto", choices=ATTENTION_KERNELS,
                   help="attention kernel (model.attention; default auto: the platform's fused kernel where it fits)")
    p.add_argument("--no-packing", action="store_true", help="pad one text per row instead of packing several "
                   "texts per row (the same embeddings, slower; for comparison)")
    p.add_argument("--compare", default=None, metavar="BASE",
                   help="also score BASE (a model folder, training workdir or hub id, e.g. the model a run started "
                        "from) on the same tasks, then print both side by side with the change")
    p.add_argument("--list", action="store_true", help="list the registered tasks and exit")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=cmd_eval)


def cmd_eval(args) -> int:
    """Checks the arguments, then ``jaxembed.evaluate.report.evaluate_and_report`` (the work and the output)."""
    if args.list:
        from jaxembed.evaluate.tasks import describe

        print(describe())
        return 0
    if args.model is None:
        raise UserError("--model is required (a model folder, a training workdir or a hub id)")
    if args.batch_size <= 0:
        raise UserError(f"--batch-size must be positive, got {args.batch_size}")
    if args.max_examples is not None and args.max_examples <= 0:
        raise UserError(f"--max-examples must be positive, got {args.max_examples}")
    from jaxembed.evaluate.prompts import DEFAULT_INSTRUCTION_TEMPLATE
    from jaxembed.evaluate.report import evaluate_and_report

    template = DEFAULT_INSTRUCTION_TEMPLATE
    if args.instruction_template is not None:
        template = args.instruction_template.replace("\\n", "\n")  # a shell-typed \n is a newline
    load_kwargs = {"dtype": args.dtype, "max_length": args.max_length, "pooling": args.pooling,
                   "attention": args.attention}
    if args.bidirectional:
        load_kwargs["causal"] = False
    evaluate_and_report(args.model, tasks=args.tasks, task_specs=args.task, split=args.split, mteb=args.mteb,
                        dims=args.dims, out=args.out, batch_size=args.batch_size, max_examples=args.max_examples,
                        seed=args.seed, instructions=args.instructions, instruction_template=template,
                        prompts_file=args.prompts, name=args.name, load_kwargs=load_kwargs,
                        packing=not args.no_packing, quiet=args.quiet, compare=args.compare)
    return 0
