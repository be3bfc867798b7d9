"""The trainer: ``jaxembed train --config FILE|RECIPE[:VARIANTS] --workdir DIR [--config.KEY=VALUE ...]``.

Flow (docs/design.md, Architecture): config -> validate -> store -> batch plan -> Grain loader -> sharded step ->
checkpoints -> export. Each arrow leaves a file in the run directory:
config.json / config.txt, store/, plan.npz, metrics.jsonl, tensorboard/, checkpoints/, export/.

Train state (one pytree): params, opt_state, step, rng (raw key data), peg_t (PEG momentum), nonfinite
(consecutive skipped steps), skipped (total). The data position is the step: the plan and the loader give the
same batch for a step after any restart, so a resumed run reproduces an uninterrupted one bit for bit on CPU.

A pod (several processes, jax.distributed): every process runs this same code on one shared workdir, started at
the same moment. Each file of the run directory has one writer and the others wait for it (jaxembed.pod;
the table is in docs/reliability.md): process 0 writes config.json / config.txt, store/, plan.npz / plan.json,
plan_lengths.npz, metrics.jsonl, tensorboard/, init_from/, export/ and summary.json, every other process waits for
its outcome (and fails with its error); Orbax writes checkpoints/ (each process its shards, process 0 the rest).

The modules, in the order a run uses them:
- ``run``: config -> ``Run`` (model, mesh, store, plan, optimizer), ``params_at``, ``export_from_workdir``
  (``jaxembed export``); ``state``: ``init_state``, the loader's length table; ``start``: the lines a run prints
  as it starts;
- ``loss``: the loss settings of a run (``make_loss_setup``); ``encode``: a batch's texts through the model, padded
  or packed, with or without the gradient cache (``gradcache``); ``step``: the jitted train step
  (``make_train_step``);
- ``loop``: the loop (``train``); ``metrics``: the logged figures (throughput, MFU, ``step_flops``, the dev
  history);
- ``export``: a run's export and its model card.

The run machinery shared with ``jaxembed pretrain`` is in ``jaxembed.runs``: the run directory's layout
(``RunDir``), checkpoints, the monitor, signals, the optimizer, the run lock, the compilation cache.

The names below are importable from the package (``from jaxembed.train import train, setup, init_state``); each is
imported from its module when first used, so that importing one module of the package (``jaxembed.train.encode``,
say) does not import the trainer.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "loop": ("train", "TrainingStopped", "dev_eval_due", "make_evaluator"),
    "run": ("Run", "setup", "check_workdir", "prepare_store", "prepare_plan", "export_dir", "init_source",
            "model_kwargs", "load_model", "params_at", "resolve_step", "export_from_workdir"),
    "state": ("init_state", "step_table", "pow2_lengths"),
    "step": ("make_train_step",),
    "metrics": ("step_flops", "host_metrics", "dev_scores", "best_step"),
    "export": ("export_params", "host_params", "host_model", "run_card", "task_prompts"),
}
_WHERE = {name: module for module, names in _PUBLIC.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'jaxembed.train' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"jaxembed.train.{module}"), name)
    globals()[name] = value
    return value
