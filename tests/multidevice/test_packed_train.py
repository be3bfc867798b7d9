"""On 8 simulated CPU devices: the train step on packed batches (each device packs and pools its own rows) gives the
padded batches' loss and gradients, with the gradient cache and MoTE experts mixed within the packs (and dropout
on in that case: each text's masks follow its id and positions, jaxembed.models.dropout); and packing adds no
communication: the compiled packed step's collectives are the padded step's (the loss's gather of the embeddings,
the gradients' all-reduce), no activation crosses devices."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

import jax
import ml_collections
import pytest

from packed_reference import assert_same_loss_and_grads, packed_and_padded, slice_data, small_config, step_grads


def _collectives(hlo: str) -> Counter:
    """(op, result shape) of the communicating collectives of an HLO module (an all-reduce within one-device
    groups, a no-op, left out)."""
    out = Counter()
    for line in hlo.splitlines():
        m = re.search(r"= (\([^=]*?\)|\S+\[[^\]]*\])\S* (all-gather|all-to-all|collective-permute|all-reduce|"
                      r"reduce-scatter)\(", line)
        if m and not re.search(r"replica_groups=\{\{\d+\}(,\{\d+\})*\}", line):
            out[(m.group(2), re.sub(r"\{[\d,]*\}", "", m.group(1)))] += 1
    return out


@pytest.mark.parametrize("mote_", [False, True], ids=["dense_one_pack", "mote_two_packs"])
def test_packed_step_on_8_devices_equals_padded_and_adds_no_communication(tmp_path, shared_data, mote_):
    from jaxembed.train import setup

    assert jax.device_count() == 8
    from jaxembed.models.tiny import tiny_model_dir

    c = small_config(slice_data(shared_data, tmp_path), gradcache_chunk=8, dropout=mote_)
    # one layer: what packing changes (rows, attention within a text, pooling, MoTE routing per token, dropout
    # masks per text) happens in every layer alike, and the 8-device step compiles in half the time
    c.model.name = str(tiny_model_dir("bert", num_layers=1))
    c.plan.global_batch_size = 16
    c.model.mote.enabled = mote_
    if mote_:  # two experts, each routed texts of both datasets in both packs: every pack mixes every expert
        # (every expert is a branch of each MoTE layer in both compiled steps: two compile in about half the time)
        c.model.mote.experts, c.model.mote.default = ("x", "y"), "x"
        c.model.mote.routing = ml_collections.ConfigDict({"sts": ("x", "y"), "retrieval": ("y", "x")})
    run = setup(c, tmp_path / "run")
    assert run.packing.shards == 8 and run.packing.combined != mote_
    # one text per row of 16 slots, sub-batches of one row: several sub-batches per device
    run = dataclasses.replace(run, packing=dataclasses.replace(run.packing, min_row_length=16,
                                                               sub_tokens=(16,) * len(run.packing.packs)))
    packed, padded = packed_and_padded(run)
    for name in run.packing.packs:
        assert packed[f"{name}_input_ids"].shape[0] >= 8 * 2
    hlo = []
    assert_same_loss_and_grads(step_grads(run, packed, mote_, hlo), step_grads(run, padded, mote_, hlo))
    comm = {"packed": _collectives(hlo[0]), "padded": _collectives(hlo[1])}
    assert comm["padded"][("all-gather", "f32[16,32]")] == 1  # the loss gathers the query embeddings [B, D]
    assert not comm["packed"] - comm["padded"], comm  # packing adds no communication (no activation moves)
