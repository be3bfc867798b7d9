"""Plans built in blocks (``build_plan_file``): the same plan as ``build_plan`` and as the plans jaxembed built in
memory before (fixed fingerprints), for every strategy, mode and curriculum; a peak memory that is a small
fraction of the plan's bytes; and a pod on which only process 0 builds the plan, the others comparing the plan's
inputs (``plan_inputs``) with process 0's."""

from __future__ import annotations

import hashlib
import json
import tracemalloc

import numpy as np
import pytest

from data_fakes import make_store
from jaxembed.data.plan import Plan, blocks, build_plan, build_plan_file, file as plan_file, plan_inputs
from jaxembed.errors import UserError


def _mixed(ra: int = 100):
    return make_store([
        ("ra", "ret", ra, dict(batching="homogeneous", temperature=0.03)),
        ("rb", "ret", 70, dict(batching="homogeneous", temperature=0.03, epochs=2)),
        ("ca", "cls", 90, dict(batching="heterogeneous", temperature=0.05)),
        ("cb", "cls", 45, dict(batching="heterogeneous", temperature=0.05, epochs=1.5)),
        ("sa", "sts", 60, dict(batching="random")),
        ("na", "nli", 80, dict(batching="random")),
    ])


def _scores(store):
    r = np.random.default_rng(3)
    return {i.name: r.normal(size=i.size) for i in store.datasets}


def _orders(store):
    r = np.random.default_rng(5)
    return {i.name: np.stack([np.full(i.size, k), r.permutation(i.size)], 1) for k, i in enumerate(store.datasets)}


UNITS = ["cb", "ra", "na", "rb", "sa", "ca"]
# name: (plan config, inputs, (fingerprint, digest of meta + config + seed + dropped) of the plan jaxembed built
# in memory, all at once, before plans were built in blocks; the sampled plans' since a fractional epoch's subset
# is drawn range by range (``passes.subset``), as every case's store has a dataset at 1.5 epochs)
CASES = {
    "epochs_mixed": (dict(global_batch_size=8), {}, ("712988d2c91eae35", "7981c53bf2cdf835")),
    "epochs_keep_remainder": (dict(global_batch_size=8, drop_remainder=False, epochs=2.5), {},
                              ("28836bc4d411800f", "5db57d4e09daf627")),
    "temperature": (dict(global_batch_size=8, sampling="temperature", sampling_temperature=2.0), {},
                    ("d3d44cdd7e551cfb", "4953654d40f1ccd4")),
    "steps": (dict(global_batch_size=8, steps=60, sampling="weights"), {}, ("efe402b2f4d3700b", "1df5e3d7427fe823")),
    "semi": (dict(global_batch_size=8, task_strategies={"ret": "semi_homogeneous", "cls": "semi_homogeneous"},
                  semi_homogeneous_proportion=0.5), {}, ("bc1bb697d7d9efe8", "033e7c90ba5ce34c")),
    "semi_steps": (dict(global_batch_size=8, steps=50, strategy="semi_homogeneous"), {},
                   ("8474739138bc9fc5", "a2c211c3cc85bc37")),
    "mask": (dict(global_batch_size=8, mask={"delta": 0.0}), {"scores": True},
             ("22249e43cf764325", "a6fc818fa2c877d6")),
    "curriculum": (dict(global_batch_size=8, curriculum={"enabled": True, "instance_order": "e2d"}),
                   {"scores": True, "order": UNITS}, ("236d48dccda7b873", "249c109d2c3ddc8b")),
    "curriculum_balanced_epochs": (
        dict(global_batch_size=8, epochs=1.5, drop_remainder=False,
             curriculum={"enabled": True, "walk": "balanced", "instance_order": "random"}),
        {"order": UNITS}, ("b3337cc45d5704d5", "019386ee709debe0")),
    "curriculum_task_steps": (
        dict(global_batch_size=8, steps=20, curriculum={"enabled": True, "unit": "task", "instance_order": "d2e"},
             mask={"delta": 0.1, "direction": "printed"}),
        {"scores": True, "order": ["nli", "cls", "ret", "sts"]}, ("5f3ec5a0d17fbfb8", "800a6d87d173f8a3")),
    "curriculum_given_long": (
        dict(global_batch_size=8, steps=90, curriculum={"enabled": True, "instance_order": "given"}),
        {"order": UNITS, "given": True}, ("75880661f52b4922", "a6f3d5c85ce4cbc7")),
}


def _kwargs(store, opt):
    kw = {}
    if opt.get("scores"):
        kw["scores"] = _scores(store)
    if opt.get("order"):
        kw["task_order"] = opt["order"]
    if opt.get("given"):
        kw["instance_orders"] = _orders(store)
    return kw


def _digest(plan):
    h = hashlib.sha256(json.dumps([plan.meta, plan.config, plan.seed], sort_keys=True, default=str).encode())
    h.update(np.ascontiguousarray(plan.dropped).tobytes())
    return plan.fingerprint(), h.hexdigest()[:16]


@pytest.mark.parametrize("name", list(CASES))
def test_block_built_plan_equals_the_in_memory_plan(name, tmp_path, monkeypatch):
    """Blocks of 3 steps (of 1 for the semi-homogeneous swaps, whose repeats are swapped out along a window of 64
    batches that then spans many blocks): the file holds the plan ``build_plan`` builds, which is the plan jaxembed
    built before blocks existed."""
    cfg, opt, want = CASES[name]
    monkeypatch.setattr(blocks, "BLOCK_EXAMPLES", 8 if name.startswith("semi") else 24)
    monkeypatch.setattr(plan_file, "_BLOCK_STEPS", 2)
    store = _mixed()
    mem = build_plan(store, cfg, **_kwargs(store, opt))
    got = build_plan_file(tmp_path / "plan.npz", store, cfg, **_kwargs(store, opt))
    assert _digest(mem) == want and _digest(got) == want
    for k in ("dataset_ids", "example_ids", "weights", "task_ids", "temperatures", "unit_ids", "dropped"):
        np.testing.assert_array_equal(getattr(got, k), getattr(mem, k), err_msg=k)
    assert isinstance(got.example_ids, np.memmap)  # read back from its file, memory-mapped
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "plan.npz"]  # no scratch left


def test_semi_homogeneous_repeats_swapped_across_blocks(tmp_path, monkeypatch):
    """Tiny datasets at 6 epochs: the shuffled rows bring repeats into many batches; swapping them out a block at
    a time gives the plan of the swaps done all at once."""
    store = make_store([("a", "t", 24, dict(epochs=6)), ("b", "t", 20, dict(epochs=6)), ("c", "u", 30, {})])
    cfg = dict(global_batch_size=8, strategy="semi_homogeneous", semi_homogeneous_proportion=0.75)
    mem = build_plan(store, cfg)
    for examples in (8, 40):
        monkeypatch.setattr(blocks, "BLOCK_EXAMPLES", examples)
        got = build_plan_file(tmp_path / f"p{examples}.npz", store, cfg)
        assert _digest(got) == _digest(mem)
    assert mem.meta["unresolved_in_batch_repeats"] == 0 and mem.meta["semi_homogeneous"]["batches"] == mem.steps


def test_building_in_blocks_holds_a_small_fraction_of_the_plan(tmp_path, monkeypatch):
    """60 datasets x 2,500 examples, batches of 32 (2.4 MB of plan arrays): the Python/numpy allocation peak while
    building in blocks of 4,096 examples is under a fifth of the plan's bytes (one unit's batches and one block);
    building in memory holds the whole plan and more."""
    monkeypatch.setattr(blocks, "BLOCK_EXAMPLES", 4096)
    monkeypatch.setattr(plan_file, "_BLOCK_STEPS", 128)
    store = make_store([(f"d{k}", f"t{k % 4}", 2500, dict(batching="homogeneous")) for k in range(60)])
    cfg = dict(global_batch_size=32)
    build_plan_file(tmp_path / "warm.npz", make_store([("x", "t", 100, {})]), cfg)  # imports outside the measure
    plan_bytes = 60 * 2500 * (4 + 8 + 4)
    tracemalloc.start()
    try:
        plan = build_plan_file(tmp_path / "plan.npz", store, cfg)
        _, blocked = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        build_plan(store, cfg)
        _, in_memory = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert plan.steps * plan.global_batch_size == 150_000 - 60 * (2500 % 32)
    assert blocked < plan_bytes / 5, (blocked, plan_bytes)
    assert in_memory > plan_bytes, (in_memory, plan_bytes)


# ------------------------------------------------------------------------------------------------- pod

def _run_config(steps: int = 0):
    from jaxembed import config as cfglib

    cfg = cfglib.default_config()
    cfg.plan.global_batch_size = 8
    cfg.plan.steps = steps
    return cfg


def _as_process_1(monkeypatch, main_inputs: dict, calls: list):
    from jaxembed import pod

    monkeypatch.setattr(pod, "is_main", lambda: False)
    monkeypatch.setattr(pod, "process_index", lambda: 1)
    monkeypatch.setattr(pod, "broadcast", lambda name, value=None: json.dumps(main_inputs))
    monkeypatch.setattr(pod, "main_first", lambda name, fn: calls.append(name))
    monkeypatch.setattr(pod, "all_agree", lambda name, fn: fn())


def test_only_process_0_builds_the_plan(tmp_path, monkeypatch):
    """Process 1 of a pod (pod functions faked) builds nothing: it checks its inputs against process 0's, waits,
    and maps the saved plan; with another dataset size it stops, naming itself and the dataset."""
    from jaxembed.train import run, saved_plan

    cfg, store = _run_config(), _mixed()
    main = run.prepare_plan(cfg, store, tmp_path)  # process 0 (one process): builds and saves
    assert json.loads((tmp_path / "plan.json").read_text())["inputs"] == saved_plan.plan_inputs_of(cfg, store)

    def no_build(*a, **k):
        raise AssertionError("process 1 built a plan")

    calls: list = []
    _as_process_1(monkeypatch, saved_plan.plan_inputs_of(cfg, store), calls)
    monkeypatch.setattr(run, "_build_plan", no_build)
    got = run.prepare_plan(cfg, store, tmp_path)
    assert calls == ["plan"] and got.fingerprint() == main.fingerprint()
    with pytest.raises(UserError, match=r"^process 1 reads other data than process 0: dataset 'ra' \(size 100 vs "
                                        r"101\) \(process 0's -> this process's\); .*\(fix: every host must see "
                                        r"the same data files\)$"):
        run.prepare_plan(cfg, _mixed(ra=101), tmp_path)


def test_saved_plan_kept_checked_or_refused(tmp_path, monkeypatch):
    """A resume keeps a saved plan that records the same inputs without building it; one saved without inputs
    (an older jaxembed) is compared with the config's plan built beside it; one of other data is refused."""
    from jaxembed.train import run

    cfg, store = _run_config(), _mixed()
    run.prepare_plan(cfg, store, tmp_path)
    built = []
    real = run._build_plan
    monkeypatch.setattr(run, "_build_plan", lambda *a, **k: built.append(1) or real(*a, **k))
    run.prepare_plan(cfg, store, tmp_path)
    assert built == []
    side = json.loads((tmp_path / "plan.json").read_text())
    del side["inputs"]
    (tmp_path / "plan.json").write_text(json.dumps(side))
    assert Plan.load(tmp_path / "plan.npz").steps == run.prepare_plan(cfg, store, tmp_path).steps and built == [1]
    with pytest.raises(UserError, match=r"plan.npz: the saved plan differs from the one the config builds .*fix: use "
                                        r"a new --workdir$"):
        run.prepare_plan(cfg, _mixed(ra=101), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "plan.npz"]
    run.prepare_plan(_run_config(steps=7), store, tmp_path, replan=True)  # a run trained on: built anew
    assert Plan.load(tmp_path / "plan.npz").steps == 7


def test_saved_plan_of_an_earlier_draw_resumed_as_saved(tmp_path, monkeypatch):
    """A plan saved by a jaxembed that drew its passes otherwise (here: rows 0 and 1 swapped, as a fractional
    epoch's earlier subset would differ) but records the config's inputs: a resume keeps it as saved, not built."""
    import dataclasses

    from jaxembed.train import run, saved_plan

    cfg, store = _run_config(), _mixed()
    path = tmp_path / "plan.npz"
    first = run.prepare_plan(cfg, store, tmp_path)
    swap = [1, 0, *range(2, first.steps)]
    older = dataclasses.replace(first, **{k: np.asarray(getattr(first, k))[swap] for k in (
        "dataset_ids", "example_ids", "task_ids", "weights", "temperatures", "unit_ids")})
    older.save(tmp_path / "older.npz", sidecar={"inputs": saved_plan.saved_inputs(path)})
    for suffix in (".npz", ".json"):
        (tmp_path / f"older{suffix}").replace(path.with_suffix(suffix))
    monkeypatch.setattr(run, "_build_plan", lambda *a, **k: pytest.fail("a saved plan with its inputs was rebuilt"))
    again = run.prepare_plan(cfg, store, tmp_path)
    assert again.fingerprint() == older.fingerprint() != first.fingerprint()
    np.testing.assert_array_equal(again.example_ids[0], first.example_ids[1])

def test_plan_inputs_name_what_differs():
    from jaxembed.data.plan import inputs_differences

    a = plan_inputs(_mixed(), {"global_batch_size": 8})
    assert inputs_differences(a, json.loads(json.dumps(a))) == []
    b = plan_inputs(_mixed(), {"global_batch_size": 16})
    assert inputs_differences(b, a) == ["the plan config"]
    c = plan_inputs(_mixed(), {"global_batch_size": 8}, {"seed": 1})
    assert inputs_differences(c, a) == ["the data config's sampling, sampling_temperature or seed"]
    # many datasets: process 0 sends their digest without the rows, and a difference is named as a whole
    from jaxembed.data.plan.identity import compact

    small = compact(plan_inputs(_mixed(ra=101), {"global_batch_size": 8}), limit=0)
    assert "datasets" not in small and compact(a) == a
    assert inputs_differences(a, small) == ["the store's datasets (names, tasks, sizes, batching, epochs, weights, "
                                            "temperatures or record files)"]
