"""An independent, loop-based float64 reference of the contrastive loss (DESIGN.md 2.1, PEG Eq. 3-6)."""

import numpy as np


def reference_loss(q, c, pos, tau, weights=None, valid=None, hashes=None, qtask=None, ctask=None, same_task=False,
                   peg=None, symmetric=False):
    """peg: None or (t_prev, alpha, beta). Returns (loss, t_new or None)."""
    q = np.asarray(q, np.float64)
    c = np.asarray(c, np.float64)
    q = q / np.linalg.norm(q, axis=1, keepdims=True)
    c = c / np.linalg.norm(c, axis=1, keepdims=True)
    B, N = len(q), len(c)
    S = q @ c.T
    w = np.ones(B) if weights is None else np.asarray(weights, np.float64)
    ps = np.array([S[i, pos[i]] for i in range(B)])
    wq, t, sigma = np.ones(B), None, None
    if peg is not None:
        t_prev, alpha, beta = peg
        active_rows = w > 0
        mean = ps[active_rows].mean()
        sigma = mean - beta
        t = alpha * mean + (1 - alpha) * t_prev
        wq = np.where(ps >= sigma, 1.0, np.clip(ps / sigma, 0, 1))
    losses = np.zeros(B)
    for i in range(B):
        terms = []
        for j in range(N):
            if j != pos[i]:
                if valid is not None and not valid[j]:
                    continue
                if hashes is not None and tuple(hashes[j]) == tuple(hashes[pos[i]]):
                    continue
                if same_task and ctask[j] != qtask[i]:
                    continue
            a = 1.0
            if peg is not None and j != pos[i] and ps[i] >= sigma and S[i, j] >= ps[i]:
                a = t + ps[i]
            terms.append(a * S[i, j] / tau)
        losses[i] = np.log(np.sum(np.exp(terms))) - ps[i] / tau
    total = np.sum(w * wq * losses)
    if symmetric:
        sym = np.zeros(B)
        P = c[pos]
        for i in range(B):
            terms = [P[i] @ q[j] / tau for j in range(B) if not same_task or qtask[j] == qtask[i]]
            sym[i] = np.log(np.sum(np.exp(terms))) - P[i] @ q[i] / tau
        total = (total + np.sum(w * wq * sym)) / 2
    return total / max(np.sum(w > 0), 1), t


def random_batch(seed=0, B=12, K=3, D=16, dup_pairs=((5, 0), (30, 9)), invalid=(4,), ntask=2):
    """A batch with hard negatives, invalid slots, duplicate texts (also across shards) and two tasks."""
    rng = np.random.default_rng(seed)
    N = B * K
    q = rng.normal(size=(B, D)).astype(np.float32)
    c = rng.normal(size=(N, D)).astype(np.float32)
    pos = np.arange(B, dtype=np.int32) * K
    hashes = rng.integers(0, 2**31, size=(N, 2)).astype(np.uint32)
    for a, b in dup_pairs:
        if a < N and b < N:
            hashes[a] = hashes[b]
            c[a] = c[b] + 0.01 * rng.normal(size=D)  # a duplicate text embeds almost identically
    valid = np.ones(N, bool)
    for i in invalid:
        if i % K:  # only negative slots can be empty
            valid[i] = False
    ctask = np.repeat(rng.integers(0, ntask, size=B), K).astype(np.int32)
    qtask = ctask[pos]
    weights = rng.uniform(0.2, 1.0, size=B).astype(np.float32)
    weights[2] = 0.0
    return dict(q=q, c=c, pos=pos, hashes=hashes, valid=valid, ctask=ctask, qtask=qtask, weights=weights)
