"""Parameter gradients of a bfloat16-compute model are accumulated in float32, as PyTorch's are: autodiff's
transpose of a broadcast parameter (a linear layer's bias, an RMS norm's scale) is a reduction in the compute
dtype, and a bfloat16 sum over thousands of tokens stalls once the partial sum outgrows the addends (the bias
gradient of 3,456 tokens of cotangent 1 came out as 1,024 on the CPU before ``layers.Dense``)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxembed import models
from jaxembed.models import layers

BF16 = layers.RuntimeOptions(dtype="bfloat16", param_dtype="float32")
TOKENS = (27, 128)  # 3,456 tokens: a packed MiniLM B=64 step's rows


def _grads(module, x):
    return nnx.grad(lambda m: jnp.sum(m(x).astype(jnp.float32)))(module)


def test_dense_bias_and_rms_scale_gradients_sum_in_float32():
    x = jnp.ones(TOKENS + (8,), jnp.float32)
    dense = layers.dense(8, 4, (None, None), bias=True, opts=BF16, rngs=nnx.Rngs(0))
    g = _grads(dense, x)
    np.testing.assert_array_equal(np.asarray(g.bias[...]), np.full(4, 3456.0))
    np.testing.assert_array_equal(np.asarray(g.kernel[...]), np.full((8, 4), 3456.0))
    # the forward pass is nnx.Linear's, value for value
    plain = nnx.Linear(8, 4, dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    plain.kernel[...], plain.bias[...] = dense.kernel[...], dense.bias[...] + 0.5
    dense.bias[...] = plain.bias[...]
    xr = jax.random.normal(jax.random.key(1), (3, 5, 8))
    np.testing.assert_array_equal(np.asarray(dense(xr).astype(jnp.float32)), np.asarray(plain(xr).astype(jnp.float32)))

    rms = layers.RMSNorm(8, 1e-6, opts=BF16, rngs=nnx.Rngs(0))
    np.testing.assert_allclose(np.asarray(_grads(rms, x).scale[...]), np.full(8, 3456.0), rtol=1e-3)
    # and the input's gradient is autodiff's: scale (bf16) times the normalisation's derivative
    rms.scale[...] = jnp.linspace(0.5, 2.0, 8)
    xr32 = jax.random.normal(jax.random.key(2), (4, 8))
    ref = jax.grad(lambda v: jnp.sum((jnp.sin(jnp.arange(8.0)) * (v / jnp.sqrt(jnp.mean(v * v, -1, keepdims=True)
                                                                         + 1e-6) * rms.scale[...]))))(xr32)
    got = jax.grad(lambda v: jnp.sum(jnp.sin(jnp.arange(8.0)) * rms(v).astype(jnp.float32)))(xr32)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=2e-2, atol=2e-2)


def test_bf16_model_parameter_gradients_match_float32():
    """A tiny BERT and a tiny Qwen2 (biases, LayerNorm, RMSNorm) on 2 x 512 tokens: each parameter's bfloat16
    gradient is within 1.5 % of the float32 model's (the kernels' are within ~0.6 %; with the biases and RMS
    scales summed in bfloat16, BERT's value bias was off by 2.0 % and Qwen2's k_proj bias by 2.3 %)."""
    for hf in (dict(model_type="bert", vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=64),
               dict(model_type="qwen2", vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                    num_key_value_heads=1, intermediate_size=64)):
        cfg32 = models.config_from_hf(hf, dtype="float32")
        m32 = models.init_model(cfg32, seed=0)
        m16 = models.model_from_params(dataclasses.replace(cfg32, dtype="bfloat16"), models.flat_params(m32))
        ids = jnp.asarray(np.random.default_rng(0).integers(3, 64, (2, 512)), jnp.int32)
        seg = jnp.ones((2, 512), jnp.int32)
        pos = jnp.broadcast_to(jnp.arange(512, dtype=jnp.int32), (2, 512))

        w = jax.random.normal(jax.random.key(3), (32,))

        def loss(m):
            return jnp.sum(m(ids, segment_ids=seg, positions=pos).astype(jnp.float32) * w)

        g32, g16 = (models.flat_params(nnx.jit(nnx.grad(loss))(m)) for m in (m32, m16))
        for path, a in g32.items():
            if path[-2:] == ("key", "bias"):
                continue  # BERT's key bias: its exact gradient is 0 (softmax ignores a per-query constant)
            err = np.linalg.norm(g16[path] - a) / max(np.linalg.norm(a), 1e-6)
            assert err < 1.5e-2, (hf["model_type"], path, err)
