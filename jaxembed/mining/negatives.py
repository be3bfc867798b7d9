"""Hard-negative mining with ranking-consistency filtering (KaLM-Embedding 3.2, ``jaxembed mine``): the filter.

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

The search is ``jaxembed.mining.search``; the embeddings ``jaxembed.mining.encoding``; the job's input and output
files ``jaxembed.mining.job``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Sequence

import numpy as np

from jaxembed.errors import UserError
from jaxembed.mining.encoding import encode_texts, normalize, progress_bar
from jaxembed.mining.search import approximate_search, blocked_search, check_approx

RANK_BINS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


@dataclasses.dataclass
class MineConfig:
    """top_k: ranking-consistency threshold (KaLM: 50); window: (start, end) ranks to sample from (50, 100);
    num_negatives: m (7); margin: drop candidates above margin x the weakest kept positive's score (None: off);
    approx: None (exact), 'ivf' (+ nlist, nprobe) or 'hnsw' (``jaxembed.mining.search.approximate_search``); tol:
    score tolerance of the rank comparisons."""

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
        check_approx(self.approx)
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
    if config.approx is not None:  # FAISS where installed (IVF / HNSW), else jaxembed's IVF index
        # FAISS counts the rows above a positive among those it returns: top_k plus the most positives of a query
        # (a rank leaves the other positives out), so that a positive ranked top_k or lower is never taken for one
        # ranked higher
        res, search_info = approximate_search(Q, D, max(T, config.top_k + P_), config.approx, nlist=config.nlist,
                                              nprobe=config.nprobe, seed=config.seed, thresholds=thr,
                                              progress=progress)
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

