"""Metric functions on embeddings and rankings (numpy only), written to give the numbers mteb gives.

- Retrieval / reranking metrics follow trec_eval (pytrec_eval, as mteb calls it): graded gains for nDCG
  (gain = relevance, discount log2(rank + 1), ideal from every judged document), relevance >= 1 counts as relevant
  for recall / MAP / MRR, and ties in score are broken by document id, descending.
- ``average_precision`` equals ``sklearn.metrics.average_precision_score``; ``best_accuracy`` / ``best_f1`` are
  mteb's pair-classification threshold searches; ``v_measure`` equals ``sklearn.metrics.v_measure_score``.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from jaxembed.evaluate.rank_stats import rankdata, spearman


def normalize(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (float32, like mteb's cos_sim)."""
    x = np.asarray(x, np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def truncate(x: np.ndarray, dim: int | None, renormalize: bool = True) -> np.ndarray:
    """Matryoshka: the first ``dim`` dimensions (re-normalised when the model normalises), the same as encoding
    with ``dim``."""
    if dim is None or dim >= x.shape[1]:
        return x
    y = np.asarray(x[:, :dim], np.float32)
    return normalize(y) if renormalize else y


def paired_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return np.sum(a * b, axis=1)


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, np.float64) - np.mean(a)
    b = np.asarray(b, np.float64) - np.mean(b)
    return float((a @ b) / math.sqrt((a @ a) * (b @ b)))


# ----------------------------------------------------------------------------------------- classification-like


def average_precision(labels: Sequence[int], scores: Sequence[float]) -> float:
    """Area under the precision-recall step curve, sklearn's definition: sum over distinct score thresholds of
    (recall_n - recall_{n-1}) * precision_n; tied scores form one threshold."""
    y = np.asarray(labels) > 0
    s = np.asarray(scores, np.float64)
    if y.sum() == 0:
        return 0.0
    order = np.argsort(-s, kind="mergesort")
    y, s = y[order], s[order]
    last = np.r_[np.flatnonzero(np.diff(s) != 0), len(s) - 1]  # last index of each distinct threshold
    tp = np.cumsum(y)[last]
    precision = tp / (last + 1)
    recall = tp / y.sum()
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def _sorted_rows(scores, labels):
    s = np.asarray(scores, np.float64)
    y = np.asarray(labels).astype(np.int64)
    order = np.argsort(-s, kind="mergesort")
    return s[order], y[order]


def best_accuracy(scores: Sequence[float], labels: Sequence[int]) -> tuple[float, float]:
    """mteb's best-threshold accuracy (higher score = positive): (accuracy, threshold). A threshold never splits
    tied scores."""
    s, y = _sorted_rows(scores, labels)
    n = len(s)
    if n < 2:
        return 0.0, -1.0
    pos = np.cumsum(y == 1)[:-1]
    neg_left = (y == 0).sum() - np.cumsum(y == 0)[:-1]
    acc = (pos + neg_left) / n
    valid = s[:-1] != s[1:]
    if not valid.any():
        return 0.0, -1.0
    acc = np.where(valid, acc, -1.0)
    i = int(np.argmax(acc))
    return float(acc[i]), float((s[i] + s[i + 1]) / 2)


def best_f1(scores: Sequence[float], labels: Sequence[int]) -> tuple[float, float, float, float]:
    """mteb's best-threshold F1 (higher score = positive): (f1, precision, recall, threshold)."""
    s, y = _sorted_rows(scores, labels)
    n, total = len(s), int((y == 1).sum())
    if n < 2 or total == 0:
        return 0.0, 0.0, 0.0, 0.0
    tp = np.cumsum(y == 1)[:-1].astype(np.float64)
    k = np.arange(1, n, dtype=np.float64)
    precision, recall = tp / k, tp / total
    with np.errstate(invalid="ignore", divide="ignore"):
        f1 = np.where(tp > 0, 2 * precision * recall / (precision + recall), 0.0)
    f1 = np.where(s[:-1] != s[1:], f1, 0.0)
    i = int(np.argmax(f1))
    if f1[i] <= 0:
        return 0.0, 0.0, 0.0, 0.0
    return float(f1[i]), float(precision[i]), float(recall[i]), float((s[i] + s[i + 1]) / 2)


def _entropy(counts: np.ndarray) -> float:
    counts = counts[counts > 0].astype(np.float64)
    if counts.size <= 1:
        return 0.0
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum())


def v_measure(labels_true: Sequence, labels_pred: Sequence) -> float:
    """Harmonic mean of homogeneity and completeness (natural-log entropies), as sklearn.metrics.v_measure_score."""
    _, t = np.unique(np.asarray(labels_true), return_inverse=True)
    _, p = np.unique(np.asarray(labels_pred), return_inverse=True)
    n = len(t)
    if n == 0:
        return 1.0
    cont = np.zeros((t.max() + 1, p.max() + 1), np.float64)
    np.add.at(cont, (t, p), 1)
    h_c, h_k = _entropy(cont.sum(1)), _entropy(cont.sum(0))
    i, j = np.nonzero(cont)
    v = cont[i, j]
    h_c_k = float(-np.sum(v / n * np.log(v / cont.sum(0)[j])))  # H(C|K)
    h_k_c = float(-np.sum(v / n * np.log(v / cont.sum(1)[i])))  # H(K|C)
    hom = 1.0 if h_c == 0 else 1.0 - h_c_k / h_c
    com = 1.0 if h_k == 0 else 1.0 - h_k_c / h_k
    return 0.0 if hom + com == 0 else float(2 * hom * com / (hom + com))


# ----------------------------------------------------------------------------------------------- ranking


def tie_rank(ids: Sequence[str]) -> np.ndarray:
    """Position of each id in ascending string order: among equal scores, the larger goes first (trec_eval)."""
    order = sorted(range(len(ids)), key=lambda i: ids[i])
    r = np.empty(len(ids), np.int64)
    r[order] = np.arange(len(ids))
    return r


def top_k(queries: np.ndarray, docs: np.ndarray, k: int, *, tie: np.ndarray | None = None,
          block_elements: int = 1 << 24) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k documents per query by cosine similarity, computed by blocked matrix products (at most
    ``block_elements`` scores at once) keeping a running top-k. Ties are broken by ``tie`` (larger first;
    default: earlier document first). -> (indices [Q, k], scores [Q, k]), best first."""
    q, d = normalize(queries), normalize(docs)
    nq, nd = len(q), len(d)
    k = min(k, nd)
    tie = (-np.arange(nd)) if tie is None else np.asarray(tie)
    q_block = max(1, min(nq, block_elements // max(1, min(nd, 4096))))
    d_block = max(1, min(nd, block_elements // q_block))
    out_i = np.zeros((nq, k), np.int64)
    out_s = np.zeros((nq, k), np.float32)
    for qs in range(0, nq, q_block):
        qq = q[qs:qs + q_block]
        best_i = np.zeros((len(qq), 0), np.int64)
        best_s = np.zeros((len(qq), 0), np.float32)
        for ds in range(0, nd, d_block):
            s = qq @ d[ds:ds + d_block].T
            idx = np.broadcast_to(np.arange(ds, ds + s.shape[1]), s.shape)
            cand_s = np.concatenate([best_s, s], axis=1)
            cand_i = np.concatenate([best_i, idx], axis=1)
            order = np.lexsort((tie[cand_i], cand_s), axis=-1)[:, ::-1][:, :k]
            best_s = np.take_along_axis(cand_s, order, axis=1)
            best_i = np.take_along_axis(cand_i, order, axis=1)
        out_i[qs:qs + len(qq)] = best_i
        out_s[qs:qs + len(qq)] = best_s
    return out_i, out_s


def ranking_metrics(rankings: Mapping[str, Sequence[str]], qrels: Mapping[str, Mapping[str, int]],
                    ndcg_k: Sequence[int] = (), recall_k: Sequence[int] = (), mrr_k: Sequence[int] = (),
                    map_k: Sequence[int] = ()) -> dict[str, float]:
    """trec_eval's ndcg_cut / recall / map_cut and mteb's MRR@k, averaged over the queries of ``rankings``
    (document ids, best first). -> {"ndcg_at_10": fraction, ...} (fractions, not points)."""
    acc: dict[str, list[float]] = {}
    for qid, ranked in rankings.items():
        rel = qrels.get(qid, {})
        n_rel = sum(1 for v in rel.values() if v > 0)
        gains = [rel.get(d, 0) for d in ranked]
        for k in ndcg_k:
            ideal = sorted((v for v in rel.values() if v > 0), reverse=True)[:k]
            idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
            dcg = sum(g / math.log2(i + 2) for i, g in enumerate(gains[:k]) if g > 0)
            acc.setdefault(f"ndcg_at_{k}", []).append(dcg / idcg if idcg > 0 else 0.0)
        for k in recall_k:
            hit = sum(1 for g in gains[:k] if g > 0)
            acc.setdefault(f"recall_at_{k}", []).append(hit / n_rel if n_rel else 0.0)
        for k in mrr_k:
            rr = next((1.0 / (i + 1) for i, g in enumerate(gains[:k]) if g > 0), 0.0)
            acc.setdefault(f"mrr_at_{k}", []).append(rr)
        for k in map_k:
            hits, total = 0, 0.0
            for i, g in enumerate(gains[:k]):
                if g > 0:
                    hits += 1
                    total += hits / (i + 1)
            acc.setdefault(f"map_at_{k}", []).append(total / n_rel if n_rel else 0.0)
    return {name: float(np.mean(v)) for name, v in acc.items()}


__all__ = ["average_precision", "best_accuracy", "best_f1", "normalize", "paired_cosine", "pearson",
           "rankdata", "ranking_metrics", "spearman", "tie_rank", "top_k", "truncate", "v_measure"]
