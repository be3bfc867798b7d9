"""On 8 simulated CPU devices: the sharded losses equal the single-device reference (loss and gradients)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxembed import models, parallel
from jaxembed.train import gradcache
from jaxembed.losses import CandidateInfo, LossOptions, QueryInfo, contrastive_loss, tiled_terms
from loss_reference import peg_constants, random_batch, reference_loss

CASES = [
    dict(opts=LossOptions(), symmetric=False, peg=False),
    dict(opts=LossOptions(same_task=True), symmetric=True, peg=False),
    dict(opts=LossOptions(peg=True), symmetric=False, peg=True),
    dict(opts=LossOptions(same_task=True, peg=True), symmetric=True, peg=True),
]


def test_eight_devices():
    assert jax.device_count() == 8


# Every case on the 8-way data mesh; the 2 x 4 (data x fsdp) mesh with the case that has every option: the batch is
# split over both axes on either mesh (parallel.BATCH_AXES), so the options' code is the same on both, and what the
# second mesh adds -- the gathers over two axes of other sizes -- is covered by one case.
MESH_CASES = [((8, 1), c) for c in CASES] + [((2, 4), CASES[-1])]


@pytest.mark.parametrize("mesh_shape,case", MESH_CASES,
                         ids=[f"{'data8' if m == (8, 1) else 'data2xfsdp4'}-{c['opts']}-sym{c['symmetric']}"
                              for m, c in MESH_CASES])
def test_sharded_losses_equal_single_device(case, mesh_shape):
    # 16 queries x 3 candidates: 2 queries / 6 candidates per device; duplicates across shards (30 ~ 9), a row
    # repeated on another shard (7 ~ 1) and on its own (13 ~ 12), two queries sharing a positive (10, 4), a query
    # text with two positives on two shards (9 ~ 3) and on one (15 ~ 14). PEG cases: positives close to their
    # queries, so that sigma > 0, several w_q < 1 and some a_n != 1 (asserted below)
    b = random_batch(seed=1, B=16, K=3, D=16, dup_pairs=((5, 0), (30, 9), (47, 3)), invalid=(4, 20),
                     repeated_rows=((7, 1), (13, 12)), shared_positives=((10, 4),), close_positives=case["peg"],
                     same_queries=((9, 3), (15, 14)))
    pos = jnp.asarray(b["pos"])
    ci = CandidateInfo(jnp.asarray(b["valid"]), jnp.asarray(b["hashes"]), jnp.asarray(b["ctask"]))
    qi = QueryInfo(pos_hash=jnp.asarray(b["hashes"][b["pos"]]), task=jnp.asarray(b["qtask"]),
                   hash=jnp.asarray(b["qhashes"]))
    w = jnp.asarray(b["weights"])
    t_prev = 0.25 if case["peg"] else None
    if case["peg"]:
        wq, a, _, sigma = peg_constants(b["q"], b["c"], b["pos"], b["weights"], (t_prev, 0.5, 0.1))
        assert sigma > 0 and np.sum(wq[b["weights"] > 0] < 1) >= 2 and np.sum(a != 1) >= 2
    kw = dict(temperature=0.05, opts=case["opts"], symmetric=case["symmetric"])
    q, c = jnp.asarray(b["q"]), jnp.asarray(b["c"])
    ref_f = lambda q, c: contrastive_loss(q, c, pos, weights=w, qi=qi, ci=ci, peg_t_prev=t_prev, **kw)
    (l0, m0), g0 = jax.jit(jax.value_and_grad(ref_f, argnums=(0, 1), has_aux=True))(q, c)  # one program
    ref, _ = reference_loss(b["q"], b["c"], b["pos"], 0.05, b["weights"], b["valid"], b["hashes"], b["qtask"],
                            b["ctask"], case["opts"].same_task, (t_prev, 0.5, 0.1) if case["peg"] else None,
                            case["symmetric"], qhashes=b["qhashes"])  # the float64 loop reference
    assert float(l0) == pytest.approx(ref, rel=1e-5, abs=1e-5)

    mesh = parallel.make_mesh(data=mesh_shape[0], fsdp=mesh_shape[1])
    put = lambda x: jax.device_put(x, parallel.batch_sharding(mesh, x.ndim))
    args = (put(pos), put(w), jax.tree.map(put, qi), jax.tree.map(put, ci), t_prev)
    for name, fn in (("jit", parallel.jit_loss(mesh, **kw)),
                     ("shard_map", parallel.shard_map_loss(mesh, **kw)),
                     ("shard_map_tiled", parallel.shard_map_loss(mesh, terms_fn=tiled_terms(1, 4), **kw))):
        (l, m), g = jax.value_and_grad(lambda q, c: fn(q, c, *args), argnums=(0, 1), has_aux=True)(put(q), put(c))
        assert abs(float(l) - float(l0)) <= 1e-5, name
        for a, r in zip(g, g0):
            np.testing.assert_allclose(np.asarray(a), np.asarray(r), atol=1e-5, err_msg=name)
        for k in m0:
            assert float(m[k]) == pytest.approx(float(m0[k]), abs=1e-5), (name, k)


def test_gist_distill_and_scored_losses_sharded_equal_single_device():
    """The batch objective with every new part on 8 devices (a 2 x 4 data x fsdp mesh: the batch over both axes)
    equals one device (loss, gradients, metrics): GIST's
    guided mask (guide embeddings sharded with the batch) through jit_loss, shard_map_loss and the tiled shard_map
    loss; rows of InfoNCE / PEG and CoSENT / AnglE mixed in one batch (each row its own loss); KL or MarginMSE
    distillation with missing teacher scores and empty slots."""
    from jaxembed.losses import objective as ob
    from jaxembed.losses.gist import guide_infos
    from jaxembed.losses.parts.angle import AngleSettings

    B, K, D, G = 16, 3, 16, 8
    b = random_batch(seed=2, B=B, K=K, D=D, dup_pairs=((5, 0), (30, 9)), invalid=(4, 20),
                     repeated_rows=((7, 1),), close_positives=True)
    rng = np.random.default_rng(7)
    proj = rng.normal(size=(D, G))
    gq = jnp.asarray(b["q"] @ proj + 0.3 * rng.normal(size=(B, G)), jnp.float32)
    gc = jnp.asarray(b["c"] @ proj + 0.3 * rng.normal(size=(B * K, G)), jnp.float32)
    teacher = rng.uniform(0.0, 1.0, size=(B, K)).astype(np.float32)
    teacher[~b["valid"].reshape(B, K)] = np.nan
    teacher[3, 2] = np.nan
    pair = jnp.asarray(rng.uniform(0, 5, size=B), jnp.float32)
    mesh = parallel.make_mesh(data=2, fsdp=4)
    put = lambda x: jax.device_put(x, parallel.batch_sharding(mesh, x.ndim))
    pos, w = jnp.asarray(b["pos"]), jnp.asarray(b["weights"])
    base = (jnp.asarray(b["valid"]), jnp.asarray(b["hashes"]), jnp.asarray(b["ctask"]),
            jnp.asarray(b["hashes"][b["pos"]]), jnp.asarray(b["qtask"]), jnp.asarray(b["qhashes"]))
    kw = dict(temperature=0.05, symmetric=True)
    cases = [  # each case through two of the three sharded contrastive losses (one compilation each)
        (ob.Objective(kinds=("infonce", "cosent"), distill="kl", distill_temperature=0.1), "infonce", "cosent",
         (("jit", parallel.jit_loss), ("shard_map_tiled", functools.partial(parallel.shard_map_loss,
                                                                            terms_fn=tiled_terms(1, 4))))),
        (ob.Objective(kinds=("peg", "angle"), distill="margin_mse",
                      settings={"angle": AngleSettings(cosine_weight=0.5)}),
         "peg", "angle",
         (("shard_map", parallel.shard_map_loss),)),
    ]
    for obj, ckind, skind, impls in cases:
        # rows alternate between the case's contrastive and scored kinds: both on every shard
        rk = jnp.asarray([ob.kind_id(ckind if i % 2 == 0 else skind) for i in range(B)], jnp.int32)
        opts = LossOptions(same_task=True, peg=ckind == "peg")

        def objective(q, c, pos, w, gq, gc, teacher, pair, rk, valid, hashes, ctask, phash, qtask, qhash, fn):
            g_q, g_c, limit = guide_infos(gq, gc, pos, 0.05, "absolute")
            cv = ob.candidate_valid(obj, valid, rk, K)
            ci = CandidateInfo(cv, hashes, ctask, g_c)
            qi = QueryInfo(pos_hash=phash, task=qtask, hash=qhash, guide=g_q, guide_limit=limit)
            contrastive = lambda q, c, pos, w_, kind: fn(q, c, pos, w_, qi, ci, 0.25)
            return ob.total_loss(q, c, pos, objective=obj, contrastive=contrastive, weights=w, temperature=0.05,
                                 row_kind=rk, teacher=teacher.reshape(-1, K), cand_valid=valid, pair_score=pair,
                                 peg_t_prev=0.25)

        single = lambda q, c, pos, w, qi, ci, t: contrastive_loss(q, c, pos, weights=w, qi=qi, ci=ci, peg_t_prev=t,
                                                                  opts=opts, **kw)
        args = (pos, w, gq, gc, jnp.asarray(teacher).reshape(-1), pair, rk) + base
        q, c = jnp.asarray(b["q"]), jnp.asarray(b["c"])
        (l0, m0), g0 = jax.jit(jax.value_and_grad(lambda q, c: objective(q, c, *args, single), argnums=(0, 1),
                                                  has_aux=True))(q, c)
        assert float(m0["masked_candidates"]) > 0 and float(m0["distill_loss"]) > 0
        assert float(m0[f"{skind}_loss"]) > 0
        sargs = tuple(put(x) for x in args)
        for name, make in impls:
            fn = make(mesh, opts=opts, **kw)
            f = jax.jit(jax.value_and_grad(lambda q, c: objective(q, c, *sargs, fn), argnums=(0, 1), has_aux=True))
            (l, m), g = f(put(q), put(c))
            assert abs(float(l) - float(l0)) <= 1e-5, (obj, name)
            for a, r in zip(g, g0):
                np.testing.assert_allclose(np.asarray(a), np.asarray(r), atol=1e-5, err_msg=f"{obj} {name}")
            for k in m0:
                assert float(m[k]) == pytest.approx(float(m0[k]), abs=1e-5), (obj, name, k)


def _tiny_bert():
    """One layer: sharding acts on each layer's weights alike, the gradient cache on whole sub-batches."""
    cfg = models.config_from_hf(dict(model_type="bert", vocab_size=64, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=32,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    return models.init_model(cfg, seed=0)


def test_fsdp_param_sharding_and_forward():
    mesh = parallel.make_mesh(data=2, fsdp=4)
    model = _tiny_bert()
    ids = jnp.asarray(np.random.default_rng(0).integers(1, 64, size=(8, 10)), jnp.int32)
    mask = jnp.ones_like(ids)
    ref = jax.jit(lambda m, i, a: m(i, a))(model, ids, mask)  # on one device
    sharded = parallel.shard_model(model, mesh, "fsdp")
    k = sharded.layers[0].ffn.intermediate.kernel[...]
    assert k.sharding.spec == jax.sharding.PartitionSpec("fsdp", None)  # [embed, mlp]: embed over fsdp
    out = jax.jit(lambda m, i, a: m(i, a))(sharded, jax.device_put(ids, parallel.batch_sharding(mesh, 2)),
                                             jax.device_put(mask, parallel.batch_sharding(mesh, 2)))
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-5)


def test_gradient_cache_data_parallel_equals_single_device():
    model = _tiny_bert()
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(1, 64, size=(32, 10)), jnp.int32)
    mask = jnp.ones_like(ids)

    def encode(st, x, key):
        return nnx.merge(graphdef, st)(x["ids"], x["mask"])[:, 0]

    def loss(st, chunk):
        e = gradcache.encode_chunked(encode, st, {"ids": ids, "mask": mask}, chunk)
        return contrastive_loss(e[:16], e[16:], jnp.arange(16), temperature=0.1)[0]

    g_ref = jax.jit(jax.grad(loss), static_argnums=1)(state, None)  # one program, not each operation eagerly
    mesh = parallel.make_mesh()
    rep = jax.device_put(state, parallel.replicated(mesh))
    g = jax.jit(jax.grad(loss), static_argnums=1)(rep, 4)
    for a, r in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(r), atol=1e-5)


def test_gradient_cache_keeps_a_data_sharded_batch_sharded():
    """Strided sub-batches: every device encodes only its own rows (no all-gather in the compiled program), and the
    rows come back in input order."""
    mesh = parallel.make_mesh()
    rng = np.random.default_rng(1)
    w = jnp.asarray(rng.normal(size=(16, 8)), jnp.float32)
    x = jnp.asarray(rng.normal(size=(64, 16)), jnp.float32)

    def encode(p, xs, key):
        return jnp.tanh(xs["x"] @ p)

    xs = jax.device_put({"x": x}, parallel.batch_sharding(mesh, 2))
    fn = jax.jit(lambda p, xs: gradcache.encode_chunked(encode, p, xs, 16),
                 out_shardings=parallel.batch_sharding(mesh, 2))
    hlo = fn.lower(w, xs).compile().as_text()
    assert "all-gather" not in hlo and "all-to-all" not in hlo
    np.testing.assert_allclose(np.asarray(fn(w, xs)), np.tanh(np.asarray(x) @ np.asarray(w)), atol=1e-6)
