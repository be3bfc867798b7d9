"""The curriculum's instance orders file: ``jaxembed curriculum`` writes it binary (``instance_orders.npz``: unit
offsets, dataset ids int32, example ids int64), the plan maps it and reads one unit at a time, and the plan it
gives is the plan of the curriculum's own order; the JSON files of earlier versions still read."""

from __future__ import annotations

import json

import numpy as np
import pytest

from data_fakes import make_store
from jaxembed.curriculum import similarity as sim
from jaxembed.curriculum.build import run_curriculum
from jaxembed.data.plan import build_plan, load_instance_orders, save_instance_orders
from jaxembed.data.plan.npz import mapped_npz
from jaxembed.errors import UserError


def _store():
    return make_store([("a", "T1", 40, dict(batching="homogeneous")), ("b", "T1", 24, dict(batching="homogeneous")),
                       ("c", "T2", 32, dict(batching="homogeneous"))])


@pytest.fixture
def curriculum(tmp_path):
    """``run_curriculum`` on scores written by hand (rounded: ties to break), dataset units."""
    store = _store()
    rng = np.random.default_rng(0)
    scores = {i.name: np.round(rng.normal(size=i.size), 1) for i in store.datasets}
    sc = tmp_path / "score"
    sc.mkdir()
    np.savez(sc / "scores.npz", **scores)
    sim.save_similarity(sc / "task_similarity.npz", np.array([[1, .5, .2], [.5, 1, .3], [.2, .3, 1]]),
                        ["a", "b", "c"], "dataset", [40, 24, 32], {})
    run_curriculum(sc, tmp_path / "cur", store=store, objective="random", delta=0.0)
    return store, scores, tmp_path / "cur"


def _plans_equal(p, q):
    for k in ("dataset_ids", "example_ids", "weights", "task_ids"):
        np.testing.assert_array_equal(getattr(p, k), getattr(q, k), err_msg=k)


def test_curriculum_writes_binary_orders_that_give_the_curriculum_plan(curriculum, tmp_path):
    store, scores, cur = curriculum
    io = cur / "instance_orders.npz"
    snippet = json.loads((cur / "plan_curriculum.json").read_text())
    assert snippet["curriculum"]["instance_orders"] == str(io.resolve()) and not (cur / "instance_orders.json").exists()
    arrays = mapped_npz(io, ("dataset_ids", "example_ids"))
    assert isinstance(arrays["example_ids"], np.memmap) and arrays["example_ids"].dtype == np.int64
    assert arrays["dataset_ids"].dtype == np.int32 and arrays["offsets"].tolist() == [0, 40, 64, 96]
    orders = load_instance_orders(io, store, {"a": [0], "b": [1], "c": [2]})
    a = orders["a"]
    assert a.shape == (40, 2) and (a[:, 0] == 0).all() and (np.diff(scores["a"][a[:, 1]]) <= 0).all()  # e2d
    cfg = {**snippet, "global_batch_size": 8}
    given = build_plan(store, cfg)
    own = build_plan(store, {**cfg, "curriculum": {**cfg["curriculum"], "instance_order": "e2d",
                                                   "instance_orders": ""}})
    _plans_equal(given, own)
    assert (given.weights == 0).any()  # the Eq. 9 mask of --delta 0 applies

    # the same orders as the JSON of earlier versions, and as the older .npz layout ({unit: [n, 2]})
    pairs = {u: load_instance_orders(io, store, {u: [k]})[u] for k, u in enumerate("abc")}
    old_json = tmp_path / "instance_orders.json"
    old_json.write_text(json.dumps({u: [["abc"[int(d)], int(e)] for d, e in v] for u, v in pairs.items()}))
    old_npz = tmp_path / "old_orders.npz"
    np.savez(old_npz, **pairs)
    for old in (old_json, old_npz):
        _plans_equal(build_plan(store, {**cfg, "curriculum": {**cfg["curriculum"], "instance_orders": str(old)}}),
                     given)


def test_orders_file_errors_name_the_file_and_the_unit(tmp_path):
    store = _store()
    units = {"a": [0], "b": [1], "c": [2]}
    good = {u: np.stack([np.full(i.size, k), np.arange(i.size)], 1) for k, (u, i) in enumerate(zip("abc",
                                                                                                   store.datasets))}
    path = tmp_path / "orders.npz"
    save_instance_orders(path, good, ["a", "b", "c"])
    assert load_instance_orders(path, store, units)["c"].tolist() == good["c"].tolist()
    # written with the datasets in another order: ids follow the names
    save_instance_orders(path, {"a": np.stack([np.ones(40, int), np.arange(40)], 1)}, ["x", "a"])
    with pytest.raises(UserError, match=r"orders.npz: field 'dataset_names': datasets \['x'\] are not in the store"):
        load_instance_orders(path, store, units)
    save_instance_orders(path, {"a": np.stack([np.ones(40, int), np.arange(40)], 1)}, ["b", "a"])
    np.testing.assert_array_equal(load_instance_orders(path, store, {"a": [0]})["a"], good["a"])
    with pytest.raises(UserError, match=r"orders.npz: no order for 'b' \(fix: "):
        load_instance_orders(path, store, units)
    bad = dict(good, b=good["b"][[0] * 24])
    save_instance_orders(path, bad, ["a", "b", "c"])
    orders = load_instance_orders(path, store, units)
    with pytest.raises(UserError, match=r"orders.npz: the order of 'b' is not a permutation of its 24 examples"):
        orders["b"]
