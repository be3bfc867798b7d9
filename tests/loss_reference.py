"""An independent, loop-based float64 reference of the contrastive loss (docs/design.md, Common core; PEG Eq. 3-6;
GIST's guided mask), its gradient by central finite differences with PEG's weights held constant, the distillation
losses (KL, MarginMSE), the scored-pair losses (CoSENT, AnglE through complex numbers), and test batches."""

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


def gist_limits(gq, gc, pos, margin=0.0, strategy="absolute"):
    """GIST (Solatorio 2024): per query, the guide similarity above which a candidate is masked, by loops."""
    gq, gc = _unit(gq), _unit(gc)
    out = []
    for i in range(len(gq)):
        p = float(gq[i] @ gc[pos[i]])
        out.append(p - margin if strategy == "absolute" else p - abs(p) * margin)
    return np.array(out)


def reference_loss(q, c, pos, tau, weights=None, valid=None, hashes=None, qtask=None, ctask=None, same_task=False,
                   peg=None, symmetric=False, qhashes=None, frozen=None, guide=None):
    """peg: None or (t_prev, alpha, beta). frozen: None or (w_q [B], a [B, N]) to use instead of the ones computed
    from q and c (PEG's stop-gradient: for the gradient they are constants). qhashes [B, 2]: the query texts' hashes
    (query i: the positive of another row j is not a negative when q_j = q_i as texts; symmetric term: query j is
    not a negative of positive i when q_j = q_i or p_j = p_i as texts).
    guide: None or (gq [B, G], gc [N, G], margin, strategy): GIST masks candidate j of query i when the guide's
    cosine g(q_i, c_j) exceeds its limit (``gist_limits``); in the symmetric term, query j of positive i when
    g(p_i, q_j) does. Returns (loss, t_new or None)."""
    if guide is not None:
        gq, gc = _unit(guide[0]), _unit(guide[1])
        limit = gist_limits(gq, gc, pos, guide[2], guide[3])
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
                if qhashes is not None and any(pos[r] == j and r != i and tuple(qhashes[r]) == tuple(qhashes[i])
                                               for r in range(B)):
                    continue  # the positive of another row with the same query text
                if same_task and ctask[j] != qtask[i]:
                    continue
                if guide is not None and gq[i] @ gc[j] > limit[i]:
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
                    if guide is not None and gc[pos[i]] @ gq[j] > limit[i]:
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
                 shared_positives=(), close_positives=False, same_queries=()):
    """A batch with hard negatives, invalid slots, duplicate texts (also across shards) and two tasks.

    repeated_rows: pairs (r, s): row r repeats row s (the same query and positive texts, embedded almost alike);
    shared_positives: pairs (r, s): row r's positive is the text of row s's positive (another query);
    same_queries: pairs (r, s): row r's query is the text of row s's query (embedded almost alike, same task), with
    another positive text; both positives near the query (a query with several relevant positives);
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
    for r, s in same_queries:
        qhashes[r], row_task[r] = qhashes[s], row_task[s]
        q[r] = q[s] + 0.01 * rng.normal(size=D)
        u = q[s] / np.linalg.norm(q[s])
        for k in (r, s):
            c[pos[k]] = u + 0.5 * rng.normal(size=D) / np.sqrt(D)
    ctask = np.repeat(row_task, K).astype(np.int32)
    qtask = ctask[pos]
    return dict(q=q, c=c, pos=pos, hashes=hashes, qhashes=qhashes, valid=valid, ctask=ctask, qtask=qtask,
                weights=weights)


def peg_batch(seed=0, **kw):
    """``random_batch`` where PEG's weighting acts: positives close to their queries (similarities spread from about
    0.3 to 0.97, so sigma > 0 and several w_q < 1) and, for every third row, a hard negative closer to the query than
    its positive (a_n != 1 where that row is active)."""
    return random_batch(seed, close_positives=True, **kw)


# ------------------------------------------------------------------------------------------ distillation

def reference_distill(kind, q, c, pos, teacher, valid, weights=None, tau=0.05, teacher_tau=None):
    """KL(p_teacher || p_student) over each query's own slots (RocketQAv2 / FlagEmbedding), or MarginMSE
    (Hofstätter et al. 2020), by loops in float64. teacher, valid: [B, K] (NaN = no score). A query (KL) or a
    (query, negative) pair (MarginMSE) takes part when every score it needs is there; the mean is over those."""
    q, c = _unit(q), _unit(c)
    B, K = np.asarray(teacher).shape
    w = np.ones(B) if weights is None else np.asarray(weights, np.float64)
    tt = tau if teacher_tau is None else teacher_tau
    total, count = 0.0, 0
    for i in range(B):
        if w[i] <= 0:
            continue
        slots = [k for k in range(K) if valid[i][k]]
        s = {k: float(q[i] @ c[pos[i] + k]) for k in slots}
        t = {k: float(teacher[i][k]) for k in slots}
        if kind == "kl":
            if not slots or slots[0] != 0 or len(slots) < 2 or any(not np.isfinite(t[k]) for k in slots):
                continue
            zs = sum(np.exp(s[k] / tau) for k in slots)
            zt = sum(np.exp(t[k] / tt) for k in slots)
            kl = 0.0
            for k in slots:
                pt, ps = np.exp(t[k] / tt) / zt, np.exp(s[k] / tau) / zs
                kl += pt * np.log(pt / ps)
            total += w[i] * kl
            count += 1
        else:
            if 0 not in slots or not np.isfinite(t[0]):
                continue
            for k in slots:
                if k == 0 or not np.isfinite(t[k]):
                    continue
                total += w[i] * ((s[0] - s[k]) - (t[0] - t[k])) ** 2
                count += 1
    return total / max(count, 1)


# ------------------------------------------------------------------------------------------ scored pairs

def angle_similarity(u, v):
    """AnglE (Li & Li 2023): u, v as complex vectors z_u, z_v (first half real, second half imaginary parts; an odd
    width padded with a zero); the reference code's quotient of the two, with the norm scaling it applies, is
    sum_d z_u[d] * conj(z_v[d]) / (|u| |v|); the similarity is |Re + Im| of it. Python complex numbers, float64."""
    u, v = np.asarray(u, np.float64), np.asarray(v, np.float64)
    if len(u) % 2:
        u, v = np.append(u, 0.0), np.append(v, 0.0)
    h = len(u) // 2
    zu = [complex(u[d], u[h + d]) for d in range(h)]
    zv = [complex(v[d], v[h + d]) for d in range(h)]
    nu = np.sqrt(sum(abs(z) ** 2 for z in zu))
    nv = np.sqrt(sum(abs(z) ** 2 for z in zv))
    total = sum(a * b.conjugate() for a, b in zip(zu, zv)) / (nu * nv)
    return abs(total.real + total.imag)


def reference_scored(kind, u, v, scores, weights=None, scale=20.0, cosine_weight=0.0):
    """CoSENT (Su 2022) / AnglE (Li & Li 2023): log(1 + sum_{y_i > y_j} exp(scale (sim_j - sim_i))) by loops."""
    u, v = np.asarray(u, np.float64), np.asarray(v, np.float64)
    B = len(u)
    w = np.ones(B) if weights is None else np.asarray(weights, np.float64)
    members = [i for i in range(B) if w[i] > 0 and np.isfinite(scores[i])]

    def rank(sim):
        terms = [scale * (sim[j] - sim[i]) for i in members for j in members if scores[i] > scores[j]]
        return float(np.log(1.0 + sum(np.exp(x) for x in terms)))

    cos = [float(_unit(u[i:i + 1])[0] @ _unit(v[i:i + 1])[0]) for i in range(B)]
    if kind == "cosent":
        return rank(cos)
    ang = [angle_similarity(u[i], v[i]) for i in range(B)]
    return rank(ang) + (cosine_weight * rank(cos) if cosine_weight else 0.0)


def numeric_grad(f, xs, h=1e-6):
    """Central differences of a float64 scalar function f(*xs) with respect to each array of xs."""
    xs = [np.asarray(x, np.float64) for x in xs]
    out = []
    for a in range(len(xs)):
        g = np.zeros_like(xs[a])
        for idx in np.ndindex(*xs[a].shape):
            vals = []
            for sign in (1, -1):
                ys = [x.copy() for x in xs]
                ys[a][idx] += sign * h
                vals.append(f(*ys))
            g[idx] = (vals[0] - vals[1]) / (2 * h)
        out.append(g)
    return out
