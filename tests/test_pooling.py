import jax.numpy as jnp
import numpy as np
import pytest

from jaxembed import pooling
from jaxembed.evaluate import rank_stats


def test_mean_pool_hand_computed():
    h = jnp.array([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    m = jnp.array([[1, 1, 0]])
    np.testing.assert_allclose(pooling.pool("mean", h, m), [[2.0, 3.0]])
    np.testing.assert_allclose(pooling.pool("max", h, m), [[3.0, 4.0]])
    np.testing.assert_allclose(pooling.pool("mean_sqrt_len", h, m), [[4 / np.sqrt(2), 6 / np.sqrt(2)]], rtol=1e-6)
    np.testing.assert_allclose(pooling.pool("cls", h, m), [[1.0, 2.0]])


def test_mean_pool_excludes_prompt_tokens():
    h = jnp.arange(12, dtype=jnp.float32).reshape(1, 4, 3)  # tokens: [0,1,2],[3,4,5],[6,7,8],[9,10,11]
    m = jnp.array([[1, 1, 1, 0]])
    out = pooling.pool("mean", h, m, prompt_lengths=jnp.array([1]))
    np.testing.assert_allclose(out, [[4.5, 5.5, 6.5]])  # mean of tokens 1 and 2


def test_left_padding_cls_and_prompt_exclusion():
    h = jnp.arange(5, dtype=jnp.float32).reshape(1, 5, 1)  # token states 0..4
    left = jnp.array([[0, 0, 1, 1, 1]])
    np.testing.assert_allclose(pooling.pool("cls", h, left), [[2.0]])  # first real token
    # prompt of 1 token starts at position 2: pool over positions 3 and 4
    np.testing.assert_allclose(pooling.pool("mean", h, left, prompt_lengths=jnp.array([1])), [[3.5]])


def test_last_token_right_and_left_padding():
    h = jnp.arange(2 * 4 * 1, dtype=jnp.float32).reshape(2, 4, 1)
    right = jnp.array([[1, 1, 0, 0], [1, 1, 1, 1]])
    left = jnp.array([[0, 0, 1, 1], [1, 1, 1, 1]])
    np.testing.assert_array_equal(pooling.last_token_index(right), [1, 3])
    np.testing.assert_array_equal(pooling.last_token_index(left), [3, 3])
    np.testing.assert_allclose(pooling.pool("lasttoken", h, right)[:, 0], [1.0, 7.0])


def test_matryoshka_truncates_and_renormalises():
    x = jnp.array([[3.0, 4.0, 12.0]])
    np.testing.assert_allclose(pooling.matryoshka(x, 2), [[0.6, 0.8]], rtol=1e-6)
    np.testing.assert_allclose(jnp.linalg.norm(pooling.matryoshka(x, None)), 1.0, rtol=1e-6)
    np.testing.assert_allclose(pooling.matryoshka(x, 2, normalize=False), [[3.0, 4.0]])
    with pytest.raises(ValueError):
        pooling.matryoshka(x, 0)


def test_unknown_mode_is_a_clear_error():
    with pytest.raises(ValueError, match="allowed"):
        pooling.pool("weird", jnp.zeros((1, 2, 3)), jnp.ones((1, 2)))


def test_spearman_matches_scipy_with_ties():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    a = rng.integers(0, 5, 200).astype(float)
    b = a + rng.normal(size=200)
    assert rank_stats.spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic, abs=1e-12)
    np.testing.assert_allclose(rank_stats.rankdata(a), stats.rankdata(a))
