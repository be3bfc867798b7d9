"""jaxembed/train/gradcache.py against numpy references with toy encoders (no model compile): which rows form each
sub-batch, which dropout key each one gets, the rows' order on the way back, the gradients, the packed-row variant.
The mutants they kill (docs/testing.md) are named in each test."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxembed.train import gradcache

M, D = 12, 3


def _x():
    return np.arange(M * D, dtype=np.float32).reshape(M, D) / 10.0


def _enc(p, x, k):
    """Row r of a sub-batch: p * x_r + the sub-batch's mean (so the output says which rows were together) + a
    draw of the sub-batch's key."""
    a = x["a"]
    out = p * a + jnp.mean(a, axis=0, keepdims=True)
    if k is not None:
        out = out + jax.random.uniform(k, a.shape)
    return out


def _reference(p, x, chunk, key):
    n = M // chunk
    out = np.zeros_like(x)
    for k in range(n):  # sub-batch k = rows k, k + n, k + 2n, ... with key fold_in(key, k)
        rows = x[k::n]
        y = p * rows + rows.mean(0, keepdims=True)
        if key is not None:
            y = y + np.asarray(jax.random.uniform(jax.random.fold_in(key, k), rows.shape))
        out[k::n] = y
    return out


@pytest.mark.parametrize("chunk", [2, 3, 4])
@pytest.mark.parametrize("with_key", [False, True])
def test_encode_chunked_rows_keys_and_order(chunk, with_key):
    """The strided sub-batches, fold_in(key, k) for sub-batch k, the input row order back; kills the mutants of
    the reshape / swapaxes shape arithmetic (`m // chunk_size` -> `m / chunk_size` ...), of `fold_in(key, k)` and of
    the `key is None` tests."""
    x, key = _x(), (jax.random.key(3) if with_key else None)
    got = gradcache.encode_chunked(_enc, jnp.float32(2.0), {"a": jnp.asarray(x)}, chunk, key)
    np.testing.assert_allclose(np.asarray(got), _reference(2.0, x, chunk, key), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("chunk", [None, M, 2 * M])
def test_encode_chunked_single_call(chunk):
    """chunk None or >= M: one call over all rows with fold_in(key, 0) (`chunk_size >= m` -> `> m`, the
    `fold_in(key, 0)` number, `key is None` -> `is not None`)."""
    x, key = _x(), jax.random.key(5)
    got = gradcache.encode_chunked(_enc, jnp.float32(2.0), {"a": jnp.asarray(x)}, chunk, key)
    np.testing.assert_allclose(np.asarray(got), _reference(2.0, x, M, key), rtol=1e-6, atol=1e-6)
    none = gradcache.encode_chunked(_enc, jnp.float32(2.0), {"a": jnp.asarray(x)}, chunk, None)
    np.testing.assert_allclose(np.asarray(none), _reference(2.0, x, M, None), rtol=1e-6, atol=1e-6)


def test_encode_chunked_gradient_and_error():
    """d/dp sum(out^2) through scan + checkpoint equals the numpy one; a row count that is not a multiple of the
    sub-batch size is an error (`m % chunk_size` -> `m // chunk_size`, the `raise`)."""
    x = _x()

    def f(p):
        return jnp.sum(gradcache.encode_chunked(_enc, p, {"a": jnp.asarray(x)}, 4, None) ** 2)

    ref_out = _reference(2.0, x, 4, None)
    np.testing.assert_allclose(float(jax.grad(f)(jnp.float32(2.0))), float(np.sum(2 * ref_out * x)), rtol=1e-5)
    with pytest.raises(ValueError, match="12 rows are not a multiple of the sub-batch size 5"):
        gradcache.encode_chunked(_enc, jnp.float32(2.0), {"a": jnp.asarray(x)}, 5, None)
    with pytest.raises(ValueError, match="not a multiple"):
        gradcache.encode_chunked(_enc, jnp.float32(2.0), {"a": jnp.asarray(x)}, 8, None)


def _pool(p, rows, sub_row, k):
    """Each text's vector: p * its row (at sub_row within the sub-batch) + its sub-batch's key draw."""
    v = p * rows["a"][sub_row]
    if k is not None:
        v = v + jax.random.uniform(k, (sub_row.shape[0], 1))
    return v


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("with_key", [False, True])
def test_pool_packed_chunked_takes_each_text_from_its_rows_sub_batch(n, with_key):
    """Text t lies in row text_row[t], which is in sub-batch text_row[t] % n at position text_row[t] // n; its
    vector comes from that sub-batch with key fold_in(key, k). Kills the mutants of `text_row // n`,
    `text_row % n`, `which == k`, the reshape, the key and the zero start of the accumulator."""
    x = _x()
    text_row = np.array([0, 0, 5, 7, 11, 3, 2, 2, 9], np.int32)
    key = jax.random.key(11) if with_key else None
    got = gradcache.pool_packed_chunked(_pool, jnp.float32(3.0), {"a": jnp.asarray(x)}, jnp.asarray(text_row), n,
                                        key)
    want = 3.0 * x[text_row]
    if key is not None:
        for t, r in enumerate(text_row):
            want[t] += float(jax.random.uniform(jax.random.fold_in(key, int(r) % n), (len(text_row), 1))[t, 0])
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)


def test_pool_packed_chunked_gradient_and_error():
    x = _x()
    text_row = jnp.asarray([1, 4, 4, 10], jnp.int32)

    def f(p):
        return jnp.sum(gradcache.pool_packed_chunked(_pool, p, {"a": jnp.asarray(x)}, text_row, 2) ** 2)

    rows = x[np.asarray(text_row)]
    np.testing.assert_allclose(float(jax.grad(f)(jnp.float32(3.0))), float(np.sum(2 * 3.0 * rows * rows)), rtol=1e-5)
    with pytest.raises(ValueError, match="12 packed rows are not a multiple of 5 sub-batches"):
        gradcache.pool_packed_chunked(_pool, jnp.float32(3.0), {"a": jnp.asarray(x)}, text_row, 5)
