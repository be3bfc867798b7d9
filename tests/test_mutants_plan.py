"""The curriculum walk of jaxembed/data/plan/ (curriculum.py, units.py) where its mutation run (docs/testing.md)
found it untested: several rounds (epochs > 1, fractional epochs, step mode longer than one pass), the unit-size and
compression boundaries, the empty walk, the dropped counts. Each test names the mutants it kills (line: original ->
mutant). Pure numpy, no model."""

import numpy as np
import pytest

from data_fakes import make_store
from jaxembed.data import plan as P
from jaxembed.data.plan import build_plan, summarize
from jaxembed.data.plan.curriculum import _compressed_batches
from jaxembed.data.plan.units import check_unit_size, Unit
from jaxembed.errors import UserError


def _cur(**kw):
    return {"enabled": True, "unit": "task", "instance_order": "random", **kw}


def _keys(plan):
    return plan.dataset_ids.astype(np.int64) * 1000 + plan.example_ids


def test_walk_order_of_no_batches_is_empty():
    """walk_order: `np.zeros(0)` -> `np.zeros(-1)` / `np.zeros(1)` in the empty return."""
    for n in ([], [0, 0]):
        for walk in ("cyclic", "balanced"):
            pos, j = P.walk_order(n, walk)
            assert pos.shape == j.shape == (0,) and pos.dtype == j.dtype == np.int64


def test_balanced_walk_by_hand():
    """n = (2, 3), R = 3: unit 0's batch 1 is in cycle floor(1 * 3 / 2) = 1, before unit 1's batch 1 (same cycle,
    later in the order); the mutant `// n[pos]` -> `/ n[pos]` (cycle 1.5) puts it after."""
    pos, j = P.walk_order([2, 3], "balanced")
    assert pos.tolist() == [0, 1, 0, 1, 1] and j.tolist() == [0, 0, 1, 1, 2]
    pos, j = P.walk_order([2, 3], "cyclic")
    assert pos.tolist() == [0, 1, 0, 1, 1] and j.tolist() == [0, 0, 1, 1, 2]
    pos, j = P.walk_order([1, 4], "balanced")  # unit 0 in cycle 0 only; unit 1 in every cycle
    assert pos.tolist() == [0, 1, 1, 1, 1] and j.tolist() == [0, 0, 1, 2, 3]
    pos, _ = P.walk_order([4, 2], "balanced")  # unit 1's batch 1 in cycle floor(1 * 4 / 2) = 2
    assert pos.tolist() == [0, 1, 0, 0, 1, 0]


def test_compressed_batches_by_hand():
    """_compressed_batches: largest remainders (`q - n` -> `q + n`), never past a unit's cap (`-np.inf` ->
    `+np.inf`), None when the steps cover a pass (`steps * G` -> `steps / G`), a cap sum equal to the steps is
    enough (`cap.sum() < steps` -> `<=`)."""
    f = _compressed_batches
    # q = 10 * (35, 45, 20) / 100 = (3.5, 4.5, 2): floors (3, 4, 2) + 1 to the first largest remainder
    np.testing.assert_array_equal(f(np.array([35, 45, 20]), 10, 1), [4, 4, 2])
    # caps (1, 12): q = (1.09, 10.9) -> floors (1, 10); the capped unit 0 cannot take the 12th batch
    np.testing.assert_array_equal(f(np.array([10, 100]), 12, 8), [1, 11])
    # caps (1, 12), q = (1.57, 10.43): the capped unit has the larger remainder and still gets nothing (`n < cap`
    # -> `n <= cap`)
    np.testing.assert_array_equal(f(np.array([15, 100]), 12, 8), [1, 11])
    np.testing.assert_array_equal(f(np.array([15, 15]), 2, 8), [1, 1])  # caps (1, 1) sum to the steps exactly
    assert f(np.array([16, 16]), 4, 8) is None  # 4 batches of 8 cover the 32 rows: a full pass
    assert f(np.array([16, 16]), 3, 8).tolist() == [2, 1]


def test_unit_size_boundaries():
    """check_unit_size: `0 < n < G` -> `0 < n <= G` (a unit of exactly one batch is fine) and -> `0 <= n < G` (an
    empty unit is no error); in a plan the check runs in the first round (`elif r == 0` -> `r == 1`)."""
    infos = make_store([("a", "A", 8, {})]).datasets
    unit = Unit("A", "curriculum", [0])
    check_unit_size(unit, 8, 8, infos, "curriculum unit")
    check_unit_size(unit, 0, 8, infos, "curriculum unit")
    with pytest.raises(UserError, match="1 examples per pass"):  # `0 < n` -> `1 < n`
        check_unit_size(unit, 1, 8, infos, "curriculum unit")
    with pytest.raises(UserError, match="curriculum unit 'A'.*7 examples per pass, fewer than global_batch_size 8"):
        check_unit_size(unit, 7, 8, infos, "curriculum unit")
    store = make_store([("a", "A", 16, {}), ("b", "B", 6, {})])
    with pytest.raises(UserError, match="curriculum unit 'B'"):
        build_plan(store, {"global_batch_size": 8, "curriculum": _cur()}, task_order=["A", "B"])


def test_two_epochs_are_two_whole_rounds():
    """Epoch mode, epochs 2: two rounds, each a whole pass (each instance once per round). Kills the loop's exit
    `steps and total >= steps` -> `steps or ...` and `r >= rounds` -> `r <= rounds` (one round), `r = 0` ->
    `r = 1`, `rounds = ceil(max epochs - 1e-9)` -> `- 1.000000001`."""
    store = make_store([("a", "A", 16, dict(epochs=2)), ("b", "B", 8, dict(epochs=2))])
    plan = build_plan(store, {"global_batch_size": 4, "curriculum": _cur()}, task_order=["A", "B"])
    assert plan.steps == 12 and summarize(plan)["curriculum"]["rounds"] == 2
    three = build_plan(make_store([("a", "A", 8, dict(epochs=3))]), {"global_batch_size": 8, "curriculum": _cur()},
                       task_order=["A"])  # rounds of one batch each (`bd.shape[0] == 0` -> `== 1` ends it early)
    assert three.steps == 3 and three.meta["curriculum"]["rounds"] == 3
    # the plan's bookkeeping (mutants of their start values: `= 0` -> `= 1` / `-1`)
    assert plan.meta["batches_per_unit"] == {"A": 8, "B": 4} and plan.meta["unresolved_in_batch_repeats"] == 0
    assert plan.meta["curriculum"]["truncated_batches"] == 0 and plan.meta["dropped"] == {}
    np.testing.assert_array_equal(plan.unit_ids, plan.task_ids)  # unit = task here, in the same table order
    k = _keys(plan)
    for half in (k[:6], k[6:]):  # round 1, round 2: every instance exactly once
        assert sorted(half.ravel().tolist()) == sorted([i for i in range(16)] + [1000 + i for i in range(8)])


def test_fractional_epochs_take_a_random_part_in_the_last_round():
    """Epochs 1.5 over 16 instances: a whole round, then 8 of them. Kills `floor(epochs + 1e-9)` ->
    `floor(epochs - 0.999999999)`, `rr < full` -> `rr <= full` and `r % rounds` -> `r // rounds`."""
    store = make_store([("a", "A", 16, dict(epochs=1.5)), ("b", "B", 8, {})])
    plan = build_plan(store, {"global_batch_size": 4, "curriculum": _cur()}, task_order=["A", "B"])
    counts = np.bincount(plan.example_ids[plan.dataset_ids == 0], minlength=16)
    assert counts.sum() == 24 and set(counts.tolist()) == {1, 2} and (counts == 2).sum() == 8
    assert np.bincount(plan.example_ids[plan.dataset_ids == 1]).tolist() == [1] * 8
    assert plan.steps == 8


def test_step_mode_past_one_pass_repeats_whole_passes():
    """Step mode with more steps than one pass: the first pass whole, then the next rounds, exactly `steps`
    batches. Kills `total >= steps` -> `total > steps` (truncated batches) and -> `total <= steps` (one round),
    `round_rows(u, 0)` -> `round_rows(u, -1)` and `first[u] if r == 0` -> `if not r == 0` (with epochs 1.5 the
    later rounds differ from the first)."""
    store = make_store([("a", "A", 16, dict(epochs=1.5)), ("b", "B", 8, {})])
    cfg = {"global_batch_size": 4, "curriculum": _cur()}
    one = build_plan(store, cfg, task_order=["A", "B"])
    plan = build_plan(store, dict(cfg, steps=16), task_order=["A", "B"])  # exactly two epoch-mode plans
    assert plan.steps == 16 and summarize(plan)["curriculum"]["truncated_batches"] == 0
    k = _keys(plan)
    assert sorted(k[:6].ravel().tolist()) == sorted(list(range(16)) + [1000 + i for i in range(8)])  # pass 1
    np.testing.assert_array_equal(plan.task_ids[:8], one.task_ids)
    assert np.bincount(plan.example_ids[plan.dataset_ids == 0], minlength=16).sum() == 48  # 2 x 24
    # one batch past a pass: a second round, truncated to the steps (`total = 0` -> `1`, `total += bd.shape[0]` ->
    # `bd.shape[1]`, `DS.shape[0] - steps` -> `DS.shape[1] - steps`)
    nine = build_plan(store, dict(cfg, steps=9), task_order=["A", "B"])
    assert nine.steps == 9 and nine.meta["curriculum"]["truncated_batches"] == 5  # rounds of 6, 2, 6 batches
    np.testing.assert_array_equal(nine.example_ids, plan.example_ids[:9])
    # epochs 1: two passes are two rounds (`r % max(rounds, 1)` -> `max(rounds, 2)` counts empty rounds)
    whole = make_store([("a", "A", 16, {}), ("b", "B", 8, {})])
    two = build_plan(whole, dict(cfg, steps=12), task_order=["A", "B"])
    assert two.steps == 12 and two.meta["curriculum"]["rounds"] == 2
    assert two.meta["curriculum"]["truncated_batches"] == 0


def test_step_mode_is_not_cut_short_by_a_round_without_a_whole_batch():
    """A fractional epoch whose extra round has less than a batch in every unit (epochs 1.1 of 16 = 2 rows, batch
    8): step mode still gives every step asked for (a loop that went on only while a round had a batch would give 3
    steps of 100; kills the mutant `bd.shape[0] == 0` -> `bd.shape[-1] == 0` of that guard)."""
    store = make_store([("a", "A", 16, dict(epochs=1.1)), ("b", "B", 8, {})])
    plan = build_plan(store, {"global_batch_size": 8, "steps": 100, "curriculum": _cur()}, task_order=["A", "B"])
    assert plan.steps == 100
    ep = build_plan(store, {"global_batch_size": 8, "curriculum": _cur()}, task_order=["A", "B"])
    assert ep.steps == 3 and summarize(ep)["dropped_total"] == 2  # epoch mode: the 2 extra rows dropped


def test_dropped_counts_name_the_dataset():
    """meta['dropped']: per dataset `d_all[:, 0] == d` (mutants `d_all[:, 1]` / `d_all[:, -1]`)."""
    store = make_store([("a", "A", 11, {}), ("b", "B", 6, {})])
    plan = build_plan(store, {"global_batch_size": 4, "curriculum": _cur()}, task_order=["A", "B"])
    assert plan.meta["dropped"] == {"a": 3, "b": 2}
    assert sorted(plan.dropped[:, 0].tolist()) == [0, 0, 0, 1, 1]


def test_empty_and_unused_datasets_are_no_units():
    """A dataset of size 0 or epochs 0 is no curriculum unit (`sizes[d] > 0` -> `> -1` / `>= 0`,
    `epochs[d] > 0` -> `> -1`): the order need not name it."""
    store = make_store([("a", "A", 16, dict(epochs=0)), ("z", "Z", 0, {}), ("b", "B", 8, {})])
    plan = build_plan(store, {"global_batch_size": 8, "curriculum": _cur(unit="dataset")}, task_order=["b"])
    assert plan.steps == 1 and [u["name"] for u in plan.meta["units"]] == ["b"]
    one = make_store([("a", "A", 1, {}), ("b", "B", 2, {})])  # a one-example dataset is a unit (`sizes[d] > 1`)
    plan = build_plan(one, {"global_batch_size": 1, "curriculum": _cur(unit="dataset")}, task_order=["a", "b"])
    assert plan.steps == 3 and plan.meta["batches_per_unit"] == {"a": 1, "b": 2}
