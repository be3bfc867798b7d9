"""Contrastive losses against an independent loop-based float64 reference and hand-computed values."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxembed.losses import (CandidateInfo, LossOptions, QueryInfo, contrastive_loss, layout_pos_index, normalize,
                             peg_statistics, query_terms, tiled_terms)
from jaxembed.losses.matryoshka import KALM_DIMS, KALM_WEIGHTS, matryoshka_loss
from loss_reference import peg_batch, peg_constants, random_batch, reference_grad, reference_loss

# a repeated row (the same query and positive texts; across shards in tests/multidevice) and two queries sharing
# a positive text: in the symmetric term neither may be a negative of the other; a query text with two positives
# (rows 9 and 3): neither positive is a negative of that query
DUPS = dict(repeated_rows=((7, 1),), shared_positives=((10, 4),), same_queries=((9, 3),))


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


# a small batch for finite differences: two w_q clipped to 0, a repeated row, a shared positive, a query text with
# two positives, a duplicate negative, an empty slot, two tasks
SMALL = dict(B=8, K=2, D=6, dup_pairs=((5, 0),), invalid=(3,), repeated_rows=((6, 1),), shared_positives=((7, 4),),
             same_queries=((5, 3),))
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
    # the forward term too: row 3's positive is the positive of another row of query 0's text (and vice versa)
    assert float(loss_q) < 1e-6


def test_query_with_several_positives_does_not_push_them_apart():
    """Rows 0 and 1 are the same query text with two different positives (each a positive of that text): masked as
    each other's negatives (query -> candidate), the loss can reach 0; without the query hashes, each row keeps a
    floor of log 2 (the other positive scores as high as its own). The reference agrees (the tiled path: in
    test_plain_and_tiled_equal_reference, DUPS)."""
    e = np.eye(4, dtype=np.float32)
    q = jnp.asarray(e[[0, 0, 2]])  # rows 0 and 1: the same query
    c = jnp.asarray(e[[0, 0, 2]])  # their positives: other texts, the same direction (K = 1)
    h = jnp.asarray(np.array([[1, 1], [2, 2], [3, 3]], np.uint32))  # three positive texts
    qh = jnp.asarray(np.array([[9, 1], [9, 1], [9, 3]], np.uint32))
    pos = layout_pos_index(3, 1)
    f = jax.jit(lambda qi: contrastive_loss(q, c, pos, temperature=0.01, qi=qi, ci=CandidateInfo(hash=h)))
    loss, m = f(QueryInfo(pos_hash=h, hash=qh))
    assert float(loss) < 1e-6 and float(m["masked_candidates"]) == 2
    unmasked, _ = f(QueryInfo(pos_hash=h))
    assert float(unmasked) == pytest.approx(2 * math.log(2) / 3, rel=1e-4)
    ref, _ = reference_loss(q, c, np.arange(3), 0.01, hashes=np.asarray(h), qhashes=np.asarray(qh))
    assert ref < 1e-6


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
    # the loss, its metrics and its gradient from one compiled program (op by op, each operation compiles its own)
    (loss, m), g = jax.jit(jax.value_and_grad(
        lambda q, c: contrastive_loss(q, c, layout_pos_index(3, 1), temperature=tau, opts=LossOptions(peg=True),
                                      peg_t_prev=t_prev, peg_alpha=alpha, peg_beta=beta),
        argnums=(0, 1), has_aux=True))(jnp.asarray(q), jnp.asarray(c))
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert float(m["peg_t"]) == pytest.approx(t, abs=1e-7)
    assert float(m["peg_sigma"]) == pytest.approx(sigma, abs=1e-7)
    st = peg_statistics(jnp.asarray([0.8, 0.8, 0.6]), t_prev, alpha, beta)
    np.testing.assert_allclose(st.w, w, rtol=1e-6)
    # PEG's weights are constants for the gradient: the gradient equals that of the loss with w, a_n frozen
    # (float64 central differences of the reference at these w and a_n)
    ref = reference_grad(q, c, np.arange(3), tau, peg=(t_prev, alpha, beta))
    for a, r in zip(g, ref):
        np.testing.assert_allclose(np.asarray(a), r, atol=1e-4)


def test_masked_query_still_serves_as_negative():
    b = random_batch()
    qi, ci = _infos(b)
    w = jnp.asarray(b["weights"])
    assert float(w[2]) == 0.0
    # one compiled program per function (op-by-op, each operation compiles its own kernel)
    loss = jax.jit(lambda q, c: contrastive_loss(q, c, jnp.asarray(b["pos"]), temperature=0.05, weights=w, qi=qi,
                                                 ci=ci)[0])
    q, c = jnp.asarray(b["q"]), jnp.asarray(b["c"])
    g = jax.jit(jax.grad(loss, argnums=1))(q, c)
    # query 2's positive gets a gradient only as a negative of the others: non-zero
    assert float(jnp.abs(g[b["pos"][2]]).sum()) > 0
    # and query 2's own term contributes nothing: changing q[2] does not change the loss
    assert float(loss(q.at[2].add(1.0), c)) == pytest.approx(float(loss(q, c)), abs=1e-6)


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


# ------------------------------------------------------------------------------- GIST, distillation, scored pairs

def _guided_batch(seed=3, B=10, K=3, D=12, G=8):
    """random_batch plus guide embeddings near the student's (so that the guide finds some negatives closer to the
    query than its positive) from an independent projection (G dims)."""
    b = random_batch(seed, B=B, K=K, D=D, close_positives=True, **(DUPS if B >= 12 else {}))
    rng = np.random.default_rng(seed + 100)
    proj = rng.normal(size=(D, G))
    b["gq"] = (b["q"] @ proj + 0.3 * rng.normal(size=(B, G))).astype(np.float32)
    b["gc"] = (b["c"] @ proj + 0.3 * rng.normal(size=(B * K, G))).astype(np.float32)
    return b


@pytest.mark.parametrize("strategy,margin,symmetric", [("absolute", 0.1, False), ("relative", 0.2, True)])
def test_gist_guided_mask_equals_reference(strategy, margin, symmetric):
    """GIST (Solatorio 2024): plain and tiled losses with the guide's mask equal the float64 reference that skips
    every candidate the guide finds above g(q, p) - margin (both directions with the symmetric term); the mask
    really removes candidates (the loss without it differs), never a query's own positive."""
    from jaxembed.losses.gist import guide_infos

    b = _guided_batch(B=12)
    qi, ci = _infos(b)
    pos = jnp.asarray(b["pos"])
    gq, gc, limit = guide_infos(jnp.asarray(b["gq"]), jnp.asarray(b["gc"]), pos, margin, strategy)
    qi, ci = qi._replace(guide=gq, guide_limit=limit), ci._replace(guide=gc)
    kw = dict(temperature=0.05, weights=jnp.asarray(b["weights"]), qi=qi, ci=ci, symmetric=symmetric)
    ref, _ = reference_loss(b["q"], b["c"], b["pos"], 0.05, b["weights"], b["valid"], b["hashes"], symmetric=symmetric,
                            qhashes=b["qhashes"], guide=(b["gq"], b["gc"], margin, strategy))
    plain_ref, _ = reference_loss(b["q"], b["c"], b["pos"], 0.05, b["weights"], b["valid"], b["hashes"],
                                  symmetric=symmetric, qhashes=b["qhashes"])
    assert abs(ref - plain_ref) > 1e-3  # the guide masks something that matters
    grads, masked = [], []
    for terms_fn in (query_terms, tiled_terms(5, 7)):
        f = lambda q, c: contrastive_loss(q, c, pos, terms_fn=terms_fn, **kw)
        (loss, m), g = jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))(jnp.asarray(b["q"]),
                                                                                    jnp.asarray(b["c"]))
        assert float(loss) == pytest.approx(ref, rel=1e-5, abs=1e-5)
        grads.append(g)
        masked.append(float(m["masked_candidates"]))
    for a, r in zip(*grads):
        np.testing.assert_allclose(a, r, atol=1e-5)
    terms = query_terms(normalize(jnp.asarray(b["q"])), normalize(jnp.asarray(b["c"])), pos, 0.05, qi, ci)
    n = len(b["c"])
    assert masked[0] == masked[1] and 0 < masked[0] < 0.5 * n * len(b["q"])
    assert np.all(np.isfinite(np.asarray(terms.loss)))  # a positive is never masked (a masked one would be -inf)


def _distill_batch(seed=5, B=6, K=3, D=5):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, D)).astype(np.float32)
    c = rng.normal(size=(B * K, D)).astype(np.float32)
    teacher = rng.uniform(-0.2, 0.9, size=(B, K)).astype(np.float32)
    valid = np.ones((B, K), bool)
    valid[1, 2] = False            # an empty slot (fewer negatives): its score is NaN, the query still counts
    teacher[1, 2] = np.nan
    teacher[3, 1] = np.nan         # a missing score on a filled slot: KL leaves the query out, MarginMSE the pair
    weights = rng.uniform(0.3, 1.0, size=B).astype(np.float32)
    weights[4] = 0.0               # a masked query
    return q, c, np.arange(B, dtype=np.int32) * K, teacher, valid, weights


@pytest.mark.parametrize("kind", ["kl", "margin_mse"])
def test_distillation_equals_float64_reference(kind):
    """KL (RocketQAv2 / FlagEmbedding) and MarginMSE (Hofstätter et al. 2020): loss and gradients against the
    float64 loop reference and its central differences, with an empty slot, a missing score and a masked query."""
    from jaxembed.losses.distill import distill_loss
    from loss_reference import numeric_grad, reference_distill

    q, c, pos, teacher, valid, weights = _distill_batch()
    tau, tt = 0.1, 0.2
    f = lambda q, c: distill_loss(kind, q, c, jnp.asarray(pos), jnp.asarray(teacher), jnp.asarray(valid),
                                  jnp.asarray(weights), temperature=tau, teacher_temperature=tt)[0]
    loss, g = jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(jnp.asarray(q), jnp.asarray(c))
    ref = lambda q, c: reference_distill(kind, q, c, pos, teacher, valid, weights, tau, tt)
    assert float(loss) == pytest.approx(ref(q, c), rel=1e-5)
    for a, r in zip(g, numeric_grad(ref, [q, c])):
        np.testing.assert_allclose(np.asarray(a), r, atol=2e-5 * max(np.abs(r).max(), 1e-3), rtol=0)
    _, count = distill_loss(kind, jnp.asarray(q), jnp.asarray(c), jnp.asarray(pos), jnp.asarray(teacher),
                            jnp.asarray(valid), jnp.asarray(weights), temperature=tau)
    # KL: queries 0, 1 (its empty slot aside), 2, 5; 3 lacks a score, 4 is masked. MarginMSE: 2 + 1 + 2 + 1 + 2 pairs
    assert float(count) == (4 if kind == "kl" else 8)


def test_distillation_of_a_perfect_student_is_zero():
    from jaxembed.losses.distill import distill_loss

    q = np.eye(4, dtype=np.float32)[:2]                    # 2 queries, K = 2
    c = np.array([[0.8, 0.6, 0, 0], [0.6, 0.8, 0, 0], [0, 0.6, 0.8, 0], [0, 1.0, 0, 0]], np.float32)
    s = np.array([[0.8, 0.6], [0.6, 1.0]], np.float32)     # the student's cosines of each query's two slots
    f = jax.jit(lambda q, c, s: [distill_loss(kind, q, c, jnp.asarray([0, 2]), s, jnp.ones((2, 2), bool), None,
                                              temperature=0.1) for kind in ("kl", "margin_mse")])
    for loss, n in f(jnp.asarray(q), jnp.asarray(c), jnp.asarray(s)):
        assert float(loss) == pytest.approx(0.0, abs=1e-6) and float(n) == 2


def test_cosent_three_pairs_hand_computed():
    """CoSENT (Su 2022) by hand: scores 3 > 2 > 1 with cosines 0.6, 0.8, 0.0 (pairs as unit vectors)."""
    from jaxembed.losses.scored import scored_loss

    u = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]], np.float32)
    v = np.array([[0.6, 0.8], [0.8, 0.6], [0.0, 1.0]], np.float32)
    y = np.array([3.0, 2.0, 1.0], np.float32)
    lam = 20.0
    # ordered pairs (i, j) with y_i > y_j: (0,1), (0,2), (1,2): exp(lam (cos_j - cos_i))
    expected = math.log(1 + math.exp(lam * (0.8 - 0.6)) + math.exp(lam * (0.0 - 0.6)) + math.exp(lam * (0.0 - 0.8)))
    loss, n = jax.jit(lambda u, v, y: scored_loss("cosent", u, v, y, None, scale=lam))(jnp.asarray(u), jnp.asarray(v),
                                                                                      jnp.asarray(y))
    assert float(loss) == pytest.approx(expected, rel=1e-6) and float(n) == 3


@pytest.mark.parametrize("kind,D,cw", [("cosent", 6, 0.0), ("angle", 7, 0.0), ("angle", 6, 0.5)])
def test_scored_losses_equal_float64_reference(kind, D, cw):
    """CoSENT and AnglE (the angle similarity through Python complex numbers; an odd width is padded) against the
    float64 reference: loss and gradients, with tied scores, a NaN score and a masked pair."""
    from jaxembed.losses.scored import scored_loss
    from loss_reference import numeric_grad, reference_scored

    rng = np.random.default_rng(11)
    B = 7
    u = rng.normal(size=(B, D)).astype(np.float32)
    v = (u + 0.8 * rng.normal(size=(B, D))).astype(np.float32)
    y = np.array([4.0, 1.5, 3.2, 1.5, np.nan, 0.2, 2.8], np.float32)
    w = np.array([1, 1, 1, 1, 1, 1, 0], np.float32)
    own = {"cosine_weight": cw} if kind == "angle" else {}  # AnglE's setting of its own
    f = lambda u, v: scored_loss(kind, u, v, jnp.asarray(y), jnp.asarray(w), scale=5.0, **own)[0]
    loss, g = jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(jnp.asarray(u), jnp.asarray(v))
    ref = lambda u, v: reference_scored(kind, u, v, y, w, scale=5.0, cosine_weight=cw)
    assert float(loss) == pytest.approx(ref(u, v), rel=1e-5)
    for a, r in zip(g, numeric_grad(ref, [u, v])):
        np.testing.assert_allclose(np.asarray(a), r, atol=2e-5 * np.abs(r).max(), rtol=0)


def test_angle_similarity_is_the_reference_codes():
    """The closed form |cos + sin_term| equals the complex-quotient form (float64 reference) on random vectors."""
    from jaxembed.losses.scored import angle_pairs
    from loss_reference import angle_similarity

    rng = np.random.default_rng(2)
    u, v = rng.normal(size=(5, 9)), rng.normal(size=(5, 9))
    got = np.asarray(angle_pairs(jnp.asarray(u, jnp.float32), jnp.asarray(v, jnp.float32)))
    np.testing.assert_allclose(got, [angle_similarity(a, b) for a, b in zip(u, v)], atol=1e-6)


def test_objective_selects_each_rows_loss():
    """objective.total_loss with InfoNCE, CoSENT and KL distillation in one batch: each kind on its own rows (the
    others' weights 0, the scored rows' candidates out of the contrastive ones); a one-kind batch is that kind's loss
    alone; a single-kind objective is exactly the plain contrastive loss."""
    from jaxembed.losses import objective as ob
    from jaxembed.losses.distill import distill_loss
    from jaxembed.losses.scored import scored_loss

    b = random_batch(seed=4, B=8, K=3, D=10, dup_pairs=(), invalid=())
    q, c, pos, w = (jnp.asarray(b[k]) for k in ("q", "c", "pos", "weights"))
    K = 3
    rng = np.random.default_rng(0)
    teacher = jnp.asarray(rng.uniform(0, 1, size=(8, K)), jnp.float32)
    pair = jnp.asarray(rng.uniform(0, 5, size=8), jnp.float32)
    valid = jnp.ones(8 * K, bool)
    kind = jnp.asarray([0, 0, 2, 2, 0, 2, 0, 2], jnp.int32)  # infonce / cosent rows
    obj = ob.Objective(kinds=("infonce", "cosent"), distill="kl", distill_weight=0.5)
    cv = ob.candidate_valid(obj, valid, kind, K)
    is_nce = np.asarray(kind) == 0

    def contrastive(q, c, pos, weights, k):
        return contrastive_loss(q, c, pos, temperature=0.05, weights=weights, ci=CandidateInfo(valid=cv))

    @jax.jit  # one compilation for all the values compared below
    def values(q, c, w, teacher, pair):
        kw = dict(objective=obj, contrastive=contrastive, weights=w, temperature=0.05, teacher=teacher,
                  cand_valid=valid, pair_score=pair)
        loss, m = ob.total_loss(q, c, pos, row_kind=kind, **kw)
        w_nce, w_cos = jnp.where(is_nce, w, 0.0), jnp.where(~is_nce, w, 0.0)
        exp_nce = contrastive_loss(q, c, pos, temperature=0.05, weights=w_nce,
                                   ci=CandidateInfo(valid=jnp.repeat(jnp.asarray(is_nce), K)))[0]
        exp_d = distill_loss("kl", q, c, pos, teacher, valid.reshape(8, K), w_nce, temperature=0.05)[0]
        exp_c = scored_loss("cosent", q, c[pos], pair, w_cos)[0]
        # a batch of CoSENT rows only: the CoSENT loss alone
        only = ob.total_loss(q, c, pos, row_kind=jnp.full((8,), 2, jnp.int32), **kw)[0]
        only_exp = scored_loss("cosent", q, c[pos], pair, w)[0]
        # one kind, no distillation: the contrastive loss, bit for bit
        plain = ob.total_loss(q, c, pos, objective=ob.Objective(kinds=("infonce",)), contrastive=contrastive,
                              weights=w, temperature=0.05)[0]
        return loss, m, exp_nce, exp_d, exp_c, only, only_exp, plain, contrastive(q, c, pos, w, "infonce")[0]

    loss, m, exp_nce, exp_d, exp_c, only, only_exp, plain, plain_exp = values(q, c, w, teacher, pair)
    assert float(loss) == pytest.approx(float(exp_nce + 0.5 * exp_d + exp_c), rel=1e-6)
    assert float(m["cosent_loss"]) == pytest.approx(float(exp_c)) and float(m["distill_loss"]) == pytest.approx(
        float(exp_d))
    assert float(exp_d) > 0 and float(exp_c) > 0
    assert float(only) == pytest.approx(float(only_exp), rel=1e-6)
    assert float(plain) == float(plain_exp)


def test_cosent_angle_and_margin_mse_equal_sentence_transformers():
    """The same values as sentence-transformers' CoSENTLoss, AnglELoss and MarginMSELoss (cosine similarity) on the
    same embeddings, scores and teacher scores: what an ST user migrating a run gets."""
    torch = pytest.importorskip("torch")
    st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
    from sentence_transformers import util as st_util

    from jaxembed.losses.distill import distill_loss
    from jaxembed.losses.scored import scored_loss

    rng = np.random.default_rng(0)
    u = rng.normal(size=(7, 9)).astype(np.float32)
    v = (u + rng.normal(size=(7, 9))).astype(np.float32)
    y = np.array([4.0, 1.5, 3.2, 1.5, 0.0, 0.2, 2.8], np.float32)
    for kind, cls in (("cosent", st_losses.CoSENTLoss), ("angle", st_losses.AnglELoss)):
        ref = cls(model=None, scale=20.0).compute_loss_from_embeddings([torch.tensor(u), torch.tensor(v)],
                                                                       torch.tensor(y))
        got = jax.jit(lambda u, v: scored_loss(kind, u, v, jnp.asarray(y), None, scale=20.0)[0])(u, v)
        assert float(got) == pytest.approx(float(ref), rel=1e-5), kind
    # MarginMSE: query, positive and two negatives per row; the teacher's [pos, neg1, neg2] scores
    q, docs = u, [v, rng.normal(size=(7, 9)).astype(np.float32), rng.normal(size=(7, 9)).astype(np.float32)]
    teacher = rng.uniform(0, 1, size=(7, 3)).astype(np.float32)
    mse = st_losses.MarginMSELoss(model=None, similarity_fct=st_util.pairwise_cos_sim)
    ref = mse.compute_loss_from_embeddings([torch.tensor(x) for x in [q] + docs], torch.tensor(teacher))
    c = np.stack(docs, axis=1).reshape(-1, 9)  # the loader's layout: each query's slots in a row
    got = distill_loss("margin_mse", jnp.asarray(q), jnp.asarray(c), None, jnp.asarray(teacher),
                       jnp.ones((7, 3), bool), None, temperature=0.05)[0]
    assert float(got) == pytest.approx(float(ref), rel=1e-5)
