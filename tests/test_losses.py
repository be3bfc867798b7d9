"""Contrastive losses against an independent loop-based float64 reference and hand-computed values."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxembed.losses import (CandidateInfo, LossOptions, QueryInfo, contrastive_loss, layout_pos_index,
                             peg_statistics, query_terms, tiled_terms)
from jaxembed.losses.matryoshka import KALM_DIMS, KALM_WEIGHTS, matryoshka_loss
from loss_reference import peg_batch, peg_constants, random_batch, reference_grad, reference_loss

# a repeated row (the same query and positive texts; across shards in tests/multidevice) and two queries sharing
# a positive text: in the symmetric term neither may be a negative of the other
DUPS = dict(repeated_rows=((7, 1),), shared_positives=((10, 4),))


def _infos(b):
    ci = CandidateInfo(jnp.asarray(b["valid"]), jnp.asarray(b["hashes"]), jnp.asarray(b["ctask"]))
    qi = QueryInfo(pos_hash=jnp.asarray(b["hashes"][b["pos"]]), task=jnp.asarray(b["qtask"]),
                   hash=jnp.asarray(b["qhashes"]))
    return qi, ci


def assert_peg_weighting_acts(b, peg):
    """The batch reaches PEG's weighting: sigma > 0, several w_q < 1 (among the counted queries), some a_n != 1."""
    wq, a, _, sigma = peg_constants(b["q"], b["c"], b["pos"], b["weights"], peg)
    counted = b["weights"] > 0
    assert sigma > 0 and np.sum(wq[counted] < 1) >= 2 and np.sum(a != 1) >= 2, (sigma, wq, np.sum(a != 1))


CASES = [
    dict(opts=LossOptions(), symmetric=False, peg=None),
    dict(opts=LossOptions(same_task=True), symmetric=False, peg=None),
    dict(opts=LossOptions(peg=True), symmetric=False, peg=(0.3, 0.5, 0.1)),
    dict(opts=LossOptions(same_task=True, peg=True), symmetric=True, peg=(0.0, 0.5, 0.1)),
    dict(opts=LossOptions(), symmetric=True, peg=None),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['opts']}-sym{c['symmetric']}")
def test_plain_and_tiled_equal_reference(case):
    peg = case["peg"]
    b = peg_batch(**DUPS) if peg else random_batch(**DUPS)
    if peg:
        assert_peg_weighting_acts(b, peg)
    qi, ci = _infos(b)
    ref, t_ref = reference_loss(b["q"], b["c"], b["pos"], 0.05, b["weights"], b["valid"], b["hashes"], b["qtask"],
                                b["ctask"], case["opts"].same_task, peg, case["symmetric"], qhashes=b["qhashes"])
    kw = dict(temperature=0.05, weights=jnp.asarray(b["weights"]), qi=qi, ci=ci, opts=case["opts"],
              symmetric=case["symmetric"], peg_t_prev=None if peg is None else peg[0])
    grads = []
    for terms_fn in (query_terms, tiled_terms(5, 7), tiled_terms(64, 64)):
        f = lambda q, c: contrastive_loss(q, c, jnp.asarray(b["pos"]), terms_fn=terms_fn, **kw)
        vg = jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))  # one compile: faster than op by op
        (loss, m), g = vg(jnp.asarray(b["q"]), jnp.asarray(b["c"]))
        assert float(loss) == pytest.approx(ref, rel=1e-5, abs=1e-5)
        if peg is not None:
            assert float(m["peg_t"]) == pytest.approx(t_ref, abs=1e-6)
        grads.append(g)
    for g in grads[1:]:
        for a, b_ in zip(grads[0], g):
            np.testing.assert_allclose(a, b_, atol=1e-5)


# a small batch for finite differences: two w_q clipped to 0, a repeated row, a shared positive, a duplicate
# negative, an empty slot, two tasks
SMALL = dict(B=8, K=2, D=6, dup_pairs=((5, 0),), invalid=(3,), repeated_rows=((6, 1),), shared_positives=((7, 4),))
PEG_ALL = dict(opts=LossOptions(same_task=True, peg=True), symmetric=True, peg=(0.3, 0.5, 0.1))


def _small_case_grads(b, terms_fn):
    qi, ci = _infos(b)
    f = lambda q, c: contrastive_loss(q, c, jnp.asarray(b["pos"]), temperature=0.05, weights=jnp.asarray(b["weights"]),
                                      qi=qi, ci=ci, opts=PEG_ALL["opts"], symmetric=True, peg_t_prev=PEG_ALL["peg"][0],
                                      terms_fn=terms_fn)[0]
    return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(jnp.asarray(b["q"]), jnp.asarray(b["c"]))


def _small_case_reference(b):
    kw = dict(weights=b["weights"], valid=b["valid"], hashes=b["hashes"], qtask=b["qtask"], ctask=b["ctask"],
              same_task=True, peg=PEG_ALL["peg"], symmetric=True, qhashes=b["qhashes"])
    return reference_loss(b["q"], b["c"], b["pos"], 0.05, **kw)[0], reference_grad(b["q"], b["c"], b["pos"], 0.05, **kw)


def test_gradients_equal_float64_reference_with_peg_weights_constant():
    """d loss / d(q, c), plain and tiled (PEG, symmetric, same-task, every mask), against central differences of the
    float64 reference in which PEG's w_q and a_n are computed once and held constant (PEG: stop-gradient). Letting
    them move (no stop_gradient) shifts the gradient by far more than the tolerance."""
    b = peg_batch(**SMALL)
    assert_peg_weighting_acts(b, PEG_ALL["peg"])
    ref_loss, ref = _small_case_reference(b)
    scale = max(np.abs(r).max() for r in ref)
    for terms_fn in (query_terms, tiled_terms(3, 5)):
        loss, g = _small_case_grads(b, terms_fn)
        assert float(loss) == pytest.approx(ref_loss, rel=1e-5)
        for a, r in zip(g, ref):
            np.testing.assert_allclose(np.asarray(a), r, atol=2e-5 * scale, rtol=0)


def test_symmetric_repeated_query_has_no_log2_floor():
    """A row repeated in the batch (same query, same positive): with the identity mask both directions can reach 0;
    without it the positive -> query term sees the repeated query as a negative as good as its own (loss >= log 2)."""
    e = np.eye(4, dtype=np.float32)
    q = jnp.asarray(e[[0, 1, 2, 0]])  # row 3 repeats row 0
    c = q  # every positive equals its query (K = 1)
    h = jnp.asarray(np.array([[1, 1], [2, 2], [3, 3], [1, 1]], np.uint32))
    qh = jnp.asarray(np.array([[9, 1], [9, 2], [9, 3], [9, 1]], np.uint32))
    loss, _ = contrastive_loss(q, c, layout_pos_index(4, 1), temperature=0.01, qi=QueryInfo(pos_hash=h, hash=qh),
                               ci=CandidateInfo(hash=h), symmetric=True)
    assert float(loss) < 1e-6
    ref, _ = reference_loss(q, c, np.arange(4), 0.01, hashes=np.asarray(h), symmetric=True, qhashes=np.asarray(qh))
    assert ref < 1e-6
    # the same batch with the query hashes only (no positive hashes) is masked as well
    loss_q, _ = contrastive_loss(q, c, layout_pos_index(4, 1), temperature=0.01, qi=QueryInfo(hash=qh),
                                 symmetric=True)
    # only the forward term of rows 0 and 3 keeps its floor (no positive hashes): (2 log 2 + 0) / 2 / 4 queries
    assert float(loss_q) == pytest.approx(math.log(2) / 4, rel=1e-4)


def test_x64_mode_gives_the_same_loss_and_gradients():
    """With jax_enable_x64 (which jaxembed.parallel.to_global recommends for int64 batch values) the tiled scan
    keeps its carry types; loss and gradients still equal the float64 reference."""
    b = peg_batch(**SMALL)
    ref_loss, ref = _small_case_reference(b)
    scale = max(np.abs(r).max() for r in ref)
    with jax.enable_x64(True):
        loss, g = _small_case_grads(b, tiled_terms(3, 5))
    assert float(loss) == pytest.approx(ref_loss, rel=1e-5)
    for a, r in zip(g, ref):
        np.testing.assert_allclose(np.asarray(a), r, atol=2e-5 * scale, rtol=0)


def test_peg_three_queries_hand_computed():
    """q_i = e_i and candidate j = column j of S, so sim(q_i, c_j) = S[i, j] exactly (no hard negatives)."""
    S = np.array([[0.8, 0.6, 0.8],
                  [0.6, 0.8, 0.0],
                  [0.0, 0.0, 0.6]])
    assert np.allclose(np.linalg.norm(S, axis=0), 1.0)
    q, c = np.eye(3, dtype=np.float32), S.T.astype(np.float32)
    tau, t_prev, alpha, beta = 0.1, 0.2, 0.5, 0.1
    # Eq. 4-6 by hand: mean positive sim = (0.8 + 0.8 + 0.6) / 3
    mean = 2.2 / 3
    sigma = mean - beta  # 0.6333...
    t = alpha * mean + (1 - alpha) * t_prev  # 0.4666...
    w = [1.0, 1.0, 0.6 / sigma]  # query 2: 0.6 < sigma
    # query 0: active; negative 1 (0.6 < 0.8): a = 1; negative 2 (0.8 >= 0.8): a = t + 0.8
    l0 = -math.log(math.exp(0.8 / tau) / (math.exp(0.8 / tau) + math.exp(0.6 / tau) + math.exp((t + 0.8) * 0.8 / tau)))
    # query 1: active; negatives 0.6 and 0.0 are both below 0.8: a = 1
    l1 = -math.log(math.exp(0.8 / tau) / (math.exp(0.8 / tau) + math.exp(0.6 / tau) + math.exp(0.0)))
    # query 2: inactive (0.6 < sigma): a = 1 for every negative
    l2 = -math.log(math.exp(0.6 / tau) / (math.exp(0.6 / tau) + 2 * math.exp(0.0)))
    expected = (w[0] * l0 + w[1] * l1 + w[2] * l2) / 3
    loss, m = contrastive_loss(jnp.asarray(q), jnp.asarray(c), layout_pos_index(3, 1), temperature=tau,
                               opts=LossOptions(peg=True), peg_t_prev=t_prev, peg_alpha=alpha, peg_beta=beta)
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert float(m["peg_t"]) == pytest.approx(t, abs=1e-7)
    assert float(m["peg_sigma"]) == pytest.approx(sigma, abs=1e-7)
    st = peg_statistics(jnp.asarray([0.8, 0.8, 0.6]), t_prev, alpha, beta)
    np.testing.assert_allclose(st.w, w, rtol=1e-6)
    # PEG's weights are constants for the gradient: the gradient equals that of the loss with w, a_n frozen
    # (float64 central differences of the reference at these w and a_n)
    g = jax.grad(lambda q, c: contrastive_loss(q, c, layout_pos_index(3, 1), temperature=tau,
                                               opts=LossOptions(peg=True), peg_t_prev=t_prev, peg_alpha=alpha,
                                               peg_beta=beta)[0], argnums=(0, 1))(jnp.asarray(q), jnp.asarray(c))
    ref = reference_grad(q, c, np.arange(3), tau, peg=(t_prev, alpha, beta))
    for a, r in zip(g, ref):
        np.testing.assert_allclose(np.asarray(a), r, atol=1e-4)


def test_masked_query_still_serves_as_negative():
    b = random_batch()
    qi, ci = _infos(b)
    w = jnp.asarray(b["weights"])
    assert float(w[2]) == 0.0
    f = lambda c: contrastive_loss(jnp.asarray(b["q"]), c, jnp.asarray(b["pos"]), temperature=0.05, weights=w,
                                   qi=qi, ci=ci)[0]
    g = jax.grad(f)(jnp.asarray(b["c"]))
    # query 2's positive gets a gradient only as a negative of the others: non-zero
    assert float(jnp.abs(g[b["pos"][2]]).sum()) > 0
    # and query 2's own term contributes nothing: changing q[2] does not change the loss
    q2 = jnp.asarray(b["q"]).at[2].add(1.0)
    l1 = contrastive_loss(q2, jnp.asarray(b["c"]), jnp.asarray(b["pos"]), temperature=0.05, weights=w, qi=qi,
                          ci=ci)[0]
    assert float(l1) == pytest.approx(float(f(jnp.asarray(b["c"]))), abs=1e-6)


def test_duplicate_of_own_positive_is_masked_not_a_negative():
    b = random_batch(dup_pairs=((5, 0),), invalid=())
    qi, ci = _infos(b)
    pos = jnp.asarray(b["pos"])
    terms = query_terms(jnp.asarray(b["q"]), jnp.asarray(b["c"]), pos, 0.05, qi, ci)
    # col 5 has the text of query 0's positive (col 0): masked for query 0 only, counted once
    np.testing.assert_array_equal(np.asarray(terms.masked), [1] + [0] * (len(b["pos"]) - 1))
    c2 = jnp.asarray(b["c"]).at[5].add(3.0)  # moving the masked duplicate does not change query 0's term
    terms2 = query_terms(jnp.asarray(b["q"]), c2, pos, 0.05, qi, ci)
    assert float(terms2.loss[0]) == pytest.approx(float(terms.loss[0]), abs=1e-6)


def test_metrics():
    q = jnp.asarray([[1.0, 0.0], [0.0, 1.0]])
    c = jnp.asarray([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0], [1.0, 0.0]])  # query 1's positive is col 2
    loss, m = contrastive_loss(q, c, layout_pos_index(2, 2), temperature=0.1)
    assert float(m["accuracy"]) == pytest.approx(0.5)  # query 0 ties with col 3 (sim 1.0): not a strict win
    assert float(m["pos_sim"]) == pytest.approx(1.0)
    assert float(m["hardest_neg_sim"]) == pytest.approx((1.0 + 0.8) / 2)


def test_matryoshka_is_weighted_sum_of_truncated_losses():
    b = random_batch(D=24)
    qi, ci = _infos(b)
    q, c, pos = jnp.asarray(b["q"]), jnp.asarray(b["c"]), jnp.asarray(b["pos"])
    dims, ws = (24, 16, 8), (1.0, 0.3, 0.2)
    total, m = matryoshka_loss(q, c, pos, dims=dims, dim_weights=ws, temperature=0.05, qi=qi, ci=ci)
    expected = sum(w * float(contrastive_loss(q[:, :d], c[:, :d], pos, temperature=0.05, qi=qi, ci=ci)[0])
                   for d, w in zip(dims, ws))
    assert float(total) == pytest.approx(expected, rel=1e-6)
    assert set(m) >= {"loss_dim24", "loss_dim16", "loss_dim8", "accuracy"}
    with pytest.raises(ValueError, match="exceed"):
        matryoshka_loss(q, c, pos, dims=KALM_DIMS, dim_weights=KALM_WEIGHTS, temperature=0.05)
