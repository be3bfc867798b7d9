"""Gradient cache: the same gradients as encoding the whole batch at once (tiny BERT)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxembed import models
from jaxembed.train import gradcache
from jaxembed.losses import contrastive_loss, layout_pos_index
from jaxembed.models.embedding import EmbeddingModel, HeadConfig


def _model(dropout):
    # one layer: the cache re-encodes whole sub-batches, so what it must get right (the sub-batches' rows, the
    # embeddings' cotangents, the recomputed dropout masks) does not depend on the depth
    cfg = models.config_from_hf(dict(model_type="bert", vocab_size=64, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=32,
                                     hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout))
    return EmbeddingModel.init(cfg, HeadConfig("mean"), seed=0)


def _batch():
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.integers(1, 64, size=(8, 12)), jnp.int32)
    d = jnp.asarray(rng.integers(1, 64, size=(16, 12)), jnp.int32)  # 8 queries x (pos + 1 hard negative)
    qm = jnp.ones_like(q).at[:, 9:].set(0)
    dm = jnp.ones_like(d).at[::3, 7:].set(0)
    return q, qm, d, dm


def _loss_fn(graphdef, q, qm, d, dm, chunk, key):
    """The loss of the batch as a function of the parameters (and of the dropout key: ``key`` is its default)."""
    def encode(state, x, k):
        model = nnx.merge(graphdef, state)
        return model(x["ids"], x["mask"], deterministic=k is None, rngs=None if k is None else nnx.Rngs(dropout=k))

    def loss(state, key=key):
        kq = kd = None
        if key is not None:
            kq, kd = jax.random.split(key)
        eq = gradcache.encode_chunked(encode, state, {"ids": q, "mask": qm}, chunk, kq)
        ed = gradcache.encode_chunked(encode, state, {"ids": d, "mask": dm}, chunk, kd)
        return contrastive_loss(eq, ed, layout_pos_index(8, 2), temperature=0.05)[0]

    return loss


def test_cached_gradients_equal_uncached():
    graphdef, state = nnx.split(_model(0.0))
    q, qm, d, dm = _batch()
    l0, g0 = jax.jit(jax.value_and_grad(_loss_fn(graphdef, q, qm, d, dm, None, None)))(state)  # traced once
    for chunk in (2, 4):
        l1, g1 = jax.jit(jax.value_and_grad(_loss_fn(graphdef, q, qm, d, dm, chunk, None)))(state)
        assert float(l1) == pytest.approx(float(l0), abs=1e-6), chunk
        for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, err_msg=f"chunk {chunk}")


def test_dropout_recomputation_matches_forward():
    """With dropout, the cached gradient equals the gradient of the same computation without checkpointing
    (each sub-batch encoded with fold_in(key, k)): the recomputed dropout masks are the forward ones."""
    graphdef, state = nnx.split(_model(0.1))
    q, qm, d, dm = _batch()
    key = jax.random.key(7)

    def manual(state):
        kq, kd = jax.random.split(key)

        def enc(ids, mask, k):  # sub-batch i = the strided rows i, i + n, ... (n sub-batches of 4)
            n = ids.shape[0] // 4
            sub = lambda x: x.reshape(4, n, -1).swapaxes(0, 1)  # [n, 4, L]: sub-batch i = rows i + n * j

            def one(x):  # a plain loop over the sub-batches (lax.map: one compiled body), no checkpointing
                m = nnx.merge(graphdef, state)
                return m(x[0], x[1], deterministic=False, rngs=nnx.Rngs(dropout=jax.random.fold_in(k, x[2])))

            e = jax.lax.map(one, (sub(ids), sub(mask), jnp.arange(n)))  # [n, 4, D]
            return e.swapaxes(0, 1).reshape(ids.shape[0], -1)  # row i + n * j back in place

        return contrastive_loss(enc(q, qm, kq), enc(d, dm, kd), layout_pos_index(8, 2), temperature=0.05)[0]

    l0, g0 = jax.jit(jax.value_and_grad(manual))(state)
    cached = jax.jit(jax.value_and_grad(_loss_fn(graphdef, q, qm, d, dm, 4, None)))  # the key: an argument
    l1, g1 = cached(state, key)
    assert float(l1) == pytest.approx(float(l0), abs=1e-6)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5)
    # and dropout is really on: a different key changes the loss (the same compiled program)
    l2, _ = cached(state, jax.random.key(8))
    assert abs(float(l2) - float(l1)) > 1e-6


def test_rows_must_divide_into_sub_batches():
    graphdef, state = nnx.split(_model(0.0))
    q, qm, _, _ = _batch()
    with pytest.raises(ValueError, match="not a multiple"):
        gradcache.encode_chunked(lambda s, x, k: x["ids"].astype(jnp.float32), state, {"ids": q}, 3)
