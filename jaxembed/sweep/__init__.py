"""``jaxembed sweep``: one config, many runs. A sweep expands a config file over hyperparameter values into runs,
each with its own workdir under a root folder, then runs them locally one after another, or writes one SLURM
array script, or a command list for ``launch/tpu_pod.sh``. ``jaxembed sweep report DIR`` tabulates the runs.

    jaxembed sweep --config demo:tiny --root runs/sweep \\
        --sweep "optim.lr=1e-5,2e-5 loss.temperature=0.01,0.02"          # 2 x 2 = 4 runs, in sequence
    jaxembed sweep report runs/sweep                                      # table, CSV, markdown, JSON, PNG

Expansion:
- ``--sweep "KEY=V1,V2 KEY2=A,B"``: the cartesian product of its keys (values are Python literals, strings may be
  bare, as for ``--config.KEY=VALUE``; commas inside brackets or quotes do not split, e.g. ``(64,32),(32,16)``).
- ``--zip "KEY=V1,V2 KEY2=A,B"``: its keys vary together (the i-th values form run i); all lists equally long.
- ``get_hyper(arg)`` in the config file (optional, ignored with ``--no-hyper``): a list of override dicts
  ``[{"optim.lr": 1e-5}, ...]``, or ``{"product": {KEY: [values]}, "zip": {KEY: [values]}}``; the helpers
  ``product``, ``zipped`` and ``cross`` below build such lists (``+`` of two lists is their union).
- Groups (each --sweep, each --zip, get_hyper) are crossed with each other. ``--set KEY=VALUE`` (or
  ``--config.KEY=VALUE``) fixes a value for every run.

Every expanded config is built and validated (``jaxembed.config.validate``) before any run starts; a bad key or
value stops the sweep with a message naming the run, the key and the fix. A run's workdir is ``ROOT/NAME`` with a
readable name from its swept values (``lr=1e-05,temperature=0.01``); ``ROOT/sweep.json`` is the manifest.

Local runs (``--mode local``, the default) are ``jaxembed train`` subprocesses (``--in-process`` runs them in this
process, sharing compilations). Each run's output goes to ``NAME/train.log`` and its outcome to
``NAME/status.json``; a failed run is recorded and the sweep goes on. Running the same sweep again skips completed
runs and resumes the others from their checkpoints. SIGTERM / Ctrl-C stop the current run at a checkpoint
(exit 143).

Modules: ``expand`` (the runs of a sweep: ``plan_sweep``), ``run`` (local runs, SLURM / TPU files, status),
``report`` (``collect``, ``format_report``, ``write_report``), ``cli`` (the commands). The names below are
re-exported: ``from jaxembed.sweep import plan_sweep``.
"""

from jaxembed.sweep.cli import add_parsers, cmd_report, cmd_sweep
from jaxembed.sweep.expand import (MANIFEST, NAME_MAX, Sweep, SweepRun, Text, cross, load_hyper, parse_spec,
                                   plan_sweep, product, run_names, split_top, zipped)
from jaxembed.sweep.expand import short_keys  # noqa: F401 (re-exported: tests/test_sweep.py reads it here)
from jaxembed.sweep.report import REPORT, collect, format_report, plot_report, write_report
from jaxembed.sweep.run import (SLURM_FILE, STATUS, TPU_FILE, run_local, run_status, slurm_script, tpu_commands,
                                train_command, write_manifest, write_status)

__all__ = ["MANIFEST", "NAME_MAX", "REPORT", "SLURM_FILE", "STATUS", "TPU_FILE", "Sweep", "SweepRun", "Text",
           "add_parsers", "cmd_report", "cmd_sweep", "collect", "cross", "format_report", "load_hyper", "parse_spec",
           "plan_sweep", "plot_report", "product", "run_local", "run_names", "run_status", "slurm_script",
           "split_top", "tpu_commands", "train_command", "write_manifest", "write_report", "write_status", "zipped"]
