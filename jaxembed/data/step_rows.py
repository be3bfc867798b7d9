"""What each row of a step holds, and how long its texts are (``jaxembed.data.pipeline`` builds the batches from it):
the examples of a step's rows, the positive and negatives each row takes (a key derived from (seed, step, global
row), so every host and every worker count agree: ``row_key``, ``choose_docs``), the instructed texts, their
tokens, and the longest query / document of every step over the whole global batch (``step_lengths``)."""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from jaxembed.data.plan import Plan
from jaxembed.data.plan.file import read_steps
from jaxembed.errors import UserError
from jaxembed.tokenizer import Tokenizer, length_buckets

M64 = (1 << 64) - 1
SEED_SALT = 0x6A61_7865_6D62  # "jaxemb": the loader's stream differs from the plan's


def splitmix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def row_key(seed: int, step: int, row: int) -> int:
    """A 64-bit key from (seed, step, global row): drives the choice of positive and sampled negatives."""
    return splitmix(splitmix(splitmix(int(seed) ^ SEED_SALT) ^ int(step)) ^ int(row))


def text_hash(text: str) -> tuple[int, int]:
    """64-bit blake2b digest of a text as two uint32 (low word first)."""
    lo, hi = np.frombuffer(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "<u4")
    return int(lo), int(hi)


def choose_docs(example: dict, num_negatives: int, key: int, negatives: str = "first") -> tuple[str, list[str]]:
    """(positive, negatives) of one row: the positive is pos[key % len(pos)]; the negatives are the first
    ``num_negatives`` of ``neg`` ('first') or a sample of them seeded by key ('sample'), fewer if ``neg`` is short."""
    pi, ni = choose_indices(example, num_negatives, key, negatives)
    neg = example.get("neg") or []
    return example["pos"][pi], [neg[i] for i in ni]


def choose_indices(example: dict, num_negatives: int, key: int, negatives: str = "first") -> tuple[int, list[int]]:
    """The indices into ``pos`` and ``neg`` that ``choose_docs`` takes."""
    pos = example.get("pos") or []
    if not pos:
        raise UserError(f"example '{example.get('id')}' has no positive (fix: every example needs pos: [text, ...])")
    pi = key % len(pos)
    n_neg = len(example.get("neg") or [])
    n = min(int(num_negatives), n_neg)
    if n <= 0:
        return pi, []
    if negatives == "first" or n == n_neg:
        return pi, list(range(n))
    return pi, [int(i) for i in np.random.default_rng(key).choice(n_neg, n, replace=False)]


def row_scores(tables: "StepTables", examples: list[dict], ds: np.ndarray, rows: np.ndarray, step: int, seed: int,
               negatives: str) -> tuple[np.ndarray, np.ndarray]:
    """(teacher_score float32 [len*K], pair_score float32 [len]) of the rows (module docstring): the teacher scores
    of the very candidates ``row_items`` chose (same keys), NaN where an example has none."""
    K = tables.K
    teacher = np.full((len(examples), K), np.nan, np.float32)
    pair = np.full(len(examples), np.nan, np.float32)
    for r, (e, d, row) in enumerate(zip(examples, ds, rows)):
        if "score" in e:
            pair[r] = e["score"]
        ps, ns = e.get("pos_scores"), e.get("neg_scores")
        if ps is None and ns is None:
            continue
        pi, ni = choose_indices(e, tables.num_neg[int(d)], row_key(seed, step, int(row)), negatives)
        if ps is not None:
            teacher[r, 0] = ps[pi]
        if ns is not None:
            teacher[r, 1:1 + len(ni)] = [ns[i] for i in ni]
    return teacher.reshape(-1), pair


class StepTables:
    """Per-dataset constants (instructions, prompt lengths, max lengths, negatives) the batcher needs."""

    def __init__(self, infos, tokenizer: Tokenizer, dataset_ids: Sequence[int], num_candidates: int | None = None):
        n = len(infos)
        self.q_instr = [getattr(i, "query_instruction", None) or "" for i in infos]
        self.d_instr = [getattr(i, "doc_instruction", None) or "" for i in infos]
        cap = int(tokenizer.max_length)
        self.max_q = [min(int(getattr(i, "max_query_length", 0) or cap), cap) for i in infos]
        self.max_d = [min(int(getattr(i, "max_doc_length", 0) or cap), cap) for i in infos]
        self.num_neg = [int(getattr(i, "num_negatives", 0) or 0) for i in infos]
        for i, k in zip(infos, self.num_neg):
            if k < 0:
                raise UserError(f"dataset '{i.name}': num_negatives must be >= 0, got {k}")
        cache: dict[str, int] = {}

        def plen(s: str) -> int:
            if s not in cache:
                cache[s] = tokenizer.prompt_length(s)
            return cache[s]

        self.q_plen = [plen(s) if d in dataset_ids else 0 for d, s in enumerate(self.q_instr)]
        self.d_plen = [plen(s) if d in dataset_ids else 0 for d, s in enumerate(self.d_instr)]
        used = sorted(set(int(d) for d in dataset_ids)) or list(range(n))
        self.Lq_max = max(self.max_q[d] for d in used)
        self.Ld_max = max(self.max_d[d] for d in used)
        self.q_buckets = length_buckets(self.Lq_max)
        self.d_buckets = length_buckets(self.Ld_max)
        self.K = 1 + max(self.num_neg[d] for d in used)
        if num_candidates is not None:
            if num_candidates < self.K:
                raise UserError(f"num_candidates {num_candidates} is below 1 + the largest num_negatives of the "
                                f"plan's datasets ({self.K}) (fix: num_candidates >= {self.K}, or None)")
            self.K = int(num_candidates)


def fetch_examples(store, ds: np.ndarray, ex: np.ndarray) -> list[dict]:
    """Examples of rows (ds[r], ex[r]), in row order; one store call per dataset."""
    out: list[dict | None] = [None] * len(ds)
    for d in np.unique(ds):
        idx = np.flatnonzero(ds == d)
        got = store.examples(int(d), [int(x) for x in ex[idx]])
        for r, e in zip(idx, got):
            out[r] = e
    return out  # type: ignore[return-value]


def tokenize_unique(tokenizer: Tokenizer, items: Sequence[tuple[str, int]]) -> list[list[int]]:
    """items: (text, max_length) -> token ids of each, each distinct pair tokenized once."""
    uniq: dict[tuple[str, int], int] = {}
    for it in items:
        uniq.setdefault(it, len(uniq))
    keys = list(uniq)
    ids: list[list[int] | None] = [None] * len(keys)
    by_len: dict[int, list[int]] = {}
    for k, (_, L) in enumerate(keys):
        by_len.setdefault(L, []).append(k)
    for L, ks in by_len.items():
        toks = tokenizer.tokenize([keys[k][0] for k in ks], max_length=L)
        for k, t in zip(ks, toks):
            ids[k] = t
    return [ids[uniq[it]] for it in items]  # type: ignore[misc]


def row_items(tables: StepTables, examples: list[dict], ds: np.ndarray, rows: np.ndarray, step: int, seed: int,
               negatives: str):
    """Query items [(text, max_len)], doc items [(text, max_len) or None for an empty slot] of length len*K,
    plus the raw query / doc texts (for the hashes)."""
    K = tables.K
    q_items, d_items, q_raw, d_raw = [], [], [], []
    for e, d, r in zip(examples, ds, rows):
        d = int(d)
        q_items.append((tables.q_instr[d] + e["query"], tables.max_q[d]))
        q_raw.append(e["query"])
        pos, negs = choose_docs(e, tables.num_neg[d], row_key(seed, step, int(r)), negatives)
        docs = [pos] + negs
        for j in range(K):
            if j < len(docs):
                d_items.append((tables.d_instr[d] + docs[j], tables.max_d[d]))
                d_raw.append(docs[j])
            else:
                d_items.append(None)
                d_raw.append(None)
    return q_items, d_items, q_raw, d_raw


def share_bounds(n: int, index: int, count: int) -> tuple[int, int]:
    """Positions [lo, hi) of share ``index`` of ``count`` contiguous, near-equal shares of n positions."""
    return index * n // count, (index + 1) * n // count


def rows_text_lengths(store, plan: Plan, tokenizer: Tokenizer, tables: StepTables, seed: int, negatives: str,
                      start_step: int, end_step: int, lo: int = 0, hi: int | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Token lengths of the rows at positions [lo, hi) of steps [start_step, end_step), position p being global
    row p % G of step start_step + p // G: (query lengths int64 [n], candidate lengths int64 [n*K]) of the
    tokenized texts (instruction included), -1 for an empty candidate slot. Each distinct text is tokenized once."""
    G = plan.global_batch_size
    hi = (end_step - start_step) * G if hi is None else hi
    if hi <= lo:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    s0, s1 = start_step + lo // G, start_step + -(-hi // G)
    cut = slice(lo - (s0 - start_step) * G, hi - (s0 - start_step) * G)
    ds = read_steps(plan.dataset_ids, s0, s1).reshape(-1)[cut]
    ex = read_steps(plan.example_ids, s0, s1).reshape(-1)[cut]
    key = ds.astype(np.int64) * (1 << 40) + ex
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    uniq_ex = fetch_examples(store, ds[first], ex[first])
    examples = [uniq_ex[k] for k in inv.reshape(-1)]
    pos = np.arange(lo, hi) + (start_step - s0) * G  # positions from step s0's first row
    q_all, d_all = [], []
    bounds = np.searchsorted(pos // G, np.arange(s1 - s0 + 1))  # positions are in order: each step's run of them
    for i, s in enumerate(range(s0, s1)):
        sel = slice(bounds[i], bounds[i + 1])
        q, d, _, _ = row_items(tables, examples[sel], ds[sel], pos[sel] % G, s, seed, negatives)
        q_all += q
        d_all += d
    q_ids = tokenize_unique(tokenizer, q_all)
    d_ids = tokenize_unique(tokenizer, [x for x in d_all if x is not None])
    real = np.array([x is not None for x in d_all], bool)
    d_len = np.full(len(d_all), -1, np.int64)
    d_len[real] = [len(t) for t in d_ids]
    return np.array([len(t) for t in q_ids], np.int64), d_len


def split_steps(q_len: np.ndarray, d_len: np.ndarray, start_step: int, G: int):
    """Yield (step, query lengths [G], candidate lengths [G*K]) of consecutive whole steps from start_step, from
    the lengths of their rows in order (``rows_text_lengths``)."""
    K = len(d_len) // max(len(q_len), 1)
    for i in range(len(q_len) // G):
        yield start_step + i, q_len[i * G:(i + 1) * G], d_len[i * G * K:(i + 1) * G * K]


def step_text_lengths(store, plan: Plan, tokenizer: Tokenizer, tables: StepTables, seed: int, negatives: str,
                       start_step: int, end_step: int, chunk_steps: int):
    """Yield (step, query lengths int64 [G], candidate lengths int64 [G*K]) of every step in [start_step, end_step)
    over the whole global batch: tokens of each tokenized text (instruction included), -1 for an empty candidate
    slot. Each distinct text of a chunk of steps is tokenized once."""
    for s0 in range(start_step, end_step, chunk_steps):
        s1 = min(end_step, s0 + chunk_steps)
        q, d = rows_text_lengths(store, plan, tokenizer, tables, seed, negatives, s0, s1)
        yield from split_steps(q, d, s0, plan.global_batch_size)


def step_lengths(store, plan: Plan, tokenizer: Tokenizer, *, seed: int | None = None, negatives: str | None = None,
                 start_step: int = 0, end_step: int | None = None, chunk_steps: int = 256,
                 tables: StepTables | None = None, text_lengths=None) -> tuple[np.ndarray, np.ndarray]:
    """Longest tokenized query and document of every step over the whole global batch:
    -> (query_len int32 [S], doc_len int32 [S]) (0 outside [start_step, end_step)). text_lengths: the steps'
    (step, query lengths, candidate lengths) when already known (``split_steps``: gathered from the processes
    of a pod), else tokenized here."""
    seed = plan.seed if seed is None else seed
    negatives = negatives or plan.config.get("negatives", "first")
    tables = tables or StepTables(store.datasets, tokenizer, plan.used_dataset_ids())
    end_step = plan.steps if end_step is None else end_step
    qlen = np.zeros(plan.steps, np.int32)
    dlen = np.zeros(plan.steps, np.int32)
    if text_lengths is None:
        text_lengths = step_text_lengths(store, plan, tokenizer, tables, seed, negatives, start_step, end_step,
                                          chunk_steps)
    for s, q, d in text_lengths:
        qlen[s] = max(int(q.max(initial=0)), 1)
        dlen[s] = max(int(d.max(initial=0)), 1)
    return qlen, dlen
