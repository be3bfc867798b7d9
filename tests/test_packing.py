"""The packer (jaxembed.packing): properties of packs of random texts, and its per-shard contract."""

import numpy as np
import pytest

from jaxembed import packing


def _texts(rng, n, max_len, min_len=0):
    return [list(rng.integers(3, 1000, int(k))) for k in rng.integers(min_len, max_len + 1, n)]


def _check_pack(p, texts, L, prompts, n_cap):
    """Every property of the layout the module docstring promises."""
    R = p["input_ids"].shape[0]
    assert p["input_ids"].shape == p["segment_ids"].shape == p["positions"].shape == p["token_text"].shape == (R, L)
    for k in packing.TEXT_KEYS:
        assert p[k].shape == (n_cap,), k
    n = len(texts)
    # each text: its (truncated) tokens, in order, contiguous at (row, start), positions 0.., one segment id
    for i, t in enumerate(texts):
        k = min(len(t), L)
        assert p["text_len"][i] == k and p["text_valid"][i] and p["text_truncated"][i] == (len(t) > L)
        assert p["text_prompt"][i] == min(prompts[i], k)
        r, s = p["text_row"][i], p["text_start"][i]
        if k == 0:
            assert (r, s, p["text_segment"][i]) == (0, 0, 0)
            continue
        np.testing.assert_array_equal(p["input_ids"][r, s:s + k], t[:k])
        np.testing.assert_array_equal(p["positions"][r, s:s + k], np.arange(k))
        assert (p["segment_ids"][r, s:s + k] == p["text_segment"][i]).all() and p["text_segment"][i] >= 1
        assert (p["token_text"][r, s:s + k] == i).all()
    # every real slot belongs to exactly one text: slots counted once, nothing else is non-padding
    assert np.count_nonzero(p["token_text"] >= 0) == sum(min(len(t), L) for t in texts)
    assert ((p["token_text"] >= 0) == (p["segment_ids"] > 0)).all()
    # rows: texts from column 0 without gaps, segment ids 1, 2, ... by column, padding only at the end
    for r in range(R):
        seg = p["segment_ids"][r]
        used = np.count_nonzero(seg)
        assert (seg[:used] > 0).all() and (seg[used:] == 0).all()
        assert (np.diff(seg[:used]) >= 0).all() and (np.diff(seg[:used]) <= 1).all()
        if used:
            assert seg[0] == 1
        assert (p["positions"][r, used:] == 0).all() and (p["token_text"][r, used:] == -1).all()
    # dummy slots
    assert not p["text_valid"][n:].any() and (p["text_len"][n:] == 0).all() and (p["text_row"][n:] == 0).all()


@pytest.mark.parametrize("seed", range(6))
def test_random_packs_keep_every_token_once_in_order(seed):
    rng = np.random.default_rng(seed)
    L = int(rng.choice([8, 16, 24, 64]))
    n = int(rng.integers(1, 60))
    texts = _texts(rng, n, max_len=L + 4)  # some longer than L (truncated), some empty
    prompts = rng.integers(0, 6, n)
    p = packing.pack(texts, None, L, prompt_lengths=prompts, num_texts=n + 3, pad_id=0)
    _check_pack(p, texts, L, prompts, n + 3)
    # deterministic, and as few rows as best-fit needs
    q = packing.pack(texts, None, L, prompt_lengths=prompts, num_texts=n + 3, pad_id=0)
    assert all(np.array_equal(p[k], q[k]) for k in p)
    assert p["input_ids"].shape[0] == max(packing.rows_needed([len(t) for t in texts], L), 1)
    # the gather info inverts the packing: (row, start, len) gives each text back
    for i, t in enumerate(texts):
        r, s, k = p["text_row"][i], p["text_start"][i], p["text_len"][i]
        assert list(p["input_ids"][r, s:s + k]) == list(t[:k])


def test_best_fit_decreasing_fills_rows_and_is_near_optimal():
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 40, 500)
    row, start, used = packing.assign(lengths, 128)
    fill = np.bincount(row, weights=lengths, minlength=used)
    assert fill.max() <= 128
    assert used <= int(np.ceil(lengths.sum() / 128)) + 1  # within one row of the volume bound
    # decreasing order: the longest text opens row 0 at column 0
    assert row[np.argmax(lengths)] == 0 and start[np.argmax(lengths)] == 0


def test_pack_into_exactly_r_rows_or_report_that_it_does_not_fit():
    texts = [[1] * 5, [2] * 5, [3] * 5, [4] * 2]
    p = packing.pack(texts, 3, 8, num_texts=6)
    assert p["input_ids"].shape == (3, 8)
    _check_pack(p, texts, 8, [0] * 4, 6)
    with pytest.raises(packing.DoesNotFit, match="need 3 rows of 8 tokens.*only 2") as e:
        packing.pack(texts, 2, 8)
    assert (e.value.needed, e.value.rows) == (3, 2)
    with pytest.raises(ValueError, match="num_texts=3 is fewer"):
        packing.pack(texts, 3, 8, num_texts=3)


def test_token_types_are_packed_with_their_tokens():
    texts = [[5, 6, 7], [8, 9]]
    types = [[0, 1, 1], [0, 0]]
    p = packing.pack(texts, 1, 8, token_types=types)
    r0, s0 = p["text_row"][0], p["text_start"][0]
    np.testing.assert_array_equal(p["token_type_ids"][r0, s0:s0 + 3], [0, 1, 1])
    assert p["token_type_ids"].sum() == 2


def test_shards_stack_with_local_indices_and_concat_with_global_ones():
    rng = np.random.default_rng(3)
    a, b = _texts(rng, 7, 10, 1), _texts(rng, 5, 10, 1)
    pa, pb = packing.pack(a, 4, 16, num_texts=8), packing.pack(b, 4, 16, num_texts=8)
    st = packing.stack([pa, pb])
    assert st["input_ids"].shape == (8, 16) and st["text_row"].shape == (16,)
    np.testing.assert_array_equal(st["text_row"][8:], pb["text_row"])  # local to shard 1
    g = packing.concat([pa, pb])
    for i, t in enumerate(b):  # shard 1's texts found through the global indices
        j = 8 + i
        r, s, k = g["text_row"][j], g["text_start"][j], g["text_len"][j]
        assert list(g["input_ids"][r, s:s + k]) == list(t) and (g["token_text"][r, s:s + k] == j).all()
    assert packing.real_fraction(pa) == sum(map(len, a)) / 64


def test_each_text_goes_to_the_fullest_row_with_room():
    # 5 -> row 0 (3 free), 4 -> row 1 (4 free), 3 -> row 0 (the fullest with room), 3 -> row 1; ties by index
    row, start, used = packing.assign([5, 4, 3, 3], 8)
    assert used == 2 and row.tolist() == [0, 1, 0, 1] and start.tolist() == [0, 0, 5, 4]
