"""Batch plans: for every training step, the global batch as (dataset id, example id) pairs.

A plan is a pure function of (dataset infos, optional per-example scores / curriculum files, plan config, seed).
It is saved next to the run (``plan.npz`` + ``plan.json``); every host loads the same file, so 1 or N hosts see the
same global batches, and resuming needs only the step index.

Arrays (S = steps, G = global batch size)::

    dataset_ids  int32   [S, G]   index into ``dataset_names`` (store order)
    example_ids  int64   [S, G]   example index inside that dataset
    task_ids     int32   [S]      the batch's task (index into ``task_names``), -1 = mixed tasks
    weights      float32 [S, G]   per-example loss weight (Data-CUBE mask alpha, Eq. 9); 1.0 by default
    temperatures float32 [S]      the batch's task temperature; NaN = run default (mixed tasks or unset)

Strategies (per task; a task's strategy comes from its datasets' ``batching`` unless the plan config overrides it):

- ``random``: all datasets of all ``random`` tasks pooled and shuffled together (mixed batches).
- ``homogeneous``: one dataset per batch.
- ``heterogeneous``: one task per batch, drawn across that task's datasets.
- ``semi_homogeneous`` (KaLM Fig. 3): homogeneous batches, then ``semi_homogeneous_proportion`` of each batch's
  rows (the same positions count in every batch) are pulled out, shuffled across all semi-homogeneous batches
  and put back.
- curriculum (Data-CUBE Algorithm 1, lines 18-25; ``curriculum.enabled``): every unit's instances sorted by
  difficulty (a unit is a dataset by default -- the paper's task is a MEDI dataset -- or a task of the data config,
  ``curriculum.unit='task'``); walk the task order cyclically, each visit takes that unit's next batch, a unit
  that runs out is skipped; every batch holds one unit. ``curriculum.walk='balanced'`` (jaxembed's extension):
  the same cycles over the task order, but each unit is visited in a share of them proportional to its size,
  spread evenly, so that all units end together instead of the largest owning the end (``walk_order``).

Two modes:

- epoch mode (``steps = 0``): dataset d contributes ``epochs_d`` copies of each example (a fractional part takes
  a random subset): ``dataset.epochs * plan.epochs`` when the dataset sets ``epochs``; otherwise, with ``size``
  sampling, ``plan.epochs``, and with ``weights`` / ``temperature`` sampling, its share (p_d) of the budget of one
  pass over those datasets (x ``plan.epochs``), so small datasets are up-sampled and large ones down-sampled.
  The batches of every unit are spread evenly over the plan (batch j of a unit with n batches lands at a random
  point of [j/n, (j+1)/n) of the plan). Each unit's incomplete last batch is either dropped
  (``drop_remainder``; the dropped examples are stored in the plan and counted in the summary) or filled with
  examples of the unit's next pass (counted as ``filled``).
- step mode (``steps > 0``): each step draws a unit with probability p_u; each unit streams through successive
  shuffled passes of its examples (without replacement inside a pass). Nothing is dropped. With the curriculum,
  steps that cover less than one pass take about the same random fraction of every unit, ordered as the full
  pass (easy -> difficult in every task), so a short run sees the whole curriculum; more steps repeat passes.

Modules (each one job):

- ``config``: the plan config, its defaults and its validation.
- ``file``: the ``Plan`` arrays and the plan file (``plan.npz`` + ``plan.json``: save, load, format checks).
- ``inputs``: scores, task orders, instance orders, and the Eq. 9 mask.
- ``units``: what the two builders share (units, seeded random streams, row keys, the unit-size check).
- ``sampling``: the sampled strategies, epoch and step mode.
- ``curriculum``: the curriculum walk.
- ``blocks``: the plan's batches and rows in blocks of steps, in memory or in a scratch folder's files.
- ``build``: ``build_plan`` (in memory) and ``build_plan_file`` (in blocks, into ``plan.npz``), which put the above
  together.
- ``identity``: ``plan_inputs``, what a plan is a pure function of (compared across the processes of a pod).
- ``summary``: ``summarize`` / ``format_summary`` / ``mixing_share``.
- ``viz``: the plan's picture (``render_png``, matplotlib: the optional ``viz`` extra).
- ``cli``: ``jaxembed plan build`` / ``jaxembed plan show``.
"""

from jaxembed.data.plan.build import build_plan, build_plan_file
from jaxembed.data.plan.config import (
    CURRICULUM_UNITS, INSTANCE_ORDERS, MASK_DIRECTIONS, NEGATIVES, SAMPLING, STRATEGIES, WALKS, default_plan_config,
    validate_data_defaults, validate_plan_config,
)
from jaxembed.data.plan.curriculum import walk_order
from jaxembed.data.plan.file import FORMAT, VERSION, Plan
from jaxembed.data.plan.identity import inputs_differences, plan_inputs
from jaxembed.data.plan.inputs import (
    instance_mask, load_instance_orders, load_scores, load_task_order, save_instance_orders,
)
from jaxembed.data.plan.summary import format_summary, mixing_share, summarize
# drawn with matplotlib in viz.py (the optional viz extra), which imports it only when called
from jaxembed.data.plan.viz import render_png

__all__ = [
    "CURRICULUM_UNITS", "FORMAT", "INSTANCE_ORDERS", "MASK_DIRECTIONS", "NEGATIVES", "SAMPLING", "STRATEGIES",
    "VERSION", "WALKS", "Plan", "build_plan", "build_plan_file", "default_plan_config", "format_summary",
    "inputs_differences", "instance_mask", "load_instance_orders", "load_scores", "load_task_order", "mixing_share",
    "plan_inputs", "render_png", "save_instance_orders", "summarize",
    "validate_data_defaults", "validate_plan_config", "walk_order",
]
