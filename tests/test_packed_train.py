"""Packed training batches (data.packing, the default): the loader's packs hold exactly the padded batch's texts,
shard by shard with local indices, with shapes fixed for the whole plan (same on every host, after a restart);
and the train step on a packed batch gives the padded batch's loss and gradients (float32, <= 1e-5), with the
gradient cache and with MoTE experts mixed within a batch. 8 devices: tests/multidevice/test_packed_train.py."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from data_fakes import mixed_store
from jaxembed import config as cfglib
from packed_reference import (assert_same_loss_and_grads, packed_and_padded, side_texts, slice_data, small_config,
                              step_grads)
from jaxembed.data import pipeline as P
from jaxembed.data.plan import build_plan
from jaxembed.errors import UserError


@pytest.fixture(scope="module")
def tok(minilm_dir):
    from jaxembed.tokenizer import Tokenizer

    return Tokenizer.from_folder(minilm_dir)


@pytest.mark.parametrize("combined", [True, False], ids=["one_pack", "two_packs"])
def test_packs_hold_the_padded_texts_per_shard(tok, combined):
    """2 hosts x 2 shards each: every query and candidate (empty slots too) is its padded row's tokens, in row
    order, in its own shard's rows (local indices); the prompt lengths are the padded ones; shapes agree across
    hosts and with a loader that starts at a later step (the shapes are the whole plan's)."""
    store = mixed_store()
    plan = build_plan(store, {"global_batch_size": 8, "seed": 1})
    packing = P.Packing(shards=4, combined=combined, min_row_length=16, sub_tokens=(0,) * (1 if combined else 2))
    table = P.step_pack_table(store, plan, tok, packing)
    shapes = {}
    for host in (0, 1):
        packed = P.make_loader(store, plan, tok, process_index=host, process_count=2, packing=packing,
                               pack_table=table, num_candidates=4)
        padded = P.make_loader(store, plan, tok, process_index=host, process_count=2, num_candidates=4)
        late = P.make_loader(store, plan, tok, process_index=host, process_count=2, packing=packing,
                             start_step=3, num_candidates=4)
        for step in range(plan.steps):
            a, b = packed.batch(step), padded.batch(step)
            for side in ("query", "doc"):
                got, prompt = side_texts(a, side, 2)
                want = [ids[m == 1].tolist() for ids, m in zip(b[f"{side}_input_ids"], b[f"{side}_attention_mask"])]
                assert got == want, (host, step, side)
                np.testing.assert_array_equal(prompt, b[f"{side}_prompt_length"])
            for k in b:
                if "input_ids" not in k and "attention_mask" not in k:
                    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
            *R, L = packed.batcher.shape(step)
            for name, r in zip(packing.packs, R):
                assert a[f"{name}_input_ids"].shape == (2 * r, L)
            stats = P.batch_stats(a, 2)
            assert stats["tokens"] == P.batch_stats(b)["tokens"] <= stats["padded_tokens"]
            if step >= 3:
                for k, v in late.batch(step).items():
                    np.testing.assert_array_equal(v, a[k], err_msg=k)
            shapes.setdefault(step, set()).add((*R, L))
    assert all(len(v) == 1 for v in shapes.values())  # every host packs a step into the same shapes
    # a stale table (fewer rows than the texts need) is one line, naming the fix
    stale = dict(table, **{f"{n}_rows": np.ones_like(table[f"{n}_rows"]) for n in packing.packs})
    with pytest.raises(UserError, match="table is stale"):
        P.make_loader(store, plan, tok, packing=packing, pack_table=stale, num_candidates=4).batch(0)


def test_choose_rows_fits_every_step_with_few_shapes():
    rng = np.random.default_rng(0)
    S = 500
    table = {"row_length": np.full(S, 64), "query_pack_rows": rng.integers(10, 30, S),
             "doc_pack_rows": rng.integers(5, 60, S)}
    need = np.stack([table["query_pack_rows"], table["doc_pack_rows"]], 1)
    for sub in ((0, 0), (64 * 3, 64 * 4)):
        packing = P.Packing(combined=False, sub_tokens=sub)
        R = P.choose_rows(table, packing)
        assert (R >= need).all()
        shapes = {tuple(r) for r in R.tolist()}
        assert 1 < len(shapes) <= P.MAX_SHAPES
        if sub[0]:  # the gradient cache: rows in whole sub-batches (3 and 4 rows of 64)
            assert all(q % 3 == 0 and d % 4 == 0 for q, d in shapes)
        # each step takes the smallest chosen shape it fits; one shape that fits all costs more slots
        assert R.sum() < len(R) * R.max(axis=0).sum()
        one = P.choose_rows(table, packing, compile_steps=10 ** 9)
        assert len({tuple(r) for r in one.tolist()}) == 1 and (one == R.max(axis=0)).all()


def _total_rows(need: np.ndarray, shapes) -> int:
    """Rows over the plan when each step takes the smallest of ``shapes`` that holds its need."""
    return sum(min(sum(c) for c in shapes if all(x >= w for x, w in zip(c, n))) for n in need.tolist())


def test_choose_rows_adds_a_shape_only_when_it_saves_a_compilation():
    rng = np.random.default_rng(1)
    S, L = 400, 64
    table = {"row_length": np.full(S, L), "query_pack_rows": rng.integers(10, 30, S),
             "doc_pack_rows": rng.integers(5, 60, S)}
    need = np.stack([table["query_pack_rows"], table["doc_pack_rows"]], 1)
    counts = []
    for compile_slots in (64 * 40, 64 * 400, 64 * 4000, 64 * 10 ** 7):
        packing = P.Packing(combined=False, sub_tokens=(0, 0), compile_slots=compile_slots)
        R = P.choose_rows(table, packing)
        assert (R >= need).all()
        shapes = sorted({tuple(r) for r in R.tolist()})
        counts.append(len(shapes))
        assert R.sum() == _total_rows(need, shapes)  # each step takes the smallest chosen shape it fits
        if len(shapes) < P.MAX_SHAPES:  # stopped because no further shape saves a compilation's slots
            best = max(R.sum() - _total_rows(need, shapes + [tuple(n)]) for n in need.tolist())
            assert best * L < compile_slots
    assert counts[0] > counts[1] > counts[2] >= counts[3] == 1, counts


def test_compile_cost_follows_the_model_and_the_platform():
    from types import SimpleNamespace

    minilm = SimpleNamespace(model_type="bert", hidden_size=384, num_layers=6, intermediate_size=1536)
    tiny = SimpleNamespace(model_type="bert", hidden_size=32, num_layers=2, intermediate_size=37)
    cpu = P.compile_cost_slots(minilm, "cpu")
    # MiniLM on a CPU core: 8 s of compilation = 8 x 6.3e10 / (6 x 10.6M) slots, about 2 steps of B=64 demo rows
    assert cpu == pytest.approx(8.0 * 6.3e10 / (6 * 6 * (4 * 384 ** 2 + 2 * 384 * 1536)))
    assert 2 * 3000 < cpu < 3 * 3700
    assert P.compile_cost_slots(tiny, "cpu") > 500 * cpu  # a tiny model: its step is cheap, a compile is not
    assert P.compile_cost_slots(minilm, "gpu", 989e12) > 1000 * cpu  # an H200 trains ~1000x more slots per second
    assert P.compile_cost_slots(SimpleNamespace(model_type="unknown", hidden_size=8, num_layers=1), "cpu") == 0.0


# ------------------------------------------------------------------------------------------ the train step


@pytest.fixture(scope="module")
def small_data(tmp_path_factory, shared_data):
    return slice_data(shared_data, tmp_path_factory.mktemp("packed_data"))


@pytest.mark.parametrize("case", ["dense", "mote_mixed_gradcache"])
def test_packed_step_equals_padded(small_data, tmp_path, case):
    """The train step's loss and every gradient on the packed batch equal the padded batch's (<= 1e-5), with
    dropout on (the default: each text's masks follow its id and positions, not its row, sub-batch or pack --
    jaxembed.models.dropout) and off; with the gradient cache (rows in sub-batches of 16 token slots: several per
    pack) and MoTE experts mixed within the packs (per-token routing) in the mote case. Both dropout settings in
    one run: the step reads train.dropout from the run's config, so the run (model, store, plan, packing) is set
    up once."""
    from jaxembed.models.tiny import tiny_model_dir
    from jaxembed.train import setup

    mote_ = case.startswith("mote")
    c = small_config(small_data, gradcache_chunk=2 if "gradcache" in case else 0, dropout=True)
    # one layer: what packing changes (rows, attention within a text, pooling, MoTE routing per token, dropout
    # masks per text) happens in every layer alike; the steps compile in about half the time
    c.model.name = str(tiny_model_dir("bert", num_layers=1))
    c.model.mote.enabled = mote_
    run = setup(c, tmp_path / "run")
    assert run.packing is not None and cfglib.packing_enabled(c)  # the default
    # dense: queries and candidates in one pack; MoTE routes WikiQA's queries and documents to different experts:
    # two packs, each with the experts of two tasks (per-token routing)
    assert run.packing.combined != mote_
    if "gradcache" in case:  # one text per row of 16, sub-batches of one row: 8 / 16 of them per pack
        run = dataclasses.replace(run, packing=dataclasses.replace(
            run.packing, min_row_length=16, sub_tokens=(16,) * len(run.packing.packs)))
    packed, padded = packed_and_padded(run)
    if "gradcache" in case:
        assert packed["query_pack_input_ids"].shape[0] >= 4
    if mote_:
        assert len(set(packed["task_id"].tolist())) == 2  # 3 experts in the packs
    want = step_grads(run, padded, mote_)
    assert_same_loss_and_grads(step_grads(run, packed, mote_), want)
    off_config = copy.deepcopy(run.config)
    off_config.train.dropout = False
    off = dataclasses.replace(run, config=off_config)
    want_off = step_grads(off, padded, mote_)
    assert_same_loss_and_grads(step_grads(off, packed, mote_), want_off)
    assert abs(want_off[0] - want[0]) > 1e-3  # dropout acts: the step without it has another loss
