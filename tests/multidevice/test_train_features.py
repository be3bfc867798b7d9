"""On 8 simulated CPU devices, one tiny training run with the README's training options switched on together, each
checked in the run's own outputs:

- ``train.param_sharding=fsdp`` on a 2 x 4 (data x fsdp) mesh: the checkpoints restore onto FSDP shardings, and a
  run resumed from a middle checkpoint (with ``train.loader_workers=1``: Grain worker processes) ends bit for bit
  where the uninterrupted run ended;
- ``optim.schedule=cosine`` with ``optim.warmup_ratio``: the logged learning rate of every step is the hand-computed
  schedule;
- ``optim.grad_clip`` and no weight decay on norms and biases: with a clip of 1e-12 (far below Adam's eps) Adam's
  step is at most 1e-4 of the learning rate, so every parameter ends at p0 * prod(1 - lr_t * wd) when it is decayed,
  and at p0 when it is a norm scale or a bias;
- ``model.dtype=bfloat16`` and ``model.remat``: the run's step computes in bf16 and rematerialises (its jaxpr);
- ``loss.symmetric`` and ``loss.same_task_mask`` in mixed-task batches (``plan.strategy=random``): the first logged
  loss equals the float64 reference loss (tests/loss_reference.py) with both options, on the first batch's
  embeddings under the initial weights, and differs from it without either option;
- MFU: with a device peak, every logged step's MFU is the hand-counted FLOPs of the step over its time;
- ``train.checkpoint_minutes`` (a checkpoint after every step with ``checkpoint_every=0``), ``eval.before`` (a dev
  evaluation at step 0 equal to evaluating the initial model), ``export.dir`` (the export lands there, loads, and
  encodes like the final checkpoint).
"""

from __future__ import annotations

import json
import math
import shutil

import jax
import numpy as np
import pytest

from jaxembed import config as cfglib
from loss_reference import reference_loss
from packed_reference import two_datasets

STEPS, LR, WD, WARMUP_RATIO, CLIP = 5, 0.05, 0.5, 0.4, 1e-12
N_STS, N_WIKI = 120, 120
PEAK = 1e12  # a made-up device peak (FLOP/s): the CPU has none, so MFU is otherwise not logged  # slices of the shared training files: a small store


def _config(model_dir, data_dir, export_dir):
    c = cfglib.default_config()
    c.model.name = str(model_dir)
    c.model.max_length = 32
    c.model.dtype = "bfloat16"
    c.model.remat = True
    c.data.datasets = two_datasets(data_dir)
    if "packing" in c.data:  # one text per row: the reference loss below re-encodes the batch's padded rows
        c.data.packing = False
    c.plan.global_batch_size = 8
    c.plan.steps = STEPS
    c.plan.strategy = "random"  # mixed-task batches: same_task_mask has something to mask
    c.loss.symmetric = True
    c.loss.same_task_mask = True
    c.optim.lr = LR
    c.optim.schedule = "cosine"
    c.optim.warmup_steps = -1
    c.optim.warmup_ratio = WARMUP_RATIO
    c.optim.weight_decay = WD
    c.optim.grad_clip = CLIP
    c.train.dropout = False  # the reference loss recomputes the embeddings
    c.train.mesh_data = 2
    c.train.mesh_fsdp = 4
    c.train.param_sharding = "fsdp"
    c.train.log_every = 1
    c.train.checkpoint_every = 0
    c.train.checkpoint_minutes = 1e-9  # due after every step
    c.train.keep_checkpoints = STEPS
    c.eval.tasks = ("STSBenchmark-dev",)
    c.eval.max_examples = 16
    c.eval.before = True
    c.export.dir = str(export_dir)
    return c


def _data(tmp_path):
    """Slices of the shared training files (a small store)."""
    from jaxembed import paths

    data = paths.shared_data_dir()
    if not (data / "train").is_dir():
        pytest.fail(f"shared data folder {data} is missing")
    for name, src, n in (("stsb", "stsb_pairs", N_STS), ("wikiqa", "wikiqa", N_WIKI)):
        lines = (data / "train" / f"{src}.jsonl").read_text(encoding="utf-8").splitlines(True)[:n]
        (tmp_path / f"{name}.jsonl").write_text("".join(lines), encoding="utf-8")
    return tmp_path


def _model_with_biases(tmp_path):
    """The tiny random BERT with every bias at 1 (its init is 0: decay on biases would go unseen)."""
    from safetensors.numpy import load_file, save_file

    from jaxembed.models.tiny import tiny_model_dir

    d = tmp_path / "model"
    shutil.copytree(tiny_model_dir("bert"), d)
    w = load_file(d / "model.safetensors")
    save_file({k: (v + 1).astype(v.dtype) if k.endswith(".bias") else v for k, v in w.items()},
              d / "model.safetensors")
    return d


def _lr(t: int) -> float:
    """Hand count of optim.schedule('cosine') with linear warm-up over warmup_ratio * steps, for step t (0-based)."""
    w = int(WARMUP_RATIO * STEPS)
    if t < w:
        return LR * t / w
    return LR * 0.5 * (1 + math.cos(math.pi * (t - w) / (STEPS - w)))


def _leaves(tree) -> dict:
    return {jax.tree_util.keystr(k): np.asarray(v, np.float64) for k, v in jax.tree_util.tree_leaves_with_path(tree)}


def _restore(run, workdir, step):
    from jaxembed.runs.checkpoints import Checkpointer
    from jaxembed.train import init_state

    ck = Checkpointer(workdir / "checkpoints", async_save=False)
    try:
        return ck.restore(step, init_state(run))
    finally:
        ck.close()


def test_fsdp_run_with_the_training_options(tmp_path, monkeypatch):
    from jaxembed import loading
    from jaxembed.data import pipeline
    from jaxembed.encode import Encoder
    from jaxembed.evaluate import evaluate
    from jaxembed.train import make_train_step, setup, train

    assert jax.device_count() == 8
    cfg = _config(_model_with_biases(tmp_path), _data(tmp_path), tmp_path / "exported")
    model_dir = cfg.model.name

    seen = []  # the host batches of the run, in order (to recompute the first step's loss)
    real_to_global = pipeline.to_global

    def recording_to_global(batch, *a, **kw):
        seen.append({k: np.array(v) for k, v in batch.items()})
        return real_to_global(batch, *a, **kw)

    monkeypatch.setattr(pipeline, "to_global", recording_to_global)
    from jaxembed import flops

    monkeypatch.setattr(flops, "peak_flops_per_device", lambda: PEAK)  # MFU is logged only with a known peak
    # the resumed run compiles the same programs: the session's persistent compilation cache (tests/conftest.py)
    wd = tmp_path / "run"
    summary = train(cfg.copy_and_resolve_references(), wd)
    assert summary["status"] == "completed" and summary["step"] == STEPS and summary["skipped"] == 0
    monkeypatch.setattr(pipeline, "to_global", real_to_global)

    # ---- checkpoint_minutes: a checkpoint after every step (checkpoint_every=0 would save only the last)
    assert sorted(int(p.name) for p in (wd / "checkpoints").iterdir() if p.name.isdigit()) == \
        list(range(1, STEPS + 1))

    # ---- schedule + warmup_ratio: the logged lr of each step is the hand-computed schedule
    lines = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines()]
    train_lines = [x for x in lines if x["split"] == "train"]
    assert [x["step"] for x in train_lines] == list(range(1, STEPS + 1))
    lrs = [x["lr"] for x in train_lines]
    np.testing.assert_allclose(lrs, [_lr(t) for t in range(STEPS)], rtol=1e-5, atol=1e-9)

    # ---- MFU: the analytic FLOPs of the step (a hand count, tests/flops_reference.py) over its time and the peak
    from flops_reference import computed_rows
    from flops_reference import train_step_flops as hand_count
    from jaxembed.models.tiny import tiny_hf_config

    assert len(seen) == STEPS
    for x, b in zip(train_lines, seen):
        nq = len(b["query_prompt_length"])
        per_step = hand_count(tiny_hf_config("bert"), *computed_rows(b), 32, False,
                              n_queries=nq, n_candidates=len(b["doc_prompt_length"]))
        assert x["mfu"] * x["step_time_s"] * PEAK * 8 == pytest.approx(per_step, rel=1e-6)

    # ---- eval.before: a dev evaluation at step 0, equal to evaluating the initial model
    before = [x for x in lines if x["split"] == "eval" and x["step"] == 0]
    assert len(before) == 1, lines
    init = loading.load(model_dir, dtype="bfloat16", max_length=32)
    ref = evaluate(Encoder.from_loaded(init), ["STSBenchmark-dev"], max_examples=16)
    assert before[0]["STSBenchmark-dev/main_score"] == pytest.approx(ref["STSBenchmark-dev"]["main_score"],
                                                                     abs=1e-4)

    # ---- fsdp: the checkpoint restores onto FSDP shardings (parameters split over the 4 fsdp devices)
    run = setup(cfg.copy_and_resolve_references(), wd)
    final = _restore(run, wd, STEPS)
    sharded = [v for v in jax.tree.leaves(final["params"]) if "fsdp" in str(v.sharding.spec)]
    assert sharded and all(len(v.sharding.device_set) == 8 for v in sharded)
    big = [v for v in jax.tree.leaves(final["params"]) if v.size >= 30522 * 32]  # the word embeddings
    assert big and all("fsdp" in str(v.sharding.spec) for v in big)
    assert all(v.addressable_shards[0].data.size == v.size // 4 for v in big)

    # ---- grad_clip, no decay on norms and biases, the applied schedule: p_T = p_0 * prod(1 - lr_t * wd)
    # for decayed matrices, p_0 for norm scales and biases, up to Adam's clipped step (<= 1e-4 * lr_t each)
    from flax import nnx

    assert all(v.dtype == np.float32 for v in jax.tree.leaves(nnx.split(init.model, nnx.Param, ...)[1]))
    p0 = _leaves(nnx.to_pure_dict(nnx.split(init.model, nnx.Param, ...)[1]))  # float32 parameters, bf16 compute
    pT = _leaves(final["params"])
    assert p0.keys() == pT.keys()
    shrink = float(np.prod([1 - _lr(t) * WD for t in range(STEPS)]))
    tol = 2e-4 * sum(_lr(t) for t in range(STEPS))
    decayed = kept = 0
    for k, a in p0.items():
        no_decay = a.ndim < 2 or k.rstrip("']").endswith(("bias", "scale"))
        expect = a if no_decay else a * shrink
        np.testing.assert_allclose(pT[k], expect, rtol=0, atol=tol, err_msg=k)
        if not no_decay:
            decayed += 1
        elif np.abs(a).max() > 0.5:  # a norm scale or a bias (1.0): decay would move it by far more than tol
            kept += 1
            assert np.abs(a * shrink - a).max() > 50 * tol
    assert decayed >= 10 and kept >= 20  # LayerNorm scales and biases, the dense layers' biases
    assert np.abs(p0["['backbone']['embeddings']['word_embeddings']['embedding']"]).max() * (1 - shrink) > 20 * tol

    # ---- bf16 and remat: the run's step computes in bf16 and rematerialises
    from jaxembed.data.pipeline import to_global
    from jaxembed.train import init_state
    from jaxembed import parallel

    batch0 = to_global(seen[0], parallel.batch_sharding(run.mesh))
    jaxpr = str(jax.make_jaxpr(make_train_step(run))(init_state(run), batch0))
    assert "bf16" in jaxpr
    assert "checkpoint" in jaxpr or "remat" in jaxpr

    # ---- symmetric + same_task_mask: the first logged loss is the reference loss with both options
    b = seen[0]
    assert len(set(b["task_id"].tolist())) == 2, "the first batch should mix the two tasks"
    K = b["doc_input_ids"].shape[0] // b["query_input_ids"].shape[0]
    gdef, gstate = nnx.split(init.model)
    embed = jax.jit(lambda st, ids, mask, pl: nnx.merge(gdef, st)(ids, mask, pl))
    n_q = len(b["query_input_ids"])
    e = np.asarray(embed(gstate, *(np.concatenate([b[f"query_{k}"], b[f"doc_{k}"]])
                                    for k in ("input_ids", "attention_mask", "prompt_length"))))
    eq, ed = e[:n_q], e[n_q:]
    qt = b["task_id"]
    kw = dict(weights=b["weight"], valid=b["doc_valid"], hashes=b["doc_hash"], qtask=qt, ctask=np.repeat(qt, K),
              qhashes=b["query_hash"])
    pos = np.arange(len(qt)) * K
    tau = cfg.loss.temperature
    want = reference_loss(eq, ed, pos, tau, same_task=True, symmetric=True, **kw)[0]
    got = train_lines[0]["loss"]
    tol_loss = 0.01 * abs(want)
    assert got == pytest.approx(want, abs=tol_loss)
    for other in (dict(same_task=False, symmetric=True), dict(same_task=True, symmetric=False)):
        assert abs(reference_loss(eq, ed, pos, tau, **other, **kw)[0] - got) > 5 * tol_loss, other

    # ---- export.dir: the export is there (not in the workdir), and encodes like the final checkpoint
    assert summary["export"] == str(tmp_path / "exported") and not (wd / "export").exists()
    texts = ["a test sentence", "another one"]
    exp = Encoder.from_loaded(loading.load(str(tmp_path / "exported"), dtype="bfloat16")).encode(texts)
    enc = Encoder(run.loaded.model, run.loaded.tokenizer)
    enc.set_model(nnx.merge(run.graphdef, jax.device_get(final["params"]), run.rest))
    np.testing.assert_allclose(exp, enc.encode(texts), atol=1e-6)

    # ---- resume onto FSDP shardings from step 2, with Grain worker processes: bit-identical to the straight run
    wd2 = tmp_path / "resumed"
    shutil.copytree(wd, wd2, ignore=shutil.ignore_patterns("summary.json", "tensorboard"))
    for p in (wd2 / "checkpoints").iterdir():
        if p.name.isdigit() and int(p.name) > 2:
            shutil.rmtree(p)
    cfg2 = cfg.copy_and_resolve_references()
    cfg2.train.loader_workers = 1
    cfg2.export.at_end = False
    cfg2.eval.tasks = ()  # what the resumed run is checked for: its final state (no evaluation, one checkpoint)
    cfg2.train.checkpoint_minutes = 0.0
    s2 = train(cfg2, wd2)
    assert s2["status"] == "completed" and s2["step"] == STEPS
    resumed = _restore(run, wd2, STEPS)
    for x, y in zip(jax.tree.leaves(final), jax.tree.leaves(resumed)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_fsdp_optimizer_state_is_sharded_like_the_parameters(tmp_path):
    """README: `param_sharding=fsdp` shards the parameters and the optimizer state (init_state places Adam's
    moments with the parameters' shardings: jaxembed.runs.optim.state_shardings)."""
    import optax

    from jaxembed.models.tiny import tiny_model_dir
    from jaxembed.train import init_state, setup

    run = setup(_config(tiny_model_dir("bert"), _data(tmp_path), tmp_path / "exported"), tmp_path / "run")
    state = init_state(run)
    adam = [x for x in jax.tree.leaves(state["opt_state"], is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
            if isinstance(x, optax.ScaleByAdamState)]
    assert len(adam) == 1
    for moments in (adam[0].mu, adam[0].nu):
        for (k, p), m in zip(jax.tree_util.tree_leaves_with_path(state["params"]), jax.tree.leaves(moments)):
            assert m.sharding.is_equivalent_to(p.sharding, p.ndim), (jax.tree_util.keystr(k), m.sharding, p.sharding)
