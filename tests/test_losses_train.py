"""A short real run of every new loss on the shared STS data (``jaxembed train`` on one CPU device): STS-B pairs under
CoSENT, SICK pairs under AnglE and SNLI triplets scored by ``jaxembed teacher-score`` under InfoNCE + KL
distillation with GIST's guide, all in one run (each dataset its own loss); the STS-B dev score goes up and each
loss was trained (its metric logged, the guide masked candidates). The same recipe with MiniLM, each loss against
InfoNCE: benchmarks/losses_sts.py (docs/losses.md)."""

from __future__ import annotations

import json

import pytest

from jaxembed.cli import main

STEPS = 90  # the dev score: 44.28 -> 45.96


def test_every_new_loss_trains_in_one_run_and_the_dev_score_goes_up(tmp_path, shared_data, capsys):
    from jaxembed import config as cfglib
    from jaxembed.data.config import dataset_config
    from jaxembed.models.tiny import tiny_model_dir
    from jaxembed.train import train

    model = tiny_model_dir("bert", num_layers=1)  # each loss acts on the pooled embedding, not on the depth
    for name, src, n in (("stsb", "stsb_pairs", 300), ("sick", "sick_pairs", 400), ("nli", "snli_triplets", 64)):
        lines = (shared_data / "train" / f"{src}.jsonl").read_text(encoding="utf-8").splitlines(True)[:n]
        (tmp_path / f"{name}.jsonl").write_text("".join(lines), encoding="utf-8")
    # the teacher: the base model itself (the only one at hand); its scores are the cosines teacher-score writes
    assert main(["teacher-score", "--model", str(model), "--input", str(tmp_path / "nli.jsonl"), "--out",
                 str(tmp_path / "nli.scored.jsonl"), "-q"]) == 0
    c = cfglib.default_config()
    c.model.name = str(model)
    c.model.max_length = 16  # one length bucket: one compilation of the step
    c.data.packing = False
    c.data.datasets = [
        dataset_config(name="stsb", path=str(tmp_path / "stsb.jsonl"), format="scored_pairs", task_type="sts",
                       num_negatives=0, loss="cosent"),
        dataset_config(name="sick", path=str(tmp_path / "sick.jsonl"), format="scored_pairs", task_type="sts",
                       task="sick", num_negatives=0, loss="angle", extra_fields=["entailment"]),
        dataset_config(name="nli", path=str(tmp_path / "nli.scored.jsonl"), task_type="nli", num_negatives=1,
                       query_instruction=""),
    ]
    c.plan.global_batch_size = 16
    c.plan.steps = STEPS
    c.loss.distill = "kl"
    c.loss.gist_guide = str(model)
    c.optim.lr = 1e-3
    c.train.log_every = 5
    c.train.checkpoint_every = 0
    c.eval.tasks = ("STSBenchmark-dev",)
    c.eval.max_examples = 300
    c.eval.every = STEPS
    c.eval.before = True
    c.export.at_end = False
    summary = train(c, tmp_path / "run")
    assert summary["status"] == "completed" and summary["skipped"] == 0
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    dev = [r["STSBenchmark-dev/main_score"] for r in rows if r["split"] == "eval"]
    assert len(dev) == 2 and dev[1] > dev[0] + 0.5, dev
    train_rows = [r for r in rows if r["split"] == "train"]
    assert len(train_rows) == STEPS // 5
    # one task per batch: every step trained one dataset's loss, and each loss had its steps
    for key in ("cosent_loss", "angle_loss", "distill_loss"):
        assert sum(r[key] > 0 for r in train_rows) >= 2, key
    assert sum(r["masked_candidates"] for r in train_rows) > 0  # GIST's guide (no duplicates in these texts)
