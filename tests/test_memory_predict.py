"""The memory prediction (jaxembed.train.memory, benchmarks/memory_predict.py): the trainer's real step compiled on
an abstract tiny model takes exactly the state, the batch and the frozen base it is given (a bfloat16 LoRA base in
half the bytes); the batch search finds the largest fitting batch in few probes; the depth cut keeps the per-layer
fields."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from jaxembed.train import memory


def _nbytes(tree) -> int:
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def test_the_compiled_step_takes_the_abstract_state_batch_and_a_bfloat16_base():
    """One compilation of a tiny Qwen2's LoRA step (bfloat16 base): XLA's argument bytes are the train state's,
    the frozen base's (in bfloat16: half the float32 model's bytes) and the batch's (the fields it reads)."""
    from flax import nnx

    from jaxembed import lora
    from jaxembed.models.tiny import tiny_model_dir

    hf = json.loads((tiny_model_dir("qwen2") / "config.json").read_text())
    run = memory.abstract_run(hf, memory.MemorySettings(lora_rank=4, base_dtype="bfloat16"))
    base = nnx.to_pure_dict(run.rest)
    assert {str(x.dtype) for x in jax.tree.leaves(base)} == {"bfloat16"}
    f32 = nnx.split(memory.abstract_model(hf, memory.MemorySettings(), None), nnx.Param, ...)[1]
    assert 2 * _nbytes(base) == _nbytes(f32)
    p = memory.step_memory(run, 4, 8, 16)
    state, batch = memory.abstract_state(run), memory.abstract_batch(4, run.K, 8, 16)
    # jit drops the batch fields the step does not read; a float32 base would add 1,990,848 bytes
    assert _nbytes(state) + _nbytes(base) < p.arguments <= _nbytes(state) + _nbytes(batch) + _nbytes(base)
    assert p.aliased == _nbytes(state)  # the donated state, updated in place
    assert p.temporaries > 0 and p.peak == p.arguments + p.outputs - p.aliased + p.temporaries
    assert {k for k in state["params"]} == {"backbone"} and lora.TRAINABLE is nnx.LoRAParam


def _fake(fixed: int, per: int, calls: list, curve: int = 10**6):
    """Peak bytes: fixed + per x batch + batch^2 / curve (the loss's [B, B x K] logits grow quadratically)."""
    def probe(batch: int) -> memory.Probe:
        calls.append(batch)
        return memory.Probe(batch, fixed, 0, 0, per * batch + (batch * batch) // curve, 0.0)
    return probe


@pytest.mark.parametrize("fixed,per,curve,step,most", [
    (10_000, 700, 4096, 8, 8), (50, 30, 10**6, 1, 8), (0, 1000, 10**5, 32, 8),
    (50, 3, 64, 1, 30),  # memory far from affine: interpolation alone would creep; bisection takes over
])
def test_the_search_finds_the_largest_fitting_batch_in_few_probes(fixed, per, curve, step, most):
    budget = 1_000_000
    calls: list = []
    best, probes = memory.largest_batch(_fake(fixed, per, calls, curve), budget, step=step, start=16,
                                        max_probes=most)
    peak = lambda b: fixed + per * b + (b * b) // curve  # noqa: E731
    assert best % step == 0 and peak(best) <= budget < peak(best + step), (best, calls)
    assert len(calls) <= most and len(set(calls)) == len(calls)  # no batch probed twice
    assert [p.batch for p in probes] == sorted(calls)


def test_nothing_fits_is_batch_zero():
    best, probes = memory.largest_batch(_fake(10**9, 1, []), 10**6, step=8, start=64)
    assert best == 0 and probes[0].batch == 8


def test_the_depth_cut_keeps_the_per_layer_fields():
    hf = {"model_type": "qwen2", "num_hidden_layers": 28, "layer_types": ["full_attention"] * 28}
    cut = memory.at_depth(hf, 3)
    assert cut["num_hidden_layers"] == 3 and cut["layer_types"] == ["full_attention"] * 3
    assert hf["num_hidden_layers"] == 28  # the model's own config is left alone
    assert memory.at_depth({"num_layers": 24}, 2) == {"num_layers": 2}
