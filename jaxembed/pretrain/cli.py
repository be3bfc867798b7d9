"""``jaxembed pretrain retromae --config NAME|FILE[:VARIANT] --workdir DIR [--set KEY=VALUE ...]``.

``add_parsers(subparsers)`` adds the ``pretrain`` command (``func`` returns the exit status; a UserError is
printed on one line by the main CLI, exit status 2). ``--set model.max_length=64`` overrides a config field
(values are Python literals; strings may be bare), as ``--config.KEY=VALUE`` does for ``jaxembed train``.
"""

from __future__ import annotations


def add_parsers(subparsers) -> None:
    from jaxembed.config.io import config_help

    p = subparsers.add_parser("pretrain", help="pre-training stages (RetroMAE)",
                              description="Pre-train an encoder before contrastive fine-tuning.")
    sub = p.add_subparsers(dest="pretrain_command", required=True, metavar="{retromae}")
    r = sub.add_parser("retromae", help="RetroMAE masked auto-encoding of a BERT-family encoder (PEG)",
                       description="Train a BERT-family encoder with RetroMAE (lightly masked encoder, [CLS] "
                                   "sentence embedding, one-layer decoder on heavily masked text), with checkpoints "
                                   "and automatic resume; export the encoder as a Hugging Face / "
                                   "sentence-transformers folder for `jaxembed train`.")
    r.add_argument("--config", required=True, metavar="NAME[:VARIANTS]|FILE[:VARIANTS]",
                   help=config_help() + " (the recipe: retromae, retromae:tiny)")
    r.add_argument("--workdir", required=True, help="run directory (created; an existing run is resumed)")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set train.steps=500 (repeatable)")
    r.set_defaults(func=cmd_retromae)


def cmd_retromae(args) -> int:
    from jaxembed import config as cfglib
    from jaxembed.pretrain.retromae import pretrain

    cfg = cfglib.load_config_file(args.config)
    overrides = list(args.set) + [o[len("--config."):] for o in getattr(args, "overrides", [])]
    cfg = cfglib.apply_overrides(cfg, overrides)
    s = pretrain(cfg, args.workdir)
    print(f"{s['status']} at step {s['step']} ({s['skipped']} skipped updates); run directory {s['workdir']}"
          + (f"; encoder exported to {s['export']} (use it as model.name in jaxembed train)" if s.get("export")
             else ""))
    return 0 if s["status"] == "completed" else 143
