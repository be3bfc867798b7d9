"""A curriculum unit's work in bounded memory (``plan.curriculum`` through ``plan.passes``): with tiny chunks,
buckets and blocks forced, the plan written through a scratch folder is byte for byte the plan built in memory, for
the score orders (e2d, d2e), the random order, fractional epochs, the fill and the short run; the pinned curriculum
plans are unchanged; the keyed sort through buckets equals numpy's lexsort, ties included; and the allocation peak of
one large curriculum unit does not grow with it."""

from __future__ import annotations

import numpy as np
import pytest

from data_fakes import make_store
from jaxembed.data.plan import blocks, build_plan, build_plan_file, curriculum, file as plan_file, passes
from test_plan_blocks import CASES as PINNED, _digest, _kwargs, _mixed
from test_plan_passes import _peak, _tiny


def _store():
    return make_store([("a", "t", 90, {}), ("b", "t", 61, dict(epochs=2.5)), ("c", "u", 47, dict(epochs=0.5)),
                       ("d", "v", 33, dict(epochs=1.5))])


def _scores(store, ties: bool):
    r = np.random.default_rng(7)
    return {i.name: (np.round(r.normal(size=i.size)) if ties else r.normal(size=i.size)) for i in store.datasets}


CASES = {
    "e2d_ties_keep_remainder": (dict(instance_order="e2d"), dict(drop_remainder=False), True),
    "d2e_task_units": (dict(instance_order="d2e", unit="task"), {}, False),
    "random_balanced": (dict(instance_order="random", walk="balanced"), dict(drop_remainder=False), False),
    "random_task_units_epochs": (dict(instance_order="random", unit="task"), dict(epochs=1.5), False),
    "e2d_short_run": (dict(instance_order="e2d"), dict(steps=9), True),
    "random_short_run": (dict(instance_order="random", unit="task"), dict(steps=7), False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_curriculum_through_buckets_equals_the_plan_in_memory(name, tmp_path, monkeypatch):
    """Units over PERMUTATION_MAX (forced to 40 rows): their random order, fractional subsets and short-run picks
    are the bounded draws, the same in memory as through the scratch folder."""
    cur, extra, ties = CASES[name]
    monkeypatch.setattr(curriculum, "PERMUTATION_MAX", 40)
    store = _store()
    units = ["t", "u", "v"] if cur.get("unit") == "task" else ["d", "a", "c", "b"]
    cfg = dict(global_batch_size=8, curriculum=dict(enabled=True, **cur), **extra)
    kw = dict(task_order=units, scores=_scores(store, ties))
    mem = build_plan(store, cfg, **kw)
    calls = _tiny(monkeypatch)
    got = build_plan_file(tmp_path / "plan.npz", store, cfg, **kw)
    assert calls  # units went through bucket files
    for k in ("dataset_ids", "example_ids", "weights", "task_ids", "temperatures", "unit_ids", "dropped"):
        np.testing.assert_array_equal(np.asarray(getattr(got, k)), getattr(mem, k), err_msg=k)
    assert got.meta == mem.meta and got.fingerprint() == mem.fingerprint()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "plan.npz"]


@pytest.mark.parametrize("name", [k for k in PINNED if k.startswith("curriculum")])
def test_pinned_curriculum_plans_unchanged_through_buckets(name, tmp_path, monkeypatch):
    """The four pinned curriculum plans (tests/test_plan_blocks.py), their score orders sorted through buckets of
    16 rows and their units read back 7 rows at a time: the same fingerprints."""
    cfg, opt, want = PINNED[name]
    calls = _tiny(monkeypatch)
    store = _mixed()
    got = build_plan_file(tmp_path / "plan.npz", store, cfg, **_kwargs(store, opt))
    assert _digest(got) == want
    assert bool(calls) == (cfg["curriculum"]["instance_order"] in ("e2d", "d2e"))


@pytest.mark.parametrize("ties", [False, True])
def test_keyed_sort_through_buckets_equals_lexsort(ties, tmp_path, monkeypatch):
    """Keys with many equal values (rounded to 3 values, or all the same in one dataset) split over buckets in
    stream order: the bucket sort is np.lexsort by (key, dataset, example)."""
    _tiny(monkeypatch)
    r = np.random.default_rng(1)
    sizes = [70, 55, 40]
    keys = [np.round(r.normal(size=n)) if ties else r.normal(size=n) for n in sizes]
    if ties:
        keys[2][:] = 0.0

    def rows():
        for d, k in enumerate(keys):
            for a in range(0, k.size, passes.CHUNK):
                yield k[a:a + passes.CHUNK], d, np.arange(a, min(k.size, a + passes.CHUNK), dtype=np.int64)

    got = list(passes.keyed_sort(rows, sum(sizes), tmp_path))
    ds = np.concatenate([np.full(n, d) for d, n in enumerate(sizes)])
    ex = np.concatenate([np.arange(n) for n in sizes])
    o = np.lexsort((ex, ds, np.concatenate(keys)))
    assert len(got) > 3 and list(tmp_path.iterdir()) == []
    np.testing.assert_array_equal(np.concatenate([g[0] for g in got]), ds[o])
    np.testing.assert_array_equal(np.concatenate([g[1] for g in got]), ex[o])


@pytest.mark.parametrize("order", ["e2d", "random"])
def test_the_peak_of_one_large_curriculum_unit_does_not_grow_with_it(order, tmp_path, monkeypatch):
    """One dataset at 1.5 epochs, one curriculum unit, batches of 64, built through buckets of 8,192 rows (the
    random order and the fractional subset drawn bounded over 4,096 rows): 4 times the examples (24,576 -> 98,304,
    3 -> 12 full buckets) add under a quarter to the allocation peak (the scores, an input, are made outside the
    measure). Sorted whole, the unit alone was ~40 bytes an example: +2.9 MB, the peak 4 times larger."""
    for mod, name, v in ((passes, "CHUNK", 4096), (passes, "BUCKET", 8192), (passes, "SUBSET_LEAF", 4096),
                         (blocks, "BLOCK_EXAMPLES", 4096), (plan_file, "_BLOCK_STEPS", 64),
                         (curriculum, "PERMUTATION_MAX", 4096)):
        monkeypatch.setattr(mod, name, v)
    cfg = dict(global_batch_size=64, curriculum=dict(enabled=True, instance_order=order))
    build_plan_file(tmp_path / "warm.npz", make_store([("a", "t", 300, {})]), cfg, task_order=["a"],
                    scores={"a": np.zeros(300)})  # imports outside the measure
    peaks = []
    for n in (24_576, 98_304):
        store, scores = make_store([("a", "t", n, dict(epochs=1.5))]), {"a": np.random.default_rng(0).normal(size=n)}
        peaks.append(_peak(lambda: build_plan_file(tmp_path / f"p{n}.npz", store, cfg, task_order=["a"],
                                                   scores=scores)))
    assert peaks[1] < 1.25 * peaks[0], peaks


def test_scores_checked_a_range_at_a_time_name_the_example():
    """A non-finite score past the first range of 2^20 scores is named by its index in the dataset."""
    from jaxembed.data.plan.inputs import load_scores
    from jaxembed.errors import UserError

    n = (1 << 20) + 10
    scores = np.zeros(n)
    scores[(1 << 20) + 5] = np.inf
    with pytest.raises(UserError, match=r"^scores: dataset 'a' example 1048581: score is inf \(fix: "):
        load_scores({"a": scores}, make_store([("a", "t", n, {})]))
