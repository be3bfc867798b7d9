"""Two processes on localhost (CPU, gloo collectives), 2 devices each: the sharded loss and its gradients equal
the single-process result."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxembed.losses import CandidateInfo, LossOptions, QueryInfo, contrastive_loss
from loss_reference import random_batch

import runs


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_equal_single_process(tmp_path):
    here = Path(__file__).parent
    out = tmp_path / "mh.npz"
    port = _free_port()
    env = dict(os.environ, XLA_FLAGS=runs.xla_flags(2), JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")]))
    worker = str(here / "multidevice" / "multihost_worker.py")
    procs = [subprocess.Popen([sys.executable, worker, str(i), str(port), str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    assert all(p.returncode == 0 for p in procs), "\n".join(x[-3000:] for x in logs)

    b = random_batch(seed=3, B=8, K=3, D=16, dup_pairs=((5, 0), (20, 9)), invalid=(4,))
    pos = jnp.asarray(b["pos"])
    qi = QueryInfo(pos_hash=jnp.asarray(b["hashes"][b["pos"]]), task=jnp.asarray(b["qtask"]))
    ci = CandidateInfo(jnp.asarray(b["valid"]), jnp.asarray(b["hashes"]), jnp.asarray(b["ctask"]))
    f = lambda q, c: contrastive_loss(q, c, pos, temperature=0.05, weights=jnp.asarray(b["weights"]), qi=qi, ci=ci,
                                      opts=LossOptions(same_task=True, peg=True), symmetric=True, peg_t_prev=0.25)
    # jitted: one compilation of the whole reference instead of one per operation run eagerly
    (loss, m), (gq, gc) = jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))(jnp.asarray(b["q"]),
                                                                                       jnp.asarray(b["c"]))
    got = np.load(out)
    assert abs(float(got["loss"]) - float(loss)) <= 1e-5
    assert abs(float(got["peg_t"]) - float(m["peg_t"])) <= 1e-6
    np.testing.assert_allclose(got["gq"], np.asarray(gq), atol=1e-5)
    np.testing.assert_allclose(got["gc"], np.asarray(gc), atol=1e-5)
