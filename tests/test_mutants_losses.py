"""jaxembed/losses/ details that the loss-value references of tests/test_losses.py do not pin (docs/testing.md: the
mutants each test kills): the per-query terms and metrics (accuracy, hardest negative, masked counts, active
queries, PEG's statistics), the tiled variant's padding, normalisation of short vectors, the guards. Tiny arrays,
float64 numpy references, no model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxembed.losses import (CandidateInfo, LossOptions, QueryInfo, contrastive_loss, layout_pos_index, normalize,
                             peg_statistics, query_terms, tiled_terms)
from jaxembed.losses import core, distill, gist, objective, scored
from jaxembed.losses.matryoshka import matryoshka_loss


def _unit(x):
    x = np.asarray(x, np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _batch(seed=0, B=5, K=2, D=4):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, D)).astype(np.float32)
    c = rng.normal(size=(B * K, D)).astype(np.float32)
    c[::K] = q + 0.4 * rng.normal(size=(B, D))  # positives near their queries
    return q, c


def _terms_reference(q, c, pos, tau, allowed):
    """Per-query loss, correct, hardest negative cosine (-1: none), masked count; allowed [B, N] (own positive
    always allowed)."""
    q, c = _unit(q), _unit(c)
    s = q @ c.T
    B, N = s.shape
    out = []
    for i in range(B):
        a = allowed[i].copy()
        a[pos[i]] = True
        lg = np.where(a, s[i] / tau, -np.inf)
        lse = np.log(np.sum(np.exp(lg[a] - lg[a].max()))) + lg[a].max()
        neg = a.copy()
        neg[pos[i]] = False
        other = lg[neg].max() if neg.any() else -np.inf
        hard = s[i][neg].max() if neg.any() else -1.0
        out.append((lse - lg[pos[i]], lg[pos[i]] > other, hard, int((~a).sum())))
    return [np.array(x) for x in zip(*out)]


@pytest.mark.parametrize("terms", ["plain", "tiled"])
def test_query_terms_and_metrics_equal_a_reference(terms):
    """query_terms / tiled terms: loss, correct, hardest_neg_sim (-1 for a query whose negatives are all masked) and
    masked counts with invalid slots and a duplicate; contrastive_loss's metrics from them. Kills `pos_logit >
    max_other` -> `>=`, `jnp.where(jnp.isfinite(hardest), hardest, -1.0)` numbers, `valid[None] & ~allowed` ->
    `|`, the tiled `masked` / `other` / `hardest` accumulators, `_pad_rows`' padding values, and the metric
    divisions (`correct / n_queries` ...)."""
    q, c = _batch()
    B, K = 5, 2
    pos = np.arange(B) * K
    valid = np.ones(B * K, bool)
    valid[3] = False
    valid[9] = False
    qtask, ctask = np.array([0, 0, 0, 0, 1]), np.array([0] * 8 + [1, 1])  # query 4: no negative left
    hashes = np.arange(B * K * 2, dtype=np.uint32).reshape(B * K, 2)
    hashes[7] = hashes[0]  # col 7 duplicates query 0's positive
    allowed = valid[None, :] & (ctask[None, :] == qtask[:, None])
    allowed[0, 7] = False
    allowed[np.arange(B), pos] = True
    ci = CandidateInfo(valid=jnp.asarray(valid), hash=jnp.asarray(hashes), task=jnp.asarray(ctask, jnp.int32))
    qi = QueryInfo(pos_hash=jnp.asarray(hashes[pos]), task=jnp.asarray(qtask, jnp.int32))
    opts = LossOptions(same_task=True)
    ref_loss, ref_ok, ref_hard, _ = _terms_reference(q, c, pos, 0.1, allowed)
    ref_masked = np.array([int((valid & ~allowed[i]).sum()) for i in range(B)])  # valid slots masked
    fn = query_terms if terms == "plain" else tiled_terms(2, 3)
    t = fn(normalize(jnp.asarray(q)), normalize(jnp.asarray(c)), jnp.asarray(pos, jnp.int32), 0.1, qi, ci, opts)
    np.testing.assert_allclose(np.asarray(t.loss), ref_loss, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(t.correct), ref_ok)
    np.testing.assert_allclose(np.asarray(t.hardest_neg_sim), ref_hard, rtol=1e-5, atol=1e-6)
    assert float(t.hardest_neg_sim[4]) == -1.0 and float(t.loss[4]) == pytest.approx(0.0, abs=1e-6)
    np.testing.assert_array_equal(np.asarray(t.masked), ref_masked)
    w = np.array([1.0, 0.5, 0.0, 2.0, 1.0], np.float32)
    loss, m = contrastive_loss(jnp.asarray(q), jnp.asarray(c), jnp.asarray(pos, jnp.int32), temperature=0.1,
                               weights=jnp.asarray(w), qi=qi, ci=ci, opts=opts, terms_fn=fn)
    assert float(loss) == pytest.approx(float(np.sum(w * ref_loss) / 4), rel=1e-5)
    assert float(m["active_queries"]) == 4
    assert float(m["accuracy"]) == pytest.approx(ref_ok.mean())
    assert float(m["hardest_neg_sim"]) == pytest.approx(ref_hard.mean(), rel=1e-5)
    assert float(m["masked_candidates"]) == ref_masked.sum()
    ps = np.sum(_unit(q) * _unit(c)[pos], axis=1)
    assert float(m["pos_sim"]) == pytest.approx(ps.mean(), rel=1e-5)


def test_normalize_short_and_zero_vectors():
    """normalize: max(norm, eps) with eps = 1e-12 (mutants 1e-12 -> 1 + 1e-12 leave long vectors alone)."""
    x = jnp.asarray([[0.3, 0.4], [0.0, 0.0], [3e-3, 4e-3]])
    np.testing.assert_allclose(np.asarray(normalize(x)), [[0.6, 0.8], [0.0, 0.0], [0.6, 0.8]], rtol=1e-6)


def test_layout_and_positive_owners():
    np.testing.assert_array_equal(np.asarray(layout_pos_index(3, 4, 2)), [2, 6, 10])
    owner, owned = core.positive_owners(jnp.asarray([0, 3]), jnp.asarray([[5, 6], [7, 8]], jnp.uint32), 5)
    np.testing.assert_array_equal(np.asarray(owner), [[5, 6], [0, 0], [0, 0], [7, 8], [0, 0]])
    np.testing.assert_array_equal(np.asarray(owned), [True, False, False, True, False])
    total, count = core.reduce_queries(jnp.asarray([1.0, 2.0, 4.0]), jnp.asarray([0.5, 0.0, 2.0]))
    assert float(total) == 8.5 and float(count) == 2
    total, count = core.reduce_queries(jnp.asarray([1.0, 2.0]), None)
    assert float(total) == 3.0 and float(count) == 2


def test_peg_statistics_by_hand():
    """PEG Eq. 4-6: sigma = mean - beta over the counted queries, w = 1 at or above sigma else clip(sim / sigma),
    t = alpha mean + (1 - alpha) t_prev. Kills the mutants of each of these operators and of `weights > 0`."""
    sims = jnp.asarray([0.9, 0.5, 0.1, -0.2, 0.7])
    st = peg_statistics(sims, 0.2, alpha=0.3, beta=0.1, weights=jnp.asarray([1.0, 1.0, 1.0, 1.0, 0.0]))
    mean = (0.9 + 0.5 + 0.1 - 0.2) / 4  # 0.325: query 4 (weight 0) left out
    sigma = mean - 0.1
    assert float(st.sigma) == pytest.approx(sigma)
    assert float(st.t) == pytest.approx(0.3 * mean + 0.7 * 0.2)
    np.testing.assert_array_equal(np.asarray(st.active), [True, True, False, False, True])
    np.testing.assert_allclose(np.asarray(st.w), [1.0, 1.0, 0.1 / sigma, 0.0, 1.0], rtol=1e-6)
    st = peg_statistics(jnp.asarray([0.05, 0.0, 0.02]), 0.0, alpha=0.5, beta=0.1)  # sigma < 0: w clipped to 1
    assert float(st.sigma) < 0 and np.asarray(st.w).tolist() == [1.0, 1.0, 1.0]
    st = peg_statistics(jnp.asarray([0.3, 0.1]), 0.0, alpha=1.0, beta=0.0)  # sim == sigma (0.2) is active
    assert np.asarray(st.active).tolist() == [True, False] and float(st.w[1]) == pytest.approx(0.5)


def test_peg_metrics_and_block_scale():
    """PEG in contrastive_loss: peg_mean_weight = mean w_q over the counted queries, peg_sigma, peg_t; the negative
    scale a_n = t + sim(q, p) on hard negatives of active queries only (block_logits)."""
    q = jnp.asarray([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    c = jnp.asarray([[1.0, 0.1], [0.9, 0.2], [0.1, 1.0], [1.0, 0.0], [-1.0, 1.0], [1.0, 1.0]])
    pos = layout_pos_index(3, 2)
    w = jnp.asarray([1.0, 1.0, 0.0])
    loss, m = contrastive_loss(q, c, pos, temperature=0.5, weights=w, opts=LossOptions(peg=True), peg_t_prev=0.4,
                               peg_alpha=0.5, peg_beta=0.3)
    qn, cn = _unit(np.asarray(q)), _unit(np.asarray(c))
    ps = np.sum(qn * cn[np.asarray(pos)], axis=1)
    mean = ps[:2].mean()
    sigma = mean - 0.3
    wq = np.where(ps >= sigma, 1.0, np.clip(ps / sigma, 0, 1))
    assert float(m["peg_sigma"]) == pytest.approx(sigma, rel=1e-5)
    assert float(m["peg_t"]) == pytest.approx(0.5 * mean + 0.5 * 0.4, rel=1e-5)
    assert float(m["peg_mean_weight"]) == pytest.approx(wq[:2].sum() / 2, rel=1e-5)
    t = 0.5 * mean + 0.5 * 0.4
    qi = QueryInfo(pos_sim=jnp.asarray(ps, jnp.float32), peg_active=jnp.asarray(ps >= sigma))
    _, sims, _, is_pos, scale = core.block_logits(jnp.asarray(qn, jnp.float32), jnp.asarray(cn, jnp.float32), pos, 0,
                                                  qi, CandidateInfo(), jnp.float32(0.5), LossOptions(peg=True),
                                                  jnp.float32(t))
    s = qn @ cn.T
    want = np.where((ps >= sigma)[:, None] & (s >= ps[:, None]) & ~np.asarray(is_pos), t + ps[:, None], 1.0)
    np.testing.assert_allclose(np.asarray(scale), want, rtol=1e-5)
    assert (want != 1.0).any()


def test_guards_and_errors():
    """The ValueErrors of the losses (each message: its `raise` and the test in front of it)."""
    q = jnp.ones((2, 4))
    pos = layout_pos_index(2, 1)
    with pytest.raises(ValueError, match="must be non-empty and of equal length"):
        matryoshka_loss(q, q, pos, dims=(4, 2), dim_weights=(1.0,), temperature=0.1)
    with pytest.raises(ValueError, match="must be non-empty"):
        matryoshka_loss(q, q, pos, dims=(), dim_weights=(), temperature=0.1)
    with pytest.raises(ValueError, match=r"dims \[0\] exceed"):
        matryoshka_loss(q, q, pos, dims=(4, 0), dim_weights=(1.0, 1.0), temperature=0.1)
    loss, m = matryoshka_loss(q, q, pos, dims=(4,), dim_weights=(1.0,), temperature=0.1)  # d == width is fine
    assert "loss_dim4" in m
    with pytest.raises(ValueError, match="margin strategy 'cubic'"):
        gist.guide_limit(jnp.ones(2), 0.1, "cubic")
    np.testing.assert_allclose(np.asarray(gist.guide_limit(jnp.asarray([0.5, -0.5]), 0.2, "relative")), [0.4, -0.6])
    np.testing.assert_allclose(np.asarray(gist.guide_limit(jnp.asarray([0.5, -0.5]), 0.2)), [0.3, -0.7])
    with pytest.raises(ValueError, match="distillation 'mse'"):
        distill.distill_loss("mse", q, q, None, jnp.ones((2, 1)), jnp.ones((2, 1), bool), None, temperature=0.1)
    with pytest.raises(ValueError, match="scored-pair loss 'mse'"):
        scored.scored_loss("mse", q, q, jnp.ones(2), None)
    with pytest.raises(ValueError, match="non-empty subset"):
        objective.Objective(kinds=())
    with pytest.raises(ValueError, match="non-empty subset"):
        objective.Objective(kinds=("infonce", "focal"))
    with pytest.raises(ValueError, match="distill 'mse'"):
        objective.Objective(distill="mse")
    obj = objective.Objective(kinds=("infonce",), distill="kl")
    contrastive = lambda q_, c_, p_, w_, k_: contrastive_loss(q_, c_, p_, temperature=0.1, weights=w_)  # noqa
    for teacher, cv in ((None, jnp.ones(2, bool)), (jnp.ones((2, 1)), None)):
        with pytest.raises(ValueError, match="teacher scores and the filled slots"):
            objective.total_loss(q, q, pos, objective=obj, contrastive=contrastive, weights=jnp.ones(2),
                                 temperature=0.1, teacher=teacher, cand_valid=cv)
    with pytest.raises(ValueError, match="cosent needs the pair scores"):
        objective.total_loss(q, q, pos, objective=objective.Objective(kinds=("cosent",)), contrastive=None,
                             weights=jnp.ones(2), temperature=0.1)


def test_kl_distillation_needs_two_slots():
    """A query with only its positive slot filled takes no part in KL (its KL is 0 and would only grow the count):
    `jnp.sum(valid, axis=1) >= 2` -> `>= 1`."""
    q = jnp.asarray([[1.0, 0.0], [0.0, 1.0]])
    c = jnp.asarray([[1.0, 0.2], [0.3, 1.0], [0.1, 1.0], [1.0, 1.0]])
    teacher = jnp.asarray([[0.9, 0.1], [0.8, 0.2]])
    valid = jnp.asarray([[True, True], [True, False]])
    loss, count = distill.distill_loss("kl", q, c, None, teacher, valid, None, temperature=0.5)
    assert float(count) == 1
    s = np.sum(_unit(np.asarray(q))[0] * _unit(np.asarray(c))[:2], axis=1) / 0.5
    pt, ps = np.exp(np.asarray(teacher[0]) / 0.5), np.exp(s)
    pt, ps = pt / pt.sum(), ps / ps.sum()
    assert float(loss) == pytest.approx(float(np.sum(pt * (np.log(pt) - np.log(ps)))), abs=1e-6)
