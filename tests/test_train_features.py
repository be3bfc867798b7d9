"""Training features outside the 8-device run (tests/multidevice/test_train_features.py): the analytic FLOP count
behind MFU against a hand count (tests/flops_reference.py), and, on an accelerator only (marked ``gpu``), MFU in
a real run's metrics."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flops_reference import computed_rows
from flops_reference import train_step_flops as hand_count

BERT_BASE = dict(model_type="bert", vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072, max_position_embeddings=512)
QWEN2_05B = dict(model_type="qwen2", vocab_size=151936, hidden_size=896, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864, max_position_embeddings=32768)


@pytest.mark.parametrize("arch", ["bert", "qwen2", "t5", "bert-base", "qwen2-0.5b"])
@pytest.mark.parametrize("gradcache", [False, True])
def test_step_flops_equal_a_hand_count(arch, gradcache):
    from jaxembed import flops, models
    from jaxembed.models.tiny import tiny_hf_config

    hf = {"bert-base": BERT_BASE, "qwen2-0.5b": QWEN2_05B}.get(arch) or tiny_hf_config(arch)
    cfg = models.config_from_hf(hf)
    B, lq, K, ld = 16, 32, 2, 64
    dim = cfg.hidden_size
    got = flops.train_step_flops(cfg, B, lq, B * K, ld, dim, gradcache)
    assert got == pytest.approx(hand_count(hf, B, lq, B * K, ld, dim, gradcache), rel=1e-12)
    if arch == "bert-base":  # the rule of thumb: 6 x (non-embedding) parameters x tokens (+ attention), 8 x with
        params = 12 * (4 * 768 * 768 + 2 * 768 * 3072)  # the gradient cache's second forward
        rule = (8 if gradcache else 6) * params * (B * lq + B * K * ld)
        assert rule < got < 1.2 * rule


@pytest.mark.gpu
def test_mfu_is_logged_on_an_accelerator(shared_data, tmp_path, monkeypatch):
    """A few bf16 steps of a tiny BERT on the accelerator: every logged train line carries MFU, equal to the
    analytic FLOPs of the step over its time and the device's datasheet peak."""
    import jax

    from jaxembed import config as cfglib
    from jaxembed import flops
    from jaxembed.data import pipeline
    from jaxembed.data.config import dataset_config
    from jaxembed.models.tiny import tiny_hf_config, tiny_model_dir
    from jaxembed.train import train

    peak = flops.peak_flops_per_device()
    if peak is None:
        pytest.fail(f"no datasheet peak for {jax.devices()[0].device_kind} in jaxembed.flops.PEAK_FLOPS")
    src = tmp_path / "stsb.jsonl"
    src.write_text("".join((shared_data / "train" / "stsb_pairs.jsonl").read_text(encoding="utf-8")
                           .splitlines(True)[:200]), encoding="utf-8")
    c = cfglib.default_config()
    c.model.name = str(tiny_model_dir("bert"))
    c.model.dtype = "bfloat16"
    c.data.datasets = [dataset_config(name="stsb", path=str(src), format="scored_pairs", task_type="sts",
                                      score_threshold=2.0, num_negatives=0, max_query_length=16,
                                      max_doc_length=16)]
    c.plan.global_batch_size = 8
    c.plan.steps = 4
    c.train.log_every = 1
    c.train.checkpoint_every = 0
    c.export.at_end = False
    seen = []  # the host batches of the run, in order: the rows each step computes (packed by default)
    real_to_global = pipeline.to_global

    def recording_to_global(batch, *a, **kw):
        seen.append({k: np.array(v) for k, v in batch.items()})
        return real_to_global(batch, *a, **kw)

    monkeypatch.setattr(pipeline, "to_global", recording_to_global)
    train(c, tmp_path / "run")
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_lines = [x for x in lines if x["split"] == "train"]
    assert train_lines and all(0 < x["mfu"] < 1 for x in train_lines)
    assert len(seen) == len(train_lines)
    for x, b in zip(train_lines, seen):
        per_step = hand_count(tiny_hf_config("bert"), *computed_rows(b), 32, False,
                              n_queries=len(b["query_prompt_length"]), n_candidates=len(b["doc_prompt_length"]))
        assert x["mfu"] == pytest.approx(per_step / x["step_time_s"] / (peak * jax.device_count()), rel=1e-3)
