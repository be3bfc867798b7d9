"""On 8 simulated CPU devices: the blocked exact search (jaxembed.mining.blocked_search, the corpus sharded over the
devices) returns the exact top-k ids and scores, in the stable order of ties, and the count of scores above each
threshold, as a full sort of all scores does."""

from __future__ import annotations

import jax
import numpy as np


def test_blocked_search_on_8_simulated_devices():
    from jaxembed import mining

    assert len(jax.devices()) == 8
    rng = np.random.default_rng(2)
    Q = rng.integers(-3, 4, size=(37, 16)).astype(np.float32)   # exact scores with ties (see the 1-device test)
    D = rng.integers(-3, 4, size=(1500, 16)).astype(np.float32)
    thr = (Q @ D[7])[:, None].astype(np.float32)
    res = mining.blocked_search(Q, D, 120, thresholds=thr, block_q=16, block_c=32)
    s = Q @ D.T
    ids = np.argsort(-s, axis=1, kind="stable")[:, :120]
    assert (res.ids == ids).all(), "ids differ"
    assert (res.scores == np.take_along_axis(s, ids, 1)).all()
    assert (res.above[:, 0] == (s > thr).sum(1)).all()
