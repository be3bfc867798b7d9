"""The shapes of packed batches, fixed before training (``jaxembed.data.pipeline`` packs each step to them; the
layout is in its docstring): the ``Packing`` of a run (shards, one pack or two, gradient-cache sub-batches), the
row length and the rows every step needs over the whole global batch (``step_pack_table``), and the few row
counts the whole plan compiles for (``choose_rows``)."""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxembed import packing as packlib
from jaxembed.data.plan import Plan
from jaxembed.data.step_rows import step_text_lengths, StepTables
from jaxembed.errors import UserError
from jaxembed.tokenizer import Tokenizer

#: a packed row holds at least this many token slots (several short texts per row; jaxembed.encode.ROW_TEXTS)
MIN_ROW_LENGTH = 64
#: the row lengths a run may take: powers of two from MIN_ROW_LENGTH up to this many times the longest text allowed
ROW_LENGTH_SPAN = 4


def sub_rows(sub_tokens: int, row_length: int) -> int:
    """Rows of a gradient-cache sub-batch (per shard): ``sub_tokens`` token slots of rows of ``row_length``, at
    least one row; 0 = no cache."""
    return max(1, int(sub_tokens) // int(row_length)) if sub_tokens else 0


def sub_batches(rows: int, row_length: int, sub_tokens: int) -> int:
    """How many gradient-cache sub-batches a pack of ``rows`` rows (per shard) is encoded in (1 = at once)."""
    r = sub_rows(sub_tokens, row_length)
    if not r or rows <= r:
        return 1
    if rows % r:
        raise ValueError(f"gradient cache: {rows} packed rows are not a multiple of the sub-batch's {r} rows")
    return rows // r


@dataclasses.dataclass(frozen=True)
class Packing:
    """How the loader packs a step (module docstring).

    shards: row shards of the global batch (devices along the mesh's batch axes, all hosts); combined: one pack of
    the queries and the candidates (``pack_*``) rather than two (``query_pack_*``, ``doc_pack_*``); min_row_length:
    the shortest row; attention_cost: the relative cost of a token's attention per slot of its row (a slot of a row
    of L costs 1 + attention_cost * L: attention is 4 L H of a layer's ~24 H^2 FLOPs per token, so 1 / (6 H)); the
    row length with the least total cost is chosen; sub_tokens: gradient cache, token slots per shard of a
    sub-batch of each pack (0: no cache); compile_slots: what one more compilation of the step costs, in token
    slots of one shard (``compile_cost_slots``; 0: ``COMPILE_STEPS`` average steps), for ``choose_rows``."""

    shards: int = 1
    combined: bool = True
    min_row_length: int = MIN_ROW_LENGTH
    attention_cost: float = 0.0
    sub_tokens: tuple[int, ...] = (0,)
    compile_slots: float = 0.0

    def __post_init__(self):
        if self.shards < 1 or self.min_row_length < 1:
            raise ValueError(f"shards ({self.shards}) and min_row_length ({self.min_row_length}) must be >= 1")
        if len(self.sub_tokens) != len(self.packs):
            raise ValueError(f"sub_tokens: one per pack ({', '.join(self.packs)}), got {self.sub_tokens}")

    @property
    def packs(self) -> tuple[str, ...]:
        """The batch's packs: their key prefixes, ``{name}_input_ids`` etc."""
        return ("pack",) if self.combined else ("query_pack", "doc_pack")

    def row_lengths(self, cap: int) -> list[int]:
        """The candidate row lengths for texts of at most ``cap`` tokens: powers of two from min_row_length up to
        ROW_LENGTH_SPAN x the power of two >= cap."""
        top = ROW_LENGTH_SPAN * (1 << (max(int(cap), self.min_row_length, 1) - 1).bit_length())
        out, L = [], 1 << (max(self.min_row_length, 1) - 1).bit_length()
        while L <= top:
            out.append(L)
            L *= 2
        return out

    def rows(self, needed: int, row_length: int, pack: int) -> int:
        """The smallest row count of pack number ``pack`` (per shard) that holds ``needed`` rows: with the gradient
        cache, a multiple of its sub-batch rows when it takes more than one."""
        R = max(int(needed), 1)
        r = sub_rows(self.sub_tokens[pack], row_length)
        if r and R > r:
            R = -(-R // r) * r
        return R

    def slot_cost(self, row_length: int) -> float:
        return 1.0 + self.attention_cost * row_length

    def key(self) -> list:
        return [self.shards, self.combined, self.min_row_length, round(self.attention_cost, 9),
                list(self.sub_tokens)]


#: seconds one compilation of a train step takes, by platform: rough figures (CPU: all-MiniLM-L6-v2 at B=64 on one
#: core, per packed shape; GPU / TPU: within the H200 records' range for MiniLM to BERT-large,
#: benchmarks/results/gpu_train_h200_*)
COMPILE_SECONDS = {"cpu": 8.0, "gpu": 30.0, "tpu": 30.0}
#: the train step's sustained matrix FLOP/s per device on a CPU (a rough figure: a MiniLM-L6 packed demo-mix step at
#: B=64 on one core); on accelerators MFU_GUESS x the device's peak (the H200 records' MFU: benchmarks/README.md)
CPU_TRAIN_FLOPS = 6.3e10
MFU_GUESS = 0.2


def compile_cost_slots(model_config, platform: str, peak_flops: float | None = None) -> float:
    """What one compilation of the train step costs in token slots of one device: COMPILE_SECONDS of the
    platform x the slots a device trains per second (its FLOP/s over 3 x 2 FLOPs per matrix parameter per
    token, ``jaxembed.flops``). MiniLM-L6 on a CPU core: ~7.9k slots (about 2 steps of B=64); a tiny test model:
    millions (one shape). 0 (the COMPILE_STEPS rule) for a model without a FLOP formula."""
    from jaxembed import flops as flopslib

    try:
        per_slot = 6.0 * flopslib.layer_matrix_params(model_config)
    except (AttributeError, ValueError):
        return 0.0
    if platform == "cpu":
        rate = CPU_TRAIN_FLOPS
    else:
        rate = MFU_GUESS * (peak_flops or 5e14)
    return COMPILE_SECONDS.get(platform, 30.0) * rate / max(per_slot, 1.0)


def packing_for(store, plan: Plan, tokenizer: Tokenizer, *, shards: int, combined: bool = True,
                model_config=None, platform: str = "cpu", peak_flops: float | None = None, gradcache_chunk: int = 0,
                num_candidates: int | None = None) -> Packing:
    """The trainer's ``Packing``: ``shards`` devices along the batch axes; combined (queries and candidates in one
    pack) or not; from the model's config, the attention cost its architecture declares (``packing_cost``,
    ``jaxembed.models.architecture``) and what a compilation costs on ``platform`` (``compile_cost_slots``; neither
    without a config); with the gradient cache (``gradcache_chunk`` queries per sub-batch of the padded path),
    sub-batches of as many token slots as that many padded queries (chunk / shards x the longest query length) and
    their candidates (x K x the longest document length) take per shard: the padded sub-batch's memory bound, spent
    on real tokens."""
    t = StepTables(store.datasets, tokenizer, plan.used_dataset_ids(), num_candidates)
    per_shard = -(-int(gradcache_chunk) // int(shards)) if gradcache_chunk else 0
    q, d = per_shard * t.Lq_max, per_shard * t.K * t.Ld_max
    cost = 0.0
    if model_config is not None:
        from jaxembed import models

        cost = models.spec_for(model_config.model_type).packing_cost(model_config)
    return Packing(shards=int(shards), combined=combined, sub_tokens=(q + d,) if combined else (q, d),
                   attention_cost=cost,
                   compile_slots=compile_cost_slots(model_config, platform, peak_flops) if model_config else 0.0)


#: without a compile cost (``Packing.compile_slots`` 0), a new packed shape is worth its compilation when it saves
#: the token slots of this many average steps
COMPILE_STEPS = 20
#: at most this many (query rows, candidate rows) shapes per row length
MAX_SHAPES = 16


def choose_rows(table: dict[str, np.ndarray], packing: Packing, compile_steps: int = COMPILE_STEPS,
                max_shapes: int = MAX_SHAPES) -> np.ndarray:
    """The row counts of every step, int32 [S, packs] (per shard, for each of ``packing.packs``), from the whole
    plan's table: a few shapes per row length, chosen greedily. Start with the shape that fits every step; add the
    shape some step needs (``Packing.rows``) that saves the most token slots (each step takes the smallest chosen
    shape it fits), as long as it saves at least what a compilation costs (``packing.compile_slots``, or else
    ``compile_steps`` average steps' slots) and there are fewer than ``max_shapes``. A pure function of the table
    and the packing, so every host and every restart get the same shapes."""
    L = np.asarray(table["row_length"])
    cols = [np.asarray(table[f"{name}_rows"]) for name in packing.packs]
    out = np.zeros((len(L), len(cols)), np.int32)
    for length in np.unique(L[L > 0]):
        idx = np.flatnonzero(L == length)
        need = np.array([[packing.rows(c[i], int(length), k) for k, c in enumerate(cols)] for i in idx], np.int64)
        shapes, inv, count = np.unique(need, axis=0, return_inverse=True, return_counts=True)
        inv = inv.reshape(-1)
        size = shapes.sum(axis=1)                           # rows of each distinct need, as a shape of its own
        top = shapes.max(axis=0)
        chosen = [tuple(int(x) for x in top)]               # fits every step
        cost = np.full(len(shapes), int(top.sum()), np.int64)  # rows each need takes under the chosen shapes
        fits = (shapes[None, :, :] <= shapes[:, None, :]).all(axis=2)  # [candidate shape, need]
        while len(chosen) < max_shapes:
            new = np.where(fits, np.minimum(cost[None, :], size[:, None]), cost[None, :])  # [candidate, need]
            saved = (cost[None, :] - new) @ count
            best = int(np.argmax(saved))
            worth = packing.compile_slots / float(length) if packing.compile_slots else \
                compile_steps * (cost @ count) / count.sum()  # a compilation's cost, in rows of this length
            if saved[best] <= 0 or saved[best] < worth:
                break
            chosen.append(tuple(int(x) for x in shapes[best]))
            cost = new[best]
        for k, want in enumerate(shapes):
            fit = min((sum(c), c) for c in chosen if all(x >= w for x, w in zip(c, want)))[1]
            out[idx[inv == k]] = fit
    return out


def step_pack_table(store, plan: Plan, tokenizer: Tokenizer, packing: Packing, *, seed: int | None = None,
                    negatives: str | None = None, chunk_steps: int = 256, tables: StepTables | None = None,
                    start_step: int = 0, end_step: int | None = None, text_lengths=None) -> dict[str, np.ndarray]:
    """The packed shapes of every step of the plan, or of steps [start_step, end_step), over the whole global
    batch (module docstring), int32 [steps] each: row_length (L, one for the steps: of the candidates
    ``Packing.row_lengths`` that hold the longest text,
    the one with the least total cost, rows x L x ``Packing.slot_cost``), ``{pack}_rows`` for each of
    ``packing.packs`` (rows best-fit decreasing needs at L on the fullest shard, before ``choose_rows``),
    query_len / doc_len (the longest texts, as ``step_lengths``). text_lengths: the steps' (step, query lengths,
    candidate lengths) when already known (``step_rows.split_steps``), else tokenized here."""
    seed = plan.seed if seed is None else seed
    negatives = negatives or plan.config.get("negatives", "first")
    tables = tables or StepTables(store.datasets, tokenizer, plan.used_dataset_ids())
    G, S = plan.global_batch_size, packing.shards
    end_step = plan.steps if end_step is None else int(end_step)
    n = end_step - start_step
    if G % S:
        raise UserError(f"global_batch_size {G} is not divisible by the {S} devices of the batch axes (fix: a "
                        f"global batch size that is a multiple of {S})")
    n_empty = len(tokenizer.tokenize([""], max_length=tables.Ld_max)[0])
    cands = packing.row_lengths(max(tables.Lq_max, tables.Ld_max))
    names = packing.packs
    rows = np.full((len(cands), len(names), n), -1, np.int64)  # -1: L is below the step's longest text
    out = {k: np.zeros(n, np.int32) for k in ("row_length", "query_len", "doc_len")}
    if text_lengths is None:
        text_lengths = step_text_lengths(store, plan, tokenizer, tables, seed, negatives, start_step, end_step,
                                          chunk_steps)
    for s, q, d in text_lengths:
        s -= start_step
        d = np.where(d < 0, n_empty, d)
        out["query_len"][s], out["doc_len"][s] = max(int(q.max()), 1), max(int(d.max()), 1)
        longest = max(int(q.max()), int(d.max()))
        parts = ([np.concatenate([a, b]) for a, b in zip(np.split(q, S), np.split(d, S))],) if packing.combined \
            else (np.split(q, S), np.split(d, S))
        for i, L in enumerate(cands):
            if L >= longest:
                for k, shards in enumerate(parts):
                    rows[i, k, s] = max(packlib.rows_needed(x, L) for x in shards)
    best, best_cost = None, None
    for i, L in enumerate(cands):
        if (rows[i] < 0).any():
            continue
        n = sum(packing.rows(r, L, k) for k in range(len(names)) for r in rows[i, k])
        cost = n * L * packing.slot_cost(L)
        if best_cost is None or cost < best_cost:
            best, best_cost = i, cost
    out["row_length"][:] = cands[best]
    for k, name in enumerate(names):
        out[f"{name}_rows"] = rows[best, k].astype(np.int32)
    return out
