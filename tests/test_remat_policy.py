"""Remat policies (``model.remat_policy``, jaxembed.models.layers.REMAT_POLICIES): each rematerialised layer is
traced with its policy, the gradients are the plain model's, and a bad name is a one-line config error."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxembed import config as cfglib
from jaxembed.errors import UserError


def _loss(remat):
    from flax import nnx

    from jaxembed import loading
    from jaxembed.models.tiny import tiny_model_dir

    model = loading.load(tiny_model_dir("qwen2"), remat=remat).model
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    ids = (np.arange(24, dtype=np.int32).reshape(2, 12) * 37) % 500 + 100
    mask = np.ones_like(ids)

    def loss(p):
        return jnp.sum(nnx.merge(graphdef, p, rest)(ids, mask) ** 2 * jnp.arange(1, 33))

    return loss, params


def test_each_policy_is_traced_and_the_gradients_are_the_plain_models():
    from jaxembed.models.layers import REMAT_POLICIES, remat_option

    assert remat_option(False, "dots") is False and remat_option(True, "nothing") is True
    assert remat_option(True, "dots_no_batch") == "dots_no_batch"
    for name, policy in REMAT_POLICIES.items():
        loss, params = _loss(remat_option(True, name))
        jaxpr = str(jax.make_jaxpr(loss)(params))
        assert jaxpr.count(f"policy={policy!r}\n") == 2, name  # the tiny model's two layers, rematerialised
    loss, params = _loss(False)
    plain = jax.jit(jax.grad(loss))(params)
    loss, params = _loss("dots_no_batch")
    got = jax.jit(jax.grad(loss))(params)
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(got)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5)  # float32 rounding


def test_a_bad_policy_is_a_one_line_error(shared_data):
    from jaxembed.data.config import dataset_config
    from jaxembed.models.tiny import tiny_model_dir

    c = cfglib.default_config()
    c.model.name = str(tiny_model_dir("qwen2"))
    c.model.remat = True
    c.model.remat_policy = "everything"
    c.data.datasets = [dataset_config(name="wikiqa", path=str(shared_data / "train/wikiqa.jsonl"),
                                      task_type="retrieval", num_negatives=1)]
    with pytest.raises(UserError, match=r"config\.model\.remat_policy = 'everything' is not valid: allowed: "
                                        r"nothing, dots, dots_no_batch") as e:
        cfglib.validate(c)
    assert "\n" not in str(e.value)
