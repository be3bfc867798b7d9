"""The sentence-transformers side of benchmarks/quality_parity.py computes jaxembed's loss: ST's
MultipleNegativesRankingLoss plus jaxembed's two masks (empty negative slots, duplicates of the own positive), and
the batch sampler replays the plan's batches in order. Fast (< 10 s): random embeddings, no model."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
torch = pytest.importorskip("torch")
pytest.importorskip("sentence_transformers")

import quality_parity as qp  # noqa: E402


def _labels_and_hashes(B, K, rng):
    """Text ids per (row, slot) with duplicated positives (shared label descriptions) and empty slots (-1)."""
    ids = rng.integers(0, 5, size=(B, K))          # few distinct texts: many duplicates
    ids[rng.random((B, K)) < 0.2] = -1              # empty negative slots
    ids[:, 0] = rng.integers(0, 5, size=B)          # a positive is never empty
    return ids


@pytest.mark.parametrize("K", [2, 3])
def test_masked_loss_matches_jaxembed(K):
    import jax.numpy as jnp

    from jaxembed.losses import CandidateInfo, QueryInfo, layout_pos_index
    from jaxembed.losses.infonce import contrastive_loss

    rng = np.random.default_rng(K)
    B, D = 8, 16
    q = rng.normal(size=(B, D)).astype(np.float32)
    docs = rng.normal(size=(B, K, D)).astype(np.float32)
    ids = _labels_and_hashes(B, K, rng)
    # jaxembed layout: doc rows r*K + j, hash = text id (0 for an empty slot), valid = not empty
    flat_ids = ids.reshape(-1)
    hashes = np.stack([np.where(flat_ids >= 0, flat_ids + 1, 0), np.zeros_like(flat_ids)], 1).astype(np.uint32)
    ci = CandidateInfo(jnp.asarray(flat_ids >= 0), jnp.asarray(hashes), None)
    qi = QueryInfo(pos_hash=jnp.asarray(hashes[::K]))
    ref, _ = contrastive_loss(jnp.asarray(q), jnp.asarray(docs.reshape(B * K, D)), layout_pos_index(B, K),
                              temperature=0.05, qi=qi, ci=ci)
    loss = qp.make_masked_mnrl()(None, scale=20.0)
    labels = torch.as_tensor(np.concatenate([ids, np.zeros((B, 1), np.int64)], 1))
    got = loss.compute_loss_from_embeddings([torch.as_tensor(q)] + [torch.as_tensor(docs[:, j]) for j in range(K)],
                                            labels)
    assert float(got) == pytest.approx(float(ref), rel=1e-5, abs=1e-5)


def test_plan_batch_sampler_and_public_argv():
    assert list(qp.PlanBatchSampler(3, 2)) == [[0, 1], [2, 3], [4, 5]]
    assert len(qp.PlanBatchSampler(3, 2)) == 3
    assert qp._public_argv(["--steps", "5", "--workdir", "/x", "--name=n", "--no-readme", "--seeds", "0"]) == \
        ["--steps", "5", "--seeds", "0"]
