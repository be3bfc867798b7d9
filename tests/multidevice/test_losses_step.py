"""On 8 simulated CPU devices (a 2 x 4 data x fsdp mesh, parameters FSDP-sharded, the GIST guide's too): one train
step of a run whose batch mixes a CoSENT dataset (scored pairs, every pair kept) and a teacher-scored triplets
dataset trained with InfoNCE (symmetric) + KL distillation + GIST's guide (the frozen base model, encoded inside the
step). Its loss equals the independent float64 reference (tests/loss_reference.py) computed on one device from the
initial model's embeddings of the same batch: each row under its own dataset's loss."""

from __future__ import annotations

import json

import numpy as np
import pytest

from loss_reference import reference_distill, reference_loss, reference_scored

TAU, TEACHER_TAU, MARGIN, W_DISTILL = 0.05, 0.1, 0.02, 0.7


def _files(tmp_path):
    """40 STS-B pairs; 40 SNLI triplets with teacher scores (made up: a function of the text; the step only reads
    them)."""
    from jaxembed import paths

    data = paths.shared_data_dir()
    if not (data / "train").is_dir():
        pytest.fail(f"shared data folder {data} is missing")
    lines = (data / "train" / "stsb_pairs.jsonl").read_text(encoding="utf-8").splitlines(True)[:40]
    (tmp_path / "stsb.jsonl").write_text("".join(lines), encoding="utf-8")
    rows = [json.loads(x) for x in (data / "train" / "snli_triplets.jsonl").read_text().splitlines()[:40]]
    score = lambda t: round(sum(map(ord, t)) % 101 / 100, 2)
    (tmp_path / "nli.jsonl").write_text("".join(
        json.dumps({**r, "pos_scores": [score(t) for t in r["pos"]], "neg_scores": [score(t) for t in r["neg"]]})
        + "\n" for r in rows), encoding="utf-8")


def test_mixed_losses_distillation_and_gist_step_equals_float64_reference(tmp_path):
    import jax

    from jaxembed import config as cfglib
    from jaxembed import parallel
    from jaxembed.data.config import dataset_config
    from jaxembed.data.pipeline import make_loader, to_global
    from jaxembed.models.tiny import tiny_model_dir
    from jaxembed.train import init_state, make_train_step, setup

    assert jax.device_count() == 8
    model_dir = tiny_model_dir("bert", num_layers=1)  # the losses see embeddings: the depth does not matter
    _files(tmp_path)
    c = cfglib.default_config()
    c.model.name = str(model_dir)
    c.model.max_length = 32
    c.data.datasets = [
        dataset_config(name="stsb", path=str(tmp_path / "stsb.jsonl"), format="scored_pairs", task_type="sts",
                       num_negatives=0, loss="cosent"),
        dataset_config(name="nli", path=str(tmp_path / "nli.jsonl"), task_type="nli", num_negatives=1,
                       query_instruction=""),
    ]
    c.plan.global_batch_size = 16
    c.plan.steps = 1
    c.plan.strategy = "random"  # both datasets in the batch: each row its own loss
    c.loss.temperature = TAU
    c.loss.symmetric = True
    c.loss.distill, c.loss.distill_temperature, c.loss.distill_weight = "kl", TEACHER_TAU, W_DISTILL
    c.loss.gist_guide, c.loss.gist_margin = str(model_dir), MARGIN
    c.train.dropout = False
    c.train.mesh_data, c.train.mesh_fsdp, c.train.param_sharding = 2, 4, "fsdp"
    run = setup(c, tmp_path / "wd")
    step = make_train_step(run)
    hb = make_loader(run.store, run.plan, run.loaded.tokenizer, num_candidates=run.K).batch(0)
    nli = hb["dataset_id"] == run.store.index("nli")
    assert 0 < nli.sum() < 16  # both kinds in the batch
    # the reference, on one device: the initial (= guide) model's embeddings, float64 loops. Encoded before the step:
    # the step donates the train state, whose replicated leaves may be the model's own buffers.
    from flax import nnx

    gd, st = nnx.split(run.loaded.model)
    fwd = jax.jit(lambda st, i, m, p: nnx.merge(gd, st)(i, m, p, deterministic=True))
    enc = lambda p: np.asarray(fwd(st, hb[f"{p}_input_ids"], hb[f"{p}_attention_mask"], hb[f"{p}_prompt_length"]),
                               np.float64)
    q, d = enc("query"), enc("doc")
    _, m = step(init_state(run), to_global(hb, parallel.batch_sharding(run.mesh)))
    K, B = run.K, 16
    pos = np.arange(B) * K
    w = hb["weight"].astype(np.float64)
    valid = hb["doc_valid"] & np.repeat(nli, K)  # CoSENT rows' texts are no candidates of the InfoNCE rows
    l_nce, _ = reference_loss(q, d, pos, TAU, np.where(nli, w, 0.0), valid, hb["doc_hash"], symmetric=True,
                              qhashes=hb["query_hash"], guide=(q, d, MARGIN, "absolute"))
    l_kl = reference_distill("kl", q, d, pos, hb["teacher_score"].reshape(B, K), hb["doc_valid"].reshape(B, K),
                             np.where(nli, w, 0.0), TAU, TEACHER_TAU)
    l_cos = reference_scored("cosent", q, d[pos], hb["pair_score"], np.where(nli, 0.0, w), scale=20.0)
    assert l_kl > 0 and l_cos > 0
    assert float(m["distill_loss"]) == pytest.approx(l_kl, rel=1e-4, abs=1e-6)
    assert float(m["cosent_loss"]) == pytest.approx(l_cos, rel=1e-4)
    assert float(m["loss"]) == pytest.approx(l_nce + W_DISTILL * l_kl + l_cos, rel=1e-4)
    # the guide masked candidates: without its mask the InfoNCE part differs
    l_plain, _ = reference_loss(q, d, pos, TAU, np.where(nli, w, 0.0), valid, hb["doc_hash"], symmetric=True,
                                qhashes=hb["query_hash"])
    assert abs(l_plain - l_nce) > 1e-3
