"""On 8 simulated CPU devices: LoRA (jaxembed.lora) under ``train.param_sharding=fsdp`` on a 2 x 4 (data x fsdp)
mesh, with bf16 compute, remat and packed batches: the adapters and their Adam moments are sharded alike (by the
adapters' logical axes), the frozen base weights are FSDP-sharded and stay out of the optimizer, and two steps run
on one compiled program (the state the step returns keeps the shardings it came with)."""

from __future__ import annotations

import logging

import jax
import numpy as np
import optax

from packed_reference import packed_and_padded, slice_data, small_config


def _shardings(tree) -> list:
    return [x.sharding for x in jax.tree.leaves(tree)]


class _Compiles(logging.Handler):
    """Counts XLA compilations of the train step (jax.log_compiles' records)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def emit(self, record):
        self.count += "Compiling jit(step)" in record.getMessage()


def test_lora_on_an_fsdp_mesh(tmp_path, shared_data):
    from jaxembed import parallel
    from jaxembed.data import pipeline as P
    from jaxembed.train import init_state, make_train_step, setup

    assert jax.device_count() == 8
    from jaxembed.models.tiny import tiny_model_dir

    c = small_config(slice_data(shared_data, tmp_path))
    c.model.name = str(tiny_model_dir("bert", num_layers=1))  # every layer's adapters are sharded alike
    c.plan.global_batch_size = 16
    c.model.dtype = "bfloat16"
    c.model.remat = True
    c.model.lora.enabled = True
    c.model.lora.rank = 4
    c.train.mesh_data, c.train.mesh_fsdp, c.train.param_sharding = 2, 4, "fsdp"
    run = setup(c, tmp_path / "run")
    assert run.packing is not None
    state = init_state(run)

    # the adapters: A of a layer whose input is the model width is split over fsdp, its moments alike
    params = dict((jax.tree_util.keystr(k), v) for k, v in jax.tree_util.tree_leaves_with_path(state["params"]))
    assert params and all(k.endswith(("['lora_a']", "['lora_b']")) for k in params)
    a_query = params["['backbone']['layers'][0]['attention']['query']['lora_a']"]
    assert a_query.sharding.spec == jax.sharding.PartitionSpec("fsdp", None)
    adam = [x for x in jax.tree.leaves(state["opt_state"], is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
            if isinstance(x, optax.ScaleByAdamState)]
    assert len(adam) == 1
    for moments in (adam[0].mu, adam[0].nu):
        for p, m in zip(jax.tree.leaves(state["params"]), jax.tree.leaves(moments)):
            assert m.sharding.is_equivalent_to(p.sharding, p.ndim)
    sizes = sum(x.size for x in jax.tree.leaves(state["opt_state"]))
    assert sizes <= 2 * sum(x.size for x in params.values()) + 8  # the adapters' moments (+ counts) only

    # the frozen base: FSDP-sharded over the 4 fsdp devices, e.g. the word embeddings' model-width axis
    base = {".".join(map(str, k)): v for k, v in nnx_flat(run.rest)}
    words = base["backbone.embeddings.word_embeddings.embedding"]
    assert "fsdp" in str(words.sharding.spec) and words.addressable_shards[0].data.size == words.size // 4
    kernel = base["backbone.layers.0.attention.query.base.kernel"]
    assert "fsdp" in str(kernel.sharding.spec)

    # two steps on one compiled program; bf16 compute and remat in it; the state keeps its shardings
    packed, _ = packed_and_padded(run)
    batch = P.to_global(packed, parallel.batch_sharding(run.mesh))
    step = make_train_step(run)
    jaxpr = str(jax.make_jaxpr(step)(state, batch))
    assert "bf16" in jaxpr and ("checkpoint" in jaxpr or "remat" in jaxpr)
    before = _shardings(state)
    frozen_before = jax.device_get(run.rest)
    compiles, logger = _Compiles(), logging.getLogger("jax._src.interpreters.pxla")
    logger.addHandler(compiles)
    try:
        with jax.log_compiles():
            for _ in range(2):
                state, m = step(state, batch)
                assert np.isfinite(float(m["loss"])) and bool(m["ok"])
    finally:
        logger.removeHandler(compiles)
    assert compiles.count == 1  # no second compilation for the state the first step returned
    assert all(a.is_equivalent_to(b, x.ndim) for a, b, x in zip(_shardings(state), before, jax.tree.leaves(state)))
    b = dict((jax.tree_util.keystr(k), np.asarray(v)) for k, v in jax.tree_util.tree_leaves_with_path(
        jax.device_get(state["params"])))
    assert all(np.abs(v).max() > 0 for k, v in b.items() if k.endswith("['lora_b']"))  # the adapters trained
    for x, y in zip(jax.tree.leaves(frozen_before), jax.tree.leaves(jax.device_get(run.rest))):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # the base is an input, never written


def nnx_flat(state):
    from flax import nnx

    return [(tuple(p), v[...]) for p, v in nnx.to_flat_state(state)]
