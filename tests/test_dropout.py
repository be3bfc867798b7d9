"""jaxembed.models.dropout: the 16-bit dropout masks (four per threefry2x32 evaluation, counters from each token's
text id and position) against their definition, from a reference threefry2x32; a text's masks are the same in a
padded row and in packed rows; the masks' statistics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxembed.models import dropout
from jaxembed.models.dropout import Dropout, Tokens, apply, attention_keep_mask, keep_mask


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


def _parts(y0, y1):
    """The four 16-bit parts of reference threefry outputs, stacked on a new last axis (low y0, high y0, low y1,
    high y1)."""
    y0, y1 = y0.astype(np.int64), y1.astype(np.int64)
    return np.stack([y0 & 0xFFFF, y0 >> 16, y1 & 0xFFFF, y1 >> 16], axis=-1)


def _ref_keep_mask(key, keep_prob, text, pos, F):
    """The docstring's definition: token i (text[i], pos[i]) of any shape, F features -> bool [..., F]."""
    P = -(-F // 4)
    j = np.arange(P, dtype=np.uint32)
    with np.errstate(over="ignore"):
        y0, y1 = _threefry(key, np.broadcast_to(np.asarray(text, np.uint32)[..., None], text.shape + (P,)),
                           np.asarray(pos, np.uint32)[..., None] * np.uint32(P) + j)
    u = np.moveaxis(_parts(y0, y1), -1, -2).reshape(text.shape + (4 * P,))[..., :F]  # f = part * P + f % P
    return u < round(keep_prob * 65536)


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


def test_keep_mask_counters_are_text_position_and_feature():
    """[B, L, F] with token coordinates (a packed layout: texts 10..13 at their positions, padding -1), and by
    default (text = row, position = column), against the reference; F = 10: P = 3, the last part short."""
    key = jax.random.key(11)
    kd = np.asarray(jax.random.key_data(key))
    text = np.array([[10, 10, 10, 11, 11, -1], [12, 12, 13, 13, 13, 13]], np.int32)
    pos = np.array([[0, 1, 2, 0, 1, 0], [0, 1, 0, 1, 2, 3]], np.int32)
    got = np.asarray(keep_mask(key, 0.7, (2, 6, 10), Tokens(jnp.asarray(text), jnp.asarray(pos))))
    np.testing.assert_array_equal(got, _ref_keep_mask(kd, 0.7, text, pos, 10))
    rows, cols = np.meshgrid(np.arange(2), np.arange(6), indexing="ij")
    np.testing.assert_array_equal(np.asarray(keep_mask(key, 0.7, (2, 6, 10))), _ref_keep_mask(kd, 0.7, rows, cols, 10))
    # four dimensions by default: the text is the row-major index over the leading axes but the last
    b, n, l = np.meshgrid(np.arange(2), np.arange(3), np.arange(4), indexing="ij")
    np.testing.assert_array_equal(np.asarray(keep_mask(key, 0.7, (2, 3, 4, 9))),
                                  _ref_keep_mask(kd, 0.7, b * 3 + n, l, 9))
    with pytest.raises(ValueError, match="token coordinates"):
        keep_mask(key, 0.7, (2, 5, 10), Tokens(jnp.asarray(text), jnp.asarray(pos)))


def _ref_attention_mask(key, keep_prob, text, q, k, N):
    """The docstring's definition: text, q [B, T], k [B, S] -> bool [B, N, T, S]."""
    P = -(-N // 4)
    B, T = text.shape
    S = k.shape[1]
    out = np.zeros((B, 4 * P, T, S), bool)
    with np.errstate(over="ignore"):
        for g in range(P):
            kg = _threefry(key, np.zeros(1, np.uint32), np.array([g], np.uint32))
            kg = np.array([kg[0][0], kg[1][0]], np.uint32)
            np.testing.assert_array_equal(kg, np.asarray(jax.random.key_data(
                jax.random.fold_in(jax.random.wrap_key_data(jnp.asarray(key)), g))))  # = fold_in(key, g)
            x0 = np.broadcast_to(text.astype(np.uint32)[:, :, None], (B, T, S))
            x1 = q.astype(np.uint32)[:, :, None] * np.uint32(65536) + k.astype(np.uint32)[:, None, :]
            u = _parts(*_threefry(kg, x0, x1))  # [B, T, S, 4]
            for c in range(4):
                out[:, g + P * c] = u[..., c] < round(keep_prob * 65536)
    return out[:, :N]


def test_attention_keep_mask_counters_are_text_query_key_position_and_head():
    """[B, N, L, L] with token coordinates and by default, against the reference; N = 6: P = 2, heads g + 2c."""
    key = jax.random.key(12)
    kd = np.asarray(jax.random.key_data(key))
    text = np.array([[4, 4, 4, 9, 9, -1], [7, 7, 7, 7, 2, 2]], np.int32)
    pos = np.array([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]], np.int32)
    got = np.asarray(attention_keep_mask(key, 0.6, (2, 6, 6, 6), Tokens(jnp.asarray(text), jnp.asarray(pos))))
    np.testing.assert_array_equal(got, _ref_attention_mask(kd, 0.6, text, pos, pos, 6))
    rows = np.broadcast_to(np.arange(2)[:, None], (2, 5))
    cols = np.broadcast_to(np.arange(5), (2, 5))
    np.testing.assert_array_equal(np.asarray(attention_keep_mask(key, 0.6, (2, 3, 5, 5))),
                                  _ref_attention_mask(kd, 0.6, rows, cols, cols, 3))
    with pytest.raises(ValueError, match="token coordinates"):
        attention_keep_mask(key, 0.6, (2, 6, 5, 5), Tokens(jnp.asarray(text), jnp.asarray(pos)))


def test_a_text_has_the_same_masks_alone_in_a_padded_row_and_packed():
    """Texts 0..3 (lengths 3, 5, 2, 4) in padded rows of 6, and packed two rows of 8 in another order (as another
    device count packs them): every real token's hidden mask and every within-text attention mask agree."""
    key = jax.random.key(5)
    lens = [3, 5, 2, 4]
    pad_text = np.repeat(np.arange(4)[:, None], 6, axis=1)
    pad_pos = np.broadcast_to(np.arange(6), (4, 6))
    place = {1: (0, 0), 0: (0, 5), 3: (1, 0), 2: (1, 4)}  # text -> (row, start)
    pk_text, pk_pos = np.full((2, 8), -1), np.zeros((2, 8), np.int64)
    for i, (r, s0) in place.items():
        pk_text[r, s0:s0 + lens[i]], pk_pos[r, s0:s0 + lens[i]] = i, np.arange(lens[i])
    tp = Tokens(jnp.asarray(pad_text), jnp.asarray(pad_pos))
    tk = Tokens(jnp.asarray(pk_text), jnp.asarray(pk_pos))
    hp, hk = (np.asarray(keep_mask(key, 0.5, (x.text.shape + (12,)), x)) for x in (tp, tk))
    ap, ak = (np.asarray(attention_keep_mask(key, 0.5, (x.text.shape[0], 4) + 2 * x.text.shape[1:], x))
              for x in (tp, tk))
    for i, (r, s0) in place.items():
        n = lens[i]
        np.testing.assert_array_equal(hp[i, :n], hk[r, s0:s0 + n])
        np.testing.assert_array_equal(ap[i, :, :n, :n], ak[r, :, s0:s0 + n, s0:s0 + n])
    assert 0.3 < hp.mean() < 0.7 and 0.3 < ap.mean() < 0.7


def test_masks_with_token_coordinates_are_bernoulli_and_independent():
    """Hidden masks of 64 texts x 32 positions x 384 features, attention masks of 8 texts x 12 heads x 64 x 64:
    the keep rate; the four 16-bit parts of one evaluation (features f, f + P, ... ; heads g, g + P, ...)
    uncorrelated; neighbouring positions, texts, heads uncorrelated; no text special."""
    key = jax.random.key(21)
    text = np.broadcast_to(np.arange(64)[:, None], (64, 32))
    pos = np.broadcast_to(np.arange(32), (64, 32))
    m = np.asarray(keep_mask(key, 0.9, (64, 32, 384), Tokens(jnp.asarray(text), jnp.asarray(pos))))
    assert abs(m.mean() - 0.9) < 4 * np.sqrt(0.09 / m.size)
    quarters = [m[..., g * 96:(g + 1) * 96] for g in range(4)]
    for a in range(4):
        for b in range(a + 1, 4):
            assert abs(np.corrcoef(quarters[a].ravel(), quarters[b].ravel())[0, 1]) < 0.02, (a, b)
    for axis in (0, 1, 2):
        x, y = np.take(m, range(m.shape[axis] - 1), axis), np.take(m, range(1, m.shape[axis]), axis)
        assert abs(np.corrcoef(x.ravel(), y.ravel())[0, 1]) < 0.02, axis
    assert m.mean(axis=(1, 2)).std() < 3 * np.sqrt(0.09 / (32 * 384))
    t8 = np.broadcast_to(np.arange(8)[:, None], (8, 64))
    p8 = np.broadcast_to(np.arange(64), (8, 64))
    a = np.asarray(attention_keep_mask(key, 0.9, (8, 12, 64, 64), Tokens(jnp.asarray(t8), jnp.asarray(p8))))
    assert abs(a.mean() - 0.9) < 4 * np.sqrt(0.09 / a.size)
    for axis in (0, 1, 2, 3):
        x, y = np.take(a, range(a.shape[axis] - 1), axis), np.take(a, range(1, a.shape[axis]), axis)
        assert abs(np.corrcoef(x.ravel(), y.ravel())[0, 1]) < 0.02, axis
    for h in range(3):  # the heads of one evaluation: h, h + 3, h + 6, h + 9
        for c in range(1, 4):
            assert abs(np.corrcoef(a[:, h].ravel(), a[:, h + 3 * c].ravel())[0, 1]) < 0.02, (h, c)
    qk = a[:, :, np.arange(64)[:, None], np.arange(64)[None, :]]  # query and key positions swapped: unrelated
    assert abs(np.corrcoef(qk.ravel(), np.swapaxes(qk, 2, 3).ravel())[0, 1]) < 0.02


def test_apply_in_a_tokens_block_flattens_the_trailing_axes():
    """x [B, L, H, D] inside ``dropout.tokens``: the mask of [B, L, H * D] with the block's coordinates; an
    activation whose leading axes are not the slots is refused."""
    key = jax.random.key(9)
    x = jnp.ones((2, 3, 4, 5))
    text, pos = jnp.asarray([[0, 0, 1], [2, 2, 2]]), jnp.asarray([[0, 1, 0], [0, 1, 2]])
    with dropout.tokens(text, pos):
        y = np.asarray(apply(x, 0.5, key))
        with pytest.raises(ValueError, match="tokens block"):
            apply(jnp.ones((2, 4, 5)), 0.5, key)
    want = np.asarray(keep_mask(key, 0.5, (2, 3, 20), Tokens(text, pos))).reshape(2, 3, 4, 5) * 2.0
    np.testing.assert_array_equal(y, want)
    assert dropout.current_tokens() is None


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
