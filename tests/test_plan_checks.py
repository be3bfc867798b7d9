"""A plan file's stored checks: ``Plan.load`` reads no row of the per-example arrays; each block of steps is checked
(its digest, its ids in range) the first time it is read, before its rows are used; a plan file written without
the stored checks still loads, checked whole; edited or mismatched files are refused with the one-line error."""

import json
import pickle

import numpy as np
import pytest

from data_fakes import make_store
from jaxembed.data.plan import Plan, build_plan
from jaxembed.data.plan import file as F
from jaxembed.data.plan.file import read_steps
from jaxembed.errors import UserError


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(F, "_BLOCK_STEPS", 4)  # blocks of 4 steps: a small plan has many


def _plan(seed=3):
    store = make_store([("ra", "ret", 100, dict(batching="homogeneous")),
                        ("rb", "ret", 70, dict(batching="homogeneous")),
                        ("ca", "cls", 90, dict(batching="heterogeneous"))])
    plan = build_plan(store, {"global_batch_size": 8, "seed": seed})
    assert plan.steps >= 12
    return plan


def _saved(tmp_path):
    plan = _plan()
    return plan, plan.save(tmp_path / "plan.npz")


def _poke(plan, name, step, value):
    """Write ``value`` into row 0 of ``step`` of the array ``name`` in the plan's file, in place."""
    a = getattr(plan, name)
    with open(a.filename, "r+b") as f:
        f.seek(a.offset + step * a.shape[1] * a.itemsize)
        f.write(np.array([value], a.dtype).tobytes())


def test_load_reads_no_row_and_checks_each_block_when_first_read(tmp_path, small_blocks):
    plan, path = _saved(tmp_path)
    back = Plan.load(path)
    assert not back._blocks.done.any()  # nothing of the per-example arrays read at load
    assert back.fingerprint() == plan.fingerprint() and back.used_dataset_ids() == plan.used_dataset_ids()
    assert not back._blocks.done.any()
    np.testing.assert_array_equal(back.step(5)["example_ids"], plan.example_ids[5])
    assert back._blocks.done.tolist() == [b == 1 for b in range(len(back._blocks.done))]
    # a row of a later block edited in place (still in range): the load does not see it, the first read does
    old = int(plan.example_ids[9, 0])
    _poke(back, "example_ids", 9, (old + 1) % int(plan.dataset_sizes[plan.dataset_ids[9, 0]]))
    again = Plan.load(path)
    np.testing.assert_array_equal(read_steps(again.weights, 0, 8), plan.weights[:8])
    with pytest.raises(UserError, match=r"do not match plan\.json \(example_ids of steps 8\.\.11 differ") as e:
        read_steps(again.dataset_ids, 10, 11)
    assert "fix: rebuild the plan" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UserError, match="do not match plan.json"):
        pickle.loads(pickle.dumps(again)).step(9)  # a loader worker's copy checks its blocks too
    with pytest.raises(UserError, match="do not match plan.json"):
        again.row_task_ids()


def test_rows_out_of_range_are_refused_before_use(tmp_path, small_blocks):
    plan = _plan()
    plan.example_ids = plan.example_ids.copy()
    plan.example_ids[6, 2] = plan.dataset_sizes[plan.dataset_ids[6, 2]]  # one past its dataset's end
    back = Plan.load(plan.save(tmp_path / "plan.npz"))
    np.testing.assert_array_equal(read_steps(back.example_ids, 0, 4), plan.example_ids[:4])
    with pytest.raises(UserError, match="example id is out of range"):
        read_steps(back.example_ids, 4, 5)


def test_edited_or_mismatched_sidecar_is_refused_at_load(tmp_path):
    plan, path = _saved(tmp_path)
    side = json.loads((tmp_path / "plan.json").read_text())
    for edit in ({"fingerprint": "0" * 16}, {"checks": dict(side["checks"], block_steps=1)}, {"checks": {}},
                 {"dataset_names": ["ra", "ca", "rb"]}, {"task_names": ["cls", "ret"]}):
        (tmp_path / "plan.json").write_text(json.dumps(dict(side, **edit)))
        with pytest.raises(UserError, match="do not match plan.json"):
            Plan.load(path)
    # the same config with another seed: arrays of the same shapes, of another build
    _plan(seed=4).save(tmp_path / "other.npz")
    (tmp_path / "other.json").replace(tmp_path / "plan.json")
    with pytest.raises(UserError, match="do not match plan.json"):
        Plan.load(path)


def _as_older_file(path):
    """Rewrite a plan file pair as a jaxembed without the stored checks wrote it."""
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files if k not in ("block_digests", "used_dataset_ids")}
    np.savez(path, **arrays)
    side = json.loads(path.with_suffix(".json").read_text())
    del side["checks"]
    path.with_suffix(".json").write_text(json.dumps(side))


def test_a_plan_file_without_stored_checks_loads_checked_whole(tmp_path):
    plan, path = _saved(tmp_path)
    _as_older_file(path)
    back = Plan.load(path)
    assert getattr(back, "_blocks", None) is None and back.fingerprint() == plan.fingerprint()
    assert back.used_dataset_ids() == plan.used_dataset_ids()
    np.testing.assert_array_equal(back.example_ids, plan.example_ids)
    _poke(back, "example_ids", back.steps - 1, (int(plan.example_ids[-1, 0]) + 1) % 70)
    with pytest.raises(UserError, match="do not match plan.json"):
        Plan.load(path)
