"""On 8 simulated CPU devices: the default run -- packed rows and dropout on -- trained on all 8 devices and on one
of them ends with the same model (every logged loss, every parameter). The two runs pack each step's texts
into different rows (8 shards of one query each, or one shard of all), so this holds only because a text's dropout
masks follow its global id and positions within the step, not its row or device (jaxembed.models.dropout)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from jaxembed import config as cfglib
from packed_reference import two_datasets

STEPS = 4


def _config(model_dir, data_dir, store):
    c = cfglib.default_config()  # data.packing and train.dropout as they come
    c.model.name = str(model_dir)
    c.model.max_length = 32
    c.data.datasets = two_datasets(data_dir)
    c.data.store = str(store)
    c.plan.global_batch_size = 8  # one query (and its candidates) per device on 8 devices
    c.plan.steps = STEPS
    c.optim.lr = 1e-3
    # Adam's epsilon above float32 reduction noise: the two runs sum the same gradients in another order (~1e-7
    # relative); at 1e-8 an element whose gradient is that noise moves by +-lr per step in one run only
    c.optim.eps = 1e-6
    c.train.log_every = 1
    c.train.checkpoint_every = 0  # the last step is saved
    c.train.async_checkpoints = False
    c.export.at_end = False
    return c


def _final_params(workdir):
    import orbax.checkpoint as ocp

    with ocp.CheckpointManager(workdir.absolute() / "checkpoints") as mgr:
        return mgr.restore(STEPS, args=ocp.args.StandardRestore())["params"]


def test_default_run_is_the_same_model_on_one_and_eight_devices(tmp_path, monkeypatch):
    from jaxembed import parallel, paths
    from jaxembed.data.store import write_store
    from jaxembed.models.tiny import tiny_model_dir
    from jaxembed.train import train

    assert jax.device_count() == 8
    data = paths.shared_data_dir()
    if not (data / "train").is_dir():
        pytest.fail(f"shared data folder {data} is missing")
    for name, src in (("stsb", "stsb_pairs"), ("wikiqa", "wikiqa")):
        lines = (data / "train" / f"{src}.jsonl").read_text(encoding="utf-8").splitlines(True)[:80]
        (tmp_path / f"{name}.jsonl").write_text("".join(lines), encoding="utf-8")
    model_dir = tiny_model_dir("bert", num_layers=1)
    hf_config = json.loads((model_dir / "config.json").read_text())
    assert hf_config.get("hidden_dropout_prob", 0.1) > 0 and hf_config.get("attention_probs_dropout_prob", 0.1) > 0
    store = tmp_path / "store"
    c = _config(model_dir, tmp_path, store)
    assert cfglib.packing_enabled(c) and c.train.dropout  # the defaults under test
    write_store(cfglib.data_section(c), store)

    make_mesh = parallel.make_mesh
    logs, params, rows = {}, {}, {}
    for devices in (8, 1):
        if devices == 1:
            monkeypatch.setattr(parallel, "make_mesh", lambda data=-1, fsdp=1, tensor=1, devices=None: make_mesh(
                data, fsdp, tensor, devices=jax.devices()[:1]))
        wd = tmp_path / f"d{devices}"
        s = train(_config(model_dir, tmp_path, store), wd)
        assert s["status"] == "completed" and s["step"] == STEPS and s["skipped"] == 0
        lines = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines()]
        logs[devices] = [x for x in lines if x["split"] == "train"]
        params[devices] = _final_params(wd)
        with np.load(wd / "plan_lengths.npz") as z:
            rows[devices] = z["pack_rows"].copy()
    # the runs packed the texts differently: 8 shards of one query and its candidates, or one shard of all of them
    assert not np.array_equal(rows[8], rows[1]), rows
    a, b = logs[8], logs[1]
    assert [x["step"] for x in a] == [x["step"] for x in b] == list(range(1, STEPS + 1))
    for x, y in zip(a, b):
        for k in ("loss", "accuracy", "pos_sim", "hardest_neg_sim", "grad_norm"):
            assert y[k] == pytest.approx(x[k], rel=1e-5, abs=1e-6), (x["step"], k, x[k], y[k])
    worst = max(float(np.abs(np.asarray(p, np.float64) - np.asarray(q, np.float64)).max())
                for p, q in zip(jax.tree.leaves(params[8]), jax.tree.leaves(params[1])))
    # reduction order: ~5e-7 on most parameters, up to ~1e-5 on the word-embedding rows of tokens seen once, where
    # Adam divides a gradient of the order of its epsilon (masks drawn per row change the first loss by ~1e-2)
    assert worst <= 5e-5, worst
