"""Nearest corpus texts for every query, for the mining filter (``jaxembed.mining.negatives``).

``blocked_search``: exact top-T by blocked matrix products. The corpus is sharded by rows over all devices
(``jax.shard_map``); each device scans its shard in blocks of ``block_c`` texts for a block of ``block_q`` queries,
keeping a running top-T and the number of texts scoring above each positive; the per-device candidates are
gathered and merged. Memory per device is O(block_q x block_c), never the [Q, D] score matrix. For very large
corpora an approximate search can replace it (``approximate_search``, ``--approx``): where FAISS is installed (the
extra ``jaxembed[faiss]``), FAISS's IVF (IndexIVFFlat) or HNSW (IndexHNSWFlat) index on the host's CPU cores
(``FaissIndex``); without it, jaxembed's own IVF index (``IVFIndex``: spherical k-means lists, ``nprobe`` lists
searched per query, on the devices). Approximate ranks count only the rows found (a lower bound of the exact rank).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxembed.errors import UserError
from jaxembed.mining.encoding import normalize, progress_bar


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



#: the approximate searches of ``--approx``: an IVF index (FAISS's IndexIVFFlat where faiss is installed, else
#: ``IVFIndex``) and an HNSW graph (FAISS's IndexHNSWFlat; needs faiss)
APPROX_KINDS = ("ivf", "hnsw")
FAISS_EXTRA = "pip install 'jaxembed[faiss]'"
#: HNSW: links per node, and candidates kept while building the graph
HNSW_M, HNSW_EF_CONSTRUCTION = 32, 80


def faiss_module():
    """The faiss module, or None where it is not installed (the optional extra ``jaxembed[faiss]``)."""
    try:
        import faiss
    except ImportError:
        return None
    return faiss


def check_approx(kind: str | None) -> None:
    """A UserError for an ``--approx`` that is not one of ``APPROX_KINDS`` (None: the exact search), or that needs
    FAISS where it is not installed: checked before any text is encoded."""
    if kind is None:
        return
    if kind not in APPROX_KINDS:
        raise UserError(f"--approx {kind!r}: one of {', '.join(APPROX_KINDS)} or none")
    if kind == "hnsw" and faiss_module() is None:
        raise UserError(f"--approx hnsw needs FAISS, which is not installed (fix: {FAISS_EXTRA}; or --approx ivf, "
                        "jaxembed's own IVF index without FAISS)")


class FaissIndex:
    """FAISS's approximate search by inner product (pass normalised rows for cosine), as FlagEmbedding and most
    mining tools use on CPU hosts. kind 'ivf': IndexIVFFlat, k-means on a sample of ``sample_per_list`` x nlist rows,
    ``nprobe`` lists searched per query (nprobe = nlist is exact); 'hnsw': IndexHNSWFlat (``HNSW_M`` links per node),
    ``ef_search`` candidates kept per query (default max(2 k, 64))."""

    def __init__(self, docs: np.ndarray, kind: str, *, nlist: int | None = None, seed: int = 0,
                 sample_per_list: int = 64):
        check_approx(kind)
        faiss = faiss_module()
        if faiss is None:
            raise UserError(f"--approx {kind} needs FAISS, which is not installed (fix: {FAISS_EXTRA})")
        docs = np.ascontiguousarray(docs, np.float32)
        n, dim = docs.shape
        self.kind, self.n = kind, n
        if kind == "ivf":
            if not nlist or not 1 <= nlist <= n:
                raise UserError(f"--nlist must be between 1 and the corpus size {n}, got {nlist}")
            self.nlist = int(nlist)
            self._quantizer = faiss.IndexFlatIP(dim)  # kept: the IVF index refers to it
            index = faiss.IndexIVFFlat(self._quantizer, dim, self.nlist, faiss.METRIC_INNER_PRODUCT)
            index.cp.seed = int(seed)
            rng = np.random.default_rng(seed)
            m = min(n, sample_per_list * self.nlist)
            index.train(docs if m == n else docs[np.sort(rng.choice(n, m, replace=False))])
        elif kind == "hnsw":
            index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        index.add(docs)
        self.index = index

    def search(self, queries: np.ndarray, k: int, *, nprobe: int = 8, ef_search: int | None = None,
               thresholds: np.ndarray | None = None, block_q: int = 4096, progress: bool | None = False
               ) -> SearchResult:
        """Approximate top-k of every query (fewer than k found: id -1, score -inf), best first, ties by lower id;
        ``above`` counts the rows above each threshold among those found (a lower bound of the exact count)."""
        queries = np.ascontiguousarray(queries, np.float32)
        nq = queries.shape[0]
        k = int(min(k, self.n))
        if self.kind == "ivf":
            self.index.nprobe = int(min(max(1, nprobe), self.nlist))
        else:
            self.index.hnsw.efSearch = int(ef_search or max(2 * k, 64))
        thr = np.full((nq, 1), np.inf, np.float32) if thresholds is None else np.asarray(thresholds, np.float32)
        ids = np.zeros((nq, k), np.int64)
        scores = np.zeros((nq, k), np.float32)
        with progress_bar(nq, f"search ({self.kind}, faiss)", progress) as bar:
            for s in range(0, nq, block_q):
                v, i = self.index.search(queries[s:s + block_q], k)
                v = np.where(i >= 0, v, -np.inf).astype(np.float32)
                order = np.lexsort((np.where(i >= 0, i, np.iinfo(np.int64).max), -v), axis=1)  # score, then id
                ids[s:s + len(i)] = np.take_along_axis(i, order, 1)
                scores[s:s + len(i)] = np.take_along_axis(v, order, 1)
                bar.update(len(i))
        above = (scores[:, :, None] > thr[:, None, :]).sum(1).astype(np.int64)
        return SearchResult(ids, scores, above)


def approximate_search(queries: np.ndarray, docs: np.ndarray, k: int, kind: str, *, nlist: int | None = None,
                       nprobe: int = 8, seed: int = 0, thresholds: np.ndarray | None = None,
                       progress: bool | None = False) -> tuple[SearchResult, dict]:
    """``--approx KIND``: FAISS where it is installed (IVF or HNSW), else jaxembed's ``IVFIndex`` for 'ivf' (HNSW
    needs faiss). nlist: IVF lists (default sqrt(corpus size)). -> (the result, what ran, for the report)."""
    check_approx(kind)
    n = len(docs)
    nlist = nlist or max(1, int(round(np.sqrt(n))))
    if kind == "ivf" and faiss_module() is None:
        index = IVFIndex(docs, nlist, seed=seed)
        res = index.search(queries, k, nprobe=nprobe, thresholds=thresholds, progress=progress)
        return res, {"search": "ivf", "engine": "jaxembed (faiss not installed)", "nlist": nlist,
                     "nprobe": min(nprobe, nlist), "largest_list": index.list_size}
    index = FaissIndex(docs, kind, nlist=nlist if kind == "ivf" else None, seed=seed)
    res = index.search(queries, k, nprobe=nprobe, thresholds=thresholds, progress=progress)
    info = {"search": kind, "engine": f"faiss {faiss_module().__version__} {type(index.index).__name__}"}
    if kind == "ivf":
        info.update(nlist=nlist, nprobe=min(nprobe, nlist))
    else:
        info.update(hnsw_m=HNSW_M, ef_construction=HNSW_EF_CONSTRUCTION, ef_search=index.index.hnsw.efSearch)
    return res, info
