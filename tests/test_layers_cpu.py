"""The CPU paths of the dense layer and GELU (jaxembed.models.layers): their own backward passes give autodiff's
values and gradients, and a frozen kernel costs no gradient product."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxembed.models import layers


def _dense_ref(x, w, b):
    return jax.lax.dot_general(x, w, (((x.ndim - 1,), (0,)), ((), ()))) + b


@pytest.mark.parametrize("din,dout", [(24, 8), (8, 24), (16, 16)])
@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 2e-6), (jnp.bfloat16, 2e-2)])
def test_dense_on_cpu_has_autodiffs_values_and_gradients(din, dout, dtype, tol):
    assert jax.default_backend() == "cpu"
    d = layers.Dense(din, dout, dtype=dtype, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    d.bias[...] = jax.random.normal(jax.random.key(3), (dout,))
    x = jax.random.normal(jax.random.key(1), (3, 5, din), jnp.float32).astype(dtype)
    g = jax.random.normal(jax.random.key(2), (3, 5, dout), jnp.float32).astype(dtype)
    assert "custom_vjp" in str(jax.make_jaxpr(lambda x: d(x))(x))  # the CPU path is the one taken

    graphdef, params = nnx.split(d)

    def ours(x, w, b):
        p = jax.tree.map(lambda v: v, params)
        p["kernel"], p["bias"] = w, b
        return jnp.sum((nnx.merge(graphdef, p)(x) * g).astype(jnp.float32))

    def ref(x, w, b):
        return jnp.sum((_dense_ref(x, w.astype(dtype), b.astype(dtype)) * g).astype(jnp.float32))

    args = (x, d.kernel[...], d.bias[...])
    got, want = jax.jit(jax.grad(ours, (0, 1, 2)))(*args), jax.jit(jax.grad(ref, (0, 1, 2)))(*args)
    for a, b, name in zip(got, want, ("x", "kernel", "bias")):
        a = getattr(a, "value", a)
        assert a.shape == b.shape and a.dtype == b.dtype, name
        scale = float(jnp.max(jnp.abs(b.astype(jnp.float32))))
        err = float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
        assert err <= tol * max(scale, 1.0), (name, err, scale)
    np.testing.assert_allclose(np.asarray(d(x).astype(jnp.float32)),
                               np.asarray(_dense_ref(x, d.kernel[...].astype(dtype),
                                                     d.bias[...].astype(dtype)).astype(jnp.float32)),
                               atol=tol, rtol=tol)


def _products(hlo: str) -> int:
    """Matrix products in the entry computation of an optimised CPU HLO text: dots and YNNPACK fusions."""
    entry = hlo[hlo.index("\nENTRY"):]
    return sum(1 for line in entry.splitlines() if " dot(" in line or '"kind":"__ynn_fusion"' in line)


def test_a_frozen_kernel_costs_no_gradient_product():
    """Only x is differentiated (a LoRA base layer): the kernel's gradient product is dead code, removed."""
    w = jax.random.normal(jax.random.key(0), (32, 8))
    x = jax.random.normal(jax.random.key(1), (4, 32))
    f = jax.jit(jax.grad(lambda x: jnp.sum(layers._cpu_matmul(x, w, None) ** 2)))
    hlo = f.lower(x).compile().as_text()
    n_dots = _products(hlo)
    assert n_dots <= 2, hlo  # the forward product and dx; no [32, 8] kernel gradient
    both = jax.jit(jax.grad(lambda x, w: jnp.sum(layers._cpu_matmul(x, w, None) ** 2), (0, 1)))
    hlo2 = both.lower(x, w).compile().as_text()
    assert _products(hlo2) == 3  # the check sees the kernel's product when there is one


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-6), (jnp.bfloat16, 1e-2)])
def test_gelu_on_cpu_has_autodiffs_values_and_gradients(dtype, tol):
    x = jnp.concatenate([jnp.linspace(-9.0, 9.0, 401), jax.random.normal(jax.random.key(0), (600,)) * 3])
    x = x.astype(dtype)
    ours = layers.gelu(x)
    want = jax.nn.gelu(x, approximate=False)
    assert ours.dtype == want.dtype
    np.testing.assert_allclose(np.asarray(ours, np.float32), np.asarray(want, np.float32), atol=tol, rtol=tol)
    g = jax.random.normal(jax.random.key(1), x.shape).astype(dtype)
    d_ours = jax.grad(lambda x: jnp.sum((layers.gelu(x) * g).astype(jnp.float32)))(x)
    d_want = jax.grad(lambda x: jnp.sum((jax.nn.gelu(x.astype(jnp.float32), approximate=False)
                                         * g.astype(jnp.float32))))(x)
    np.testing.assert_allclose(np.asarray(d_ours, np.float32), np.asarray(d_want, np.float32),
                               atol=tol * 4, rtol=tol * 4)
    assert "custom_vjp" in str(jax.make_jaxpr(layers.gelu)(x))


def test_gelu_matches_torch():
    import torch  # the [test] extra installs it
    x = np.linspace(-8, 8, 1001, dtype=np.float32)
    t = torch.tensor(x, requires_grad=True)
    y = torch.nn.GELU()(t)
    y.sum().backward()
    np.testing.assert_allclose(np.asarray(layers.gelu(jnp.asarray(x))), y.detach().numpy(), atol=1e-6, rtol=1e-6)
    d = jax.grad(lambda x: jnp.sum(layers.gelu(x)))(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(d), t.grad.numpy(), atol=1e-6, rtol=1e-6)
