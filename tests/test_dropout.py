"""jaxembed.models.dropout: the 16-bit dropout masks (two per random 32-bit word) against their definition."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxembed.models.dropout import Dropout, apply, keep_mask


def test_keep_mask_is_bernoulli_with_independent_halves():
    m = np.asarray(keep_mask(jax.random.key(0), 0.9, (64, 1001)))  # odd last axis: the last word's high half unused
    assert m.shape == (64, 1001) and m.dtype == bool
    n = m.size
    assert abs(m.mean() - 0.9) < 4 * np.sqrt(0.09 / n)
    lo, hi = m[:, 0:1000:2], m[:, 1:1000:2]  # the two halves of each word
    assert abs((lo & hi).mean() - 0.81) < 4 * np.sqrt(0.81 * 0.19 / lo.size)
    assert abs(np.corrcoef(lo.ravel(), hi.ravel())[0, 1]) < 0.02
    rows = m.mean(axis=1)  # no row is special (the words are drawn per row)
    assert rows.std() < 3 * np.sqrt(0.09 / m.shape[1])


def test_keep_mask_threshold_is_the_rounded_probability():
    """Element j of the last axis is the low / high 16 bits of word j // 2 of jax.random.bits."""
    key = jax.random.key(3)
    m = np.asarray(keep_mask(key, 0.25, (5, 7)))
    words = np.asarray(jax.random.bits(key, (5, 4), jnp.uint32)).astype(np.int64)
    halves = np.stack([words & 0xFFFF, words >> 16], axis=-1).reshape(5, 8)[:, :7]
    np.testing.assert_array_equal(m, halves < round(0.25 * 65536))
    assert not np.array_equal(m, np.asarray(keep_mask(jax.random.key(4), 0.25, (5, 7))))


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
