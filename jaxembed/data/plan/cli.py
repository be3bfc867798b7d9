"""``jaxembed plan build`` and ``jaxembed plan show``.

``add_parsers(subparsers)`` adds the ``plan`` command to the main parser; each sub-command sets ``func`` (returns the
exit status; a UserError is printed on one line by the main CLI, exit status 2).

- ``plan build --store DIR [--config PATH[:VARIANT]|FILE.json] [--set KEY=VALUE ...] --out plan.npz
  [--tokenizer DIR]``: builds the plan in blocks (``jaxembed.data.plan.build_plan_file``) into ``plan.npz`` +
  ``plan.json``.
  ``--config`` is a Python file whose ``get_config()`` returns a ConfigDict with a ``plan`` field (its ``data``
  field, if any, supplies the sampling defaults), a plan config itself, or a JSON file holding a plan config.
  ``--set global_batch_size=128 --set curriculum.enabled=true`` override single fields (values parsed as JSON,
  else taken as strings). ``--tokenizer`` also precomputes the loader's length table (``plan.lengths.npz``).
- ``plan show plan.npz [--png out.png] [--json]``: the summary (batches per task / dataset, epochs, repeats,
  dropped remainder) and a picture of the task sequence over steps.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from jaxembed.errors import UserError


def add_parsers(subparsers) -> None:
    """Add ``plan build`` and ``plan show`` to an argparse sub-parsers object."""
    from jaxembed.config.io import config_help

    p = subparsers.add_parser("plan", help="build and inspect batch plans",
                              description="Batch plans: the global batch of every training step, saved to disk.")
    sub = p.add_subparsers(dest="plan_command", required=True, metavar="{build,show}")

    b = sub.add_parser("build", help="build a batch plan from a dataset store and a plan config",
                       description="Build the plan (a pure function of the store, the scores / curriculum files, "
                                   "the plan config and the seed) and write PLAN.npz + PLAN.json.")
    b.add_argument("--store", required=True, metavar="DIR", help="dataset store (jaxembed data prepare)")
    b.add_argument("--config", default=None, metavar="NAME|PATH[:VARIANT]|FILE.json",
                   help="plan config: " + config_help("a Python config file (its 'plan' field)") + "; or a JSON "
                        "file; default: the defaults of jaxembed.data.plan.default_plan_config")
    b.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a plan config field, e.g. --set global_batch_size=128 (repeatable)")
    b.add_argument("--out", required=True, metavar="PLAN.npz", help="output plan file (.npz; a .json sidecar "
                                                                    "is written beside it)")
    b.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="also precompute the loader's per-step length table with this tokenizer "
                        "(PLAN.lengths.npz, read by make_loader(lengths_cache=...))")
    b.add_argument("-q", "--quiet", action="store_true", help="print one line, not the summary")
    b.set_defaults(func=cmd_build)

    s = sub.add_parser("show", help="summarise a plan; optionally draw the task sequence as a PNG")
    s.add_argument("plan", metavar="PLAN.npz")
    s.add_argument("--png", default=None, metavar="OUT.png", help="write a picture of the task sequence")
    s.add_argument("--json", action="store_true", help="print the summary as JSON")
    s.set_defaults(func=cmd_show)


def _parse_value(text: str):
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_overrides(cfg: dict, items: list[str]) -> dict:
    """``KEY=VALUE`` strings (dotted keys) applied to a plain dict config."""
    for item in items:
        if "=" not in item:
            raise UserError(f"--set {item}: expected KEY=VALUE (e.g. --set global_batch_size=128)")
        key, val = item.split("=", 1)
        parts = key.strip().split(".")
        node = cfg
        for k in parts[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise UserError(f"--set {item}: '{k}' is not a group of fields")
        node[parts[-1]] = _parse_value(val)
    return cfg


def load_plan_config(spec: str | None):
    """(plan config as a plain dict, data config or None) from ``--config``."""
    from jaxembed.data.plan.config import as_plain_dict

    if spec is None:
        return {}, None
    if spec.endswith(".json") and Path(spec).is_file():
        try:
            obj = json.loads(Path(spec).read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise UserError(f"{spec}:{e.lineno}: invalid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise UserError(f"{spec}: expected a JSON object with the plan config fields")
        return (obj["plan"] if "plan" in obj else obj), obj.get("data")
    from jaxembed.config import load_config_file

    cfg = load_config_file(spec)
    keys = set(cfg.keys()) if hasattr(cfg, "keys") else set()
    data = cfg["data"] if "data" in keys else None
    if "plan" in keys:
        return as_plain_dict(cfg["plan"]), data
    if "global_batch_size" in keys:
        return as_plain_dict(cfg), data
    raise UserError(f"{spec}: get_config() returned no 'plan' field (fix: add config.plan = "
                    "jaxembed.data.plan.default_plan_config() and set its fields)")


def cmd_build(args) -> int:
    from jaxembed.data.plan.build import build_plan_file
    from jaxembed.data.plan.summary import format_summary, summarize
    from jaxembed.data.store import Store

    from jaxembed.runs.outputs import check_output

    t0 = time.time()
    out = check_output(args.out, "file", "--out", ".npz")  # before any work (also its .json sidecar's folder)
    cfg, data = load_plan_config(args.config)
    cfg = apply_overrides(cfg, args.set)
    store = Store.open(args.store)
    plan = build_plan_file(out, store, cfg, data_config=data)  # in blocks, straight into the file; mapped
    msg = (f"wrote {out} (+ {out.with_suffix('.json').name}): {plan.steps} steps x {plan.global_batch_size}, "
           f"fingerprint {plan.fingerprint()}, in {time.time() - t0:.1f}s")
    if args.tokenizer:
        from jaxembed.data.pipeline import cached_step_lengths
        from jaxembed.tokenizer import Tokenizer

        lengths = out.with_suffix(".lengths.npz")
        cached_step_lengths(store, plan, Tokenizer.from_folder(args.tokenizer), lengths)
        msg += f"; length table {lengths}"
    if not args.quiet:
        print(format_summary(summarize(plan)))
    print(msg)
    return 0


def cmd_show(args) -> int:
    from jaxembed.data.plan.file import Plan
    from jaxembed.data.plan.summary import format_summary, summarize
    from jaxembed.data.plan.viz import render_png

    plan = Plan.load(args.plan)
    s = summarize(plan)
    print(json.dumps(s, indent=1) if args.json else format_summary(s))
    if args.png:
        path = render_png(plan, args.png)
        print(f"wrote {path}")
    return 0
