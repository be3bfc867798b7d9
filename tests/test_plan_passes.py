"""A unit's pass, its fill, its de-duplication and step mode's passes in bounded memory (``plan.passes``): with tiny
chunks, buckets and blocks forced, the plan written through a scratch folder is byte for byte the plan built in
memory, for one dataset with a fractional epoch, the random strategy over several datasets, the fill of the last
batch and step mode; the building blocks agree with their all-at-once forms; and the allocation peak of one
large unit does not grow with it."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from data_fakes import make_store
from jaxembed.data.plan import blocks, build_plan, build_plan_file, file as plan_file, passes
from jaxembed.data.plan.sampling import dedupe_batches


def _tiny(monkeypatch, chunk=7, bucket=16, block=24):
    monkeypatch.setattr(passes, "CHUNK", chunk)
    monkeypatch.setattr(passes, "BUCKET", bucket)
    monkeypatch.setattr(passes, "MAX_BUCKETS", 9)
    monkeypatch.setattr(blocks, "BLOCK_EXAMPLES", block)
    monkeypatch.setattr(plan_file, "_BLOCK_STEPS", 2)
    calls = []
    real = passes._bucket_sorted
    monkeypatch.setattr(passes, "_bucket_sorted", lambda *a: calls.append(1) or real(*a))
    return calls


def test_a_generator_drawn_in_chunks_gives_the_stream_of_one_call():
    whole = np.random.default_rng([3, 11]).random(1000)
    rng = np.random.default_rng([3, 11])
    parts = np.concatenate([rng.random(n) for n in (1, 7, 300, 0, 692)])
    np.testing.assert_array_equal(parts, whole)


@pytest.mark.parametrize("members,epochs", [([0], [2.5]), ([0, 1, 2], [1.0, 2.0, 0.4])])
def test_bucket_sorted_pass_equals_the_sort_in_memory(members, epochs, tmp_path, monkeypatch):
    calls = _tiny(monkeypatch)
    sizes, ep = np.array([50, 33, 20]), np.array(epochs + [0.0] * (3 - len(epochs)))
    ref = list(passes.sorted_pass(np.random.default_rng(5), members, sizes, ep, None))
    got = list(passes.sorted_pass(np.random.default_rng(5), members, sizes, ep, tmp_path))
    assert len(ref) == 1 and len(got) > 3 and calls == [1]
    for k in (0, 1):
        np.testing.assert_array_equal(np.concatenate([g[k] for g in got]), ref[0][k])
    assert ref[0][0].size == passes.pass_size(members, sizes, ep) and list(tmp_path.iterdir()) == []


def test_dedupe_in_blocks_equals_all_at_once():
    rng = np.random.default_rng(2)
    ds, ex = np.zeros((40, 6), np.int32), rng.integers(0, 30, (40, 6))
    ref_d, ref_e = ds.copy(), ex.copy()
    left = dedupe_batches(ref_d, ref_e, window=4)
    out_d, out_e, at = [], [], [0]

    def pull(m):
        at[0] += m
        return ds[at[0] - m:at[0]].copy(), ex[at[0] - m:at[0]].copy()

    got = passes.dedupe_stream(pull, 40, lambda d, e: (out_d.append(d), out_e.append(e)), 3, dedupe_batches, 4)
    assert got == left and left < 40
    np.testing.assert_array_equal(np.concatenate(out_d), ref_d)
    np.testing.assert_array_equal(np.concatenate(out_e), ref_e)


CASES = {
    "one_dataset_fractional_fill": ([("a", "t", 90, dict(batching="homogeneous"))],
                                    dict(global_batch_size=8, epochs=2.5, drop_remainder=False)),
    "one_dataset_dropped": ([("a", "t", 93, dict(batching="homogeneous", epochs=1.5))], dict(global_batch_size=8)),
    "random_several": ([("a", "t", 40, {}), ("b", "u", 35, dict(epochs=2)), ("c", "v", 27, dict(epochs=0.5))],
                       dict(global_batch_size=8, strategy="random", drop_remainder=False)),
    "steps": ([("a", "t", 30, dict(batching="homogeneous")), ("b", "u", 44, dict(batching="random")),
               ("c", "u", 19, dict(batching="random", epochs=1.5))], dict(global_batch_size=8, steps=40)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_plan_built_through_buckets_equals_the_plan_in_memory(name, tmp_path, monkeypatch):
    spec, cfg = CASES[name]
    mem = build_plan(make_store(spec), cfg)
    calls = _tiny(monkeypatch)
    got = build_plan_file(tmp_path / "plan.npz", make_store(spec), cfg)
    assert calls  # the passes went through bucket files
    for k in ("dataset_ids", "example_ids", "weights", "task_ids", "temperatures", "unit_ids", "dropped"):
        np.testing.assert_array_equal(np.asarray(getattr(got, k)), getattr(mem, k), err_msg=k)
    assert got.meta == mem.meta and got.fingerprint() == mem.fingerprint()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "plan.npz"]



def _peak(build) -> int:
    tracemalloc.start()
    try:
        build()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_peak_of_one_large_unit_does_not_grow_with_it(tmp_path, monkeypatch):
    """One dataset at 1.5 epochs, one unit (the random strategy), batches of 64, built through buckets of 8,192
    examples: 4 times the examples (30,000 -> 120,000 planned) add under a quarter to the allocation peak. Sorted
    in memory, the pass alone is ~27 bytes an example (key, its sort, dataset and example ids): +4.9 MB."""
    for mod, name, v in ((passes, "CHUNK", 4096), (passes, "BUCKET", 8192), (passes, "SUBSET_LEAF", 4096),
                         (blocks, "BLOCK_EXAMPLES", 4096), (plan_file, "_BLOCK_STEPS", 64)):
        monkeypatch.setattr(mod, name, v)
    cfg = dict(global_batch_size=64, strategy="random")
    build_plan_file(tmp_path / "warm.npz", make_store([("x", "t", 100, {})]), cfg)  # imports outside the measure
    peaks = [_peak(lambda: build_plan_file(tmp_path / f"p{n}.npz", make_store([("a", "t", n, dict(epochs=1.5))]),
                                           cfg)) for n in (20_000, 80_000)]
    assert peaks[1] < 1.25 * peaks[0], peaks


def test_summary_reads_the_mapped_plan_a_block_at_a_time(tmp_path, monkeypatch):
    """``summarize`` (``jaxembed plan show``) of a plan read from its file: the same summary in blocks of 3 steps
    as in one block, and an allocation peak under half the plan's bytes (80,000 examples, 1.28 MB of per-example
    arrays; the counts per example of each dataset are 2 bytes)."""
    from jaxembed.data.plan import Plan
    from jaxembed.data.plan.summary import summarize

    store = make_store([("a", "t", 50_000, dict(batching="homogeneous")), ("b", "u", 30_000, dict(epochs=1.5))])
    build_plan_file(tmp_path / "plan.npz", store, dict(global_batch_size=64, mask={"delta": 0.0}),
                    scores={"a": np.linspace(-1, 1, 50_000), "b": np.linspace(1, -1, 30_000)})
    plan = Plan.load(tmp_path / "plan.npz")
    monkeypatch.setattr(plan_file, "_BLOCK_STEPS", 64)
    summarize(plan)  # imports outside the measure
    peak = _peak(lambda: summarize(plan))
    whole = summarize(plan)
    monkeypatch.setattr(plan_file, "_BLOCK_STEPS", 3)
    assert summarize(plan) == whole and whole["masked_rows"] > 0
    assert peak < plan.steps * 64 * 16 / 2, peak


def test_a_fractional_epoch_is_an_exact_size_uniform_subset(monkeypatch):
    """``subset``: exactly k distinct indices of the range, ascending, in pieces of at most SUBSET_LEAF; each index
    equally likely (2,000 draws of 3 of 9 over 2 leaves: every count within 5 standard deviations of 2,000 / 3);
    a range numpy's hypergeometric cannot halve is refused in one line before anything is drawn."""
    import math

    from jaxembed.errors import UserError

    rng = np.random.default_rng(0)
    got = list(passes.subset(rng, 300_000, 123_457, lo=10))
    sub = np.concatenate(got)
    assert sub.size == 123_457 and np.all(np.diff(sub) > 0) and sub[0] >= 10 and sub[-1] < 300_010
    assert max(g.size for g in got) <= passes.SUBSET_LEAF
    counts = np.zeros(9)
    monkeypatch.setattr(passes, "SUBSET_LEAF", 5)
    for _ in range(2000):
        counts[np.concatenate(list(passes.subset(rng, 9, 3)))] += 1
    p = 3 / 9
    assert np.all(np.abs(counts - 2000 * p) < 5 * math.sqrt(2000 * p * (1 - p))), counts
    with pytest.raises(UserError, match=r"a fractional epoch of a dataset of 2000000010 examples: .*\(fix: "):
        next(passes.subset(rng, 2_000_000_010, 5))
