"""jaxembed.models.dropout: the 16-bit dropout masks (four per threefry2x32 evaluation) against their definition."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxembed.models.dropout import Dropout, apply, keep_mask


def test_keep_mask_is_bernoulli_with_independent_quarters():
    m = np.asarray(keep_mask(jax.random.key(0), 0.9, (64, 1001)))  # 1001 = 4 x 251 - 3: the last group is short
    assert m.shape == (64, 1001) and m.dtype == bool
    n = m.size
    assert abs(m.mean() - 0.9) < 4 * np.sqrt(0.09 / n)
    p = 251
    groups = [m[:, g * p:(g + 1) * p][:, :248] for g in range(4)]  # the four 16-bit parts of the same evaluations
    for a in range(4):
        for b in range(a + 1, 4):
            x, y = groups[a], groups[b]
            assert abs((x & y).mean() - 0.81) < 4 * np.sqrt(0.81 * 0.19 / x.size), (a, b)
            assert abs(np.corrcoef(x.ravel(), y.ravel())[0, 1]) < 0.02, (a, b)
    assert abs(np.corrcoef(m[:, :-1].ravel(), m[:, 1:].ravel())[0, 1]) < 0.02  # neighbours
    rows = m.mean(axis=1)  # no row is special (the counters run over the rows)
    assert rows.std() < 3 * np.sqrt(0.09 / m.shape[1])
    other = np.asarray(keep_mask(jax.random.key(1), 0.9, (64, 1001)))  # another key: another mask
    assert abs(np.corrcoef(m.ravel(), other.ravel())[0, 1]) < 0.02


def _threefry(key, x0, x1):
    """Reference threefry2x32 (20 rounds; Salmon et al. 2011), numpy uint32 arithmetic."""
    rot = [[13, 15, 26, 6], [17, 29, 16, 24]]
    k0, k1 = np.uint32(key[0]), np.uint32(key[1])
    ks = [k0, k1, np.uint32(k0 ^ k1 ^ np.uint32(0x1BD11BDA))]
    x = [x0.astype(np.uint32) + ks[0], x1.astype(np.uint32) + ks[1]]
    for i in range(5):
        for r in rot[i % 2]:
            x[0] = x[0] + x[1]
            x[1] = (x[1] << np.uint32(r)) | (x[1] >> np.uint32(32 - r))
            x[1] = x[1] ^ x[0]
        x[0] = x[0] + ks[(i + 1) % 3]
        x[1] = x[1] + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x


def test_keep_mask_threshold_is_the_rounded_probability():
    """The docstring's definition, from a reference threefry2x32; a raw uint32 key gives the typed key's mask."""
    key = jax.random.key(3)
    m = np.asarray(keep_mask(key, 0.25, (5, 7)))  # P = 2: elements 0-1, 2-3, 4-5, 6 from y0 lo, y0 hi, y1 lo, y1 hi
    with np.errstate(over="ignore"):
        y0, y1 = _threefry(np.asarray(jax.random.key_data(key)), np.zeros(10, np.uint32),
                           np.arange(10, dtype=np.uint32))
    y0, y1 = y0.reshape(5, 2).astype(np.int64), y1.reshape(5, 2).astype(np.int64)
    u = np.concatenate([y0 & 0xFFFF, y0 >> 16, y1 & 0xFFFF, y1 >> 16], axis=1)[:, :7]
    np.testing.assert_array_equal(m, u < round(0.25 * 65536))
    np.testing.assert_array_equal(m, np.asarray(keep_mask(jax.random.key_data(key), 0.25, (5, 7))))
    assert not np.array_equal(m, np.asarray(keep_mask(jax.random.key(4), 0.25, (5, 7))))


def test_keep_mask_of_another_prng_draws_bits_halves():
    key = jax.random.key(3, impl="rbg")
    m = np.asarray(keep_mask(key, 0.25, (5, 7)))
    words = np.asarray(jax.random.bits(key, (5, 4), jnp.uint32)).astype(np.int64)
    halves = np.stack([words & 0xFFFF, words >> 16], axis=-1).reshape(5, 8)[:, :7]
    np.testing.assert_array_equal(m, halves < round(0.25 * 65536))


def test_apply_and_module_scale_kept_values_and_share_the_mask():
    x = jnp.arange(1.0, 41.0).reshape(4, 10)
    key = jax.random.key(7)
    y = np.asarray(apply(x, 0.2, key))
    keep = np.asarray(keep_mask(key, 0.8, x.shape))
    np.testing.assert_allclose(y, np.where(keep, np.asarray(x) / 0.8, 0.0), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(Dropout(0.2)(x, deterministic=False, rngs=key)), y)
    np.testing.assert_array_equal(np.asarray(Dropout(0.2)(x, deterministic=True, rngs=key)), np.asarray(x))
    assert np.asarray(apply(x, 1.0, key)).sum() == 0 and apply(x, 0.0, key) is x
    with pytest.raises(ValueError):
        Dropout(0.2)(x, deterministic=False)
    y2 = Dropout(0.2)(x, deterministic=False, rngs=nnx.Rngs(dropout=7))
    assert y2.shape == x.shape
