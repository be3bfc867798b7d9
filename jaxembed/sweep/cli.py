"""The ``jaxembed sweep`` and ``jaxembed sweep report`` commands: argument parsing, then the library
(``jaxembed.sweep.expand``, ``.run``, ``.report``)."""

from __future__ import annotations

import shlex
from pathlib import Path

from jaxembed.config.io import config_help
from jaxembed.errors import UserError
from jaxembed.sweep.expand import MANIFEST, Sweep, plan_sweep
from jaxembed.sweep.report import REPORT, collect, format_report, write_report
from jaxembed.sweep.run import (SLURM_FILE, TPU_FILE, slurm_launch_script, slurm_script, start_local, tpu_commands,
                                train_command, write_slurm, write_tpu)


def _describe(sw: Sweep) -> str:
    lines = [f"sweep: {len(sw.runs)} runs of {sw.config_spec} into {sw.root}"
             + (f" (fixed: {' '.join(sw.fixed)})" if sw.fixed else "")]
    for r in sw.runs:
        lines.append(f"  {r.index:>3}  {r.name:<40}  {' '.join(f'{k}={v}' for k, v in r.overrides.items())}")
    return "\n".join(lines)


def cmd_sweep(args) -> int:
    if getattr(args, "sweep_action", None) == "report":
        return cmd_report(args)
    if not args.config or not args.root:
        raise UserError("sweep: --config NAME|FILE[:VARIANT] and --root DIR are required (e.g. jaxembed sweep "
                        "--config demo:tiny --root runs/sweep --sweep \"optim.lr=1e-5,2e-5\"; or jaxembed sweep "
                        "report DIR)")
    fixed = list(args.set or []) + [o[len("--config."):] for o in getattr(args, "overrides", [])]
    sw = plan_sweep(args.config, args.root, args.sweep or (), args.zip or (), fixed, use_hyper=not args.no_hyper,
                    validate=not args.no_validate)
    print(_describe(sw))
    if args.mode == "slurm":
        text = slurm_script(sw, slurm_launch_script(args.slurm_script), args.array_parallel)
        if args.dry_run:
            print(f"--- {sw.root / SLURM_FILE} (dry run: not written)\n{text}")
            return 0
        out = write_slurm(sw, text)
        print(f"wrote {out} (one array task per run) and {sw.root / MANIFEST}\nsubmit: sbatch {out}")
        return 0
    if args.mode == "tpu":
        text = tpu_commands(sw)
        if args.dry_run:
            print(f"--- {sw.root / TPU_FILE} (dry run: not written)\n{text}")
            return 0
        out = write_tpu(sw, text)
        note = "" if sw.root.is_absolute() else (" (the workdirs are relative: on the workers they resolve inside "
                                                 "the code folder; give an absolute --root on shared storage)")
        print(f"wrote {out} and {sw.root / MANIFEST}{note}\nrun: launch/tpu_pod.sh --name TPU_NAME --zone ZONE "
              f"run-list {out}")
        return 0
    if args.dry_run:
        for r in sw.runs:
            print(f"  {shlex.join(train_command(sw, r, args.launcher))}")
        print("(dry run: nothing written, nothing run)")
        return 0
    return start_local(sw, in_process=args.in_process, launcher=args.launcher, quiet=args.quiet,
                       compile_cache=not args.no_compile_cache)


def cmd_report(args) -> int:
    rep = collect(args.dir, metric=args.metric, mode=args.metric_mode)
    print(format_report(rep))
    prefix = Path(args.out) if args.out else Path(args.dir) / REPORT
    out = write_report(rep, prefix, plot=not args.no_plot)
    written = [str(p) for p in out.values() if p]
    print("wrote " + ", ".join(written))
    if not args.no_plot and out["png"] is None:
        print("plot skipped: matplotlib is not installed (pip install matplotlib)")
    return 0


def add_parsers(sub) -> None:
    """Register ``jaxembed sweep`` (run a sweep) and ``jaxembed sweep report DIR``."""
    p = sub.add_parser("sweep", help="expand a config over hyperparameter values into runs and run them (locally "
                                     "in sequence), or write a SLURM array script / TPU command list; "
                                     "`sweep report DIR` tabulates them",
                       description="Expand a config over hyperparameter values into runs, each in its own workdir "
                                   "under --root; run them here in sequence (--mode local), or write one SLURM array "
                                   "script (--mode slurm) or a TPU command list (--mode tpu). `jaxembed sweep report "
                                   "DIR` tabulates the runs.",
                       epilog="Fixed overrides: --set KEY=VALUE or --config.KEY=VALUE. Values parse like "
                              "--config.KEY=VALUE. See jaxembed/sweep/ and the README (Sweeps).")
    p.add_argument("--config", default=None, metavar="NAME[:VARIANTS]|FILE[:VARIANTS]",
                   help=config_help("a config file with get_config(arg) (and optionally get_hyper(arg))"))
    p.add_argument("--root", default=None, help="sweep folder: one run directory per run, and sweep.json")
    p.add_argument("--sweep", action="append", metavar="'KEY=V1,V2 KEY2=A,B'",
                   help="cartesian product of these values (repeatable; groups are crossed)")
    p.add_argument("--zip", action="append", metavar="'KEY=V1,V2 KEY2=A,B'",
                   help="these keys vary together: run i takes the i-th value of each (repeatable)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="a fixed override for every run "
                                                                       "(same as --config.KEY=VALUE)")
    p.add_argument("--no-hyper", action="store_true", help="ignore get_hyper() of the config file")
    p.add_argument("--mode", choices=["local", "slurm", "tpu"], default="local",
                   help="local: run in sequence here (default); slurm: write ROOT/sweep_slurm.sh, one array task "
                        "per run; tpu: write ROOT/sweep_tpu.txt for launch/tpu_pod.sh run-list")
    p.add_argument("--dry-run", action="store_true", help="print the runs and commands (or the script), write "
                                                          "nothing, run nothing")
    p.add_argument("--in-process", action="store_true", help="local: train every run in this process (shares "
                                                             "compilations; a crash of one run is still recorded)")
    p.add_argument("--launcher", default=None, metavar="CMD", help="local: train each run with "
                                                                   "`CMD CONFIG WORKDIR --config.K=V ...`, e.g. "
                                                                   "launch/local.sh (default: jaxembed train)")
    p.add_argument("--no-compile-cache", action="store_true", help="local: do not share JAX's persistent "
                                                                   "compilation cache ROOT/.jax_cache between runs")
    p.add_argument("--no-validate", action="store_true", help="skip config.validate() (e.g. writing a TPU command "
                                                              "list on a machine without the data); keys and "
                                                              "value types are still checked")
    p.add_argument("--slurm-script", default=None, help="slurm: the per-run batch script (default "
                                                        "launch/slurm_gpu.sh of this repository)")
    p.add_argument("--array-parallel", type=int, default=None, metavar="N", help="slurm: at most N array tasks "
                                                                                 "at once (--array=0-K%%N)")
    p.add_argument("-q", "--quiet", action="store_true", help="local: do not echo the runs' output (it is in "
                                                              "ROOT/NAME/train.log)")
    p.set_defaults(func=cmd_sweep, sweep_action=None)
    actions = p.add_subparsers(dest="sweep_action", required=False, metavar="{report}")
    r = actions.add_parser("report", help="tabulate a sweep's runs: overrides, status, final and best metrics "
                                          "(text, CSV, markdown, JSON, PNG)")
    r.add_argument("dir", help="the sweep root (with sweep.json), or any folder of run directories")
    r.add_argument("--metric", default=None, help="dev metric for 'best' (default: the runs' eval.best_metric, "
                                                  "else the first */main_score logged)")
    r.add_argument("--metric-mode", choices=["max", "min"], default=None,
                   help="best = max or min (default: the runs' eval.best_mode)")
    r.add_argument("--out", default=None, metavar="PREFIX", help="write PREFIX.csv/.md/.json/.png (default "
                                                                 "DIR/sweep_report)")
    r.add_argument("--no-plot", action="store_true", help="no PNG")
    r.set_defaults(func=cmd_sweep)

