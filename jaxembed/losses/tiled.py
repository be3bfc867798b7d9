"""Memory-bounded InfoNCE: blocks of queries against blocks of candidates with an online log-sum-exp.

The [B, N] logits are never materialised. The forward pass scans query blocks, and within each, candidate blocks,
carrying the running max and sum of exponentials (as FlashAttention does). A custom VJP recomputes each block in
the backward pass from the saved per-query log-sum-exp. Peak memory is O((B + N) * D + block_q * block_c).
Values and gradients equal ``infonce.query_terms`` (tests).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxembed.losses.core import CandidateInfo, LossOptions, QueryInfo, block_logits
from jaxembed.losses.infonce import QueryTerms


def _pad_rows(x, rows, value=0):
    if x is None:
        return None
    pad = rows - x.shape[0]
    if pad == 0:
        return x
    return jnp.concatenate([x, jnp.full((pad,) + x.shape[1:], value, x.dtype)], axis=0)


def _blocks(x, size):
    return None if x is None else x.reshape((-1, size) + x.shape[1:])


def _forward(q, c, aux, bq, bc, opts):
    """q: [nq*bq, D], c: [nc*bc, D] padded. Returns (lse, max_other_logit, hardest_sim, masked), each [nq*bq]."""
    pos_index, qi, ci, temperature, peg_t = aux
    cb, cib = _blocks(c, bc), jax.tree.map(lambda x: _blocks(x, bc), ci)
    nc = cb.shape[0]

    def q_block(_, xs):
        qb, posb, qib = xs

        def c_block(state, ys):
            m, s, other, hardest, masked = state
            cbk, cibk, j = ys
            logits, sims, allowed, is_pos, _ = block_logits(qb, cbk, posb, j * bc, qib, cibk, temperature, opts,
                                                            peg_t)
            m_new = jnp.maximum(m, jnp.max(logits, axis=1))
            m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
            s = s * jnp.exp(m - m_safe) + jnp.sum(jnp.exp(logits - m_safe[:, None]), axis=1)
            neg = allowed & ~is_pos
            other = jnp.maximum(other, jnp.max(jnp.where(neg, logits, -jnp.inf), axis=1))
            hardest = jnp.maximum(hardest, jnp.max(jnp.where(neg, sims, -jnp.inf), axis=1))
            valid = jnp.ones(cbk.shape[0], bool) if cibk.valid is None else cibk.valid
            masked = masked + jnp.sum(valid[None, :] & ~allowed, axis=1, dtype=jnp.int32)
            return (m_new, s, other, hardest, masked), None

        b = qb.shape[0]
        # explicit dtypes: with jax_enable_x64 the defaults are 64-bit and the scan carry would change type
        f32 = jnp.float32
        init = (jnp.full((b,), -jnp.inf, f32), jnp.zeros((b,), f32), jnp.full((b,), -jnp.inf, f32),
                jnp.full((b,), -jnp.inf, f32), jnp.zeros((b,), jnp.int32))
        (m, s, other, hardest, masked), _ = jax.lax.scan(c_block, init, (cb, cib, jnp.arange(nc, dtype=jnp.int32)))
        return None, (m + jnp.log(s), other, hardest, masked)

    xs = (_blocks(q, bq), _blocks(pos_index, bq), jax.tree.map(lambda x: _blocks(x, bq), qi))
    _, out = jax.lax.scan(q_block, None, xs)
    return tuple(o.reshape(-1) for o in out)


def _backward(q, c, aux, lse, g, bq, bc, opts):
    """Cotangents of q and c for d(sum_i g_i lse_i): p_ij = exp(logit_ij - lse_i), ds_ij = g_i p_ij a_ij / tau."""
    pos_index, qi, ci, temperature, peg_t = aux
    cb, cib = _blocks(c, bc), jax.tree.map(lambda x: _blocks(x, bc), ci)
    nc = cb.shape[0]

    def q_block(dc, xs):
        qb, posb, qib, lseb, gb = xs

        def c_block(carry, ys):
            dq, dc = carry
            cbk, cibk, j = ys
            logits, _, _, _, scale = block_logits(qb, cbk, posb, j * bc, qib, cibk, temperature, opts, peg_t)
            p = jnp.exp(logits - lseb[:, None])  # 0 where masked (-inf)
            ds = gb[:, None] * p * scale / temperature
            dq = dq + ds @ cbk.astype(jnp.float32)
            dc = dc.at[j].add(ds.T @ qb.astype(jnp.float32))  # in place: one [N, D] accumulator, no stacked copy
            return (dq, dc), None

        (dq, dc), _ = jax.lax.scan(c_block, (jnp.zeros(qb.shape, jnp.float32), dc),
                                   (cb, cib, jnp.arange(nc, dtype=jnp.int32)))
        return dc, dq

    xs = (_blocks(q, bq), _blocks(pos_index, bq), jax.tree.map(lambda x: _blocks(x, bq), qi), _blocks(lse, bq),
          _blocks(g, bq))
    dc, dq = jax.lax.scan(q_block, jnp.zeros(cb.shape, jnp.float32), xs)
    return dq.reshape(q.shape).astype(q.dtype), dc.reshape(c.shape).astype(c.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _tiled(q, c, aux, bq, bc, opts):
    return _forward(q, c, aux, bq, bc, opts)


def _tiled_fwd(q, c, aux, bq, bc, opts):
    out = _forward(q, c, aux, bq, bc, opts)
    return out, (q, c, aux, out[0])


def _tiled_bwd(bq, bc, opts, res, cts):
    q, c, aux, lse = res
    dq, dc = _backward(q, c, aux, lse, cts[0], bq, bc, opts)
    return dq, dc, jax.tree.map(lambda x: None if x is None else jnp.zeros_like(x) if jnp.issubdtype(
        x.dtype, jnp.floating) else None, aux)


_tiled.defvjp(_tiled_fwd, _tiled_bwd)


def tiled_terms(block_q: int = 1024, block_c: int = 4096):
    """A ``terms_fn`` for ``infonce.contrastive_loss`` that never materialises [B, N]."""

    def query_terms_tiled(q, c, pos_index, temperature, qi: QueryInfo = QueryInfo(),
                          ci: CandidateInfo = CandidateInfo(), opts: LossOptions = LossOptions(),
                          peg_t=None) -> QueryTerms:
        b, n = q.shape[0], c.shape[0]
        bq, bc = min(block_q, b), min(block_c, n)
        rb, rn = -(-b // bq) * bq, -(-n // bc) * bc
        valid = jnp.ones((n,), bool) if ci.valid is None else ci.valid
        ci_p = CandidateInfo(_pad_rows(valid, rn, False), _pad_rows(ci.hash, rn), _pad_rows(ci.task, rn, -1),
                             _pad_rows(ci.guide, rn), _pad_rows(ci.owner_hash, rn), _pad_rows(ci.owned, rn, False))
        qi_p = QueryInfo(*(_pad_rows(x, rb, False if x is not None and x.dtype == bool else 0) for x in qi))
        aux = (_pad_rows(pos_index, rb), qi_p, ci_p, jnp.asarray(temperature, jnp.float32),
               None if peg_t is None else jnp.asarray(peg_t, jnp.float32))
        lse, other, hardest, masked = _tiled(_pad_rows(q, rb), _pad_rows(c, rn), aux, bq, bc, opts)
        lse, other, hardest, masked = lse[:b], other[:b], hardest[:b], masked[:b]
        pos_logit = jnp.sum(q * c[pos_index], axis=1) / temperature  # the positive's scale is always 1
        return QueryTerms(lse - pos_logit, pos_logit > jax.lax.stop_gradient(other),
                          jnp.where(jnp.isfinite(hardest), hardest, -1.0), masked)

    return query_terms_tiled
