"""Helpers for the packed-training tests (tests/test_packed_train.py, tests/multidevice/test_packed_train.py,
tests/multidevice/test_train_features.py): a train step's loss and gradients on a host batch, a step's packed and
padded batches, and a packed batch read back as padded rows (independent of jaxembed's packed encoder)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from jaxembed import config as cfglib
from jaxembed.data import pipeline as P


def slice_data(shared_data, out):
    """The first 120 rows of the shared STS-B and WikiQA training files, in ``out``."""
    for name, src, n in (("stsb", "stsb_pairs", 120), ("wikiqa", "wikiqa", 120)):
        lines = (shared_data / "train" / f"{src}.jsonl").read_text(encoding="utf-8").splitlines(True)[:n]
        (out / f"{name}.jsonl").write_text("".join(lines), encoding="utf-8")
    return out


def two_datasets(data_dir) -> list:
    """The datasets of ``data_dir``'s stsb.jsonl and wikiqa.jsonl (``slice_data``'s): STS-B (sts, no negative) and
    WikiQA (retrieval, one hard negative, an instruction), 16 tokens per text."""
    from jaxembed.data.config import dataset_config

    return [
        dataset_config(name="stsb", path=str(data_dir / "stsb.jsonl"), format="scored_pairs", task_type="sts",
                       score_threshold=3.0, num_negatives=0, max_query_length=16, max_doc_length=16),
        dataset_config(name="wikiqa", path=str(data_dir / "wikiqa.jsonl"), task_type="retrieval", num_negatives=1,
                       query_instruction="Instruct: Given a question, retrieve answers \n Query: ",
                       max_query_length=16, max_doc_length=16)]


def small_config(data_dir, **train):
    """A run config: the tiny BERT, 120 rows each of STS-B (sts, no negative) and WikiQA (retrieval, one hard
    negative, an instruction), 16 tokens per text, 8 queries, mixed-task batches, no dropout; ``train`` keys."""
    from jaxembed.models.tiny import tiny_model_dir

    c = cfglib.default_config()
    c.model.name = str(tiny_model_dir("bert"))
    c.model.max_length = 32
    c.data.datasets = two_datasets(data_dir)
    c.plan.global_batch_size = 8
    c.plan.steps = 3
    c.plan.strategy = "random"  # mixed-task batches: MoTE routes rows (tokens) of one batch to different experts
    c.train.dropout = False
    for k, v in train.items():
        setattr(c.train, k, v)
    return c


def step_grads(run, host_batch: dict, perturb_experts: bool = False, hlo: list | None = None
               ) -> tuple[float, dict]:
    """(loss, gradients) of the run's train step on a host batch: the step with SGD at learning rate 1, the
    gradient = parameters before - after. perturb_experts: MoTE's experts made different from each other first
    (up-cycled experts are copies: a wrong route would go unnoticed); hlo: a list that gets the compiled step's
    HLO text (the step is compiled once)."""
    import optax

    from jaxembed import mote, parallel
    from jaxembed.train import init_state, make_train_step

    run = dataclasses.replace(run, tx=optax.with_extra_args_support(optax.sgd(1.0)))
    state = init_state(run)
    if perturb_experts:
        def bump(path, x):
            if not mote.is_expert_path(path):
                return x
            scale = 1.0 + 0.3 * np.arange(x.shape[0]).reshape((-1,) + (1,) * (x.ndim - 1))
            return jax.device_put(np.asarray(x) * scale.astype(np.asarray(x).dtype), x.sharding)

        state["params"] = jax.tree_util.tree_map_with_path(bump, state["params"])
    before = jax.device_get(state["params"])
    batch = P.to_global(host_batch, parallel.batch_sharding(run.mesh))
    compiled = make_train_step(run).lower(state, batch).compile()
    if hlo is not None:
        hlo.append(compiled.as_text())
    state, m = compiled(state, batch)
    grads = jax.tree.map(lambda a, b: np.asarray(a, np.float64) - np.asarray(b, np.float64), before,
                         jax.device_get(state["params"]))
    return float(m["loss"]), grads


def packed_and_padded(run, step: int = 0):
    """The loader's packed and padded host batches of a step (the run's packing, or a finer one)."""
    packed = P.make_loader(run.store, run.plan, run.loaded.tokenizer, packing=run.packing, num_candidates=run.K)
    padded = P.make_loader(run.store, run.plan, run.loaded.tokenizer, num_candidates=run.K)
    return packed.batch(step), padded.batch(step)


def assert_same_loss_and_grads(a, b, tol=1e-5):
    assert a[0] == pytest.approx(b[0], abs=tol)
    worst = max(float(np.abs(x - y).max()) for x, y in zip(jax.tree.leaves(a[1]), jax.tree.leaves(b[1])))
    largest = max(float(np.abs(y).max()) for y in jax.tree.leaves(b[1]))
    assert worst <= tol and largest > 1e-3, (worst, largest)


def pack_texts(batch: dict, name: str, shards: int) -> list[list[int]]:
    """Each text's tokens read back from the stacked packs ``name`` (shard s: rows [s*R, (s+1)*R), text slots
    [s*N, (s+1)*N), indices local to the shard: checked), in the pack's text order."""
    ids = batch[f"{name}_input_ids"]
    R = ids.shape[0] // shards
    n = len(batch[f"{name}_text_row"]) // shards
    out = []
    for i, (r, s0, ln) in enumerate(zip(*(batch[f"{name}_text_{k}"] for k in ("row", "start", "len")))):
        s = i // n
        assert 0 <= r < R
        row = s * R + r
        assert (batch[f"{name}_token_text"][row, s0:s0 + ln] == i - s * n).all()  # the local text index
        out.append(ids[row, s0:s0 + ln].tolist())
    return out


def side_texts(batch: dict, side: str, shards: int) -> tuple[list[list[int]], np.ndarray]:
    """The tokens and prompt lengths of a packed batch's queries (side 'query') or candidates ('doc'), in row
    order, from a combined pack (per shard: its queries, then its candidates) or the side's own pack."""
    if "pack_input_ids" in batch:
        texts = pack_texts(batch, "pack", shards)
        b = len(batch["query_prompt_length"])
        idx = np.arange(len(texts)).reshape(shards, -1)
        pick = idx[:, :b // shards] if side == "query" else idx[:, b // shards:]
        return [texts[i] for i in pick.reshape(-1)], batch["pack_text_prompt"][pick.reshape(-1)]
    return pack_texts(batch, f"{side}_pack", shards), batch[f"{side}_pack_text_prompt"]


def unpack(batch: dict, side: str, shards: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A packed host batch's ``side`` texts as padded rows: (input_ids [N, Lmax], attention_mask, prompt_length)."""
    rows, prompt = side_texts(batch, side, shards)
    width = max(len(x) for x in rows)
    out = np.zeros((len(rows), width), np.int32)
    mask = np.zeros((len(rows), width), np.int32)
    for i, x in enumerate(rows):
        out[i, :len(x)] = x
        mask[i, :len(x)] = 1
    return out, mask, np.asarray(prompt, np.int32)
