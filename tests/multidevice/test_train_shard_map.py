"""On 8 simulated CPU devices: the trainer's ``loss.impl='shard_map'`` branch (explicit all_gather / psum) against
``loss.impl='jit'`` in real training runs through ``jaxembed.train`` (a tiny BERT, PEG with its momentum, the
symmetric term and same-task masking in mixed-task batches): the same logged metrics every step and the same
parameters and PEG momentum at the end."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from jaxembed import config as cfglib

STEPS = 3


def _config(model_dir, data_dir, store, impl):
    from jaxembed.data.config import dataset_config

    c = cfglib.default_config()
    c.model.name = str(model_dir)
    c.model.max_length = 32
    c.data.datasets = [
        dataset_config(name="stsb", path=str(data_dir / "stsb.jsonl"), format="scored_pairs", task_type="sts",
                       score_threshold=3.0, num_negatives=0, max_query_length=16, max_doc_length=16),
        dataset_config(name="wikiqa", path=str(data_dir / "wikiqa.jsonl"), task_type="retrieval", num_negatives=1,
                       query_instruction="Instruct: Given a question, retrieve answers \n Query: ",
                       max_query_length=16, max_doc_length=16),
    ]
    c.data.store = str(store)
    c.plan.global_batch_size = 16  # 2 queries, 4 candidates per device
    c.plan.steps = STEPS
    c.plan.strategy = "random"  # mixed-task batches: same_task_mask has something to mask
    c.loss.type = "peg"
    c.loss.symmetric = True
    c.loss.same_task_mask = True
    c.loss.impl = impl
    c.optim.lr = 1e-2
    c.optim.warmup_steps = 0
    c.train.dropout = False
    c.train.log_every = 1
    c.train.checkpoint_every = 0  # the last step is saved
    c.train.async_checkpoints = False
    c.export.at_end = False
    return c


def _final_state(workdir):
    import orbax.checkpoint as ocp

    with ocp.CheckpointManager(workdir.absolute() / "checkpoints") as mgr:
        return mgr.restore(STEPS, args=ocp.args.StandardRestore())


def test_shard_map_training_equals_jit(tmp_path):
    from jaxembed import paths
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
    store = tmp_path / "store"
    write_store(cfglib.data_section(_config(model_dir, tmp_path, "", "jit")), store)

    logs, states = {}, {}
    for impl in ("jit", "shard_map"):
        wd = tmp_path / impl
        s = train(_config(model_dir, tmp_path, store, impl), wd)
        assert s["status"] == "completed" and s["step"] == STEPS and s["skipped"] == 0
        assert json.loads((wd / "config.json").read_text())["loss"]["impl"] == impl
        lines = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines()]
        logs[impl] = [x for x in lines if x["split"] == "train"]
        states[impl] = _final_state(wd)

    a, b = logs["jit"], logs["shard_map"]
    assert [x["step"] for x in a] == [x["step"] for x in b] == list(range(1, STEPS + 1))
    keys = ("loss", "accuracy", "pos_sim", "hardest_neg_sim", "masked_candidates", "active_queries", "grad_norm", "lr",
            "peg_t", "peg_sigma", "peg_mean_weight")
    for x, y in zip(a, b):
        for k in keys:
            assert y[k] == pytest.approx(x[k], rel=1e-4, abs=1e-5), (x["step"], k, x[k], y[k])
    # the runs reached what they compare: PEG's weights below 1, masked candidates, changing parameters
    assert min(x["peg_mean_weight"] for x in a) < 1 and all(x["peg_sigma"] > 0 for x in a)
    assert all(x["masked_candidates"] > 0 for x in a)
    ja, sa = states["jit"], states["shard_map"]
    assert float(sa["peg_t"]) == pytest.approx(float(ja["peg_t"]), abs=1e-6) and float(ja["peg_t"]) > 0
    for p, q in zip(jax.tree.leaves(ja["params"]), jax.tree.leaves(sa["params"])):
        np.testing.assert_allclose(np.asarray(q), np.asarray(p), atol=2e-5)
