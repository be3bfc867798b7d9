"""The contrastive core shared by the plain and the tiled InfoNCE: which candidates a query may see, and the
scaled logits of one block of queries against one block of candidates.

Notation (docs/design.md, Common core): B queries, N candidates (every positive and every hard negative of the
global batch), D embedding dims. ``pos_index[i]`` is the column of query i's own positive among the candidates,
computed from the batch layout (see :func:`layout_pos_index`), never assumed. Embeddings are L2-normalised before
the loss, so a dot product is the cosine similarity.

A candidate j is *allowed* for query i when it is valid (not a padding slot), is not a duplicate of query i's own
positive (same text hash but another column: a false negative by identity, masked to -inf), is not the positive of
another row whose query is the same text as query i's (data with several positives per query: each is a positive
of that query text, not a negative; the mirror of the positive -> query mask of ``infonce``'s symmetric term), and
-- with same-task masking -- belongs to query i's task. Query i's own positive is always allowed. Both identity
masks are text-identity false-negative masking: a candidate that is a positive of query i's text by the texts
themselves is never counted as its negative. sentence-transformers reaches the same end on the sampling side
(``BatchSamplers.NO_DUPLICATES``: no in-batch negative duplicates an anchor or a positive, for
MultipleNegativesRankingLoss); here the batch keeps the duplicates (curricula and task batches fix its rows) and
the loss masks them. A text may carry several identities
(hash [..., H, 2], e.g. the symmetric term's (query text, positive text) of a row): then a candidate is a duplicate
when any of its identities equals the same identity of the query's positive.

GISTEmbed (Solatorio 2024, arXiv:2402.16829; sentence-transformers' GISTEmbedLoss): with guide embeddings (a
frozen guide model's, normalised) a candidate j is also masked for query i when its guide similarity to the query
exceeds the guide's query-positive similarity minus a margin: g(q_i, c_j) > QueryInfo.guide_limit[i] (see
``gist.guide_infos``).

PEG (Eq. 3-5) multiplies the logit of a negative by a_n = t + sim(q, p) when sim(q, p) >= sigma and
sim(q, n) >= sim(q, p), else 1; the positive keeps scale 1. sim(q, p), sigma and t are stop-gradient constants.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

NEG_INF = -jnp.inf


class CandidateInfo(NamedTuple):
    """Per-candidate attributes; every field may be None (= not used).

    valid: bool [N] (False = empty slot); hash: uint32 [N, 2] (text identity; or [N, H, 2]: H identities, see the
    module docstring); task: int32 [N]; guide: float32 [N, G] the guide model's normalised embedding (GIST);
    owner_hash: uint32 [N, 2] the query-text hash of the row whose positive the candidate is, where ``owned``: bool
    [N] (see ``positive_owners``; ``infonce.contrastive_loss`` fills both from QueryInfo.hash)."""

    valid: jax.Array | None = None
    hash: jax.Array | None = None
    task: jax.Array | None = None
    guide: jax.Array | None = None
    owner_hash: jax.Array | None = None
    owned: jax.Array | None = None


class QueryInfo(NamedTuple):
    """Per-query attributes. pos_hash: uint32 [B, 2] hash of the query's own positive (or [B, H, 2], matching
    CandidateInfo.hash); task: int32 [B]; pos_sim: float32 [B] sim(q, p) (stop-gradient; used by PEG);
    peg_active: bool [B] sim(q, p) >= sigma; hash: uint32 [B, 2] hash of the query text itself (used by the
    symmetric term, where the queries are the candidates: a repeated query is not a negative of itself);
    guide: float32 [B, G] the guide model's normalised query embedding and guide_limit: float32 [B] the guide
    similarity above which a candidate is masked (GIST; both or neither)."""

    pos_hash: jax.Array | None = None
    task: jax.Array | None = None
    pos_sim: jax.Array | None = None
    peg_active: jax.Array | None = None
    hash: jax.Array | None = None
    guide: jax.Array | None = None
    guide_limit: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class LossOptions:
    """Static options. same_task: a candidate from another task is not a negative (mixed batches);
    peg: apply PEG's negative scales a_n (needs QueryInfo.pos_sim / peg_active and ``peg_t``)."""

    same_task: bool = False
    peg: bool = False


def layout_pos_index(num_queries: int, group: int, offset: int | jax.Array = 0) -> jax.Array:
    """Positive columns for the standard layout: query r's candidates are rows [r*group, (r+1)*group) with the
    positive first (group = 1 + hard negatives). offset: index of this shard's first candidate. -> int32 [B]."""
    return (jnp.arange(num_queries, dtype=jnp.int32) * group + offset).astype(jnp.int32)


def positive_owners(pos_index: jax.Array, query_hash: jax.Array, num_candidates: int) -> tuple[jax.Array, jax.Array]:
    """Which query text each candidate is the positive of. pos_index: int32 [B] the positive columns of every row of
    the (global) batch; query_hash: uint32 [B, 2] the rows' query texts. -> (owner_hash uint32 [N, 2]: the query
    hash of the row whose positive column j is (0 elsewhere), owned bool [N]: column j is some row's positive)."""
    owner = jnp.zeros((num_candidates,) + query_hash.shape[1:], query_hash.dtype).at[pos_index].set(query_hash)
    owned = jnp.zeros((num_candidates,), bool).at[pos_index].set(True)
    return owner, owned


def block_logits(q: jax.Array, c: jax.Array, pos_index: jax.Array, col_start: int | jax.Array, qi: QueryInfo,
                 ci: CandidateInfo, temperature: jax.Array, opts: LossOptions, peg_t: jax.Array | None = None):
    """Scaled, masked logits of a block of queries against a block of candidates.

    q: [b, D], c: [n, D] (normalised); pos_index: [b] global column of each query's positive; col_start: global
    column of c[0]; qi / ci: the blocks' attributes. Returns (logits [b, n] float32 with -inf where masked,
    sims [b, n] raw cosine, allowed [b, n] bool, is_pos [b, n] bool, scale: the PEG a_n [b, n] or 1.0)."""
    sims = jnp.einsum("bd,nd->bn", q, c, preferred_element_type=jnp.float32)
    cols = col_start + jnp.arange(c.shape[0], dtype=jnp.int32)
    is_pos = cols[None, :] == pos_index[:, None]
    allowed = jnp.ones(sims.shape, bool)
    if ci.valid is not None:
        allowed = allowed & ci.valid[None, :]
    if ci.hash is not None and qi.pos_hash is not None:
        dup = jnp.all(ci.hash[None] == qi.pos_hash[:, None], axis=-1)  # [b, n] or [b, n, H]
        if dup.ndim == 3:
            dup = jnp.any(dup, axis=-1)
        allowed = allowed & ~dup
    if ci.owned is not None and qi.hash is not None:  # the positive of another row of the same query text
        same_query = jnp.all(ci.owner_hash[None] == qi.hash[:, None], axis=-1)  # [b, n]
        allowed = allowed & ~(ci.owned[None, :] & same_query)
    if opts.same_task and ci.task is not None and qi.task is not None:
        allowed = allowed & (ci.task[None, :] == qi.task[:, None])
    if ci.guide is not None and qi.guide is not None:  # GIST: the guide says j is as close as the positive
        guide_sims = jnp.einsum("bg,ng->bn", qi.guide, ci.guide, preferred_element_type=jnp.float32)
        allowed = allowed & ~(guide_sims > qi.guide_limit[:, None])
    allowed = allowed | is_pos
    scale = 1.0
    if opts.peg:
        hard = qi.peg_active[:, None] & (sims >= qi.pos_sim[:, None]) & ~is_pos
        scale = jnp.where(hard, peg_t + qi.pos_sim[:, None], 1.0)
        scale = jax.lax.stop_gradient(scale)
    logits = jnp.where(allowed, scale * sims / temperature, NEG_INF)
    return logits, sims, allowed, is_pos, scale


def normalize(x: jax.Array, eps: float = 1e-12) -> jax.Array:
    """Row-wise L2 normalisation in float32: [M, D] -> [M, D]."""
    x = x.astype(jnp.float32)
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)


def reduce_queries(per_query: jax.Array, weights: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """Weighted sum of per-query losses and the number of active queries (weight > 0).
    Loss = sum(w * l) / max(count, 1): a masked query (w = 0) adds nothing but still served as a negative."""
    if weights is None:
        weights = jnp.ones_like(per_query)
    total = jnp.sum(weights * per_query)
    count = jnp.sum((weights > 0).astype(jnp.float32))
    return total, count
