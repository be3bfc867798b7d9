"""InfoNCE over the global batch, with PEG's progressive weighting, and metrics (docs/design.md, Common core; PEG).

For query i with positive column p_i and allowed candidates A_i (see ``core``):

    l_i = logsumexp_{j in A_i}(a_ij * s_ij / tau) - s_{i p_i} / tau          (InfoNCE; PEG Eq. 3 with a_ij)
    L   = sum_i v_i w_i l_i / max(#{i : v_i > 0}, 1)

With the query texts' hashes (QueryInfo.hash), A_i leaves out the positive p_j of every other row j whose query is
the same text as query i (``core``: text-identity false-negative masking), so that a query text with several
positives in the batch does not push its own positives apart.

v_i is the instance weight (Data-CUBE mask alpha, per-instance weights, 0 for padding) and w_i PEG's w_q (1 without
PEG); a query with v_i = 0 adds nothing but its positive and negatives stay candidates for the others. The
denominator counts v only: a w_q of 0 (see ``peg_statistics``) weighs a term without dropping it from the mean.

The symmetric variant adds the same loss with positives as queries and queries as candidates, and averages the two
(the same v_i w_i weigh its terms). Its identity mask mirrors the forward one: for positive p_i, query q_j (j != i)
is masked when q_j is the same text as q_i (a repeated query) or p_j the same text as p_i (another query of the same
positive); either pair is a positive pair, not a negative (without the mask a repeated row puts a floor of log 2
under its term). With GIST guide embeddings (``core``), query q_j is also masked for positive p_i when the guide
finds g(p_i, q_j) above query i's limit g(q_i, p_i) - margin.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxembed.losses.core import (CandidateInfo, LossOptions, QueryInfo, block_logits, normalize, positive_owners,
                                  reduce_queries)


class QueryTerms(NamedTuple):
    """Per-query results. loss: [B] l_i; correct: [B] the positive outranks every other allowed candidate;
    hardest_neg_sim: [B] max cosine over allowed negatives (-1 when none); masked: [B] valid candidates masked out."""

    loss: jax.Array
    correct: jax.Array
    hardest_neg_sim: jax.Array
    masked: jax.Array


def query_terms(q: jax.Array, c: jax.Array, pos_index: jax.Array, temperature, qi: QueryInfo = QueryInfo(),
                ci: CandidateInfo = CandidateInfo(), opts: LossOptions = LossOptions(), peg_t=None,
                col_start=0) -> QueryTerms:
    """Plain per-query InfoNCE terms. q: [B, D], c: [N, D] normalised; pos_index: [B]. Materialises [B, N]."""
    logits, sims, allowed, is_pos, _ = block_logits(q, c, pos_index, col_start, qi, ci, temperature, opts, peg_t)
    lse = jax.nn.logsumexp(logits, axis=1)
    pos_logit = jnp.sum(jnp.where(is_pos, logits, 0.0), axis=1)
    neg = allowed & ~is_pos
    max_other = jnp.max(jnp.where(neg, logits, -jnp.inf), axis=1)
    hardest = jnp.max(jnp.where(neg, sims, -jnp.inf), axis=1)
    valid = jnp.ones(c.shape[0], bool) if ci.valid is None else ci.valid
    masked = jnp.sum(valid[None, :] & ~allowed, axis=1)
    return QueryTerms(lse - pos_logit, pos_logit > max_other, jnp.where(jnp.isfinite(hardest), hardest, -1.0),
                      masked)


class PegState(NamedTuple):
    """PEG statistics of one batch (Eq. 4-6). w: [B] query weights; active: [B] sim(q,p) >= sigma;
    sigma: threshold; t: the momentum after this batch (carried in the train state, t_0 = 0)."""

    w: jax.Array
    active: jax.Array
    sigma: jax.Array
    t: jax.Array


def peg_statistics(pos_sim: jax.Array, t_prev, alpha: float = 0.5, beta: float = 0.1,
                   axis_name: str | tuple | None = None, weights: jax.Array | None = None) -> PegState:
    """PEG Eq. 4-6 from the positive similarities [B] of the (global) batch.

    sigma = mean(sim(q,p)) - beta; w_q = 1 if sim >= sigma else sim / sigma, clipped to [0, 1];
    t_s = alpha * mean + (1 - alpha) * t_{s-1}, used for this batch's a_n.

    The clip departs from the paper's Eq. 4 (which has none) in two cases: a negative sim(q, p) below sigma > 0
    would get a negative weight (its term would be maximised): here 0; and when sigma < 0 (mean positive similarity
    below beta, e.g. early in training), every sim < sigma gives sim / sigma > 1, which would up-weight the worst
    pairs: here 1 (the plain InfoNCE term). With sigma = 0, w_q = 0 below it.
    axis_name: mean over all shards (shard_map). Queries with weight 0 (padding) are left out of the mean."""
    pos_sim = jax.lax.stop_gradient(pos_sim)
    m = jnp.ones_like(pos_sim) if weights is None else (weights > 0).astype(jnp.float32)
    s, n = jnp.sum(pos_sim * m), jnp.sum(m)
    if axis_name is not None:
        s, n = jax.lax.psum(s, axis_name), jax.lax.psum(n, axis_name)
    mean = s / jnp.maximum(n, 1.0)
    sigma = mean - beta
    active = pos_sim >= sigma
    w = jnp.where(active, 1.0, jnp.clip(pos_sim / sigma, 0.0, 1.0))
    t = alpha * mean + (1.0 - alpha) * jnp.asarray(t_prev, jnp.float32)
    return PegState(w, active, sigma, t)


def contrastive_loss(q: jax.Array, c: jax.Array, pos_index: jax.Array, *, temperature, weights=None,
                     qi: QueryInfo = QueryInfo(), ci: CandidateInfo = CandidateInfo(),
                     opts: LossOptions = LossOptions(), symmetric: bool = False, peg_t_prev=None,
                     peg_alpha: float = 0.5, peg_beta: float = 0.1, terms_fn=query_terms,
                     axis_name: str | tuple | None = None):
    """The full loss on (global or per-shard) arrays. Returns (loss, metrics dict).

    q: [B, D], c: [N, D] raw embeddings (normalised here); pos_index: [B]; weights: [B] or None;
    terms_fn: ``query_terms`` (plain) or ``tiled.query_terms_tiled``; axis_name: when called inside shard_map
    with c already gathered over that axis (and pos_index global), sums and means are taken over all shards."""
    q, c = normalize(q), normalize(c)
    temperature = jnp.asarray(temperature, jnp.float32)
    if qi.hash is not None and ci.owned is None:  # which query text each positive column belongs to (all shards)
        gather = (lambda x: x) if axis_name is None else (lambda x: jax.lax.all_gather(x, axis_name, tiled=True))
        owner, owned = positive_owners(gather(pos_index), gather(qi.hash), c.shape[0])
        ci = ci._replace(owner_hash=owner, owned=owned)
    pos_sim = jnp.sum(q * c[pos_index], axis=1)
    metrics = {}
    peg_t = None
    w = weights
    wsum = jnp.zeros((), jnp.float32)
    if opts.peg:
        st = peg_statistics(pos_sim, 0.0 if peg_t_prev is None else peg_t_prev, peg_alpha, peg_beta, axis_name,
                            weights)
        qi = qi._replace(pos_sim=jax.lax.stop_gradient(pos_sim), peg_active=st.active)
        peg_t = st.t
        wsum = jnp.sum(st.w if weights is None else jnp.where(weights > 0, st.w, 0.0))
        w = st.w if w is None else w * st.w
        metrics.update(peg_t=st.t, peg_sigma=st.sigma)
    terms = terms_fn(q, c, pos_index, temperature, qi, ci, opts, peg_t)
    # the mean is over the queries that count (weights > 0): PEG's w_q weighs a term inside it, so a w_q clipped to
    # 0 leaves the denominator alone (the loss stays continuous in sim(q, p))
    total, _ = reduce_queries(terms.loss, w)
    _, count = reduce_queries(terms.loss, weights)
    if symmetric:
        total = (total + _symmetric_total(q, c, pos_index, temperature, qi, ci, opts, w, terms_fn, axis_name)) / 2
    n_queries = jnp.asarray(q.shape[0], jnp.float32)
    correct, hardest, masked = (jnp.sum(terms.correct.astype(jnp.float32)), jnp.sum(terms.hardest_neg_sim),
                                jnp.sum(terms.masked.astype(jnp.float32)))
    possum = jnp.sum(pos_sim)
    if axis_name is not None:
        total, count, n_queries, correct, hardest, masked, possum, wsum = jax.lax.psum(
            (total, count, n_queries, correct, hardest, masked, possum, wsum), axis_name)
    loss = total / jnp.maximum(count, 1.0)
    if opts.peg:  # mean w_q over the queries that count (weight > 0), as sigma's mean
        metrics["peg_mean_weight"] = wsum / jnp.maximum(count, 1.0)
    metrics.update(loss=loss, accuracy=correct / n_queries, pos_sim=possum / n_queries,
                   hardest_neg_sim=hardest / n_queries, masked_candidates=masked, active_queries=count)
    return loss, jax.tree.map(jax.lax.stop_gradient, metrics)


def _symmetric_total(q, c, pos_index, temperature, qi: QueryInfo, ci: CandidateInfo, opts: LossOptions, w,
                     terms_fn, axis_name):
    """The positives -> queries term: each query's positive against every query of the (global) batch, the label
    its own query; sum_i w_i l_i over this shard's rows. Identity mask: see the module docstring."""
    p = c[pos_index]
    gather = (lambda x: x) if axis_name is None else (lambda x: jax.lax.all_gather(x, axis_name, tiled=True))
    # identities of each row, [B, H, 2]: its query text and its positive text (whichever hashes are known)
    ids = [h for h in (qi.hash, qi.pos_hash) if h is not None]
    ident = jnp.stack(ids, axis=1) if ids else None
    same = opts.same_task and ci.task is not None and qi.task is not None
    # GIST: positive p_i against query q_j, masked when g(p_i, q_j) > g(q_i, p_i) - margin (the same limit)
    guided = qi.guide is not None and ci.guide is not None
    sym_qi = QueryInfo(pos_hash=ident, task=qi.task if same else None,
                       guide=ci.guide[pos_index] if guided else None, guide_limit=qi.guide_limit if guided else None)
    sym_ci = CandidateInfo(hash=None if ident is None else gather(ident), task=gather(qi.task) if same else None,
                           guide=gather(qi.guide) if guided else None)
    own = jnp.arange(q.shape[0], dtype=jnp.int32)
    if axis_name is not None:  # candidates = the queries of every shard
        own = own + jax.lax.axis_index(axis_name) * q.shape[0]
    sym = terms_fn(p, gather(q), own, temperature, sym_qi, sym_ci, LossOptions(same_task=opts.same_task), None)
    return reduce_queries(sym.loss, w)[0]
