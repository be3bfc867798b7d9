"""What the sampled and the curriculum builders share: a unit (the datasets a batch is drawn from), the seeded
random streams (one purpose number per use, so the streams are independent), the key of a (dataset, example) row,
and the check that a unit fills a batch."""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxembed.errors import UserError

# rng purposes: independent streams derived from (seed, purpose, ...)
R_POOL, R_ORDER, R_STEPS, R_SEMI, R_FRAC, R_FILL, R_CURR, R_SHORT = 11, 12, 13, 14, 15, 16, 17, 18


@dataclasses.dataclass
class Unit:
    name: str
    strategy: str           # one of STRATEGIES or "curriculum"
    members: list[int]      # dataset ids


def seeded_rng(seed: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), *[int(k) for k in keys]])


def pair_key(ds: np.ndarray, ex: np.ndarray) -> np.ndarray:
    return ds.astype(np.int64) * (1 << 40) + ex.astype(np.int64)


def check_unit_size(unit: Unit, n: int, G: int, infos, what: str):
    if 0 < n < G:
        names = [infos[d].name for d in unit.members]
        raise UserError(f"{what} '{unit.name}' (datasets {names}) has {n} examples per pass, fewer than "
                        f"global_batch_size {G}: a batch would repeat examples or the unit would be dropped "
                        "(fix: a smaller global_batch_size, more epochs for it, or random / heterogeneous "
                        "batching)")
