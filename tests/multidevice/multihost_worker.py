"""One process of the 2-process test (tests/test_multihost.py): 2 CPU devices each, gloo collectives.

argv: process_id port out.npz. Builds the same random batch in every process, keeps this process's rows
(host-local data), computes the sharded loss and its gradients on the 4-device global mesh, and process 0 writes
them gathered to out.npz."""

import sys

import numpy as np

from jaxembed import parallel

pid, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
parallel.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid, cpu_collectives="gloo")

import jax  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from jaxembed.losses import CandidateInfo, LossOptions, QueryInfo  # noqa: E402
from loss_reference import random_batch  # noqa: E402

assert jax.process_count() == 2 and jax.device_count() == 4 and jax.local_device_count() == 2
b = random_batch(seed=3, B=8, K=3, D=16, dup_pairs=((5, 0), (20, 9)), invalid=(4,))
mesh = parallel.make_mesh()
rows_q, rows_c = len(b["q"]) // 2, len(b["c"]) // 2
local = lambda x, rows: x[pid * rows:(pid + 1) * rows]
g = lambda x, rows: parallel.host_local_to_global(local(x, rows), mesh)
q, c = g(b["q"], rows_q), g(b["c"], rows_c)
pos, w = g(b["pos"], rows_q), g(b["weights"], rows_q)
qi = QueryInfo(pos_hash=g(b["hashes"][b["pos"]], rows_q), task=g(b["qtask"], rows_q))
ci = CandidateInfo(g(b["valid"], rows_c), g(b["hashes"], rows_c), g(b["ctask"], rows_c))
fn = parallel.shard_map_loss(mesh, temperature=0.05, opts=LossOptions(same_task=True, peg=True), symmetric=True)
(loss, m), (gq, gc) = jax.value_and_grad(lambda q, c: fn(q, c, pos, w, qi, ci, 0.25), argnums=(0, 1),
                                         has_aux=True)(q, c)
gq = multihost_utils.process_allgather(gq, tiled=True)
gc = multihost_utils.process_allgather(gc, tiled=True)
if pid == 0:
    np.savez(out, loss=np.asarray(loss), gq=np.asarray(gq), gc=np.asarray(gc), peg_t=np.asarray(m["peg_t"]))
print(f"process {pid}: loss {float(loss):.6f}")
