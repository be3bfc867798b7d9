"""GISTEmbed's guided false-negative filter (Solatorio 2024, arXiv:2402.16829; sentence-transformers'
``GISTEmbedLoss``): a frozen guide model embeds the queries and the candidates; candidate j is masked for query i
(neither a negative nor counted) when the guide finds it at least as close to the query as the query's own
positive, up to a margin:

    absolute:  g(q_i, c_j) > g(q_i, p_i) - margin
    relative:  g(q_i, c_j) > g(q_i, p_i) - |g(q_i, p_i)| * margin

g is the guide's cosine similarity. The query's own positive is never masked. The mask itself is applied where every
other identity mask is (``core.block_logits``), so it works the same in the plain, tiled and sharded losses; this
module only computes its inputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxembed.losses.core import normalize
from jaxembed.losses.parts.gist import MARGIN_STRATEGIES  # noqa: F401 (declared with the guide's settings)


def guide_limit(pos_sim: jax.Array, margin: float, strategy: str = "absolute") -> jax.Array:
    """The guide similarity above which a candidate is masked. pos_sim: [B] g(q_i, p_i) -> [B]."""
    if strategy == "absolute":
        return pos_sim - margin
    if strategy == "relative":
        return pos_sim - jnp.abs(pos_sim) * margin
    raise ValueError(f"GIST margin strategy {strategy!r} is not one of {', '.join(MARGIN_STRATEGIES)}")


def guide_infos(gq: jax.Array, gc: jax.Array, pos_index: jax.Array, margin: float = 0.0,
                strategy: str = "absolute") -> tuple[jax.Array, jax.Array, jax.Array]:
    """The guide inputs of ``QueryInfo`` / ``CandidateInfo``.

    gq: [B, G] guide embeddings of the queries; gc: [N, G] of the candidates (raw; normalised here); pos_index: [B]
    the column of each query's positive. Returns (query guide [B, G], candidate guide [N, G], guide_limit [B]),
    all stop-gradient (the guide is frozen)."""
    gq, gc = normalize(jax.lax.stop_gradient(gq)), normalize(jax.lax.stop_gradient(gc))
    pos_sim = jnp.sum(gq * gc[pos_index], axis=1)
    return gq, gc, guide_limit(pos_sim, margin, strategy)
