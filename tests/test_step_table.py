"""The loader's table of step shapes in windows of steps (jaxembed.data.step_table): the first batch tokenises one
window, not the plan; a loader that starts later (a resumed run, another host) computes the same shapes; the row
counts of a many-window plan stay on a bounded menu; windows are cached for a restart; a saved plan is
memory-mapped and travels to worker processes by its file name."""

import pickle

import numpy as np
import pytest

from data_fakes import mixed_store
from jaxembed.data import pipeline as P
from jaxembed.data import step_table as T
from jaxembed.data.plan import Plan, build_plan
from jaxembed.data.plan.file import read_steps
from jaxembed.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok(minilm_dir):
    return Tokenizer.from_folder(minilm_dir)


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_first_batch_tokenises_one_window_and_a_late_start_agrees(tok, monkeypatch):
    store = mixed_store()
    plan = build_plan(store, {"global_batch_size": 8, "seed": 1})
    packing = P.Packing(shards=2, min_row_length=16)
    calls = []
    real = T.step_pack_table

    def counted(*a, **k):
        calls.append((k["start_step"], k["end_step"]))
        return real(*a, **k)

    monkeypatch.setattr(T, "step_pack_table", counted)
    W, S = 4, plan.steps
    assert S > 2 * W
    table = T.StepTable(store, plan, tok, packing=packing, num_candidates=4, window=W)
    loader = P.make_loader(store, plan, tok, packing=packing, num_candidates=4, step_table=table)
    loader.batch(0)
    assert calls == [(0, W)]  # the first batch: its window's steps only
    walked = [loader.batch(s) for s in range(S)]  # every step's texts fit its window's shapes
    assert calls == [(s, min(s + W, S)) for s in range(0, S, W)]
    del calls[:]
    late_table = T.StepTable(store, plan, tok, packing=packing, num_candidates=4, window=W)
    late = P.make_loader(store, plan, tok, packing=packing, num_candidates=4, step_table=late_table, start_step=9)
    _assert_same(late.batch(9), walked[9])  # a resumed run continues with the identical batch
    assert calls == [(8, 12)]
    other = T.StepTable(store, plan, tok, packing=packing, num_candidates=4, window=W)
    host1 = P.make_loader(store, plan, tok, packing=packing, num_candidates=4, step_table=other, process_index=1,
                          process_count=2)
    assert [host1.batcher.shape(s) for s in range(S)] == [loader.batcher.shape(s) for s in range(S)]
    # several windows: row counts on the menu, so the run's shapes stay a bounded set
    for s in range(S):
        *rows, _ = table.shape(s)
        assert all(int(T.ladder_rows(r)) == r for r in rows)


def test_ladder_rows_is_a_bounded_menu():
    r = np.arange(1, 1 << 17)
    up = T.ladder_rows(r)
    assert (up >= r).all() and (up * 16 <= r * 17 + 16).all()  # at most 1/16 more rows
    assert np.array_equal(up[:T.LADDER], r[:T.LADDER])
    assert np.array_equal(T.ladder_rows(up), up)
    assert len(np.unique(up[(up >= 1024) & (up < 2048)])) == 16  # 16 counts per doubling


def test_windows_are_cached_for_a_restart(tok, tmp_path, monkeypatch):
    store = mixed_store()
    plan = build_plan(store, {"global_batch_size": 8, "seed": 1})
    cache = tmp_path / "plan_lengths.npz"
    first = T.StepTable(store, plan, tok, window=4, cache=cache, round_lengths="pow2")
    shapes = [first.shape(s) for s in range(4, 8)]
    copy = pickle.loads(pickle.dumps(first))  # a worker's copy reads the file and never writes it
    assert copy.write is False and copy.cached(1) and not copy.cached(0)
    monkeypatch.setattr(T.step_rows, "step_lengths", lambda *a, **k: pytest.fail("a cached window was recomputed"))
    again = T.StepTable(store, plan, tok, window=4, cache=cache, round_lengths="pow2")
    assert [again.shape(s) for s in range(4, 8)] == shapes
    assert all(q & (q - 1) == 0 and d & (d - 1) == 0 for q, d in shapes)  # powers of two
    other = T.StepTable(store, plan, tok, window=2, cache=cache)  # another window size: another key
    assert not other.cached(2)


def test_a_saved_plan_is_memory_mapped_and_travels_by_name(tmp_path):
    rng = np.random.default_rng(0)
    S, G = 3000, 8
    plan = Plan(rng.integers(0, 2, (S, G)).astype(np.int32), rng.integers(0, 5, (S, G)).astype(np.int64),
                np.zeros(S, np.int32), np.ones((S, G), np.float32), np.full(S, np.nan, np.float32), ("t",),
                ("a", "b", "c"), np.zeros(3, np.int32), np.array([5, 5, 5], np.int64), {}, 0, {})
    plan.save(tmp_path / "plan.npz")
    got = Plan.load(tmp_path / "plan.npz")
    assert isinstance(got.dataset_ids, np.memmap) and isinstance(got.example_ids, np.memmap)
    assert got.fingerprint() == plan.fingerprint() and got.used_dataset_ids() == [0, 1]
    blob = pickle.dumps(got)
    assert len(blob) < plan.example_ids.nbytes // 4  # the file's name, not the per-example arrays
    for a, b in ((got.example_ids, plan.example_ids), (got.weights, plan.weights), (got.task_ids, plan.task_ids)):
        np.testing.assert_array_equal(read_steps(a, 5, 9), b[5:9])  # positioned reads of the file's steps
    back = pickle.loads(blob)
    np.testing.assert_array_equal(back.example_ids, plan.example_ids)
    np.testing.assert_array_equal(back.weights, plan.weights)
