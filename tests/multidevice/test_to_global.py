"""On 8 simulated CPU devices: ``to_global`` turns a host batch of the loader into global arrays, every batched
array split over the 8 devices along the batch axes (parallel.BATCH_AXES) or another sharding's axis, scalars
replicated, the values unchanged."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from data_fakes import make_store


def test_to_global_on_8_simulated_devices(minilm_dir):
    from jaxembed import parallel
    from jaxembed.data.pipeline import make_loader, to_global
    from jaxembed.data.plan import build_plan
    from jaxembed.tokenizer import Tokenizer

    assert jax.device_count() == 8
    store = make_store([("a", "t", 64, dict(batching="homogeneous", num_negatives=2, temperature=0.02))])
    plan = build_plan(store, {"global_batch_size": 16})
    batch = next(iter(make_loader(store, plan, Tokenizer.from_folder(minilm_dir))))
    mesh = parallel.make_mesh()
    g = to_global(batch, mesh)
    for k, v in batch.items():
        a = g[k]
        assert a.shape == v.shape, k
        np.testing.assert_array_equal(np.asarray(a), v.astype(np.asarray(a).dtype), err_msg=k)
        if v.ndim:
            assert len(a.sharding.device_set) == 8 and a.sharding.spec[0] == ("data", "fsdp"), (k, a.sharding)
            assert a.addressable_shards[0].data.shape[0] == v.shape[0] // 8, k
        else:
            assert a.sharding.is_fully_replicated, k
    assert g["example_index"].dtype == np.int32 and g["doc_input_ids"].shape == (48, batch["doc_input_ids"].shape[1])
    mesh2 = jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2), ("dp", "mp"))
    g2 = to_global(batch, NamedSharding(mesh2, P("dp")))
    assert g2["query_input_ids"].addressable_shards[0].data.shape[0] == 4
    assert g2["query_input_ids"].sharding.spec == P("dp", None)
