"""Batch plans: determinism, epoch coverage, each strategy's invariants, sampling, curriculum, mask, files, CLI."""

import argparse
import json
import struct
import zlib

import numpy as np
import pytest

from data_fakes import make_store, real_store_dir
from jaxembed.data import plan as P
from jaxembed.data.plan import Plan, build_plan, default_plan_config, summarize, validate_plan_config
from jaxembed.errors import UserError


def _key(plan):
    return plan.dataset_ids.astype(np.int64) * (1 << 40) + plan.example_ids


def _counts(plan, d):
    return np.bincount(plan.example_ids[plan.dataset_ids == d], minlength=int(plan.dataset_sizes[d]))


def _mixed_store(**kw):
    """Two retrieval datasets (homogeneous), a two-dataset classification task (heterogeneous), two random
    tasks; sizes not multiples of the batch; epochs 1, 2 and 1.5."""
    return make_store([
        ("ra", "ret", 100, dict(batching="homogeneous", temperature=0.03, **kw)),
        ("rb", "ret", 70, dict(batching="homogeneous", temperature=0.03, epochs=2, **kw)),
        ("ca", "cls", 90, dict(batching="heterogeneous", temperature=0.05, **kw)),
        ("cb", "cls", 45, dict(batching="heterogeneous", temperature=0.05, epochs=1.5, **kw)),
        ("sa", "sts", 60, dict(batching="random", **kw)),
        ("na", "nli", 80, dict(batching="random", **kw)),
    ])


# ------------------------------------------------------------------------------------------------ config

def test_default_config_is_valid():
    c = default_plan_config()
    validate_plan_config(c)
    assert c.global_batch_size > 0 and c.steps == 0 and c.mask.delta is None and c.drop_remainder


@pytest.mark.parametrize("field,value,match", [
    ("global_batch_size", 0, "global_batch_size"),
    ("steps", -1, "steps"),
    ("epochs", 0.0, "epochs"),
    ("sampling", "uniform", "sampling"),
    ("strategy", "mixed", "strategy"),
    ("semi_homogeneous_proportion", 1.5, "semi_homogeneous_proportion"),
    ("negatives", "all", "negatives"),
    ("task_strategies", {"ret": "bogus"}, "task_strategies.ret"),
])
def test_bad_config_values_are_named(field, value, match):
    with pytest.raises(UserError, match=match) as e:
        build_plan(_mixed_store(), {field: value})
    assert "fix:" in str(e.value)


def test_unknown_field_and_dependent_fields():
    with pytest.raises(UserError, match="global_batch_sise.*unknown field"):
        build_plan(_mixed_store(), {"global_batch_sise": 8})
    with pytest.raises(UserError, match="mask.delta.*scores"):
        build_plan(_mixed_store(), {"mask": {"delta": 0.1}})
    with pytest.raises(UserError, match="task_order"):
        build_plan(_mixed_store(), {"curriculum": {"enabled": True, "instance_order": "random"}})


# ------------------------------------------------------------------------------------------------ determinism

def test_same_seed_same_plan_other_seed_other_plan():
    cfg = {"global_batch_size": 8, "seed": 3}
    a, b = build_plan(_mixed_store(), cfg), build_plan(_mixed_store(), cfg)
    assert a.fingerprint() == b.fingerprint()
    for k in ("dataset_ids", "example_ids", "task_ids", "weights"):
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k))
    c = build_plan(_mixed_store(), dict(cfg, seed=4))
    assert c.fingerprint() != a.fingerprint()
    s = build_plan(_mixed_store(), dict(cfg, steps=40))
    assert s.fingerprint() == build_plan(_mixed_store(), dict(cfg, steps=40)).fingerprint()


# ------------------------------------------------------------------------------------------------ epochs

@pytest.mark.parametrize("strategy", [None, "random", "homogeneous", "heterogeneous", "semi_homogeneous"])
def test_epoch_coverage_with_dropped_remainder(strategy):
    """Every example appears exactly its configured number of times, except the dropped remainders, which the
    plan lists; nothing is repeated beyond the configured count; no example twice in one batch."""
    store = _mixed_store()
    plan = build_plan(store, {"global_batch_size": 8, "strategy": strategy, "epochs": 1.0})
    dropped = plan.dropped
    assert plan.meta["mode"] == "epochs"
    total_dropped = 0
    for d, info in enumerate(store.datasets):
        e = info.epochs or 1.0
        c = _counts(plan, d) + np.bincount(dropped[dropped[:, 0] == d, 1], minlength=info.size)
        full, extra = int(np.floor(e)), int(round((e - np.floor(e)) * info.size))
        assert c.sum() == full * info.size + extra
        assert c.min() >= full and c.max() <= int(np.ceil(e))
        total_dropped += int((dropped[:, 0] == d).sum())
    s = summarize(plan)
    assert s["dropped_total"] == total_dropped == len(dropped) > 0
    assert s["in_batch_repeats"] == 0
    assert all(v["repeats_beyond_configured"] == 0 for v in s["datasets"].values())
    assert "dropped remainder: %d" % total_dropped in P.format_summary(s)


def test_epoch_coverage_with_filled_remainder():
    """drop_remainder=False: nothing dropped; the last batch of each unit is filled from the unit's next pass, and
    exactly those rows (counted as 'filled') go beyond the configured count."""
    store = _mixed_store()
    plan = build_plan(store, {"global_batch_size": 8, "drop_remainder": False})
    assert plan.dropped.shape == (0, 2)
    s = summarize(plan)
    for d, info in enumerate(store.datasets):
        c = _counts(plan, d)
        e = info.epochs or 1.0
        full, extra = int(np.floor(e)), int(round((e % 1) * info.size))
        filled = s["datasets"][info.name]["filled"]
        assert c.min() >= full and c.sum() == full * info.size + extra + filled
    assert s["filled_total"] > 0 and s["in_batch_repeats"] == 0


def test_plan_epochs_multiplies_dataset_epochs():
    store = make_store([("a", "t", 64, dict(batching="homogeneous", epochs=2))])
    plan = build_plan(store, {"global_batch_size": 16, "epochs": 1.5})
    np.testing.assert_array_equal(_counts(plan, 0), 3)
    assert plan.steps == 12 and summarize(plan)["in_batch_repeats"] == 0


def test_unit_smaller_than_batch_is_an_error():
    store = make_store([("big", "t", 100, dict(batching="homogeneous")), ("tiny", "t", 5,
                                                                          dict(batching="homogeneous"))])
    with pytest.raises(UserError, match="'tiny'.*5 examples.*global_batch_size 8"):
        build_plan(store, {"global_batch_size": 8})
    build_plan(store, {"global_batch_size": 8, "strategy": "heterogeneous"})  # pooled: fine


# ------------------------------------------------------------------------------------------------ strategies

def test_homogeneous_heterogeneous_random_invariants():
    store = _mixed_store()
    plan = build_plan(store, {"global_batch_size": 8})
    tasks = plan.row_task_ids()
    names = plan.task_names
    single_ds = np.all(plan.dataset_ids == plan.dataset_ids[:, :1], axis=1)
    for s in range(plan.steps):
        t = plan.task_ids[s]
        if t >= 0 and names[t] == "ret":  # homogeneous: one dataset per batch
            assert single_ds[s]
        if t >= 0:
            assert np.all(tasks[s] == t)
    cls = plan.task_names.index("cls")
    cls_steps = np.flatnonzero(plan.task_ids == cls)
    assert cls_steps.size and not single_ds[cls_steps].all()  # heterogeneous: across the task's datasets
    # random: the sts and nli datasets pooled -> mixed batches (task id -1, temperature NaN = run default)
    mixed = np.flatnonzero(plan.task_ids == -1)
    assert mixed.size >= 10 and np.isnan(plan.temperatures[mixed]).all()
    assert set(np.unique(plan.dataset_ids[mixed])) == {4, 5}
    # temperatures of single-task batches
    assert np.allclose(plan.temperatures[plan.task_ids == names.index("ret")], 0.03)
    assert np.allclose(plan.temperatures[cls_steps], 0.05)
    assert plan.meta["strategies"] == {"ret": "homogeneous", "cls": "heterogeneous", "sts": "random",
                                       "nli": "random"}


def test_task_strategy_override_and_disagreeing_batching():
    plan = build_plan(_mixed_store(), {"global_batch_size": 8, "task_strategies": {"cls": "homogeneous"}})
    cls = plan.task_names.index("cls")
    steps = plan.task_ids == cls
    assert np.all(plan.dataset_ids[steps] == plan.dataset_ids[steps][:, :1])
    bad = make_store([("a", "t", 40, dict(batching="homogeneous")), ("b", "t", 40, dict(batching="random"))])
    with pytest.raises(UserError, match="task 't'.*disagree.*task_strategies.t"):
        build_plan(bad, {"global_batch_size": 8})


def test_temperature_clash_inside_a_task_batch_is_an_error():
    bad = make_store([("a", "t", 40, dict(batching="heterogeneous", temperature=0.03)),
                      ("b", "t", 40, dict(batching="heterogeneous", temperature=0.05))])
    with pytest.raises(UserError, match="different temperatures"):
        build_plan(bad, {"global_batch_size": 8})


@pytest.mark.parametrize("prop", [0.0, 0.25, 0.5, 1.0])
def test_semi_homogeneous_measured_mixing(prop):
    """KaLM Fig. 3: homogeneous batches, then `prop` of each batch's rows shuffled across batches. With four
    equal datasets a moved row lands in a batch of another dataset with probability 3/4, so the measured share
    of foreign rows is prop * 3/4; the multiset of examples is that of the homogeneous plan."""
    spec = [(f"d{i}", f"t{i}", 256, dict(batching="semi_homogeneous")) for i in range(4)]
    cfg = {"global_batch_size": 32, "semi_homogeneous_proportion": prop}
    plan = build_plan(make_store(spec), cfg)
    homo = build_plan(make_store(spec), dict(cfg, strategy="homogeneous"))
    np.testing.assert_array_equal(np.sort(_key(plan).ravel()), np.sort(_key(homo).ravel()))
    share = P.mixing_share(plan)
    assert abs(share - prop * 0.75) <= 0.05, share
    s = summarize(plan)
    assert s["semi_homogeneous"]["rows_per_batch"] == round(prop * 32)
    assert abs(s["semi_homogeneous"]["measured_foreign_share"] - share) < 1e-9
    if prop == 0.0:
        assert (plan.task_ids >= 0).all()
    else:
        assert (plan.task_ids == -1).mean() > 0.9
    assert s["in_batch_repeats"] == 0


# ------------------------------------------------------------------------------------------------ sampling

@pytest.mark.parametrize("sampling,extra,expect", [
    ("size", {}, [1, 4, 16]),
    ("temperature", {"sampling_temperature": 2.0}, [1, 2, 4]),
    ("weights", {}, [1, 1, 2]),
])
def test_step_mode_sampling_proportions(sampling, extra, expect):
    spec = [("a", "ta", 100, dict(batching="homogeneous", weight=1.0)),
            ("b", "tb", 400, dict(batching="homogeneous", weight=1.0)),
            ("c", "tc", 1600, dict(batching="homogeneous", weight=2.0))]
    plan = build_plan(make_store(spec), dict({"global_batch_size": 4, "steps": 6000, "sampling": sampling}, **extra))
    assert plan.steps == 6000 and plan.meta["mode"] == "steps"
    got = np.bincount(plan.dataset_ids[:, 0], minlength=3) / 6000
    want = np.array(expect, float) / sum(expect)
    np.testing.assert_allclose(got, want, atol=0.02)
    # within a dataset: passes without replacement (the first `size` rows of dataset a hold each example once)
    rows_a = plan.example_ids[plan.dataset_ids == 0][:100]
    if rows_a.size == 100:
        assert np.unique(rows_a).size == 100


@pytest.mark.parametrize("sampling,extra,want_epochs", [
    ("weights", {}, [0.5, 1.5]),                                  # one pass of 800 split 1:3
    ("temperature", {"sampling_temperature": 2.0}, [3.4, 0.85]),  # sizes 100 / 1600 -> sqrt: 1:4 of 1700
])
def test_epoch_mode_sampling_sets_the_amounts(sampling, extra, want_epochs):
    """Epoch mode with weights / temperature: the datasets without explicit epochs share one pass in proportion to
    p_d (up- / down-sampling); coverage holds for the effective epochs; a dataset with explicit epochs keeps them;
    every unit is spread evenly over the plan."""
    sizes = [400, 400] if sampling == "weights" else [100, 1600]
    spec = [("a", "ta", sizes[0], dict(batching="homogeneous", weight=1.0)),
            ("b", "tb", sizes[1], dict(batching="homogeneous", weight=3.0)),
            ("fixed", "tc", 64, dict(batching="homogeneous", epochs=2.0))]
    plan = build_plan(make_store(spec), dict({"global_batch_size": 4, "sampling": sampling}, **extra))
    meta = {d["name"]: d for d in plan.meta["datasets"]}
    np.testing.assert_allclose([meta["a"]["epochs"], meta["b"]["epochs"]], want_epochs)
    assert meta["fixed"]["epochs"] == 2.0 and meta["fixed"]["epochs_from"] == "config"
    assert meta["a"]["epochs_from"] == "sampling"
    for d, e in enumerate(want_epochs + [2.0]):
        c = _counts(plan, d) + np.bincount(plan.dropped[plan.dropped[:, 0] == d, 1], minlength=plan.dataset_sizes[d])
        assert c.sum() == round(e * plan.dataset_sizes[d])
        assert c.min() >= np.floor(e) and c.max() <= np.ceil(e)
    for d in range(3):  # evenly spread: each unit's batches fill the whole plan, a quarter in each quarter
        steps = np.flatnonzero(plan.dataset_ids[:, 0] == d)
        quarters = np.bincount(steps * 4 // plan.steps, minlength=4) / steps.size
        np.testing.assert_allclose(quarters, 0.25, atol=0.06)
    assert "* epochs from" in P.format_summary(summarize(plan))


def test_data_config_and_store_supply_sampling_defaults():
    spec = [("a", "ta", 100, dict(batching="homogeneous")), ("b", "tb", 1600, dict(batching="homogeneous"))]
    plan = build_plan(make_store(spec), {"global_batch_size": 4, "steps": 2000},
                      data_config={"sampling": "temperature", "sampling_temperature": 100.0, "seed": 5})
    assert plan.seed == 5 and plan.config["sampling"] == "temperature"
    assert abs((plan.dataset_ids[:, 0] == 0).mean() - 0.5) < 0.05  # T large: near uniform
    with pytest.raises(UserError, match="sampling_temperature"):
        build_plan(make_store(spec), {"global_batch_size": 4, "steps": 10, "sampling": "temperature"})


# ------------------------------------------------------------------------------------------------ curriculum

def _curriculum_store():
    return make_store([("a1", "A", 40, {}), ("a2", "A", 24, {}), ("b", "B", 40, {}), ("c", "C", 16, {})])


def _scores(store, seed=0):
    rng = np.random.default_rng(seed)
    return {i.name: rng.random(i.size) for i in store.datasets}


def test_curriculum_walks_the_task_order_cyclically_and_sorts_instances():
    """Data-CUBE Algorithm 1 lines 18-25: visit tasks in order, cyclically; each visit takes the task's next batch
    of its E2D-sorted instances; exhausted tasks are skipped; one task per batch."""
    store = _curriculum_store()
    scores = _scores(store)
    cfg = {"global_batch_size": 8, "curriculum": {"enabled": True, "unit": "task", "instance_order": "e2d"}}
    plan = build_plan(store, cfg, scores=scores, task_order=["C", "A", "B"])
    names = plan.task_names
    expect = ["C", "A", "B", "C", "A", "B", "A", "B", "A", "B", "A", "B", "A", "A", "A"]
    assert [names[t] for t in plan.task_ids] == expect
    assert np.all(plan.row_task_ids() == plan.task_ids[:, None])  # one task per batch
    flat = {i.name: s for i, s in zip(store.datasets, scores.values())}
    phi = np.vectorize(lambda d, e: flat[plan.dataset_names[d]][e])(plan.dataset_ids, plan.example_ids)
    for t in range(len(names)):
        rows = phi[plan.task_ids == t].ravel()  # the task's instances in plan order
        assert np.all(np.diff(rows) <= 0)  # easy (large phi) to difficult
    # every instance exactly once (the sizes are multiples of 8)
    assert np.unique(_key(plan)).size == plan.steps * 8 == sum(i.size for i in store.datasets)
    # D2E reverses the order inside each task
    rev = build_plan(store, dict(cfg, curriculum={"enabled": True, "unit": "task", "instance_order": "d2e"}),
                     scores=scores,
                     task_order=["C", "A", "B"])
    phi_r = np.vectorize(lambda d, e: flat[rev.dataset_names[d]][e])(rev.dataset_ids, rev.example_ids)
    assert all(np.all(np.diff(phi_r[rev.task_ids == t].ravel()) >= 0) for t in range(3))
    s = summarize(plan)
    assert s["curriculum"]["order"] == ["C", "A", "B"] and "curriculum" in P.format_summary(s)


def test_curriculum_with_fewer_steps_than_a_pass_compresses_the_whole_curriculum():
    """Step mode shorter than one pass: every unit gets its share of the steps (largest remainders), filled with a
    uniform random subset of its instances that keeps the E2D order, so each task still runs from easy to
    difficult (not just its easiest batches); exactly `steps` batches, nothing truncated."""
    store = make_store([("a1", "A", 400, {}), ("a2", "A", 240, {}), ("b", "B", 400, {}), ("c", "C", 160, {})])
    scores = _scores(store, 3)
    flat = {i.name: s for i, s in zip(store.datasets, scores.values())}
    cfg = {"global_batch_size": 8, "steps": 30, "curriculum": {"enabled": True, "unit": "task",
                                                               "instance_order": "e2d"}}
    plan = build_plan(store, cfg, scores=scores, task_order=["C", "A", "B"])
    assert plan.steps == 30 and summarize(plan)["curriculum"]["truncated_batches"] == 0
    names = [plan.task_names[t] for t in plan.task_ids]
    assert {t: names.count(t) for t in "ABC"} == {"A": 16, "B": 10, "C": 4}  # 30 x (640, 400, 160) / 1200
    assert names[:6] == ["C", "A", "B"] * 2  # the cyclic walk
    assert np.unique(_key(plan)).size == 30 * 8  # no repeats
    phi = np.vectorize(lambda d, e: flat[plan.dataset_names[d]][e])(plan.dataset_ids, plan.example_ids)
    for t, task in enumerate(plan.task_names):
        rows = phi[plan.task_ids == t].ravel()
        assert np.all(np.diff(rows) <= 0)  # E2D inside the subset
        members = [flat[i.name] for i in store.datasets if i.task == task]
        everything = np.sort(np.concatenate(members))[::-1]
        # the subset spans the whole difficulty range: its hardest row is among the unit's hardest 10 %, where the
        # old truncation took only the unit's easiest len(rows) instances
        assert rows[-1] <= everything[int(0.9 * everything.size)] < everything[rows.size - 1]
    s = summarize(plan)
    assert s["curriculum"]["fraction_of_one_pass"] == pytest.approx(240 / 1200)
    assert "20.0% of one pass" in P.format_summary(s)
    # a unit smaller than a batch is fine here (it gets no batch); with steps covering the pass nothing changes
    full = build_plan(store, dict(cfg, steps=150), scores=scores, task_order=["C", "A", "B"])
    whole = build_plan(store, dict(cfg, steps=0), scores=scores, task_order=["C", "A", "B"])
    np.testing.assert_array_equal(full.example_ids, whole.example_ids)
    assert summarize(full)["curriculum"]["fraction_of_one_pass"] == 1.0


def test_curriculum_from_files_with_remainder_random_and_given_orders(tmp_path):
    store = make_store([("a", "A", 20, {}), ("b", "B", 13, {})])
    scores = _scores(store, 1)
    np.savez(tmp_path / "scores.npz", **scores)
    (tmp_path / "order.json").write_text(json.dumps(["B", "A"]))
    cfg = {"global_batch_size": 4, "scores": str(tmp_path / "scores.npz"),
           "curriculum": {"enabled": True, "unit": "task", "task_order": str(tmp_path / "order.json")}}
    plan = build_plan(store, cfg)
    assert [plan.task_names[t] for t in plan.task_ids] == ["B", "A"] * 3 + ["A", "A"]
    assert plan.dropped.shape == (1, 2) and plan.dropped[0, 0] == 1  # b: 13 = 3 batches + 1 dropped
    # the dropped instance is the most difficult one of b (the tail of its E2D order)
    assert plan.dropped[0, 1] == int(np.argmin(scores["b"]))
    np.save(tmp_path / "order.npy", np.array([1, 0]))  # indices into the task table (A, B)
    same = build_plan(store, dict(cfg, curriculum=dict(cfg["curriculum"], task_order=str(tmp_path / "order.npy"))))
    assert same.fingerprint() == plan.fingerprint()
    rnd = build_plan(store, {"global_batch_size": 4, "curriculum": {"enabled": True, "unit": "task",
                                                                   "instance_order": "random",
                                                                   "task_order": str(tmp_path / "order.json")}})
    assert [rnd.task_names[t] for t in rnd.task_ids] == ["B", "A"] * 3 + ["A", "A"]
    orders = {"A": [["a", i] for i in range(19, -1, -1)], "B": [["b", i] for i in range(13)]}
    (tmp_path / "orders.json").write_text(json.dumps(orders))
    giv = build_plan(store, {"global_batch_size": 4, "drop_remainder": False, "curriculum": {
        "enabled": True, "unit": "task", "instance_order": "given", "instance_orders": str(tmp_path / "orders.json"),
        "task_order": ["A", "B"]}})
    a_rows = giv.example_ids[giv.task_ids == 0].ravel()
    np.testing.assert_array_equal(a_rows, np.arange(19, -1, -1))
    b_rows = giv.example_ids[giv.task_ids == 1].ravel()
    np.testing.assert_array_equal(b_rows[:13], np.arange(13))  # then filled from b's start, not repeating 12
    assert summarize(giv)["filled_total"] == 3 and giv.dropped.size == 0


@pytest.mark.parametrize("order,match", [(["A"], "lacks"), (["A", "B", "B"], "more than once"),
                                         (["A", "B", "X"], "unknown")])
def test_bad_task_orders_are_named(order, match):
    store = make_store([("a", "A", 8, {}), ("b", "B", 8, {})])
    with pytest.raises(UserError, match=match):
        build_plan(store, {"global_batch_size": 4, "curriculum": {"enabled": True, "unit": "task",
                                                                  "instance_order": "random"}}, task_order=order)


def _window_deviation(pos: np.ndarray, n: np.ndarray) -> np.ndarray:
    """max over every window of W consecutive batches of |count_k - W s_k| - (1 + U s_k + 2 n_k / max n): the
    bound walk_order's docstring proves for the balanced walk is that this is < 0 for every unit k. -> [U]."""
    U, N = n.size, int(n.sum())
    s = n / N
    cum = np.vstack([np.zeros(U), np.cumsum(np.eye(U)[pos], 0)])  # [N + 1, U]
    worst = np.full(U, -np.inf)
    for W in range(1, N + 1):
        dev = np.abs(cum[W:] - cum[:-W] - W * s)
        worst = np.maximum(worst, dev.max(0) - (1 + U * s + 2 * n / n.max()))
    return worst


def test_walk_order_cyclic_and_balanced_properties():
    """walk_order (docs/design.md, Data-CUBE: Algorithm 1 lines 18-25, and the balanced walk), on random unit
    sizes: both walks take every batch once, each unit's batches in their order, and visit the units first in the
    task order; equal sizes give identical walks; the balanced walk keeps every unit's share of every window of W
    batches within 1 + U s_k + 2 n_k / R of W s_k, which Algorithm 1 breaks when one unit is large (it owns the
    end)."""
    rng = np.random.default_rng(0)
    for trial in range(120):
        U = int(rng.integers(1, 9))
        n = rng.integers(1, 12, size=U)
        if trial % 2:
            n[rng.integers(U)] *= 12  # one dominant unit, as SST-2 in the shared data
        for walk in ("cyclic", "balanced"):
            pos, j = P.walk_order(n, walk)
            assert pos.size == n.sum() and np.unique(pos * 1000 + j).size == n.sum()  # every batch once
            for k in range(U):
                np.testing.assert_array_equal(j[pos == k], np.arange(n[k]))  # a unit's batches in order
            np.testing.assert_array_equal(pos[:U], np.arange(U))  # cycle 0: every unit, in the task order
            again = P.walk_order(n.tolist(), walk)
            assert np.array_equal(again[0], pos) and np.array_equal(again[1], j)  # deterministic
        bal = P.walk_order(n, "balanced")[0]
        assert (_window_deviation(bal, n) < 0).all(), n
        same = np.full(U, int(n[0]))
        for a, b in zip(P.walk_order(same, "cyclic"), P.walk_order(same, "balanced")):
            np.testing.assert_array_equal(a, b)
    n = np.array([3, 80, 2, 5])
    cyc = P.walk_order(n, "cyclic")[0]
    assert (cyc[-75:] == 1).all() and _window_deviation(cyc, n).max() > 1  # Algorithm 1: unit 1 alone at the end
    assert (_window_deviation(P.walk_order(n, "balanced")[0], n) < 0).all()
    with pytest.raises(UserError, match="curriculum.walk"):
        P.walk_order(n, "zigzag")


def test_curriculum_unit_is_the_dataset_and_the_balanced_walk_in_a_plan(tmp_path):
    """Plans: the default curriculum unit is the dataset (Data-CUBE's task is a MEDI dataset); the balanced walk
    interleaves the same batches as Algorithm 1 (each unit's batches identical and in the same order, E2D inside),
    keeps every unit's share of every window within the bound, and ends with every unit instead of the largest;
    the same holds for a short run (step mode, the compressed curriculum)."""
    store = make_store([("big", "S", 400, {}), ("small", "S", 48, {}), ("b", "B", 64, {}), ("c", "C", 40, {})])
    scores = _scores(store, 5)
    order = ["c", "small", "big", "b"]
    cfg = {"global_batch_size": 8, "curriculum": {"enabled": True, "instance_order": "e2d"}}
    assert default_plan_config().curriculum.unit == "dataset"
    for steps in (0, 30):
        plans = {w: build_plan(store, dict(cfg, steps=steps, curriculum=dict(cfg["curriculum"], walk=w)),
                               scores=scores, task_order=order) for w in ("cyclic", "balanced")}
        cyc, bal = plans["cyclic"], plans["balanced"]
        assert bal.meta["curriculum"]["walk"] == "balanced" and "walk balanced" in P.format_summary(summarize(bal))
        assert bal.steps == cyc.steps == (steps or 69)
        units = [u["name"] for u in bal.meta["units"]]
        assert units == ["big", "small", "b", "c"]  # one unit per dataset (big and small share task S)
        for plan in (cyc, bal):
            assert np.all(plan.dataset_ids == plan.dataset_ids[:, :1])  # one dataset per batch
            walked = [units[u] for u in plan.unit_ids]
            assert [u for k, u in enumerate(walked) if u not in walked[:k]] == order  # first visits: the order
        for k, name in enumerate(units):  # the same batches of each unit, in the same order (E2D inside)
            np.testing.assert_array_equal(bal.example_ids[bal.unit_ids == k], cyc.example_ids[cyc.unit_ids == k])
            phi = scores[name][bal.example_ids[bal.unit_ids == k]].ravel()
            assert np.all(np.diff(phi) <= 0)
        n = np.array([int((bal.unit_ids == units.index(u)).sum()) for u in order])
        pos_of = np.array([order.index(units[u]) for u in bal.unit_ids])
        assert (_window_deviation(pos_of, n) < 0).all()
        half = bal.steps // 2
        assert {units[u] for u in bal.unit_ids[-half:]} == set(units)  # every unit reaches the second half
        assert {units[u] for u in cyc.unit_ids[-half:]} == {"big"}     # Algorithm 1: the largest owns it
    # an order over tasks given to a dataset-unit plan: the file says so, in one line with the fix
    (tmp_path / "order.json").write_text(json.dumps({"order": ["S", "B", "C"], "unit": "task"}))
    with pytest.raises(UserError, match=r"order.json: field 'unit': the order is over tasks, but the plan's "
                                        r"curriculum.unit is 'dataset' \(fix: set curriculum.unit='task'"):
        build_plan(store, {"global_batch_size": 8, "curriculum": {"enabled": True, "instance_order": "random",
                                                                  "task_order": str(tmp_path / "order.json")}})
    with pytest.raises(UserError, match="curriculum.unit='dataset' orders the dataset names"):
        build_plan(store, {"global_batch_size": 8, "curriculum": {"enabled": True, "instance_order": "random"}},
                   task_order=["S", "B", "C"])
    with pytest.raises(UserError, match=r"curriculum.walk.*'cyclic' \(Algorithm 1\) or 'balanced'"):
        build_plan(store, {"global_batch_size": 8, "curriculum": {"enabled": True, "instance_order": "random",
                                                                  "walk": "zigzag"}}, task_order=order)


# ------------------------------------------------------------------------------------------------ mask

def test_instance_mask_directions_and_plan_weights():
    phi = np.array([-0.2, 0.0, 0.1, 0.5])
    np.testing.assert_array_equal(P.instance_mask(phi, 0.1, "text"), [0, 0, 1, 1])
    np.testing.assert_array_equal(P.instance_mask(phi, 0.1, "printed"), [1, 1, 0, 0])
    np.testing.assert_array_equal(P.instance_mask(phi, None), [1, 1, 1, 1])
    store = make_store([("a", "A", 32, dict(batching="homogeneous")), ("b", "B", 32, dict(batching="homogeneous"))])
    scores = {"a": np.linspace(-1, 1, 32), "b": np.linspace(0, 1, 32)}
    off = build_plan(store, {"global_batch_size": 8}, scores=scores)
    assert off.weights.dtype == np.float32 and np.all(off.weights == 1.0)
    for direction in ("text", "printed"):
        plan = build_plan(store, {"global_batch_size": 8, "mask": {"delta": 0.0, "direction": direction}},
                          scores=scores)
        phi_rows = np.where(plan.dataset_ids == 0, scores["a"][plan.example_ids], scores["b"][plan.example_ids])
        want = (phi_rows >= 0.0) if direction == "text" else (phi_rows < 0.0)
        np.testing.assert_array_equal(plan.weights, want.astype(np.float32))
        assert summarize(plan)["masked_rows"] == int((~want).sum())


def test_scores_file_formats_and_errors(tmp_path):
    store = make_store([("a", "A", 4, {}), ("b", "B", 3, {})])
    flat = np.arange(7.0)
    np.save(tmp_path / "s.npy", flat)
    (tmp_path / "s.json").write_text(json.dumps({"a": [0, 1, 2, 3], "b": [4, 5, 6]}))
    for f in ("s.npy", "s.json"):
        got = P.load_scores(str(tmp_path / f), store)
        np.testing.assert_array_equal(got["a"], [0, 1, 2, 3])
        np.testing.assert_array_equal(got["b"], [4, 5, 6])
    with pytest.raises(UserError, match="6 scores for 7 examples"):
        P.load_scores(np.arange(6.0), store)
    with pytest.raises(UserError, match="'b' has 3 examples but 2 scores"):
        P.load_scores({"b": [1, 2]}, store)
    with pytest.raises(UserError, match="example 1: score is nan"):
        P.load_scores({"b": [1, np.nan, 2]}, store)
    with pytest.raises(UserError, match="unknown dataset 'z'"):
        P.load_scores({"z": [1]}, store)


# ------------------------------------------------------------------------------------------------ files

def test_save_load_roundtrip_and_validation(tmp_path):
    plan = build_plan(_mixed_store(), {"global_batch_size": 8, "strategy": "semi_homogeneous"})
    path = plan.save(tmp_path / "run" / "plan.npz")
    assert path.exists() and (tmp_path / "run" / "plan.json").exists()
    back = Plan.load(path)
    assert back.fingerprint() == plan.fingerprint()
    for k in ("dataset_ids", "example_ids", "task_ids", "weights", "temperatures", "dropped"):
        np.testing.assert_array_equal(getattr(back, k), getattr(plan, k))
        assert getattr(back, k).dtype == getattr(plan, k).dtype
    assert back.task_names == plan.task_names and back.config == json.loads(json.dumps(plan.config))
    assert summarize(back) == summarize(plan)
    back.check_datasets(_mixed_store())
    with pytest.raises(UserError, match="rebuild the plan"):
        back.check_datasets(make_store([("ra", "ret", 100, {})]))
    # the step view: everything a loader needs to resume from step s
    st = back.step(3)
    assert st["dataset_ids"].shape == (8,) and st["task_id"] == int(plan.task_ids[3])
    with pytest.raises(UserError, match="outside the plan"):
        back.step(back.steps)


def test_load_errors_name_the_file(tmp_path):
    plan = build_plan(_mixed_store(), {"global_batch_size": 8})
    path = plan.save(tmp_path / "plan.npz")
    with pytest.raises(UserError, match="no such plan file"):
        Plan.load(tmp_path / "nope.npz")
    other = build_plan(_mixed_store(), {"global_batch_size": 8, "seed": 9})
    other.save(tmp_path / "other.npz")
    (tmp_path / "other.json").replace(tmp_path / "plan.json")  # arrays of one build, sidecar of another
    with pytest.raises(UserError, match="do not match plan.json"):
        Plan.load(path)
    side = json.loads((tmp_path / "plan.json").read_text())
    (tmp_path / "plan.json").write_text(json.dumps(dict(side, version=99)))
    with pytest.raises(UserError, match="version 99"):
        Plan.load(path)
    (tmp_path / "plan.json").unlink()
    with pytest.raises(UserError, match="sidecar is missing"):
        Plan.load(path)
    with pytest.raises(UserError, match=r"must end in \.npz"):
        plan.save(tmp_path / "plan.bin")


def _png_size(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", data[16:24])
    idat = data[data.index(b"IDAT") + 4:]
    zlib.decompressobj().decompress(idat)  # a valid zlib stream
    return w, h


def test_png_of_the_task_sequence(tmp_path):
    plan = build_plan(_mixed_store(), {"global_batch_size": 4, "steps": 3000})
    w, h = _png_size(P.render_png(plan, tmp_path / "seq.png"))
    assert w > 1000 and h > 40


# ------------------------------------------------------------------------------------------------ real store + CLI

@pytest.fixture(scope="module")
def real_store(tmp_path_factory):
    from jaxembed.data.store import Store

    return Store.open(real_store_dir(tmp_path_factory))


def test_real_store_plan(real_store):
    """The shared training data, prepared by the real store writer: MoTE's task-aware batching (retrieval
    homogeneous, classification heterogeneous), the store's sampling defaults, full coverage."""
    plan = build_plan(real_store, {"global_batch_size": 64})
    assert plan.config["sampling"] == real_store.manifest["sampling"]
    names = plan.task_names
    single_ds = np.all(plan.dataset_ids == plan.dataset_ids[:, :1], axis=1)
    infos = {i.name: i for i in real_store.datasets}
    for s in range(plan.steps):
        t = plan.task_ids[s]
        assert t >= 0  # no random strategy in the shared config: every batch one task
        ttype = infos[plan.dataset_names[plan.dataset_ids[s, 0]]].task_type
        if ttype in ("retrieval", "reranking", "nli", "sts", "pair_classification"):
            assert single_ds[s]
    sentiment = names.index("sentiment")  # sst2 + mr, heterogeneous
    assert not single_ds[plan.task_ids == sentiment].all()
    # the store's temperature sampling up-samples the small datasets and down-samples SST-2 (one pass in all)
    epochs = {d["name"]: d["epochs"] for d in plan.meta["datasets"]}
    assert epochs["sst2"] < 1 < epochs["trecqa"]
    total = 0
    for d, info in enumerate(real_store.datasets):
        c = _counts(plan, d) + np.bincount(plan.dropped[plan.dropped[:, 0] == d, 1], minlength=info.size)
        e = epochs[info.name]
        assert c.min() >= np.floor(e) and c.max() <= np.ceil(e), info.name
        assert c.sum() == int(np.floor(e)) * info.size + round((e % 1) * info.size), info.name
        total += c.sum()
    assert abs(total - sum(i.size for i in real_store.datasets)) <= len(real_store.datasets)
    size_plan = build_plan(real_store, {"global_batch_size": 64, "sampling": "size"})
    for d, info in enumerate(real_store.datasets):  # size sampling: every example exactly once
        c = _counts(size_plan, d) + np.bincount(size_plan.dropped[size_plan.dropped[:, 0] == d, 1],
                                                minlength=info.size)
        assert np.all(c == 1), info.name
    s = summarize(plan)
    assert s["dropped_total"] < 64 * len(plan.meta["units"]) and s["in_batch_repeats"] == 0


def _cli(argv):
    from jaxembed.data.plan import cli as plan_cli

    parser = argparse.ArgumentParser(prog="jaxembed")
    plan_cli.add_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_build_and_show(real_store, tmp_path, capsys, minilm_dir, monkeypatch):
    cfg = tmp_path / "plan_cfg.py"
    cfg.write_text("from jaxembed.data.plan import default_plan_config\n"
                   "import ml_collections\n"
                   "def get_config(arg=None):\n"
                   "    c = ml_collections.ConfigDict()\n"
                   "    c.plan = default_plan_config()\n"
                   "    c.plan.global_batch_size = 32 if arg == 'tiny' else 64\n"
                   "    c.plan.strategy = 'semi_homogeneous'\n"
                   "    return c\n")
    out = tmp_path / "plan.npz"
    assert _cli(["plan", "build", "--store", str(real_store.path), "--config", f"{cfg}:tiny", "--set",
                 "semi_homogeneous_proportion=0.5", "--set", "steps=200", "--out", str(out),
                 "--tokenizer", str(minilm_dir)]) == 0
    text = capsys.readouterr().out
    assert "200 steps x 32" in text and "semi-homogeneous: proportion 0.5" in text
    plan = Plan.load(out)
    assert plan.steps == 200 and plan.config["semi_homogeneous_proportion"] == 0.5
    # the precomputed length table is the one the loader looks up
    from jaxembed.data import pipeline
    from jaxembed.tokenizer import Tokenizer

    monkeypatch.setattr(pipeline, "step_lengths", lambda *a, **k: pytest.fail("length table recomputed"))
    lengths = tmp_path / "plan.lengths.npz"
    assert lengths.exists()
    loader = pipeline.make_loader(real_store, plan, Tokenizer.from_folder(minilm_dir), lengths_cache=lengths)
    assert loader.batch(199)["query_input_ids"].shape[0] == 32
    monkeypatch.undo()
    assert _cli(["plan", "show", str(out), "--png", str(tmp_path / "p.png")]) == 0
    text = capsys.readouterr().out
    assert "batches per task" in text and "wrote" in text
    _png_size(tmp_path / "p.png")
    assert _cli(["plan", "show", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 200
    with pytest.raises(UserError, match="unknown field"):
        _cli(["plan", "build", "--store", str(real_store.path), "--set", "bogus=1", "--out", str(out)])
