"""An independent, loop-based float64 reference of the contrastive loss (DESIGN.md 2.1, PEG Eq. 3-6), its gradient
by central finite differences with PEG's weights held constant, and test batches."""

import numpy as np


def _unit(x):
    x = np.asarray(x, np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def peg_constants(q, c, pos, weights=None, peg=(0.0, 0.5, 0.1)):
    """PEG Eq. 4-6 by loops. peg = (t_prev, alpha, beta). Returns (w_q [B], a [B, N], t, sigma): w_q the query
    weights (clipped to [0, 1], see jaxembed.losses.infonce.peg_statistics), a the negative scales (1 for the
    positive and for negatives that are not hard)."""
    q, c = _unit(q), _unit(c)
    B, N = len(q), len(c)
    w = np.ones(B) if weights is None else np.asarray(weights, np.float64)
    t_prev, alpha, beta = peg
    ps = np.array([q[i] @ c[pos[i]] for i in range(B)])
    mean = ps[w > 0].mean()
    sigma = mean - beta
    t = alpha * mean + (1 - alpha) * t_prev
    wq = np.array([1.0 if ps[i] >= sigma else min(max(ps[i] / sigma, 0.0), 1.0) for i in range(B)])
    a = np.ones((B, N))
    for i in range(B):
        for j in range(N):
            if j != pos[i] and ps[i] >= sigma and q[i] @ c[j] >= ps[i]:
                a[i, j] = t + ps[i]
    return wq, a, t, sigma


def reference_loss(q, c, pos, tau, weights=None, valid=None, hashes=None, qtask=None, ctask=None, same_task=False,
                   peg=None, symmetric=False, qhashes=None, frozen=None):
    """peg: None or (t_prev, alpha, beta). frozen: None or (w_q [B], a [B, N]) to use instead of the ones computed
    from q and c (PEG's stop-gradient: for the gradient they are constants). qhashes [B, 2]: the query texts' hashes
    (symmetric term: query j is not a negative of positive i when q_j = q_i or p_j = p_i as texts).
    Returns (loss, t_new or None)."""
    q, c = _unit(q), _unit(c)
    B, N = len(q), len(c)
    w = np.ones(B) if weights is None else np.asarray(weights, np.float64)
    ps = np.array([q[i] @ c[pos[i]] for i in range(B)])
    wq, a, t = np.ones(B), np.ones((B, N)), None
    if peg is not None:
        wq, a, t, _ = peg_constants(q, c, pos, w, peg)
    if frozen is not None:
        wq, a = frozen
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
            terms.append(a[i, j] * (q[i] @ c[j]) / tau)
        losses[i] = np.log(np.sum(np.exp(terms))) - ps[i] / tau
    total = np.sum(w * wq * losses)
    if symmetric:
        sym = np.zeros(B)
        P = c[pos]
        for i in range(B):
            terms = []
            for j in range(B):
                if j != i:
                    if qhashes is not None and tuple(qhashes[j]) == tuple(qhashes[i]):
                        continue
                    if hashes is not None and tuple(hashes[pos[j]]) == tuple(hashes[pos[i]]):
                        continue
                    if same_task and qtask[j] != qtask[i]:
                        continue
                terms.append(P[i] @ q[j] / tau)
            sym[i] = np.log(np.sum(np.exp(terms))) - P[i] @ q[i] / tau
        total = (total + np.sum(w * wq * sym)) / 2
    return total / max(np.sum(w > 0), 1), t


def reference_grad(q, c, pos, tau, h=1e-6, **kw):
    """d reference_loss / d(q, c) by central differences in float64. With ``peg`` in kw, PEG's w_q and a_n are
    computed once at (q, c) and held constant (``frozen``), as PEG prescribes (stop-gradient)."""
    q, c = np.asarray(q, np.float64), np.asarray(c, np.float64)
    if kw.get("peg") is not None and kw.get("frozen") is None:
        wq, a, _, _ = peg_constants(q, c, pos, kw.get("weights"), kw["peg"])
        kw = dict(kw, frozen=(wq, a))
    grads = []
    for which in (0, 1):
        x = (q, c)[which]
        g = np.zeros_like(x)
        for idx in np.ndindex(*x.shape):
            vals = []
            for sign in (1, -1):
                y = x.copy()
                y[idx] += sign * h
                args = (y, c) if which == 0 else (q, y)
                vals.append(reference_loss(*args, pos, tau, **kw)[0])
            g[idx] = (vals[0] - vals[1]) / (2 * h)
        grads.append(g)
    return grads


def random_batch(seed=0, B=12, K=3, D=16, dup_pairs=((5, 0), (30, 9)), invalid=(4,), ntask=2, repeated_rows=(),
                 shared_positives=(), close_positives=False):
    """A batch with hard negatives, invalid slots, duplicate texts (also across shards) and two tasks.

    repeated_rows: pairs (r, s): row r repeats row s (the same query and positive texts, embedded almost alike);
    shared_positives: pairs (r, s): row r's positive is the text of row s's positive (another query);
    close_positives: positives near their queries, so that PEG's weighting acts (see ``peg_batch``).
    Returns arrays including ``qhashes`` [B, 2] (the query texts)."""
    rng = np.random.default_rng(seed)
    N = B * K
    q = rng.normal(size=(B, D)).astype(np.float32)
    c = rng.normal(size=(N, D)).astype(np.float32)
    pos = np.arange(B, dtype=np.int32) * K
    if close_positives:
        noise = np.linspace(0.25, 3.0, B)[rng.permutation(B)]  # how far each positive is from its query
        for i in range(B):
            u = q[i] / np.linalg.norm(q[i])
            c[pos[i]] = u + noise[i] * rng.normal(size=D) / np.sqrt(D)
            if K > 1 and i % 3 == 0:  # a hard negative closer to the query than the positive
                c[pos[i] + 1] = u + 0.5 * noise[i] * rng.normal(size=D) / np.sqrt(D)
    hashes = rng.integers(0, 2**31, size=(N, 2)).astype(np.uint32)
    for a, b in dup_pairs:
        if a < N and b < N:
            hashes[a] = hashes[b]
            c[a] = c[b] + 0.01 * rng.normal(size=D)  # a duplicate text embeds almost identically
    valid = np.ones(N, bool)
    for i in invalid:
        if i % K:  # only negative slots can be empty
            valid[i] = False
    row_task = rng.integers(0, ntask, size=B)
    weights = rng.uniform(0.2, 1.0, size=B).astype(np.float32)
    weights[2] = 0.0
    qhashes = rng.integers(0, 2**31, size=(B, 2)).astype(np.uint32)  # drawn last: the batches above are unchanged
    for r, s in repeated_rows:
        qhashes[r], hashes[pos[r]], row_task[r] = qhashes[s], hashes[pos[s]], row_task[s]
        q[r] = q[s] + 0.01 * rng.normal(size=D)
        c[pos[r]] = c[pos[s]] + 0.01 * rng.normal(size=D)
    for r, s in shared_positives:
        hashes[pos[r]] = hashes[pos[s]]
        c[pos[r]] = c[pos[s]] + 0.01 * rng.normal(size=D)
    ctask = np.repeat(row_task, K).astype(np.int32)
    qtask = ctask[pos]
    return dict(q=q, c=c, pos=pos, hashes=hashes, qhashes=qhashes, valid=valid, ctask=ctask, qtask=qtask,
                weights=weights)


def peg_batch(seed=0, **kw):
    """``random_batch`` where PEG's weighting acts: positives close to their queries (similarities spread from about
    0.3 to 0.97, so sigma > 0 and several w_q < 1) and, for every third row, a hard negative closer to the query than
    its positive (a_n != 1 where that row is active)."""
    return random_batch(seed, close_positives=True, **kw)
