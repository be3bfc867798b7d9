"""A run's training objective from its config and its dataset store: the loss kind of each dataset (its ``loss``,
else the run's ``loss.type``), the ``jaxembed.losses.objective.Objective`` of the kinds the plan uses, the data checks
that need the prepared store (pair scores, teacher scores: also for Hugging Face / TFDS sources, which the config
check cannot read ahead), and the GIST guide model (loaded, checked against the student's tokenizer, placed on the
mesh; frozen: the train step takes its parameters as an input that no optimizer sees).

How the per-dataset loss stays static under jit: the set of kinds is static (the plan's datasets), so one step is
compiled for all of them; each batch row selects its kind by data (``kind_of_dataset[dataset_id]``), see
``jaxembed.losses.objective``. A one-task batch therefore trains its task's loss, with no recompilation and no
host-side switch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxembed.errors import UserError
from jaxembed.losses.objective import KINDS, Objective, kind_id
from jaxembed.losses.table import section_settings


@dataclasses.dataclass
class LossSetup:
    """objective: the static settings; kind_of_dataset: int32 [datasets] index into ``KINDS`` of each store
    dataset; guide: (graphdef, state) of the GIST guide placed on the mesh, or None; settings: {part: its settings}
    of every loss and feature (``jaxembed.losses.table.section_settings``), which the train step reads."""

    objective: Objective
    kind_of_dataset: np.ndarray
    guide: tuple[Any, Any] | None = None
    settings: dict = dataclasses.field(default_factory=dict)


def dataset_kinds(store, run_loss: str) -> list[str]:
    """The loss kind of each dataset of the store: its own ``loss``, else the run's."""
    return [d.loss or run_loss for d in store.datasets]


def make_loss_setup(run) -> LossSetup:
    """The LossSetup of a ``jaxembed.train.Run`` (raises UserError naming the dataset and the fix)."""
    from jaxembed.data.loss_checks import check_dataset_losses

    c = run.config
    check_dataset_losses(c, store_dir=run.store.path)  # the prepared store: its pair / teacher score counts
    kinds = dataset_kinds(run.store, c.loss.type)
    used = run.plan.used_dataset_ids() or list(range(len(kinds)))  # counted in blocks: no copy of the plan
    present = tuple(k for k in KINDS if k in {kinds[d] for d in used})
    settings = section_settings(c.loss)
    d = settings["distill"]
    objective = Objective(kinds=present, distill=d.kind, distill_weight=d.weight, distill_temperature=d.temperature,
                          settings={k: settings[k] for k in present})
    table = np.asarray([kind_id(k) for k in kinds], np.int32)
    guide = load_guide(run) if settings["gist"].guide and objective.contrastive else None
    return LossSetup(objective, table, guide, settings)


def load_guide(run) -> tuple[Any, Any]:
    """The GIST guide model of ``loss.gist_guide`` as (graphdef, state) on the run's mesh (its parameters sharded as
    the run's, ``train.param_sharding``). It reads the batch's token ids, so its tokenizer must be the student's."""
    from flax import nnx

    from jaxembed import loading, parallel

    c = run.config
    name = str(c.loss.gist_guide)
    guide = loading.load(name, dtype=c.model.dtype)  # no max_length: the guide reads the student's token ids (below)
    if getattr(guide.model.config, "mote", None) is not None:
        raise UserError(f"config.loss.gist_guide = {name!r} is a MoTE model (task experts) (fix: a dense guide, e.g. "
                        "`jaxembed export --model ... --average-experts`)")
    student = run.loaded.tokenizer
    if guide.tokenizer.hf.get_vocab() != student.hf.get_vocab() or guide.tokenizer.lowercase != student.lowercase:
        raise UserError(f"config.loss.gist_guide = {name!r}: its tokenizer differs from model.name's "
                        f"({c.model.name!r}); the guide encodes the batch's own token ids (fix: a guide with the "
                        "same tokenizer, e.g. a larger model of the same family, or the model itself)")
    limit = loading.config_position_limit(guide.model.config)
    need = int(student.max_length)
    if limit is not None and limit < need:
        raise UserError(f"config.loss.gist_guide = {name!r} reads at most {limit} tokens but the run's texts reach "
                        f"{need} (fix: --config.model.max_length={limit} or a guide with longer positions)")
    model = parallel.shard_model(guide.model, run.mesh, c.train.param_sharding)
    graphdef, state = nnx.split(model)
    return graphdef, state
