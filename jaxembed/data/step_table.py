"""The loader's table of step shapes, computed in windows of steps as the loader reaches them.

A step's static shapes (the padded length buckets, or the packed row length and row counts) come from the longest
texts and the packed rows of that step over the whole global batch (``step_rows``, ``pack_shapes``). Rather than
tokenising every text of the plan before the first step, the table is computed one window of ``window_steps``
consecutive steps at a time (window w = steps [w*W, (w+1)*W)), when the loader first asks for a step of it. A
window's shapes depend only on that window's steps (its row length: the cheapest for its steps; its row counts:
``choose_rows`` over its steps), so every host, every worker and a resumed run get the same shapes for a step
(whoever tokenised which texts), and the work before the first step is one window whatever the plan's size.

W = ``WINDOW_EXAMPLES`` // global batch size steps (at least 1): 1,024 steps at a global batch of 16, 256 at 64,
4 at 4,096, 1 at 16,384 and above. A plan of at most W steps is one window: its table is the whole plan's, as it
always was. Over several windows the row counts a window may choose are rounded up to a fixed menu (``ladder_rows``:
every count up to ``LADDER``, then 16 per doubling, <= 6.25 % more rows), and its row length is one of
``Packing.row_lengths``, so the shapes of the whole run, hence its compilations, stay a bounded set however many
windows it has.

In a pod (``jaxembed.pod``: several processes), the processes compute each window together: each tokenises
its share of the window's (step, row) positions (a contiguous 1/P of them), they exchange the token lengths
through the coordinator (``pod.exchange``: uint16, compressed, ~1/P of a window's texts each), and each builds the
window's table from all of them, the very table one process computes alone. Every process computes the windows
in window order, from the first it was asked for (``_pod_windows``), so the exchanges of two processes never wait
on different windows, also from the loader's prefetch thread (the key-value store is no device collective). A
window is read from the cache only when every process can read it there. A loader worker's copy of the table
(``__getstate__``) is no process of the pod: it computes the windows it lacks by itself.

``StepTable.of_arrays`` wraps a table computed for the whole plan (``step_pack_table`` / ``step_lengths``, a
``cached_step_table`` file) as a single window. With ``cache``, computed windows are also written to files (each
keyed by plan, tokenizer, settings and window size; ``window_file``): a plan of one window in the cache file
itself, else one small file a window beside it, so writing or reading a window costs the window, not the plan. A
restarted run reads them back, and every host may read the files of process 0.
"""

from __future__ import annotations

import base64
import collections
import hashlib
import json
import os
import threading
import zlib
from pathlib import Path

import numpy as np

from jaxembed import pod
from jaxembed.data import step_rows
from jaxembed.data.pack_shapes import Packing, choose_rows, step_pack_table
from jaxembed.data.plan import Plan
from jaxembed.tokenizer import Tokenizer, bucket_for

#: examples (rows of the global batch) a window of steps holds: W = WINDOW_EXAMPLES // global batch size steps
WINDOW_EXAMPLES = 1 << 14
#: row counts up to LADDER are kept; larger ones are rounded up to m * 2^e with LADDER <= m < 2 * LADDER
LADDER = 16
#: windows kept in memory per process (the loader moves forward; prefetching reads a window or two ahead)
KEEP_WINDOWS = 8
#: tables made per key in this process, so that a second table of the same plan exchanges under other names
_instances: collections.Counter = collections.Counter()


def tokenizer_id(tokenizer: Tokenizer) -> str:
    h = hashlib.sha256()
    try:
        h.update(tokenizer.hf.backend_tokenizer.to_str().encode())
    except Exception:  # slow tokenizers: fall back on the vocabulary
        h.update(json.dumps(sorted(tokenizer.hf.get_vocab().items())).encode())
    h.update(f"{tokenizer.max_length}|{tokenizer.lowercase}|{tokenizer.padding_side}".encode())
    return h.hexdigest()[:16]


def window_steps(global_batch_size: int, window_examples: int = WINDOW_EXAMPLES) -> int:
    """Steps per window: ``window_examples`` // global batch size, at least 1."""
    return max(1, int(window_examples) // max(int(global_batch_size), 1))


def ladder_rows(rows: np.ndarray) -> np.ndarray:
    """Each row count rounded up to the menu: itself up to LADDER, else the next multiple of 2^e where
    2^e * LADDER <= count < 2^e * 2 * LADDER (16 values per doubling)."""
    r = np.asarray(rows, np.int64)
    e = np.maximum(np.floor(np.log2(np.maximum(r, 1))).astype(np.int64) - int(np.log2(LADDER)), 0)
    step = np.left_shift(1, e)
    return np.where(r <= LADDER, r, -(-r // step) * step)


def pow2_lengths(lengths: np.ndarray, smallest: int = 16) -> np.ndarray:
    """Each step's longest text rounded up to a power of two (>= smallest): few padded shapes."""
    x = np.maximum(np.asarray(lengths), smallest)
    return (2 ** np.ceil(np.log2(x))).astype(np.int32)


class StepTable:
    """The shapes of a plan's steps (module docstring). ``shape(step)``: packed, (rows per shard of each of
    ``packing.packs``..., row length); padded, (query length, document length), the length buckets of
    ``tables``. round_lengths: 'pow2' rounds the padded lengths up to powers of two first."""

    def __init__(self, store, plan: Plan, tokenizer: Tokenizer, *, packing: Packing | None = None,
                 tables: step_rows.StepTables | None = None, seed: int | None = None, negatives: str | None = None,
                 num_candidates: int | None = None, cache: str | os.PathLike | None = None,
                 round_lengths: str | None = None, window: int | None = None, write: bool = True):
        self.store, self.plan, self.tokenizer, self.packing = store, plan, tokenizer, packing
        self.tables = tables or step_rows.StepTables(store.datasets, tokenizer, plan.used_dataset_ids(),
                                                  num_candidates)
        self.seed = plan.seed if seed is None else int(seed)
        self.negatives = negatives or plan.config.get("negatives", "first")
        self.window_steps = int(window) if window else window_steps(plan.global_batch_size)
        self.windows = max(1, -(-plan.steps // self.window_steps))
        self.cache = Path(cache) if cache is not None else None
        self.round_lengths, self.write = round_lengths, write
        self._done: collections.OrderedDict[int, dict] = collections.OrderedDict()
        self._lock, self._stopped = threading.Lock(), threading.Event()
        self.shapes_seen: set[tuple[int, ...]] = set()
        self._key, self._alone, self._next = None, False, None
        if self.cache is not None or pod.process_count() > 1:
            self.key()  # before any tokenising: a fast tokenizer's settings change as it truncates
        if pod.process_count() > 1:  # the windows' names in the pod's exchanges (the same on every process)
            self._pod_name = f"step_table/{self.key()}/{_instances[self.key()]}"
            _instances[self.key()] += 1

    @classmethod
    def of_arrays(cls, plan: Plan, table: dict[str, np.ndarray], tables: step_rows.StepTables,
                  packing: Packing | None = None, source: str | os.PathLike | None = None) -> "StepTable":
        """A table computed for the whole plan (``step_pack_table`` with packing, else query_len / doc_len),
        as one window."""
        self = cls.__new__(cls)
        self.store = self.tokenizer = None
        self.plan, self.packing, self.tables, self.round_lengths, self.write = plan, packing, tables, None, False
        self.window_steps, self.windows = max(plan.steps, 1), 1
        self.cache = Path(source) if source is not None else None
        self._done, self._lock, self.shapes_seen, self._key = collections.OrderedDict(), threading.Lock(), set(), None
        self._alone, self._next, self._stopped = True, None, threading.Event()
        self._done[0] = self._finish({k: np.asarray(v) for k, v in table.items()})
        return self

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_lock"] = state["_stopped"] = None
        state["write"] = False  # a copy in a loader's worker reads the cache file, the main process writes it
        state["_alone"] = True  # and computes the windows it lacks by itself (it is no process of the pod)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock, self._stopped = threading.Lock(), threading.Event()

    def stop(self) -> None:
        """Give up the windows this process waits for from the others (its loader closed: the run is ending, and
        a process that stopped first will never send its share): a wait in progress or to come ends in a
        UserError, within ``pod.POLL_S``."""
        self._stopped.set()

    # ---- lookup
    def steps_of(self, w: int) -> tuple[int, int]:
        return w * self.window_steps, min((w + 1) * self.window_steps, self.plan.steps)

    def window(self, w: int) -> dict[str, np.ndarray]:
        """Window w's table: from memory, from the cache file, or computed (and written to the cache); in a pod,
        computed by all processes together (``_pod_window``)."""
        with self._lock:
            if w in self._done:
                self._done.move_to_end(w)
                return self._done[w]
            todo = self._pod_windows(w)
            if todo is None:
                raw = self._read(w)
                if raw is None:
                    raw = self._compute(w)
                    self._write(w, raw)
                self._keep(w, raw)
            for v in todo or ():
                self._keep(v, self._pod_window(v))
            return self._done[w]

    def _keep(self, w: int, raw: dict[str, np.ndarray]) -> None:
        self._done[w] = self._finish(raw)
        while len(self._done) > KEEP_WINDOWS:
            self._done.popitem(last=False)

    def shape(self, step: int) -> tuple[int, ...]:
        w = int(step) // self.window_steps
        t, i = self.window(w), int(step) - self.steps_of(w)[0]
        if self.packing is not None:
            return (*(int(x) for x in t["R"][i]), int(t["row_length"][i]))
        return int(t["Lq"][i]), int(t["Ld"][i])

    def query_doc_lengths(self, step: int) -> tuple[int, int]:
        """The step's longest query and document (tokens, over the global batch)."""
        w = int(step) // self.window_steps
        t, i = self.window(w), int(step) - self.steps_of(w)[0]
        return int(t["query_len"][i]), int(t["doc_len"][i])

    # ---- computing a window
    def _compute(self, w: int, text_lengths=None) -> dict[str, np.ndarray]:
        """Window w's raw table; text_lengths: its steps' text lengths when known (gathered in a pod)."""
        s0, s1 = self.steps_of(w)
        if self.packing is not None:
            return step_pack_table(self.store, self.plan, self.tokenizer, self.packing, seed=self.seed,
                                   negatives=self.negatives, tables=self.tables, start_step=s0, end_step=s1,
                                   text_lengths=text_lengths)
        q, d = step_rows.step_lengths(self.store, self.plan, self.tokenizer, seed=self.seed,
                                     negatives=self.negatives, start_step=s0, end_step=s1, tables=self.tables,
                                     text_lengths=text_lengths)
        return {"query_len": np.asarray(q)[s0:s1], "doc_len": np.asarray(d)[s0:s1]}

    # ---- a window computed by the processes of a pod together
    def _pod_windows(self, w: int) -> range | None:
        """The windows to compute with the other processes before w is known, in window order (the same on
        every process, so no two processes ever wait for each other's different windows): from the first window
        this process was asked for (or the last computed) up to w. None: computed by this process alone (one
        process, a loader worker's copy, or a window before those computed, asked again after it left memory)."""
        if self._alone or pod.process_count() == 1:
            return None
        if self._next is None:
            self._next = w
        if w < self._next:
            return None
        todo, self._next = range(self._next, w + 1), w + 1
        return todo

    def _pod_window(self, w: int) -> dict[str, np.ndarray]:
        """Window w, with the other processes: if every process can read it from the cache file, from there;
        else each tokenises its share of the window's rows (``step_rows.share_bounds`` of the (step, row)
        positions), the processes exchange the token lengths (``pod.exchange``: uint16, compressed), and each
        builds the window's table from all of them: the table one process computes alone."""
        name = f"{self._pod_name}/{w}"
        raw = self._read(w)
        cached = pod.exchange(f"{name}/cached", lambda: "1" if raw is not None else "0", self._stopped.is_set)
        for part in ("cached", "lengths"):  # every process is past window w - 1: its values were read
            pod.forget(f"{self._pod_name}/{w - 1}/{part}")
        if all(c == "1" for c in cached):
            return raw
        s0, s1 = self.steps_of(w)
        G = self.plan.global_batch_size
        n, count = (s1 - s0) * G, pod.process_count()

        def share() -> str:
            lo, hi = step_rows.share_bounds(n, pod.process_index(), count)
            q, d = step_rows.rows_text_lengths(self.store, self.plan, self.tokenizer, self.tables, self.seed,
                                               self.negatives, s0, s1, lo, hi)
            return encode_lengths(np.concatenate([q, d]))

        qs, ds = [], []
        for i, text in enumerate(pod.exchange(f"{name}/lengths", share, self._stopped.is_set)):
            lo, hi = step_rows.share_bounds(n, i, count)
            x = decode_lengths(text)
            qs.append(x[:hi - lo])
            ds.append(x[hi - lo:])
        q, d = np.concatenate(qs), np.concatenate(ds)
        raw = self._compute(w, text_lengths=step_rows.split_steps(q, d, s0, G))
        self._write(w, raw)
        return raw

    def _finish(self, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A window's raw table -> with the shapes the loader uses: R (packed rows per shard, ``choose_rows``,
        on the ladder when the plan has several windows) or Lq / Ld (length buckets)."""
        out = dict(raw)
        if self.packing is not None:
            chosen = {k: v for k, v in raw.items()}
            if self.windows > 1:
                for name in self.packing.packs:
                    chosen[f"{name}_rows"] = ladder_rows(raw[f"{name}_rows"])
            out["R"] = choose_rows(chosen, self.packing)
            L = np.asarray(raw["row_length"])
            self.shapes_seen |= {(*(int(x) for x in r), int(x)) for r, x in zip(out["R"], L)}
        else:
            q, d = np.asarray(raw["query_len"]), np.asarray(raw["doc_len"])
            if self.round_lengths == "pow2":
                q, d = pow2_lengths(q), pow2_lengths(d)
            out["Lq"] = np.array([bucket_for(max(int(x), 1), self.tables.q_buckets) for x in q], np.int32)
            out["Ld"] = np.array([bucket_for(max(int(x), 1), self.tables.d_buckets) for x in d], np.int32)
            self.shapes_seen |= set(zip(out["Lq"].tolist(), out["Ld"].tolist()))
        return out

    # ---- the cache file
    def key(self) -> str:
        if self._key is None:
            t = self.tables
            parts = [self.plan.fingerprint(), tokenizer_id(self.tokenizer), self.seed, self.negatives, t.K, t.max_q,
                     t.max_d, t.q_instr, t.d_instr, "windows", self.window_steps]
            parts += [] if self.packing is None else [self.packing.key()]
            self._key = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]
        return self._key

    def window_file(self, w: int) -> Path | None:
        """Where window w is cached: a plan of one window, in the cache file itself; else one small file a window,
        ``{stem}.windows/{w:07d}.npz`` beside it (writing a window costs the window, not the plan)."""
        if self.cache is None:
            return None
        if self.windows == 1:
            return self.cache
        return self.cache.with_name(f"{self.cache.stem}.windows") / f"{w:07d}.npz"

    def cached(self, w: int) -> bool:
        """Whether window w is in memory or in the cache file (no computing needed)."""
        return w in self._done or self._read(w) is not None

    def _read(self, w: int) -> dict | None:
        """Window w's raw table from its file, if that was written for this table (key, window, steps)."""
        f = self.window_file(w)
        if f is None or self.store is None or not f.is_file():
            return None
        s0, s1 = self.steps_of(w)
        try:
            with np.load(f, allow_pickle=False) as z:
                if str(z["key"]) != self.key() or (int(z["window"]) if "window" in z.files else 0) != w:
                    return None
                raw = {k: z[k] for k in z.files if k not in ("key", "window", "windows")}
        except (ValueError, OSError, KeyError, EOFError):
            return None
        return raw if raw and all(len(v) == s1 - s0 for v in raw.values()) else None

    def _write(self, w: int, raw: dict[str, np.ndarray]) -> None:
        """Write window w's file (atomically: a reader sees no file or the whole one)."""
        f = self.window_file(w)
        if f is None or not self.write:
            return
        z = {**raw, "key": np.array(self.key()), "window": np.array(w)}
        from jaxembed.runs import atomic_files

        atomic_files.write_with(f, lambda t: np.savez(t, **z), suffix=".npz")


def encode_lengths(x: np.ndarray) -> str:
    """Token lengths (>= -1: -1 an empty slot) as a short string: uint16 (uint32 from 65,535 tokens up),
    zlib-compressed, base64."""
    y = np.asarray(x, np.int64) + 1
    kind, dtype = ("h", np.uint16) if int(y.max(initial=0)) < 1 << 16 else ("i", np.uint32)
    return kind + base64.b64encode(zlib.compress(y.astype(dtype).tobytes(), 1)).decode("ascii")


def decode_lengths(text: str) -> np.ndarray:
    """``encode_lengths``'s lengths, int64."""
    dtype = np.uint16 if text[:1] == "h" else np.uint32
    return np.frombuffer(zlib.decompress(base64.b64decode(text[1:])), dtype).astype(np.int64) - 1
