"""``jaxembed <command>``: the command-line interface.

Commands: ``encode`` (texts -> .npy), ``export`` (any supported folder -> HF / sentence-transformers folder with a
model card; ``--push-to-hub ORG/NAME`` uploads it, jaxembed/hub.py),
``data validate`` / ``data prepare`` (dataset store), ``plan build`` / ``plan show`` (batch plans),
``train`` (run or resume training), ``eval`` (local evaluators, MTEB), ``synth personas`` / ``judge`` (LLM data
tools), ``pretrain retromae`` (RetroMAE), ``score`` / ``curriculum`` / ``mine`` (reference-model
scores, Data-CUBE task order, hard-negative mining), ``teacher-score`` (a teacher's pos_scores / neg_scores for
distillation), ``sweep`` / ``sweep report`` (hyperparameter sweeps: local, SLURM array, TPU command list), ``demo``
(the built-in default job), ``recipes`` (the recipes that ship with jaxembed, each ``--config NAME[:VARIANTS]``).
User errors print one line naming file, line, field and fix (exit 2); Ctrl-C (KeyboardInterrupt) in any command
prints one line (exit 130).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import sys
import time
from pathlib import Path

from jaxembed.choices import ATTENTION_KERNELS, DTYPES, POOLING_MODES
from jaxembed.errors import UserError


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model folder (HF / sentence-transformers / jaxembed export) "
                                                  "or Hugging Face hub id")
    p.add_argument("--dtype", default="float32", choices=DTYPES,
                   help="computation dtype (default float32)")
    p.add_argument("--max-length", type=int, default=None, help="truncate texts to N tokens (default: the model's)")
    p.add_argument("--pooling", default=None, choices=POOLING_MODES,
                   help="override the folder's pooling")
    p.add_argument("--bidirectional", action="store_true", help="decoder backbones (Qwen2/3): bidirectional "
                                                               "attention instead of causal")
    p.add_argument("--attention", default="auto", choices=ATTENTION_KERNELS,
                   help="attention kernel (model.attention; default auto: the platform's fused kernel where it fits)")


def _load(args, task: str | None = None):
    from jaxembed import loading

    kw = {"dtype": args.dtype, "max_length": args.max_length, "pooling": args.pooling,
          "attention": getattr(args, "attention", "auto")}
    if getattr(args, "bidirectional", False):
        kw["causal"] = False
    if task is not None:
        kw["task"] = task
    return loading.load(args.model, **kw)


def cmd_encode(args) -> int:
    from jaxembed.encode import Encoder, checked_texts, encode_file
    from jaxembed.runs.outputs import check_output

    if args.batch_size <= 0:
        raise UserError(f"--batch-size must be positive, got {args.batch_size}")
    out = check_output(args.out, "file", "--out", ".npy")
    total, texts = checked_texts(args.input, args.field, args.format)  # all checked before loading the model
    if total == 0:
        raise UserError(f"{args.input}: no texts to encode")
    t0 = time.time()
    enc = Encoder.from_loaded(_load(args, task=args.task))  # MoTE: only the task's expert is loaded
    # streamed: read, encoded and written a chunk at a time, into a temporary file that replaces --out when
    # complete (an interrupted or failed encode leaves the old file, or none)
    n, d = encode_file(enc, texts(), out, total=total, prompt=args.prompt,
                       prompt_name=args.prompt_name, batch_size=args.batch_size, dim=args.dim,
                       progress=not args.quiet, task=args.task, packing=not args.no_packing)
    print(f"wrote {out}: {n} x {d} float32 in {time.time() - t0:.1f}s")
    return 0


def cmd_export(args) -> int:
    from jaxembed import export

    if (args.model is None) == (args.workdir is None):
        raise UserError("export: give exactly one of --model (a model folder / hub id) or --workdir (a run)")
    if args.task is not None and args.average_experts:
        raise UserError("export: give --task or --average-experts, not both")
    from jaxembed.runs.outputs import check_output

    check_output(args.out, "folder", "--out")
    export.check_target(args.out, "--out", workdir=args.workdir, source=args.model)
    repo = args.push_to_hub
    if repo is None and (args.private or args.revision or args.commit_message):
        raise UserError("export: --private, --revision and --commit-message go with --push-to-hub ORG/NAME")
    if repo is not None:  # before any work: a bad id, offline mode, no token or one the hub refuses stop here
        from jaxembed import hub

        hub.check_access(repo)
    if args.workdir:
        from jaxembed.train import export_from_workdir

        path = export_from_workdir(args.workdir, args.out, args.step, task=args.task,
                                   average_experts=args.average_experts, name=repo)
    elif args.task is not None:  # only the task's expert is read from the MoTE folder
        loaded = _load(args, task=args.task)
        path = export.export_expert(loaded.model, loaded.tokenizer, args.out, args.task, **_export_kw(loaded))
    elif args.average_experts:
        loaded = _load(args)
        path = export.export_averaged(loaded.model, loaded.tokenizer, args.out, **_export_kw(loaded))
    else:
        path = export.export_loaded(_load(args), args.out, name=repo)
    folder = export.loadable_folder(path)  # a LoRA export of the adapter alone: its adapter/
    if (Path(path) / "mote_config.json").exists():
        print(f"exported to {path}: a MoTE folder with every task expert (sentence_transformers.SentenceTransformer"
              "(..., trust_remote_code=True), then model.encode(texts, task=...); transformers.AutoModel loads the "
              "default expert)")
    elif folder != Path(path):
        print(f"exported to {path}: the LoRA adapter alone, in {folder} (PEFT, no base weights: "
              "sentence_transformers.SentenceTransformer loads the base model, then the adapter)")
    else:
        print(f"exported to {path} (loads with transformers.AutoModel and sentence_transformers.SentenceTransformer)"
              + (f"; the LoRA adapter alone in {folder / export.ADAPTER_DIR}"
                 if (folder / export.ADAPTER_DIR / "adapter_config.json").is_file() else ""))
    if repo is not None:
        from jaxembed import hub, pod

        if pod.is_main():
            url = hub.push_folder(folder, repo, private=args.private, revision=args.revision,
                                  commit_message=args.commit_message)
            print(f"pushed {folder} to {hub.endpoint()}/{repo}"
                  + (f" (revision {args.revision})" if args.revision else "") + (" (private)" if args.private else "")
                  + f": {url}")
    return 0


def _export_kw(loaded) -> dict:
    return dict(hf_config=loaded.hf_config, prompts=loaded.st.prompts,
                default_prompt_name=loaded.st.default_prompt_name, similarity_fn_name=loaded.st.similarity_fn_name)


def cmd_train(args) -> int:
    from jaxembed import config as cfglib
    from jaxembed.train import train

    cfg = cfglib.load_config_file(args.config)
    cfg = cfglib.apply_overrides(cfg, [o[len("--config."):] for o in args.overrides])
    summary = train(cfg, args.workdir)
    print(f"{summary['status']} at step {summary['step']} ({summary['skipped']} skipped updates); run directory "
          f"{summary['workdir']}" + (f"; export {summary['export']}" if summary.get("export") else ""))
    return 0 if summary["status"] == "completed" else 143


def cmd_recipes(args) -> int:
    """The recipes that ship with jaxembed (jaxembed.config.io.recipe_list), or one recipe's documentation."""
    from jaxembed.config.io import recipe_list

    recipes = recipe_list(args.name)
    if args.name:
        r = recipes[0]
        print(f"{r['name']}: {r['path']}\nvariants: {', '.join(r['variants']) or '(none)'}\n\n{r['doc']}")
        return 0
    print("recipes that ship with jaxembed; from any folder: --config NAME or NAME:VARIANT[,VARIANT...], e.g. "
          "jaxembed train --config kalm:tiny,lora --workdir runs/kalm_lora")
    width = max(len(r["name"]) for r in recipes)
    for r in recipes:
        print(f"  {r['name']:<{width}}  {r['summary']}\n  {'':<{width}}  variants: {', '.join(r['variants']) or '-'}")
    print(f"files: {Path(recipes[0]['path']).parent} (`jaxembed recipes NAME` prints one's documentation; copy one "
          "to start your own config, and give its path to --config)")
    return 0


def cmd_demo(args) -> int:
    """The main job on the built-in default (jaxembed.demo)."""
    from jaxembed.demo import run_demo

    return run_demo(args.workdir, tiny=args.tiny, overrides=[o[len("--config."):] for o in args.overrides],
                    tasks=args.tasks.split(",") if args.tasks else None, max_examples=args.max_examples,
                    progress=not args.quiet)


def _device() -> str:
    import jax

    d = jax.devices()
    return f"{len(d)} x {d[0].device_kind}" if len(d) > 1 else d[0].device_kind


#: the commands other modules add (their ``add_parsers(subparsers)``), in the order of ``jaxembed --help``
_COMMAND_MODULES = {"data": "jaxembed.data.cli:add_parsers", "plan": "jaxembed.data.plan.cli:add_parsers",
                    "eval": "jaxembed.evaluate.cli:add_parsers", "sweep": "jaxembed.sweep.cli:add_parsers",
                    "score": "jaxembed.curriculum.cli:add_parsers", "curriculum": "jaxembed.curriculum.cli:add_parsers",
                    "mine": "jaxembed.curriculum.cli:add_parsers", "synth": "jaxembed.synth.cli:add_parsers",
                    "judge": "jaxembed.synth.cli:add_parsers", "pretrain": "jaxembed.pretrain.cli:add_parsers",
                    "teacher-score": "jaxembed.teacher.cli:add_parser"}
#: the commands this module adds itself
_OWN_COMMANDS = ("encode", "export", "train", "recipes", "demo")


def _command_of(argv: list[str] | None) -> str | None:
    """The command word of ``argv`` (after the global flags), or None (``--help``, none, or not a command)."""
    words = sys.argv[1:] if argv is None else argv
    rest = [w for w in words if w not in ("-v", "--verbose")]
    return rest[0] if rest and not rest[0].startswith("-") else None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser. ``command``: a command of another module (``_COMMAND_MODULES``) adds that
    module's commands alone, and a command of this module (``_OWN_COMMANDS``) its own alone, so that a command
    does not import the modules of all the others (their imports cost each start of ``jaxembed``); otherwise
    (None: ``--help``, no command or an unknown one) every command."""
    parser = argparse.ArgumentParser(prog="jaxembed", description="Train and use text-embedding models in JAX.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    own = command not in _COMMAND_MODULES
    if own:
        _add_encode_export_train(sub)
    if command in _COMMAND_MODULES:
        targets = [_COMMAND_MODULES[command]]
    else:
        targets = [] if command in _OWN_COMMANDS else list(dict.fromkeys(_COMMAND_MODULES.values()))
    for target in targets:
        module, _, func = target.partition(":")
        getattr(importlib.import_module(module), func)(sub)
    if own:
        _add_recipes_demo(sub)
    return parser


def _add_encode_export_train(sub) -> None:
    from jaxembed.config.io import config_help

    p = sub.add_parser("encode", help="encode texts to a .npy matrix")
    _model_args(p)
    p.add_argument("--input", required=True, help="JSON Lines (.jsonl) or plain text (one text per line); - = stdin")
    p.add_argument("--out", required=True, help="output .npy (float32, one row per input text, input order)")
    p.add_argument("--field", default="text", help="JSON field holding the text (default: text)")
    p.add_argument("--format", choices=["jsonl", "text"], default=None, help="input format (default: by suffix)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--prompt", default=None, help="instruction prefixed to every text")
    g.add_argument("--prompt-name", default=None, help="a named prompt of the model (config_sentence_transformers)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--dim", type=int, default=None, help="Matryoshka: keep the first D dimensions (re-normalised)")
    p.add_argument("--no-packing", action="store_true", help="pad one text per row instead of packing several "
                                                             "texts into each row (same embeddings, slower)")
    p.add_argument("--task", default=None, help="MoTE models: the task expert to encode with: an expert name "
                                                "(search_query, classification, ...), a task type (clustering, "
                                                "sts, ...) or query / document; only its expert is loaded")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_encode)

    p = sub.add_parser("export", help="write a Hugging Face / sentence-transformers folder")
    p.add_argument("--model", default=None, help="model folder or hub id to convert")
    p.add_argument("--workdir", default=None, help="a training run: export its latest (or --step) checkpoint")
    p.add_argument("--step", default=None, help="with --workdir: a checkpoint's step (default: the latest), 'best' "
                                                 "(the best dev step, eval.best_metric) or 0 (the starting model)")
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--max-length", type=int, default=None)
    p.add_argument("--pooling", default=None, choices=POOLING_MODES)
    p.add_argument("--bidirectional", action="store_true")
    p.add_argument("--task", default=None, help="MoTE: a plain dense folder whose feed-forward is this task's expert "
                                                "(an expert name, or a task type with one expert)")
    p.add_argument("--average-experts", action="store_true", help="MoTE: the dense folder of the expert average "
                                                                  "(MoTE App. B)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--push-to-hub", default=None, metavar="ORG/NAME",
                   help="then upload the folder to this Hugging Face model repository (token: HF_TOKEN or `hf auth "
                        "login`; created if missing)")
    p.add_argument("--private", action="store_true", help="with --push-to-hub: create the repository private (an "
                                                          "existing public one is refused)")
    p.add_argument("--revision", default=None, help="with --push-to-hub: the branch to push to (created from main "
                                                    "if missing; default main)")
    p.add_argument("--commit-message", default=None, help="with --push-to-hub: the commit message")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("train", help="train (or resume) a run: --config NAME|FILE[:VARIANT] --workdir DIR "
                                     "[--config.KEY=VALUE ...]")
    p.add_argument("--config", required=True, metavar="NAME[:VARIANTS]|FILE[:VARIANTS]", help=config_help())
    p.add_argument("--workdir", required=True, help="run directory (created; an existing run is resumed)")
    p.set_defaults(func=cmd_train)


def _add_recipes_demo(sub) -> None:
    from jaxembed.demo import DEMO_TASKS

    p = sub.add_parser("recipes", help="list the recipes that ship with jaxembed (--config NAME[:VARIANTS] from "
                                       "any folder) and their variants; with NAME, that recipe's documentation")
    p.add_argument("name", nargs="?", default=None, metavar="NAME", help="a recipe: print its file and documentation")
    p.set_defaults(func=cmd_recipes)

    p = sub.add_parser("demo", help="the main job on the built-in default: fine-tune all-MiniLM-L6-v2 on the "
                                    "shared multi-task data, evaluate before / after, export")
    p.add_argument("--workdir", default="runs/demo", help="run directory (default runs/demo; rerun to resume)")
    p.add_argument("--tiny", action="store_true", help="the 4-step :tiny variant (CI)")
    p.add_argument("--tasks", default="", help=f"comma-separated evaluation tasks (default {','.join(DEMO_TASKS)})")
    p.add_argument("--max-examples", type=int, default=1000,
                   help="a fixed sample of at most N examples per evaluation set, the same before and after "
                        "(default 1000; 0 = the whole sets)")
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(func=cmd_demo)


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status: 0, 1 when a disk or a permission fails it during its work (full, read-only,
    not readable or writable; one line), 2 for a user error (one line), 130 for Ctrl-C (SIGINT; one line), 141 when
    the reader of standard output has closed it."""
    name = ["jaxembed"]
    try:
        return _main(argv, name)
    except KeyboardInterrupt:
        # every writer removes its temporary files and folders as the KeyboardInterrupt passes through it, so only
        # the traceback is left to replace; 130 = 128 + SIGINT, as a shell reports a command stopped by Ctrl-C
        print(f"error: interrupted (Ctrl-C): `{' '.join(name)}` stopped before it finished (run the same command "
              "again to do the work)", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader of standard output closed it (`jaxembed recipes | head -3`): stop quietly, as other command-line
        # tools do. Output still buffered for the closed pipe goes nowhere (Python would print a second error for it
        # at exit); 141 = 128 + SIGPIPE, as a shell reports such a command. A broken pipe elsewhere is a real error.
        if not _stdout_reader_gone():
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as e:
        # the disk filled up, a file system turned read-only, or a path is not readable or writable for this user,
        # during the work (the outputs were checked writable before it began): one line instead of a traceback.
        # Writers replace their files through temporary ones (jaxembed.runs.atomic_files), so a file being written is
        # left as it was.
        fix = _DISK_FIXES.get(e.errno)
        if fix is None:
            raise
        where = f" ({e.filename})" if e.filename else ""
        print(f"error: {e.strerror or e}{where}: `{' '.join(name)}` stopped before it finished (fix: {fix})",
              file=sys.stderr)
        return 1


#: errno -> the fix, for a disk or a permission that fails a command during its work (an error line, exit 1)
_DISK_FIXES = {errno.ENOSPC: "free some space on that disk, or write to another one, then run the same command "
                             "again",
               errno.EDQUOT: "free some of your disk quota, or write to another disk, then run the same command again",
               errno.EROFS: "the file system became read-only: write to another folder",
               errno.EACCES: "check that you may read or write that path, or use another one",
               errno.EPERM: "check that you may read or write that path, or use another one"}


def _stdout_reader_gone() -> bool:
    """Whether standard output is a pipe whose reading end is closed (poll reports an error on its writing end)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), or stdout replaced or closed
        return False


def _main(argv: list[str] | None, name: list[str]) -> int:
    """``main`` without its Ctrl-C handling; ``name`` receives the command's words for the message."""
    parser = build_parser(_command_of(argv))
    args, unknown = parser.parse_known_args(argv)
    overrides = [u for u in unknown if u.startswith("--config.")]
    rest = [u for u in unknown if not u.startswith("--config.")]
    if rest or (overrides and args.command not in ("train", "demo", "sweep", "pretrain")):
        parser.error(f"unrecognized arguments: {' '.join(rest or overrides)}")
    args.overrides = overrides
    name += [args.command] + [v for k, v in sorted(vars(args).items())
                              if k.endswith(("_command", "_action")) and isinstance(v, str)]
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from jaxembed.runs.outputs import check_cli_outputs

        check_cli_outputs(args)  # every output path is writable before any work starts
        return args.func(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
