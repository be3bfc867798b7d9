"""TA-CL, Task-Aware Contrastive Learning (MoTE 3.2, App. A and D.2, Table 4): each task type's batching strategy
and contrastive temperature, applied to a data config.

MoTE trains every batch on one task, and that task fixes how the batch is drawn and the InfoNCE temperature:
retrieval batches come from one dataset (homogeneous); classification and clustering batches span the task's
datasets (heterogeneous); the temperature is 0.03, 0.06 for clustering. ``STATIC`` is the paper's baseline without
TA-CL. ``ta_cl`` sets the ``batching`` and ``temperature`` fields of each dataset of a data config
(``jaxembed.data.config``); which expert a batch goes through is the routing's (``jaxembed.mote.spec``).
"""

from __future__ import annotations

from typing import Mapping

from jaxembed.errors import UserError

#: TA-CL (MoTE 3.2, App. D.2, Table 4): task type -> (batching strategy, InfoNCE temperature). Retrieval batches
#: come from one dataset; classification and clustering batches span the task's datasets; 0.03 except 0.06 for
#: clustering. The types the paper did not train on follow their routing: re-ranking as retrieval; STS, pair
#: classification and NLI are local-semantics tasks (App. A.1: homogeneous batches suit them) at 0.03.
TA_CL = {
    "retrieval": ("homogeneous", 0.03),
    "reranking": ("homogeneous", 0.03),
    "classification": ("heterogeneous", 0.03),
    "clustering": ("heterogeneous", 0.06),
    "sts": ("homogeneous", 0.03),
    "pair_classification": ("homogeneous", 0.03),
    "nli": ("homogeneous", 0.03),
}

#: the "static" baseline of MoTE Table 4: heterogeneous batches and 0.03 for every task.
STATIC = ("heterogeneous", 0.03)


def ta_cl(data_config, static: bool = False, pool_by_type: bool = True,
          table: Mapping[str, tuple[str, float]] | None = None) -> None:
    """Apply TA-CL (MoTE 3.2, App. D.2) to a data config in place: each dataset gets its task type's batching
    strategy and temperature (``TA_CL``); ``static=True`` gives the static baseline of Table 4 (heterogeneous
    batches, 0.03 for every task).

    pool_by_type: the paper's heterogeneous batch draws "across all datasets associated with the task", where a
    task is classification / clustering / retrieval. jaxembed's plan mixes the datasets of one ``task`` name.
    So with pool_by_type, the datasets of a heterogeneous task type share one task name: the type itself, e.g.
    ``classification``. Their instructions stay per dataset."""
    table = dict(TA_CL if table is None else table)
    missing = []
    for d in data_config.datasets:
        ttype = d.task_type
        if ttype is None:
            raise UserError(f"TA-CL: dataset {d.name!r} has task_type None (decided by its records); set its "
                            "task_type so that its batching and temperature are known")
        if static:
            batching, temp = STATIC
        elif ttype in table:
            batching, temp = table[ttype]
        else:
            missing.append(f"{d.name} ({ttype})")
            continue
        d.batching = batching
        d.temperature = float(temp)
        if pool_by_type and batching == "heterogeneous":
            d.task = ttype
    if missing:
        raise UserError(f"TA-CL has no batching / temperature for {', '.join(missing)} (fix: pass "
                        "table={task_type: (strategy, temperature)})")
