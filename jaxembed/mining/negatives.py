"""Hard-negative mining with ranking-consistency filtering (KaLM-Embedding 3.2, ``jaxembed mine``).

The job: encode every query of a dataset and its corpus (all positives and negatives of the dataset, deduplicated,
or a given corpus file plus the positives), rank the corpus for every query, and

1. **ranking-consistency filter** (KaLM, "top-k filtering"): a (query, positive) pair is kept only when the positive
   ranks within the top ``top_k`` (k = 50) of the corpus for its query; an example with no such positive left is
   dropped (counted, with its best rank);
2. **negative sampling**: ``num_negatives`` (m = 7) negatives are drawn, seeded, from the rank window
   ``[window[0], window[1])`` (ranks 50-100), excluding every positive of the query, exact duplicates of a positive
   text (also after whitespace normalisation) and the query text itself;
3. **margin filter** (optional): a candidate scoring above ``margin`` x the score of the query's weakest kept
   positive is dropped as a likely false negative.

Ranks are 0-based positions in the ranking by cosine similarity (rank 0 = most similar); a window ``A:B`` is a
Python slice of that ranking. The rank of a positive counts the corpus texts other than the query's positives that
score more than ``tol`` (1e-5) above it, so ties favour the positive and other positives never push it down.

Search (``blocked_search``): exact top-T by blocked matrix products. The corpus is sharded by rows over all devices
(``jax.shard_map``); each device scans its shard in blocks of ``block_c`` texts for a block of ``block_q`` queries,
keeping a running top-T and the number of texts scoring above each positive; the per-device candidates are
gathered and merged. Memory per device is O(block_q x block_c), never the [Q, D] score matrix. For very large
corpora an approximate IVF index (spherical k-means lists, ``nprobe`` lists searched per query) can replace it;
its ranks then count only the searched lists (a lower bound of the exact rank).

Embeddings come from the project's ``Encoder`` (batched by length, multi-device, progress bar); ``encode_texts``
caches them per shard of texts so that a killed job resumes without re-encoding finished shards (``jaxembed score``
uses it too).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from jaxembed.errors import UserError

RANK_BINS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


# ------------------------------------------------------------------------------------------------ encoding

def normalize(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (zero rows stay zero). [N, D] -> [N, D] float32."""
    x = np.asarray(x, np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def model_fingerprint(encoder) -> str:
    """A short hash of an Encoder's weights (a few parameter arrays), tokenizer settings and output dimension:
    the cache key that tells one model from another."""
    h = hashlib.sha256()
    try:
        import jax
        from flax import nnx

        leaves = jax.tree.leaves(nnx.state(encoder.model))
        for leaf in leaves[:3] + leaves[-3:]:
            a = np.asarray(leaf)
            h.update(str(a.shape).encode())
            h.update(a.reshape(-1)[:65536].tobytes())
        tok = encoder.tokenizer
        h.update(f"{tok.max_length}|{tok.lowercase}|{tok.padding_side}|{encoder.model.dim}".encode())
    except Exception:  # noqa: BLE001 -- an encoder-like object without flax weights: its class names it
        h.update(type(encoder).__qualname__.encode())
    return h.hexdigest()[:16]


def _shard_key(model_key: str, prompt: str, max_length, texts: Sequence[str]) -> str:
    h = hashlib.sha256()
    h.update(f"{model_key}|{max_length}|{len(prompt)}:{prompt}|{len(texts)}".encode())
    for t in texts:
        h.update(len(t).to_bytes(8, "little"))
        h.update(t.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def encode_texts(encoder, texts: Sequence[str], *, prompt: str = "", max_length: int | None = None,
                 batch_size: int = 64, cache_dir: str | os.PathLike | None = None, name: str = "texts",
                 shard_size: int = 4096, model_key: str | None = None, bar=None,
                 encode_kw: dict | None = None) -> np.ndarray:
    """Encode ``texts`` (each prefixed by ``prompt``, pooled as the training loader does) with an Encoder.
    -> [N, D] float32 in input order.

    With ``cache_dir``, the texts are encoded in shards of ``shard_size``; shard k is saved as
    ``cache_dir/<name>-<k>.npz`` with a key (model fingerprint, prompt, max length, the shard's texts), written
    atomically. A rerun loads every shard whose key matches and encodes only the others, so a killed job
    resumes where it stopped. ``bar``: a tqdm bar to advance by the texts done (encoded or loaded); ``encode_kw``:
    more keyword arguments of ``Encoder.encode`` (e.g. a MoTE model's ``task`` / ``side``)."""
    n = len(texts)
    if n == 0:
        dim = getattr(getattr(encoder, "model", None), "dim", 0)
        return np.zeros((0, dim), np.float32)
    kw = dict(prompt=prompt, max_length=max_length, batch_size=batch_size, progress=False, **(encode_kw or {}))
    if cache_dir is None:
        out = np.asarray(encoder.encode(list(texts), **kw), np.float32)
        if bar is not None:
            bar.update(n)
        return out
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    mk = model_key or model_fingerprint(encoder)
    parts = []
    for k, s in enumerate(range(0, n, shard_size)):
        chunk = list(texts[s:s + shard_size])
        key = _shard_key(mk + json.dumps(encode_kw or {}, sort_keys=True), prompt, max_length, chunk)
        path = cache / f"{name}-{k:05d}.npz"
        emb = None
        if path.exists():
            try:
                with np.load(path, allow_pickle=False) as z:
                    if str(z["key"]) == key and z["emb"].shape[0] == len(chunk):
                        emb = z["emb"]
            except (OSError, ValueError, KeyError):
                emb = None  # a damaged shard (killed mid-write by something else): encode it again
        if emb is None:
            emb = np.asarray(encoder.encode(chunk, **kw), np.float32)
            tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
            np.savez(tmp, emb=emb, key=np.array(key))
            os.replace(tmp, path)
        parts.append(emb)
        if bar is not None:
            bar.update(len(chunk))
    return np.concatenate(parts, 0)


def progress_bar(total: int, desc: str, show: bool | None = None):
    """A tqdm bar with ETA (on a terminal, or when ``show`` says so)."""
    from tqdm.auto import tqdm

    show = sys.stderr.isatty() if show is None else show
    return tqdm(total=total, desc=desc, unit="text", disable=not show, smoothing=0.1)


# ------------------------------------------------------------------------------------------------ exact search

def _mesh():
    import jax
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()), ("d",))


_SEARCH_FNS: dict = {}


def _search_fn(mesh, T: int, block_c: int):
    """jit(shard_map) block search: (q [bq, D], thr [bq, P], docs [N, D] sharded by rows, valid [N])
    -> (top scores [bq, T], top ids [bq, T], above [bq, P]). Each device scans its shard in blocks of block_c."""
    key = (id(mesh), tuple(mesh.devices.flat), T, block_c)
    if key in _SEARCH_FNS:
        return _SEARCH_FNS[key]
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    def local(q, thr, docs, valid):
        nl, dim = docs.shape
        nch = nl // block_c
        base = jax.lax.axis_index("d") * nl
        chunks = docs.reshape(nch, block_c, dim)
        vch = valid.reshape(nch, block_c)
        bq = q.shape[0]

        def body(carry, xs):
            vals, idx, above, off = carry
            c, v = xs
            s = jnp.dot(q, c.T, precision=jax.lax.Precision.HIGHEST)            # [bq, block_c]
            s = jnp.where(v[None, :], s, -jnp.inf)
            above = above + jnp.sum(s[:, :, None] > thr[:, None, :], axis=1, dtype=jnp.int32)
            ids = jnp.broadcast_to(off + jnp.arange(block_c, dtype=jnp.int32), s.shape)
            # carry first: lax.top_k keeps the lower position first among equal scores -> lower id first
            nv, pos = jax.lax.top_k(jnp.concatenate([vals, s], 1), T)
            ni = jnp.take_along_axis(jnp.concatenate([idx, ids], 1), pos, axis=1)
            return (nv, ni, above, off + block_c), None

        init = (jnp.full((bq, T), -jnp.inf, q.dtype), jnp.full((bq, T), -1, jnp.int32),
                jnp.zeros(thr.shape, jnp.int32), (base + 0).astype(jnp.int32))
        (vals, idx, above, _), _ = jax.lax.scan(body, init, (chunks, vch))
        allv = jax.lax.all_gather(vals, "d", axis=1, tiled=True)                 # device-major = id order
        alli = jax.lax.all_gather(idx, "d", axis=1, tiled=True)
        nv, pos = jax.lax.top_k(allv, T)
        return nv, jnp.take_along_axis(alli, pos, axis=1), jax.lax.psum(above, "d")

    fn = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P("d"), P("d")),
                               out_specs=(P(), P(), P()), check_vma=False))
    _SEARCH_FNS[key] = fn
    return fn


@dataclasses.dataclass
class SearchResult:
    """ids / scores int64 / float32 [Q, T]: the top T corpus rows per query, best first (ties: lower id first);
    above int64 [Q, P]: number of corpus rows scoring more than thresholds[q, p]."""

    ids: np.ndarray
    scores: np.ndarray
    above: np.ndarray


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def prepare_corpus(docs: np.ndarray, block_c: int, mesh=None):
    """Pad the corpus to a multiple of (devices x block_c) and shard it by rows over the mesh.
    -> (docs [N', D] sharded, valid [N'] sharded, block_c used, mesh)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = mesh or _mesh()
    ndev = mesh.size
    n = docs.shape[0]
    block_c = max(8, min(int(block_c), _round_up(-(-n // ndev), 8)))
    total = _round_up(max(n, 1), ndev * block_c)
    pad = np.zeros((total, docs.shape[1]), np.float32)
    pad[:n] = docs
    valid = np.zeros(total, bool)
    valid[:n] = True
    sh = NamedSharding(mesh, P("d"))
    return jax.device_put(pad, sh), jax.device_put(valid, sh), block_c, mesh


def blocked_search(queries: np.ndarray, docs: np.ndarray, k: int, *, thresholds: np.ndarray | None = None,
                   block_q: int = 256, block_c: int = 4096, mesh=None, progress: bool | None = False
                   ) -> SearchResult:
    """Exact top-k of ``docs`` [N, D] for every row of ``queries`` [Q, D] by inner product (pass normalised rows
    for cosine), by blocks of block_q queries x block_c corpus rows per device, the corpus sharded over all
    devices. thresholds [Q, P] (optional, +inf = unused): also count the corpus rows scoring above each."""
    import jax

    queries = np.asarray(queries, np.float32)
    docs = np.asarray(docs, np.float32)
    nq, n = queries.shape[0], docs.shape[0]
    if n == 0:
        raise UserError("the corpus is empty: nothing to rank")
    k = int(min(k, n))
    thr = np.full((nq, 1), np.inf, np.float32) if thresholds is None else np.asarray(thresholds, np.float32)
    P_ = thr.shape[1]
    # keep the [block_q, block_c, P] comparison within ~64M elements
    dev_docs, valid, block_c, mesh = prepare_corpus(docs, block_c, mesh)
    block_q = max(1, min(int(block_q), max(1, (1 << 26) // max(1, block_c * P_)), nq))
    fn = _search_fn(mesh, k, block_c)
    ids = np.zeros((nq, k), np.int64)
    scores = np.zeros((nq, k), np.float32)
    above = np.zeros((nq, P_), np.int64)
    bar = progress_bar(nq, "search", progress)
    with bar:
        for s in range(0, nq, block_q):
            qb = np.zeros((block_q, queries.shape[1]), np.float32)
            tb = np.full((block_q, P_), np.inf, np.float32)
            m = min(block_q, nq - s)
            qb[:m] = queries[s:s + m]
            tb[:m] = thr[s:s + m]
            v, i, a = jax.device_get(fn(qb, tb, dev_docs, valid))
            ids[s:s + m], scores[s:s + m], above[s:s + m] = i[:m], v[:m], a[:m]
            bar.update(m)
    return SearchResult(ids, scores, above)


def search_memory(nq_block: int, n_docs: int, dim: int, k: int, block_c: int, P_: int = 1, mesh=None) -> dict:
    """XLA's memory analysis of one compiled block search (bytes): how much the search of ``nq_block`` queries
    against ``n_docs`` rows needs besides its inputs -- the test that the [Q, D] matrix is never built."""
    import jax.numpy as jnp

    docs, valid, block_c, mesh = prepare_corpus(np.zeros((n_docs, dim), np.float32), block_c, mesh)
    fn = _search_fn(mesh, min(k, n_docs), block_c)
    c = fn.lower(jnp.zeros((nq_block, dim), jnp.float32), jnp.zeros((nq_block, P_), jnp.float32), docs,
                 valid).compile()
    m = c.memory_analysis()
    return {"temp": int(m.temp_size_in_bytes), "arguments": int(m.argument_size_in_bytes),
            "output": int(m.output_size_in_bytes), "block_c": block_c}


# ------------------------------------------------------------------------------------------------ IVF index

class IVFIndex:
    """Approximate search: spherical k-means splits the (normalised) corpus into ``nlist`` lists; a query is scored
    against the documents of its ``nprobe`` closest lists only. nprobe = nlist is exact."""

    def __init__(self, docs: np.ndarray, nlist: int, *, iterations: int = 10, seed: int = 0,
                 sample: int = 100_000):
        import jax
        import jax.numpy as jnp

        docs = np.asarray(docs, np.float32)
        n = docs.shape[0]
        if not 1 <= nlist <= n:
            raise UserError(f"--nlist must be between 1 and the corpus size {n}, got {nlist}")
        self.docs, self.nlist = docs, int(nlist)
        rng = np.random.default_rng(seed)
        train = docs if n <= sample else docs[rng.choice(n, sample, replace=False)]
        cent = train[rng.choice(train.shape[0], self.nlist, replace=False)].copy()
        assign_fn = jax.jit(lambda x, c: jnp.argmax(jnp.dot(x, c.T, precision=jax.lax.Precision.HIGHEST), 1))

        def assign(x, c):
            return np.concatenate([np.asarray(assign_fn(x[s:s + 8192], c)) for s in range(0, x.shape[0], 8192)])

        for _ in range(iterations):
            a = assign(train, cent)
            sums = np.zeros_like(cent)
            np.add.at(sums, a, train)
            counts = np.bincount(a, minlength=self.nlist)
            empty = counts == 0
            sums[empty] = train[rng.choice(train.shape[0], int(empty.sum()), replace=True)]
            cent = normalize(sums)
        self.centroids = cent
        a = assign(docs, cent)
        order = np.argsort(a, kind="stable")
        counts = np.bincount(a, minlength=self.nlist)
        self.list_size = int(counts.max())
        table = np.full((self.nlist, self.list_size), -1, np.int64)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        for c in range(self.nlist):
            table[c, :counts[c]] = order[starts[c]:starts[c] + counts[c]]
        self.table = table
        self.counts = counts
        self._fns: dict = {}

    def _fn(self, T: int, nprobe: int):
        key = (T, nprobe)
        if key not in self._fns:
            import jax
            import jax.numpy as jnp

            hi = jax.lax.Precision.HIGHEST

            def f(q, thr, cent, table, docs):
                probe = jax.lax.top_k(jnp.dot(q, cent.T, precision=hi), nprobe)[1]    # [bq, nprobe]
                ids = table[probe].reshape(q.shape[0], -1)                           # [bq, nprobe * L]
                emb = docs[jnp.maximum(ids, 0)]                                      # [bq, M, D]
                s = jnp.einsum("bd,bmd->bm", q, emb, precision=hi)
                s = jnp.where(ids >= 0, s, -jnp.inf)
                above = jnp.sum(s[:, :, None] > thr[:, None, :], axis=1, dtype=jnp.int32)
                nv, pos = jax.lax.top_k(s, T)
                return nv, jnp.take_along_axis(ids, pos, axis=1), above

            self._fns[key] = jax.jit(f)
        return self._fns[key]

    def search(self, queries: np.ndarray, k: int, *, nprobe: int = 8, thresholds: np.ndarray | None = None,
               block_bytes: int = 1 << 28, progress: bool | None = False) -> SearchResult:
        """Approximate top-k of every query among the documents of its nprobe closest lists (fewer than k
        candidates: the rest are id -1, score -inf)."""
        import jax

        queries = np.asarray(queries, np.float32)
        nq, dim = queries.shape
        nprobe = int(min(max(1, nprobe), self.nlist))
        M = nprobe * self.list_size
        k = int(min(k, self.docs.shape[0], M))
        thr = np.full((nq, 1), np.inf, np.float32) if thresholds is None else np.asarray(thresholds, np.float32)
        bq = int(max(1, min(nq, block_bytes // max(1, M * dim * 4))))
        fn = self._fn(k, nprobe)
        ids = np.zeros((nq, k), np.int64)
        scores = np.zeros((nq, k), np.float32)
        above = np.zeros((nq, thr.shape[1]), np.int64)
        with progress_bar(nq, "search (ivf)", progress) as bar:
            for s in range(0, nq, bq):
                m = min(bq, nq - s)
                qb = np.zeros((bq, dim), np.float32)
                tb = np.full((bq, thr.shape[1]), np.inf, np.float32)
                qb[:m], tb[:m] = queries[s:s + m], thr[s:s + m]
                v, i, a = jax.device_get(fn(qb, tb, self.centroids, self.table, self.docs))
                ids[s:s + m], scores[s:s + m], above[s:s + m] = i[:m], v[:m], a[:m]
                bar.update(m)
        return SearchResult(ids, scores, above)


# ------------------------------------------------------------------------------------------------ mining

@dataclasses.dataclass
class MineConfig:
    """top_k: ranking-consistency threshold (KaLM: 50); window: (start, end) ranks to sample from (50, 100);
    num_negatives: m (7); margin: drop candidates above margin x the weakest kept positive's score (None: off);
    approx: None (exact) or 'ivf' (+ nlist, nprobe); tol: score tolerance of the rank comparisons."""

    top_k: int = 50
    window: tuple[int, int] = (50, 100)
    num_negatives: int = 7
    margin: float | None = None
    seed: int = 0
    approx: str | None = None
    nlist: int | None = None
    nprobe: int = 8
    block_q: int = 256
    block_c: int = 4096
    tol: float = 1e-5

    def check(self) -> None:
        if self.top_k < 1:
            raise UserError(f"--top-k must be >= 1, got {self.top_k}")
        a, b = self.window
        if not 0 <= a < b:
            raise UserError(f"--window {a}:{b}: expected START:END with 0 <= START < END (e.g. 50:100)")
        if self.num_negatives < 0:
            raise UserError(f"--num-negatives must be >= 0, got {self.num_negatives}")
        if self.margin is not None and not (0 < self.margin and math.isfinite(self.margin)):
            raise UserError(f"--margin must be a positive fraction (e.g. 0.95), got {self.margin}")
        if self.approx not in (None, "ivf"):
            raise UserError(f"--approx {self.approx!r}: 'ivf' or none")
        if self.nprobe < 1:
            raise UserError(f"--nprobe must be >= 1, got {self.nprobe}")


def parse_window(text: str) -> tuple[int, int]:
    """'50:100' -> (50, 100)."""
    try:
        a, b = text.split(":")
        return int(a), int(b)
    except ValueError:
        raise UserError(f"--window {text!r}: expected START:END, e.g. 50:100") from None


def norm_text(t: str) -> str:
    """Whitespace-normalised text: what counts as an exact duplicate."""
    return " ".join(t.split())


def rank_histogram(ranks: Sequence[int]) -> dict[str, int]:
    """Counts of ranks in the bins 0, 1, 2-4, 5-9, 10-19, 20-49, 50-99, ..., >= 1000."""
    ranks = np.asarray(ranks, np.int64)
    out = {}
    edges = list(RANK_BINS) + [None]
    for lo, hi in zip(edges[:-1], edges[1:]):
        label = (str(lo) if hi == lo + 1 else f"{lo}-{hi - 1}") if hi is not None else f">={lo}"
        sel = ranks >= lo if hi is None else (ranks >= lo) & (ranks < hi)
        out[label] = int(sel.sum())
    return out


@dataclasses.dataclass
class MineResult:
    records: list[dict]
    report: dict


def build_corpus(examples: Sequence[dict], corpus: Sequence[str] | None = None) -> tuple[list[str], dict, int]:
    """The corpus texts (deduplicated, first occurrence order): every pos and neg of the examples, or ``corpus``
    plus every positive missing from it. -> (texts, text -> id, positives added to a given corpus)."""
    texts: list[str] = []
    index: dict[str, int] = {}

    def add(t):
        if t not in index:
            index[t] = len(texts)
            texts.append(t)

    added = 0
    if corpus is None:
        for e in examples:
            for t in e["pos"]:
                add(t)
            for t in e.get("neg", []):
                add(t)
    else:
        for t in corpus:
            add(t)
        for e in examples:
            for t in e["pos"]:
                if t not in index:
                    added += 1
                    add(t)
    return texts, index, added


def mine_with_embeddings(examples: Sequence[dict], query_emb: np.ndarray, corpus: Sequence[str],
                         corpus_emb: np.ndarray, config: MineConfig, *, query_index: np.ndarray | None = None,
                         progress: bool | None = False) -> MineResult:
    """The mining step on embeddings: examples (``{"id", "query", "pos", "neg", ...}``), query_emb [Qu, D]
    (row ``query_index[i]`` is example i's query; default one row per example), the corpus texts and their
    embeddings [N, D] (every positive must be in the corpus). -> MineResult(records, report)."""
    config.check()
    t0 = time.time()
    n_ex = len(examples)
    qi = np.arange(n_ex) if query_index is None else np.asarray(query_index, np.int64)
    Q = normalize(query_emb)[qi] if n_ex else np.zeros((0, corpus_emb.shape[1]), np.float32)
    D = normalize(corpus_emb)
    index = {t: i for i, t in enumerate(corpus)}
    by_norm: dict[str, list[int]] = {}
    for i, t in enumerate(corpus):
        by_norm.setdefault(norm_text(t), []).append(i)
    pos_ids = []
    for e in examples:
        ids = []
        for t in e["pos"]:
            if t not in index:
                raise UserError(f"example {e.get('id')!r}: its positive is not in the corpus (fix: build the corpus "
                                "with jaxembed.mining.build_corpus)")
            ids.append(index[t])
        pos_ids.append(ids)
    P_ = max([len(p) for p in pos_ids] + [1])
    pos_scores = np.full((n_ex, P_), -np.inf, np.float64)
    for i, ids in enumerate(pos_ids):
        pos_scores[i, :len(ids)] = (D[ids].astype(np.float64) @ Q[i].astype(np.float64))
    thr = np.where(np.isfinite(pos_scores), pos_scores + config.tol, np.inf).astype(np.float32)
    a, b = config.window
    T = max(b, 1)
    if config.approx == "ivf":
        nlist = config.nlist or max(1, int(round(math.sqrt(len(corpus)))))
        index_ivf = IVFIndex(D, nlist, seed=config.seed)
        res = index_ivf.search(Q, T, nprobe=config.nprobe, thresholds=thr, progress=progress)
        search_info = {"search": "ivf", "nlist": nlist, "nprobe": min(config.nprobe, nlist),
                       "largest_list": index_ivf.list_size}
    else:
        res = blocked_search(Q, D, T, thresholds=thr, block_q=config.block_q, block_c=config.block_c,
                             progress=progress)
        search_info = {"search": "exact", "block_q": config.block_q, "block_c": config.block_c}

    records, filtered = [], []
    best_ranks, all_ranks = [], []
    n_pos = n_pos_kept = 0
    excl = {"positive of the query": 0, "duplicate of a positive": 0, "the query itself": 0, "margin": 0}
    neg_full = neg_short = neg_none = neg_total = 0
    m = config.num_negatives
    for i, e in enumerate(examples):
        ids = pos_ids[i]
        ps = pos_scores[i, :len(ids)]
        ranks = []
        for l in range(len(ids)):
            others = sum(1 for l2 in range(len(ids)) if l2 != l and ps[l2] > ps[l] + config.tol)
            ranks.append(max(0, int(res.above[i, l]) - others))
        all_ranks += ranks
        best = min(ranks)
        best_ranks.append(best)
        keep = [l for l in range(len(ids)) if ranks[l] < config.top_k]
        n_pos += len(ids)
        n_pos_kept += len(keep)
        if not keep:
            filtered.append({"id": e.get("id"), "best_rank": best, "reason": "no positive within top-k"})
            continue
        pos_set = set(ids)
        dup = set()
        for t in e["pos"]:
            dup.update(by_norm.get(norm_text(t), []))
        selfq = set(by_norm.get(norm_text(e["query"]), []))
        floor = config.margin * float(min(ps[l] for l in keep)) if config.margin is not None else None
        cands = []
        for r in range(a, min(b, res.ids.shape[1])):
            c = int(res.ids[i, r])
            if c < 0:
                break
            if c in pos_set:
                excl["positive of the query"] += 1
            elif c in dup:
                excl["duplicate of a positive"] += 1
            elif c in selfq:
                excl["the query itself"] += 1
            elif floor is not None and float(res.scores[i, r]) > floor:
                excl["margin"] += 1
            else:
                cands.append(c)
        rng = np.random.default_rng([config.seed, i])
        take = sorted(rng.choice(len(cands), min(m, len(cands)), replace=False).tolist()) if cands and m else []
        negs = [corpus[cands[k]] for k in take]
        neg_total += len(negs)
        if m:
            if len(negs) == m:
                neg_full += 1
            elif negs:
                neg_short += 1
            else:
                neg_none += 1
        rec = {"id": e.get("id"), "query": e["query"], "pos": [e["pos"][l] for l in keep], "neg": negs}
        for extra in ("label", "prompt", "type"):
            if extra in e:
                rec[extra] = e[extra]
        records.append(rec)
    report = {
        "examples": n_ex, "kept": len(records),
        "filtered": {"no positive within top-k": len(filtered)},
        "positives": {"total": n_pos, "kept": n_pos_kept, "dropped (rank >= top_k)": n_pos - n_pos_kept},
        "negatives": {"per example": m, "total": neg_total, f"examples with {m}": neg_full,
                      "examples with fewer": neg_short, "examples with none": neg_none},
        "window_candidates_excluded": excl,
        "rank_histogram_best_positive": rank_histogram(best_ranks),
        "rank_histogram_all_positives": rank_histogram(all_ranks),
        "settings": {"top_k": config.top_k, "window": [a, b], "num_negatives": m, "margin": config.margin,
                     "seed": config.seed, "tol": config.tol, **search_info},
        "corpus_size": len(corpus), "queries_encoded": int(query_emb.shape[0]),
        "seconds_search_and_filter": round(time.time() - t0, 3),
        "filtered_examples": filtered,
    }
    return MineResult(records, report)


def mine(encoder, examples: Sequence[dict], config: MineConfig | None = None, *, query_instruction: str = "",
         doc_instruction: str = "", corpus: Sequence[str] | None = None, max_query_length: int | None = None,
         max_doc_length: int | None = None, batch_size: int = 64, progress: bool | None = None,
         task: str | None = None) -> MineResult:
    """Encode the queries (with ``query_instruction``) and the corpus (``build_corpus``; with ``doc_instruction``)
    with an Encoder, then ``mine_with_embeddings``. -> MineResult(records, report).

    task: the data's task type; with a MoTE encoder, queries go through that task's query expert and the corpus
    through its document expert, as in training (a dense encoder ignores it)."""
    config = config or MineConfig()
    config.check()
    if not examples:
        raise UserError("no examples to mine")
    t0 = time.time()
    texts, _, added = build_corpus(examples, corpus)
    uq: dict[str, int] = {}
    qidx = np.array([uq.setdefault(e["query"], len(uq)) for e in examples], np.int64)
    mote = getattr(encoder, "mote", None) is not None
    routes = {side: encoder.expert_index(task, side=side) if mote else None for side in ("query", "document")}
    kw = {side: {"task": task, "side": side} if mote else None for side in routes}
    with progress_bar(len(uq) + len(texts), "encode", progress) as bar:
        Q = encode_texts(encoder, list(uq), prompt=query_instruction, max_length=max_query_length,
                         batch_size=batch_size, bar=bar, encode_kw=kw["query"])
        D = encode_texts(encoder, texts, prompt=doc_instruction, max_length=max_doc_length, batch_size=batch_size,
                         bar=bar, encode_kw=kw["document"])
    t1 = time.time()
    res = mine_with_embeddings(examples, Q, texts, D, config, query_index=qidx, progress=progress)
    res.report["corpus"] = {"size": len(texts), "source": "given corpus + positives" if corpus is not None
                            else "the dataset's positives and negatives", "positives_added": added}
    res.report["instructions"] = {"query": query_instruction, "doc": doc_instruction}
    if mote:
        names = encoder.mote.experts
        res.report["mote_experts"] = {"task": task, **{side: names[i] for side, i in routes.items()}}
    res.report["seconds_encode"] = round(t1 - t0, 3)
    return res


# ------------------------------------------------------------------------------------------------ files

def instruction_prompt(instruction: str) -> str | None:
    """The BGE ``prompt`` whose KaLM form (``Instruct: {prompt} \\n Query: ``) is ``instruction`` ('' for no
    instruction), or None when the instruction is not of that form."""
    from jaxembed.data.formats import kalm_instruction

    if instruction == "":
        return ""
    head, tail = "Instruct: ", " \n Query: "
    if instruction.startswith(head) and instruction.endswith(tail):
        p = instruction[len(head):len(instruction) - len(tail)]
        if p.strip() and kalm_instruction(p) == instruction:
            return p
    return None


def write_jsonl(path: str | os.PathLike, records: Sequence[dict]) -> None:
    """Write records as JSON Lines atomically (a temporary file renamed into place)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, p)


def annotate_records(records: list[dict], *, query_instruction: str, task_type: str | None) -> list[str]:
    """Give every mined record the BGE ``prompt`` (and ``type``) that make ``jaxembed data prepare`` restore the
    dataset's query instruction and task type. -> notes (e.g. when the instruction has no BGE form)."""
    notes = []
    prompt = instruction_prompt(query_instruction)
    for r in records:
        if prompt is not None:
            r["prompt"] = prompt
        if task_type:
            r["type"] = task_type
    if prompt is None:
        notes.append(f"the query instruction {query_instruction!r} is not of the form 'Instruct: ... \\n Query: ': "
                     "set query_instruction in the data config (see data_config in this report)")
    return notes


def data_config_entry(name: str, path: str, *, task_type: str | None, query_instruction: str,
                      doc_instruction: str, num_negatives: int, info=None) -> dict:
    """The ``dataset_config(...)`` fields that read the mined file as the dataset it came from."""
    d = {"name": name, "path": str(path), "format": "triplets", "task_type": task_type,
         "query_instruction": query_instruction, "doc_instruction": doc_instruction,
         "num_negatives": int(num_negatives)}
    if info is not None:
        for k in ("task", "temperature", "batching", "max_query_length", "max_doc_length", "weight", "epochs"):
            v = getattr(info, k, None)
            if v is not None:
                d[k] = v
    return d


def write_report(path: str | os.PathLike, report: dict) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(report, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def format_report(report: dict) -> str:
    """A few lines for the terminal."""
    r = report
    lines = [f"examples {r['examples']}: kept {r['kept']}, filtered {sum(r['filtered'].values())} "
             f"({'; '.join(f'{k}: {v}' for k, v in r['filtered'].items())})",
             f"positives {r['positives']['total']}: kept {r['positives']['kept']}",
             "negatives: " + ", ".join(f"{k} {v}" for k, v in r["negatives"].items()),
             "window candidates excluded: " + ", ".join(f"{k} {v}" for k, v in r["window_candidates_excluded"].items()),
             "rank of the best positive: " + ", ".join(f"{k}: {v}" for k, v in
                                                       r["rank_histogram_best_positive"].items() if v)]
    if "mote_experts" in r:
        m = r["mote_experts"]
        lines.append(f"MoTE experts (task {m['task']!r}): queries {m['query']}, documents {m['document']}")
    return "\n".join(lines)


__all__ = ["IVFIndex", "MineConfig", "MineResult", "SearchResult", "blocked_search", "build_corpus", "encode_texts",
           "mine", "mine_with_embeddings", "normalize", "rank_histogram", "search_memory"]
