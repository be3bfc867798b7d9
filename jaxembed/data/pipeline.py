"""The Grain loader: a ``grain.MapDataset`` over plan steps that yields host-local batches with static shapes.

Step i -> fetch the examples of step i (this host's rows only), prefix the instructions, tokenize (fast tokenizer),
pad to a length bucket, and return numpy arrays ready for ``jax.make_array_from_process_local_data``. A batch is a
pure function of (store, plan, tokenizer, step): after a restart the loader continues at step s with the identical
batch, and worker processes change nothing but speed.

Host-local batch (b = global_batch_size / process_count, K = 1 + max num_negatives of the plan's datasets)::

    query_input_ids      int32  [b, Lq]      query_attention_mask int32 [b, Lq]   query_prompt_length int32 [b]
    doc_input_ids        int32  [b*K, Ld]    doc_attention_mask   int32 [b*K, Ld] doc_prompt_length   int32 [b*K]
    doc_valid            bool   [b*K]        False for empty negative slots
    doc_hash             uint32 [b*K, 2]     64-bit blake2b of the document text without instruction (0 if empty)
    query_hash           uint32 [b, 2]
    task_id int32 [b], dataset_id int32 [b], weight float32 [b], example_index int64 [b]
    teacher_score        float32 [b*K]       the example's teacher score of each candidate (``pos_scores`` /
                                             ``neg_scores``, for distillation), NaN where none or empty
    pair_score           float32 [b]         a scored pair's ``score`` (CoSENT / AnglE), NaN where none
    temperature          float32 []          the batch's task temperature, NaN = run default
    step                 int64 []

Host h holds rows [h*b, (h+1)*b) of the global batch; the candidates of query r are doc rows [r*K, (r+1)*K), the
positive first. The positive is drawn from ``pos`` and (with ``negatives='sample'``) the negatives from ``neg`` by
a key derived from (seed, step, global row), so every host and every worker count agree.

Length buckets: Lq / Ld must be equal on all hosts. The loader takes the longest tokenized query and document of
each step over the *whole* global batch (each distinct text tokenized once) and maps them to
``length_buckets(max length)``: a table computed one window of steps at a time as the loader reaches it
(``jaxembed.data.step_table``; optionally cached in a file), so the first step waits for one window, not for the
whole plan. Every host gets the same table from the same plan (in a pod the hosts compute each window together,
each tokenising its share of the window's texts).
Empty negative slots hold the tokenizer's encoding of the empty text (special tokens only, attention mask 1) so
that the model sees a well-formed sequence; ``doc_valid`` marks them for the loss.

Packed batches (``data.packing``, the trainer's default: ``packing=Packing(...)``; docs/design.md, Architecture)
----------------------------------------------------------------------------------------------------------------

The padded arrays ``query_input_ids`` / ``query_attention_mask`` / ``doc_input_ids`` / ``doc_attention_mask`` are
replaced by two packs, one of the queries and one of the candidates (every other key stays as above)::

    query_pack_input_ids, _segment_ids, _positions, _token_text   int32 [s*Rq, L]   (jaxembed.packing, per slot)
    query_pack_text_row, _text_start, _text_len, _text_prompt     int32 [b]         (per query, in row order)
    doc_pack_input_ids, ...                                       int32 [s*Rd, L]
    doc_pack_text_row, ...                                        int32 [b*K]       (per candidate, in row order)

Shards. The global batch's rows are split over ``Packing.shards`` row shards (the devices along the mesh's batch
axes, every host's); this host holds s = shards / process_count of them, shard j = its rows
[j*b/s, (j+1)*b/s) (the rows ``to_global`` puts on its j-th device). Each shard's queries and each shard's
candidates (in row order, row-major over K) are packed on their own, best-fit decreasing (``jaxembed.packing.pack``)
into Rq (Rd) rows of L token slots, and the packs are stacked (``packing.stack``): shard j's rows are
[j*Rq, (j+1)*Rq) and its indices (``text_row``, ``token_text``) are local, so a device pools only its own rows and
the embeddings come back in the plan's order (query i of shard j = global row j*b/s + i): the loss sees the [B, D]
and [B*K, D] it sees unpacked. Empty candidate slots are packed as the encoding of the empty text (as above), so
every text slot is real and the number of texts per shard is fixed (b/s and b*K/s).

Shapes. Like the padded lengths, a step's shapes are equal on every shard and host, from the step's window of the
table: for every step over the *whole* global batch, the longest text and the rows that best-fit decreasing needs
on the fullest shard (``step_pack_table`` over the window's steps; cached like the lengths). The row length L is
one of ``Packing.row_lengths`` that holds the window's longest text (one L for both packs). The row counts
(Rq, Rd) come from a few shapes chosen for the window (``choose_rows``: greedily, a shape is added while it saves
more token slots than a compilation costs, ``Packing.compile_slots`` from ``compile_cost_slots``, at most
``MAX_SHAPES``; the demo mix at B=64 with MiniLM on a CPU: 12 shapes over a 1000-step plan as one window, 1.9 %
of the rows empty); over several windows the counts are on a fixed menu (``step_table.ladder_rows``), so the run's
shapes stay a bounded set. With the gradient cache
(``Packing.sub_tokens``), a pack's rows are split into sub-batches of about that many token slots per shard
(``sub_rows``, ``sub_batches``), and a row count above one sub-batch is a multiple of the sub-batch's rows. A text
never spans two rows, so it is never cut (L >= the longest text); the loader checks that the table still fits (a
stale table is a UserError naming the cache file).

Choices, measured (benchmarks/train_throughput.py): queries and candidates are two packs rather than one, so that
MoTE keeps one expert per encode call (a pack of queries and documents of different experts runs every used
expert on all its rows, jaxembed.mote) and the gradient cache keeps separate query / candidate sub-batches; best fit
already fills rows to ~90 %, so one shared pack would save little.

Modules: what each row holds and the length table are ``jaxembed.data.step_rows``; the packed shapes (``Packing``,
``step_pack_table``, ``choose_rows``) ``jaxembed.data.pack_shapes``; this module builds the batches
(``StepBatcher``), runs Grain (``Loader``, ``make_loader``), caches the tables and puts batches on devices. It
re-exports the names of the other two.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from jaxembed import packing as packlib
from jaxembed.data.pack_shapes import (COMPILE_STEPS, MAX_SHAPES, MIN_ROW_LENGTH,  # noqa: F401 (re-exported)
                                       ROW_LENGTH_SPAN, Packing, choose_rows, compile_cost_slots, packing_for,
                                       step_pack_table, sub_batches, sub_rows)
from jaxembed.data.step_rows import (M64, SEED_SALT, fetch_examples, row_items, splitmix,  # noqa: F401 (re-exported)
                                     step_text_lengths, StepTables, tokenize_unique, choose_docs, choose_indices,
                                     row_key, row_scores, step_lengths, text_hash)
from jaxembed.data.plan import Plan
from jaxembed.data.plan.file import read_steps
from jaxembed.data.step_table import StepTable, tokenizer_id  # noqa: F401 (re-exported)
from jaxembed.errors import UserError
from jaxembed.tokenizer import Tokenizer

log = logging.getLogger(__name__)

_MIN_SHM_BYTES = 16 << 20  # arrays below this go from the workers by copy, larger ones through shared memory


class StepBatcher:
    """step -> host-local batch dict (see the module docstring). Pickled into each worker process (the store
    must be picklable; ``jaxembed.data.store.Store`` re-opens its files there)."""

    def __init__(self, store, plan: Plan, tokenizer: Tokenizer, *, process_index: int, process_count: int,
                 seed: int, negatives: str, tables: StepTables, table: StepTable, first_step: int, end_step: int,
                 packing: Packing | None = None, table_file: str | os.PathLike | None = None):
        G = plan.global_batch_size
        b = G // process_count
        self.store, self.tokenizer, self.tables, self.plan, self.table = store, tokenizer, tables, plan, table
        self.seed, self.negatives, self.b, self.K = int(seed), negatives, b, tables.K
        self.row0 = process_index * b
        self.first_step, self.end_step = first_step, end_step
        self.dataset_tasks = plan.dataset_tasks.copy()
        self.empty_doc = tokenizer.tokenize([""], max_length=tables.Ld_max)[0]
        self.packing, self.table_file = packing, table_file
        if packing is not None:
            self.shards = packing.shards // process_count  # this host's row shards (its devices)

    def shape(self, step: int) -> tuple[int, ...]:
        """The step's static shapes: packed (the rows per shard of each of ``packing.packs``, then the row length
        L); padded (query length, document length). From the step's window of the table (``StepTable``)."""
        return self.table.shape(step)

    def rows_of(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """This host's (dataset ids, example ids, weights) of the step: its columns of the plan's row, read from the
        plan (memory-mapped when loaded from its file) rather than copied at set-up."""
        cols = slice(self.row0, self.row0 + self.b)
        p = self.plan
        return tuple(read_steps(a, step, step + 1)[0, cols] for a in (p.dataset_ids, p.example_ids, p.weights))

    def _pack(self, step: int, name: str, parts: list[tuple[list, np.ndarray]], rows: int, L: int) -> dict:
        """Each of this host's shards' texts (the shard's share of every (token ids, prompt lengths) part, one part
        after the other) packed on their own into ``rows`` rows of L, stacked (``packing.stack``: local indices),
        under ``{name}_*`` keys (module docstring)."""
        packs = []
        for j in range(self.shards):
            ids, prompt = [], []
            for part_ids, part_prompt in parts:
                n = len(part_ids) // self.shards
                ids += part_ids[j * n:(j + 1) * n]
                prompt.append(part_prompt[j * n:(j + 1) * n])
            try:
                packs.append(packlib.pack(ids, rows, L, prompt_lengths=np.concatenate(prompt),
                                          pad_id=self.tokenizer.pad_id))
            except packlib.DoesNotFit as e:
                where = f" (fix: delete {self.table_file})" if self.table_file else ""
                raise UserError(f"step {step}: the texts of a shard's {name} need {e.needed} packed rows of {L} "
                                f"tokens, the length table allows {rows}: the table is stale{where}") from None
        if any(bool(p["text_truncated"].any()) for p in packs):
            raise UserError(f"step {step}: a text is longer than the step's row length {L}: the length table is "
                            "stale" + (f" (fix: delete {self.table_file})" if self.table_file else ""))
        stacked = packlib.stack(packs)
        keys = packlib.ROW_KEYS + ("text_row", "text_start", "text_len", "text_prompt")
        return {f"{name}_{k}": stacked[k].astype(np.int32) for k in keys}

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        step = int(step)
        if not self.first_step <= step < self.end_step:
            raise UserError(f"step {step} is outside the loader's range [{self.first_step}, {self.end_step})")
        b, K, tok, t = self.b, self.K, self.tokenizer, self.tables
        ds, ex, weight = self.rows_of(step)
        examples = fetch_examples(self.store, ds, ex)
        rows = self.row0 + np.arange(b)
        q_items, d_items, q_raw, d_raw = row_items(t, examples, ds, rows, step, self.seed, self.negatives)
        q_ids = tokenize_unique(tok, q_items)
        valid = np.array([x is not None for x in d_items], bool)
        d_tok = tokenize_unique(tok, [x for x in d_items if x is not None])
        it = iter(d_tok)
        d_ids = [next(it) if v else self.empty_doc for v in valid]
        row_ds = np.repeat(ds, K)
        q_pl = np.array([min(t.q_plen[int(d)], len(x)) for d, x in zip(ds, q_ids)], np.int32)
        d_pl = np.array([min(t.d_plen[int(d)], len(x)) if v else 0 for d, x, v in zip(row_ds, d_ids, valid)],
                        np.int32)
        if self.packing is not None:
            *R, L = self.shape(step)
            parts = [(q_ids, q_pl), (d_ids, d_pl)]
            if self.packing.combined:
                texts = self._pack(step, "pack", parts, R[0], L)
            else:
                texts = {**self._pack(step, "query_pack", parts[:1], R[0], L),
                         **self._pack(step, "doc_pack", parts[1:], R[1], L)}
        else:
            Lq, Ld = self.shape(step)
            longest_q, longest_d = max(len(x) for x in q_ids), max(len(x) for x in d_ids)
            if longest_q > Lq or longest_d > Ld:
                raise UserError(f"step {step}: a text is longer than the step's length bucket ({longest_q} > {Lq} "
                                f"or {longest_d} > {Ld}): the length table is stale (fix: delete the lengths cache "
                                "file)")
            qi, qm = tok.pad(q_ids, Lq)
            di, dm = tok.pad(d_ids, Ld)
            texts = {"query_input_ids": qi, "query_attention_mask": qm, "doc_input_ids": di,
                     "doc_attention_mask": dm}
        teacher, pair = row_scores(t, examples, ds, rows, step, self.seed, self.negatives)
        q_hash = np.array([text_hash(s) for s in q_raw], np.uint32).reshape(b, 2)
        d_hash = np.array([text_hash(s) if s is not None else (0, 0) for s in d_raw], np.uint32).reshape(b * K, 2)
        return {
            **texts, "query_prompt_length": q_pl, "doc_prompt_length": d_pl,
            "doc_valid": valid, "doc_hash": d_hash, "query_hash": q_hash,
            "task_id": self.dataset_tasks[ds].astype(np.int32), "dataset_id": ds.astype(np.int32),
            "weight": weight.astype(np.float32), "example_index": ex.astype(np.int64),
            "teacher_score": teacher, "pair_score": pair,
            "temperature": np.array(self.plan.temperatures[step], np.float32), "step": np.array(step, np.int64),
        }


def _worker_init(worker_index: int, worker_count: int, tokenizer_parallelism: bool = False) -> None:
    """Runs in each Grain worker before it unpickles the pipeline: one tokenizer thread per worker by default
    (the workers are the parallelism; a Rust thread pool per worker oversubscribes the cores)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if tokenizer_parallelism else "false"


def _mark_absl_flags_parsed() -> None:
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


class Loader:
    """Iterator of host-local batches for steps [start_step, end_step). ``batch(step)`` computes any step directly
    (no prefetch); ``close()`` stops the worker processes. ``next_step`` is the step the next batch will have."""

    def __init__(self, batcher: StepBatcher, start_step: int, end_step: int, workers: int, threads: int,
                 buffer: int, worker_tokenizer_parallelism: bool = False):
        import functools

        import grain

        self.batcher, self.start_step, self.end_step = batcher, start_step, end_step
        self.next_step = start_step
        self.workers = workers
        ds = grain.MapDataset.range(start_step, end_step).map(batcher)
        it_ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=threads, prefetch_buffer_size=buffer))
        if workers > 0:
            _mark_absl_flags_parsed()
            # batches are small (< a few MiB): pickled copies are cheap and leave no shared-memory segments behind
            it_ds = grain.experimental.WithOptionsIterDataset(
                it_ds, grain.experimental.DatasetOptions(min_shm_size=_MIN_SHM_BYTES))
            it_ds = it_ds.mp_prefetch(
                grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=buffer),
                worker_init_fn=functools.partial(_worker_init, tokenizer_parallelism=worker_tokenizer_parallelism))
        self._ds = it_ds
        self._it = None

    @property
    def shapes(self) -> dict:
        b, K = self.batcher.b, self.batcher.K
        out = {"rows": b, "candidates": K, "query_buckets": self.batcher.tables.q_buckets,
               "doc_buckets": self.batcher.tables.d_buckets}
        if self.batcher.packing is not None:  # the (query rows, candidate rows, row length) per shard of the steps
            out["packed_shapes"] = sorted(self.batcher.table.shapes_seen)  # of the windows this process computed
        return out

    def batch(self, step: int) -> dict[str, np.ndarray]:
        return self.batcher(step)

    def __iter__(self) -> "Loader":
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self.next_step >= self.end_step:
            raise StopIteration
        if self._it is None:
            self._it = iter(self._ds)
        batch = next(self._it)
        if int(batch["step"]) != self.next_step:  # cannot happen: grain keeps order
            raise RuntimeError(f"loader out of order: got step {int(batch['step'])}, expected {self.next_step}")
        self.next_step += 1
        return batch

    def close(self) -> None:
        stop = getattr(self.batcher.table, "stop", None)
        if stop is not None:  # a prefetch waiting for the other processes' share of a window gives up
            stop()
        it, self._it = self._it, None
        if it is not None and hasattr(it, "close"):
            it.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def make_loader(store, plan: Plan, tokenizer: Tokenizer, *, process_index: int = 0, process_count: int = 1,
                start_step: int = 0, end_step: int | None = None, workers: int = 0, threads: int = 1,
                buffer: int = 4, seed: int | None = None, lengths: tuple[np.ndarray, np.ndarray] | None = None,
                lengths_cache: str | os.PathLike | None = None, worker_tokenizer_parallelism: bool = False,
                num_candidates: int | None = None, packing: Packing | None = None,
                pack_table: dict[str, np.ndarray] | None = None, step_table: StepTable | None = None) -> Loader:
    """An iterator over host-local batches of steps [start_step, end_step) (end: the plan's last step).

    store: the dataset store the plan was built on (checked by name and size); tokenizer: a jaxembed Tokenizer;
    process_index / process_count: this host and the host count (global batch % count == 0);
    workers: Grain worker processes (0 = in-process; each worker tokenizes on one thread unless
    worker_tokenizer_parallelism); threads / buffer: Grain read threads and prefetch depth;
    seed: the positive / negative sampling seed (default: the plan's);
    lengths: precomputed ``step_lengths`` (query_len, doc_len); lengths_cache: a .npz file where the length table
    is read from or written to (keyed by plan fingerprint, tokenizer and settings);
    num_candidates: K, the candidate rows per query (default 1 + the largest num_negatives of the plan's datasets;
    set it to keep K fixed across plans / stages of one run);
    packing: packed batches (module docstring; None = padded); pack_table: its precomputed ``step_pack_table``
    (else read from / written to lengths_cache);
    step_table: a ``StepTable`` (the trainer's, with its cache file); without it, lengths, pack_table or
    lengths_cache, the table is computed in windows of steps as the loader reaches them (``StepTable``)."""
    plan.check_datasets(store)
    G = plan.global_batch_size
    if process_count < 1 or not 0 <= process_index < process_count:
        raise UserError(f"process_index {process_index} / process_count {process_count}: need "
                        "0 <= process_index < process_count")
    if G % process_count:
        raise UserError(f"global_batch_size {G} is not divisible by process_count {process_count} "
                        "(fix: a global batch size that is a multiple of the host count)")
    end_step = plan.steps if end_step is None else int(end_step)
    if not 0 <= start_step <= end_step <= plan.steps:
        raise UserError(f"steps [{start_step}, {end_step}) are outside the plan's {plan.steps} steps "
                        "(fix: resume from a step inside the plan, or build a longer plan)")
    if workers < 0:
        raise UserError(f"workers must be >= 0, got {workers}")
    seed = plan.seed if seed is None else int(seed)
    negatives = plan.config.get("negatives", "first")
    if packing is not None:
        S = packing.shards
        if S % process_count or G % S:
            raise UserError(f"packing over {S} devices: the global batch size {G} and the {process_count} hosts "
                            f"must divide evenly (fix: a global batch size that is a multiple of {S}, and the same "
                            "number of devices on every host)")
    if step_table is not None:
        table, tables = step_table, step_table.tables
        if step_table.plan.steps != plan.steps or (step_table.packing is None) != (packing is None):
            raise UserError("step_table was made for another plan or packing (fix: make it with this loader's plan "
                            "and packing)")
    else:
        tables = StepTables(store.datasets, tokenizer, plan.used_dataset_ids(), num_candidates)
        table = _given_table(store, plan, tokenizer, tables, packing, seed, lengths, lengths_cache, pack_table)
    batcher = StepBatcher(store, plan, tokenizer, process_index=process_index, process_count=process_count,
                          seed=seed, negatives=negatives, tables=tables, table=table, first_step=start_step,
                          end_step=end_step, packing=packing, table_file=lengths_cache or table.cache)
    return Loader(batcher, start_step, end_step, workers, threads, buffer, worker_tokenizer_parallelism)


def _given_table(store, plan: Plan, tokenizer: Tokenizer, tables: StepTables, packing: Packing | None, seed: int,
                 lengths, lengths_cache, pack_table) -> StepTable:
    """make_loader's table: the whole plan's when given (pack_table / lengths) or cached (lengths_cache, computed
    there once for the whole plan); otherwise computed in windows as the loader goes (``StepTable``)."""
    if packing is not None:
        if pack_table is None and lengths_cache is not None:
            pack_table = cached_step_table(store, plan, tokenizer, lengths_cache, packing=packing, seed=seed,
                                           tables=tables)
        if pack_table is None:
            return StepTable(store, plan, tokenizer, packing=packing, tables=tables, seed=seed)
        if any(np.asarray(pack_table.get(k, ())).shape != (plan.steps,)
               for k in ("row_length", *(f"{n}_rows" for n in packing.packs))):
            raise UserError(f"pack_table must hold arrays of shape [{plan.steps}] (one entry per plan step)")
        return StepTable.of_arrays(plan, pack_table, tables, packing, source=lengths_cache)
    if lengths is None and lengths_cache is not None:
        lengths = cached_step_lengths(store, plan, tokenizer, lengths_cache, seed=seed, tables=tables)
    if lengths is None:
        return StepTable(store, plan, tokenizer, tables=tables, seed=seed)
    qlen, dlen = (np.asarray(x) for x in lengths)
    if qlen.shape != (plan.steps,) or dlen.shape != (plan.steps,):
        raise UserError(f"lengths must be two arrays of shape [{plan.steps}] (one entry per plan step)")
    return StepTable.of_arrays(plan, {"query_len": qlen, "doc_len": dlen}, tables, source=lengths_cache)


def cached_step_lengths(store, plan: Plan, tokenizer: Tokenizer, cache: str | os.PathLike, *,
                        seed: int | None = None, tables: StepTables | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``step_lengths`` of the whole plan, read from ``cache`` (.npz) when it was written for the same plan,
    tokenizer and settings, else computed and written there (atomically). Every host may share one file."""
    t = cached_step_table(store, plan, tokenizer, cache, seed=seed, tables=tables)
    return t["query_len"], t["doc_len"]


#: the step-table cache of a run, in its run directory (RunDir.step_tables); a StepTable's windows go beside it,
#: in ``plan_lengths.windows/``
STEP_TABLE_FILE = "plan_lengths.npz"


def cached_step_table(store, plan: Plan, tokenizer: Tokenizer, cache: str | os.PathLike, *,
                      packing: Packing | None = None, seed: int | None = None, tables: StepTables | None = None,
                      num_candidates: int | None = None) -> dict[str, np.ndarray]:
    """The length table of the whole plan (``step_lengths`` as query_len / doc_len; with ``packing``,
    ``step_pack_table``), read from ``cache`` (.npz) when it was written for the same plan, tokenizer and settings,
    else computed and written there (atomically). Every host may share one file. num_candidates: K (as
    ``make_loader``; packing counts the empty candidate slots)."""
    seed = plan.seed if seed is None else int(seed)
    negatives = plan.config.get("negatives", "first")
    tables = tables or StepTables(store.datasets, tokenizer, plan.used_dataset_ids(), num_candidates)
    key = hashlib.sha256(json.dumps([plan.fingerprint(), tokenizer_id(tokenizer), seed, negatives, tables.K,
                                     tables.max_q, tables.max_d, tables.q_instr, tables.d_instr]
                                    + ([] if packing is None else [packing.key()])).encode()
                         ).hexdigest()[:16]
    cache = Path(cache)
    if cache.is_file():
        try:
            with np.load(cache, allow_pickle=False) as z:
                if str(z["key"]) == key:
                    return {k: z[k] for k in z.files if k != "key"}
                log.info("%s: lengths cache is for another plan/tokenizer; recomputing", cache)
        except (ValueError, OSError, KeyError):
            log.warning("%s: unreadable lengths cache; recomputing", cache)
    t0 = time.time()
    if packing is None:
        qlen, dlen = step_lengths(store, plan, tokenizer, seed=seed, negatives=negatives, tables=tables)
        table = {"query_len": qlen, "doc_len": dlen}
    else:
        table = step_pack_table(store, plan, tokenizer, packing, seed=seed, negatives=negatives, tables=tables)
    log.info("length table for %d steps in %.1fs", plan.steps, time.time() - t0)
    from jaxembed.runs import atomic_files

    # a temporary name unique across hosts (a pid alone repeats across containers), renamed into place
    atomic_files.write_with(cache, lambda t: np.savez(t, key=np.array(key), **table), suffix=".npz")
    return table


# --------------------------------------------------------------------------------------------------- device

def to_global(batch: dict, sharding, *, keys: Sequence[str] | None = None) -> dict:
    """Host-local batch -> global ``jax.Array``s (``jaxembed.parallel.host_local_to_global``).

    sharding: a ``jax.sharding.Mesh`` (rows split over its batch axes) or a ``NamedSharding`` whose spec splits
    dim 0. keys: only these entries (default: all)."""
    from jaxembed.parallel import host_local_to_global

    return host_local_to_global({k: batch[k] for k in (keys or list(batch))}, sharding)


def split_combined(x: np.ndarray, shards: int, queries: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-text values of a combined pack (per shard: its queries, then its candidates) -> (the queries' [b], the
    candidates' [b*K]) in row order; queries: b (all shards)."""
    x = np.asarray(x).reshape(shards, -1, *np.shape(x)[1:])
    q = queries // shards
    return x[:, :q].reshape(queries, *x.shape[2:]), x[:, q:].reshape(-1, *x.shape[2:])


def batch_stats(batch: dict, shards: int = 1) -> dict:
    """Examples, real tokens (valid texts) and computed token slots of a host-local batch, padded or packed (for
    throughput figures); shards: this host's row shards (a combined pack)."""
    b = int(batch["query_prompt_length"].shape[0])
    if "pack_input_ids" in batch:
        ql, dl = split_combined(batch["pack_text_len"], shards, b)
        slots = int(batch["pack_input_ids"].size)
    elif "query_pack_input_ids" in batch:
        ql, dl = batch["query_pack_text_len"], batch["doc_pack_text_len"]
        slots = int(batch["query_pack_input_ids"].size + batch["doc_pack_input_ids"].size)
    else:
        ql, dl = batch["query_attention_mask"].sum(axis=1), batch["doc_attention_mask"].sum(axis=1)
        slots = int(batch["query_input_ids"].size + batch["doc_input_ids"].size)
    return {"examples": b, "tokens": int(ql.sum() + dl[batch["doc_valid"]].sum()), "padded_tokens": slots}


__all__ = ["make_loader", "StepTable", "to_global", "step_lengths", "cached_step_lengths", "cached_step_table",
           "step_pack_table", "Packing", "packing_for", "choose_rows", "compile_cost_slots", "sub_batches", "sub_rows",
           "choose_docs", "choose_indices", "row_scores", "row_key", "text_hash", "Loader", "StepBatcher",
           "batch_stats", "split_combined"]
