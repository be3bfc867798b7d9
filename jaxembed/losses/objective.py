"""The training objective of a batch whose rows may follow different losses (a dataset names its loss).

Each row of the batch has a loss kind (``KINDS``, the losses of ``jaxembed.losses.table``: its dataset's ``loss``,
else the run's ``loss.type``); each kind present in the run is computed on its rows only, and the batch loss is
their sum::

    L = sum_{k in contrastive kinds} L_k(rows of k)  +  w_d * L_distill(contrastive rows)
        + sum_{k in scored kinds} L_k(rows of k)

Each kind's term is its hook (``jaxembed.losses.parts``: ``Loss.rows``), called with the instance weights of the
other rows set to 0 and its settings (``Objective.settings``):

- contrastive kinds (``infonce``, ``peg``): the contrastive path (``infonce.contrastive_loss``, plain / tiled /
  shard_map), the other rows' candidates left out by the caller (see ``candidate_valid``);
- distillation (``distill.py``, ``none`` / ``kl`` / ``margin_mse``): on the contrastive rows with teacher scores;
- the other kinds after it: scored kinds (``cosent``, ``angle``, ``scored.py``) on the rows of the kind with a pair
  score, the pair being (query, positive).

The set of kinds is static (the run's datasets), the selection per row is data: one compiled step serves a batch of
any dataset, and a batch mixing datasets of different losses gets each row's own loss. In a one-task batch (the
default batching) exactly one kind has rows, so the batch's loss is its task's. A run with a single contrastive kind
and no distillation computes exactly the plain contrastive loss (the weights are not touched).

The contrastive part is a callable (plain / tiled / shard_map, with the run's masks and GIST guide), so this module
does not depend on how the batch is sharded; the other terms are small ([B, K] and [B, B]) and run on global arrays.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxembed.losses import distill as distill_lib
from jaxembed.losses.table import CONTRASTIVE_LOSSES as CONTRASTIVE
from jaxembed.losses.table import LOSS_TABLE
from jaxembed.losses.table import LOSSES as KINDS
from jaxembed.losses.table import SCORED_LOSSES as SCORED

DISTILL = ("none",) + distill_lib.KINDS


def kind_id(kind: str) -> int:
    return KINDS.index(kind)


@dataclasses.dataclass(frozen=True)
class Objective:
    """Static settings. kinds: the loss kinds present in the run (a subset of ``KINDS``); distill / distill_weight /
    distill_temperature (0: the batch's temperature); settings: {kind: its settings} (``jaxembed.losses.parts``; a
    kind not given has its defaults)."""

    kinds: tuple[str, ...] = ("infonce",)
    distill: str = "none"
    distill_weight: float = 1.0
    distill_temperature: float = 0.0
    settings: Any = ()

    def __post_init__(self):
        bad = [k for k in self.kinds if k not in KINDS]
        if bad or not self.kinds:
            raise ValueError(f"loss kinds {self.kinds} must be a non-empty subset of {tuple(KINDS)}")
        if self.distill not in DISTILL:
            raise ValueError(f"distill {self.distill!r} is not one of {DISTILL}")
        given = dict(self.settings)
        for k, s in given.items():
            if k not in self.kinds or not isinstance(s, LOSS_TABLE[k].settings):
                raise ValueError(f"settings {s!r} given for {k!r}: they must be its own, for a kind in {self.kinds}")
        object.__setattr__(self, "settings", tuple(sorted(given.items())))

    def settings_of(self, kind: str):
        """The settings of ``kind``: the given ones, else its defaults."""
        return dict(self.settings).get(kind) or LOSS_TABLE[kind].settings()

    @property
    def contrastive(self) -> tuple[str, ...]:
        return tuple(k for k in KINDS if k in self.kinds and k in CONTRASTIVE)

    @property
    def scored(self) -> tuple[str, ...]:
        return tuple(k for k in KINDS if k in self.kinds and k in SCORED)

    @property
    def others(self) -> tuple[str, ...]:
        """The kinds that are not contrastive (scored pairs, ...): their terms come after distillation."""
        return tuple(k for k in KINDS if k in self.kinds and k not in CONTRASTIVE)

    @property
    def mixed(self) -> bool:
        """Several kinds: rows are selected by their kind."""
        return len(self.kinds) > 1


def contrastive_rows(obj: Objective, row_kind: jax.Array | None, batch_rows: int) -> jax.Array:
    """bool [B]: the rows trained by a contrastive kind."""
    if not obj.mixed or row_kind is None:
        return jnp.full((batch_rows,), bool(obj.contrastive))
    return jnp.isin(row_kind, jnp.asarray([kind_id(k) for k in obj.contrastive] or [-1], jnp.int32))


def candidate_valid(obj: Objective, valid: jax.Array, row_kind: jax.Array | None, K: int) -> jax.Array:
    """valid [B*K] without the candidates of rows trained by a scored loss: in a batch mixing kinds, a scored pair's
    second text is no positive of anything, so it is no negative of the contrastive queries either. (With
    ``loss.symmetric``, the positive -> query term still sees every query of the batch, as its candidates.)"""
    if not (obj.mixed and obj.others and obj.contrastive) or row_kind is None:
        return valid
    return valid & jnp.repeat(contrastive_rows(obj, row_kind, row_kind.shape[0]), K)


ContrastiveFn = Callable[..., tuple[jax.Array, dict]]


class Rows(NamedTuple):
    """What a loss's hook (``jaxembed.losses.parts``: ``rows(settings, rows, weights, kind)``) reads: the batch's
    queries q [B, D] and candidates c [N, D] (raw, the loader's layout), pos_index [B], the batch's temperature, the
    contrastive path ``contrastive(q, c, pos_index, weights, kind) -> (loss, metrics)``, the pair scores [B] (NaN:
    none) or None, the filled slots [B*K] or None, PEG's momentum, and whether the batch mixes kinds."""

    q: jax.Array
    c: jax.Array
    pos_index: jax.Array
    temperature: Any
    contrastive: ContrastiveFn | None
    pair_score: jax.Array | None
    cand_valid: jax.Array | None
    peg_t_prev: Any
    mixed: bool


def kind_loss(obj: Objective, kind: str, rows: Rows, weights: jax.Array, row_kind: jax.Array | None
              ) -> tuple[jax.Array, dict]:
    """The loss of one kind on its own rows (the other rows' weights 0 in a batch mixing kinds): its hook."""
    w = weights if not obj.mixed else jnp.where(row_kind == kind_id(kind), weights, 0.0)
    return LOSS_TABLE[kind].hook()(obj.settings_of(kind), rows, w, kind)


def total_loss(q: jax.Array, c: jax.Array, pos_index: jax.Array, *, objective: Objective,
               contrastive: ContrastiveFn | None, weights: jax.Array, temperature, row_kind: jax.Array | None = None,
               teacher: jax.Array | None = None, cand_valid: jax.Array | None = None,
               pair_score: jax.Array | None = None, peg_t_prev=None) -> tuple[jax.Array, dict]:
    """The batch loss (module docstring) and its metrics, on global arrays (the contrastive callable may shard).

    q: [B, D], c: [N, D] raw embeddings in the loader's layout (N = B * K, query i's candidates are rows
    [iK, (i+1)K), its positive first: pos_index[i] = iK); weights: [B] instance weights; temperature: the
    batch's tau; row_kind: int32 [B] index into ``KINDS`` (needed when several kinds are present); teacher: [B, K]
    teacher scores (NaN: none; needed with distillation); cand_valid: bool [B*K] filled slots; pair_score: [B]
    (NaN: none; needed with scored kinds); peg_t_prev: PEG's momentum.
    contrastive(q, c, pos_index, weights, kind) -> (loss, metrics): the contrastive loss of one kind.

    Metrics: the contrastive kind's metrics (with several contrastive kinds, the second's are prefixed by its
    name), ``distill_loss``, the other kinds' (``<kind>_loss`` for a scored kind), and ``loss``."""
    obj = objective
    B = q.shape[0]
    weights = jnp.asarray(weights, jnp.float32)
    rows = Rows(q, c, pos_index, temperature, contrastive, pair_score, cand_valid, peg_t_prev, obj.mixed)
    total = jnp.zeros((), jnp.float32)
    metrics: dict = {}
    for n, kind in enumerate(obj.contrastive):
        loss_k, m = kind_loss(obj, kind, rows, weights, row_kind)
        total = total + loss_k
        metrics.update(m if n == 0 else {f"{kind}_{k}": v for k, v in m.items()})
    if obj.distill != "none":
        if teacher is None or cand_valid is None:
            raise ValueError("distillation needs the teacher scores and the filled slots")
        K = teacher.shape[1]
        rows_c = contrastive_rows(obj, row_kind, B)
        tt = obj.distill_temperature or None
        d_loss, _ = distill_lib.distill_loss(obj.distill, q, c, None, teacher, cand_valid.reshape(B, K),
                                             jnp.where(rows_c, weights, 0.0), temperature=temperature,
                                             teacher_temperature=tt)
        total = total + obj.distill_weight * d_loss
        metrics["distill_loss"] = d_loss
    for kind in obj.others:
        loss_k, m = kind_loss(obj, kind, rows, weights, row_kind)
        total = total + loss_k
        metrics.update(m)
    metrics["loss"] = total
    return total, jax.tree.map(jax.lax.stop_gradient, metrics)
