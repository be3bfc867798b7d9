"""Task order (Data-CUBE 4.2.2): the cyclic objective (Eq. 6) and three solvers for it.

The order O = (o_1 .. o_m) of m tasks is scored by the cyclic sum of neighbouring task similarities (Eq. 6)::

    f(O) = sum_{i=1}^{m-1} S[o_i, o_{i+1}] + S[o_m, o_1]

with S the task-similarity matrix (Eq. 5). The objective direction is selectable (Data-CUBE Table 6):

- ``max`` (Data-CUBE, "MQMax"): maximise f, i.e. the smoothest transitions;
- ``min`` ("MQMin"): minimise f (the solvers maximise -f);
- ``random`` ("MQRand"): a seeded random permutation.

Solvers (all compiled with numba, never a Python loop over iterations):

- ``anneal``: simulated annealing exactly as the paper (Eq. 7, Algorithm 1 lines 1-12): start from a random order,
  swap two random positions, accept when the objective improves, otherwise with probability exp(-Delta / tau_s)
  where Delta >= 0 is the loss of the objective, then tau_s <- alpha * tau_s, for N iterations (early stop after
  ``patience`` iterations without a new best). The change of the cyclic objective of a swap is computed in O(1)
  from the (at most four) edges it touches; adjacent swaps and the wrap-around pair (positions 0 and m-1 are
  neighbours) touch fewer edges (``swap_delta``).
- ``2opt``: a stronger local search for the same objective: 2-opt (segment reversal) and Or-opt (move a segment of
  1-3 tasks, possibly reversed) until neither improves, inside an iterated local search with double-bridge kicks
  from a greedy start (for symmetric S, which cosine similarities are).
- ``exact``: Held-Karp dynamic programming, the exact optimum for m <= 16 (O(2^m m^2); the tests use 8-12).

Size: one module because the three solvers of Eq. 6 share the objective's numba kernels (``_objective``,
``_swap_delta``) and the front door ``solve``, and are compared with each other (tests, ``benchmarks/task_order.py``).

Paper note: Algorithm 1 writes "if Delta > 0 then accept" with Delta a gain, and Eq. 7 writes exp(-Delta / tau)
with Delta the loss; both describe the usual Metropolis rule, which is what is implemented.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numba
import numpy as np

from jaxembed.errors import UserError

OBJECTIVES = ("max", "min", "random")
SOLVERS = ("anneal", "2opt", "exact")
EXACT_MAX_TASKS = 16
_EPS = 1e-12


# ----------------------------------------------------------------------------------------------- the objective

def check_matrix(S) -> np.ndarray:
    """S as a float64 [m, m] array; a UserError when it is not square or not finite."""
    S = np.asarray(S, np.float64)
    if S.ndim != 2 or S.shape[0] != S.shape[1]:
        raise UserError(f"task similarity: expected a square matrix, got shape {S.shape}")
    if not np.all(np.isfinite(S)):
        raise UserError("task similarity: the matrix has non-finite entries (fix: recompute it with jaxembed score)")
    return np.ascontiguousarray(S)


@numba.njit(cache=True)
def _objective(S, order):
    n = order.shape[0]
    if n < 2:
        return 0.0
    total = 0.0
    for p in range(n):
        q = p + 1 if p + 1 < n else 0
        total += S[order[p], order[q]]
    return total


def cyclic_objective(S, order) -> float:
    """Eq. 6: S [m, m], order int [m] (a permutation) -> sum of S over the m cyclic neighbour pairs (0 when m < 2)."""
    return float(_objective(np.asarray(S, np.float64), np.asarray(order, np.int64)))


@numba.njit(cache=True, inline="always")
def _edge_change(S, order, n, p, i, j, a, b):
    """New minus old weight of edge e(p) (positions p, p+1 mod n) when positions i and j swap tasks a and b."""
    q = p + 1 if p + 1 < n else 0
    u = order[p]
    v = order[q]
    u2 = b if p == i else (a if p == j else u)
    v2 = b if q == i else (a if q == j else v)
    return S[u2, v2] - S[u, v]


@numba.njit(cache=True)
def _swap_delta(S, order, n, i, j):
    """Change of the cyclic objective when the tasks at positions i != j are swapped, in O(1).

    Edge e(p) joins positions p and p+1 (mod n). A swap touches e(i-1), e(i), e(j-1), e(j); an adjacent swap
    (j = i+1) shares e(i) = e(j-1), and the wrap-around swap (i = 0, j = n-1) shares e(i-1) = e(j): each distinct
    edge is counted once."""
    if i > j:
        i, j = j, i
    a = order[i]
    b = order[j]
    e0 = i - 1 if i > 0 else n - 1
    e2 = j - 1
    d = _edge_change(S, order, n, e0, i, j, a, b) + _edge_change(S, order, n, i, i, j, a, b)
    if e2 != i and e2 != e0:
        d += _edge_change(S, order, n, e2, i, j, a, b)
    if j != e0 and j != e2:
        d += _edge_change(S, order, n, j, i, j, a, b)
    return d


def swap_delta(S, order, i: int, j: int) -> float:
    """f(order with positions i and j swapped) - f(order), computed from the touched edges only."""
    order = np.asarray(order, np.int64)
    if i == j:
        return 0.0
    return float(_swap_delta(np.asarray(S, np.float64), order, order.shape[0], int(i), int(j)))


# ----------------------------------------------------------------------------------------------- annealing

@numba.njit(cache=True)
def _anneal(S, order, iterations, tau0, alpha, patience, seed):
    """In-place annealing of ``order`` (maximising). -> (best order, best value, iterations run, accepted moves)."""
    np.random.seed(seed)
    n = order.shape[0]
    cur = _objective(S, order)
    best = cur
    best_order = order.copy()
    tau = tau0
    since = 0
    accepted = 0
    it = 0
    while it < iterations:
        it += 1
        i = np.random.randint(0, n)
        j = np.random.randint(0, n - 1)
        if j >= i:
            j += 1
        d = _swap_delta(S, order, n, i, j)
        take = d > 0.0
        if not take and tau > 0.0:
            take = np.random.random() < math.exp(d / tau)  # d <= 0: Eq. 7 with Delta = -d, the loss
        if take:
            t = order[i]
            order[i] = order[j]
            order[j] = t
            cur += d
            accepted += 1
        if cur > best + _EPS:
            best = cur
            best_order[:] = order
            since = 0
        else:
            since += 1
            if patience > 0 and since >= patience:
                break
        tau *= alpha
    return best_order, _objective(S, best_order), it, accepted


@numba.njit(cache=True)
def _mean_loss(S, samples, seed):
    np.random.seed(seed)
    n = S.shape[0]
    order = np.random.permutation(n).astype(np.int64)
    total = 0.0
    count = 0
    for _ in range(samples):
        i = np.random.randint(0, n)
        j = np.random.randint(0, n - 1)
        if j >= i:
            j += 1
        d = _swap_delta(S, order, n, i, j)
        if d < 0.0:
            total -= d
            count += 1
    return total / count if count else 0.0


def auto_tau0(S, seed: int = 0, samples: int = 2000, accept: float = 0.5) -> float:
    """Initial temperature at which an average worsening swap of a random order is accepted with probability
    ``accept``: tau0 = mean loss / ln(1 / accept)."""
    S = check_matrix(S)
    if S.shape[0] < 3:
        return 1.0
    loss = _mean_loss(S, int(samples), int(seed) % (2 ** 32))
    return float(loss / math.log(1.0 / accept)) if loss > 0 else 1e-3


def anneal(S, *, iterations: int = 2_000_000, tau0: float | None = None, cooling: float | None = None,
           final_tau_ratio: float = 1e-2, patience: int = 0, seed: int = 0, init=None):
    """Simulated annealing (Eq. 7), maximising Eq. 6 over S [m, m]. -> (order int64 [m], value, iterations run,
    accepted moves).

    tau0: initial temperature (None: ``auto_tau0``); cooling: alpha of tau_s <- alpha tau_s (None: the alpha that
    brings tau0 down to ``final_tau_ratio`` * tau0 after ``iterations`` steps); patience: stop after this many
    iterations without a new best (0: never); init: the starting order (default a seeded random one, Algorithm 1
    line 2)."""
    S = check_matrix(S)
    n = S.shape[0]
    if iterations < 0:
        raise UserError(f"--iterations must be >= 0, got {iterations}")
    rng = np.random.default_rng(seed)
    order = (rng.permutation(n) if init is None else np.asarray(init)).astype(np.int64)
    if n < 3 or iterations == 0:
        return order, cyclic_objective(S, order), 0, 0
    t0 = auto_tau0(S, seed) if tau0 is None else float(tau0)
    if not t0 > 0:
        raise UserError(f"--tau0 must be positive, got {tau0}")
    alpha = (final_tau_ratio ** (1.0 / iterations)) if cooling is None else float(cooling)
    if not 0 < alpha <= 1:
        raise UserError(f"--cooling must be in (0, 1], got {cooling}")
    best, value, its, acc = _anneal(S, order, int(iterations), t0, alpha, int(patience), int(seed) % (2 ** 32))
    return best, float(value), int(its), int(acc)


# ----------------------------------------------------------------------------------------------- local search

@numba.njit(cache=True)
def _reverse(order, i, j):
    while i < j:
        t = order[i]
        order[i] = order[j]
        order[j] = t
        i += 1
        j -= 1


@numba.njit(cache=True, inline="always")
def _record(S, order, trace, k):
    """trace[k] = the objective after move k (tracing only: trace has room for it)."""
    if k < trace.shape[0]:
        trace[k] = _objective(S, order)


@numba.njit(cache=True)
def _two_opt(S, order, trace, done):
    """First-improvement 2-opt until no reversal improves (maximising, symmetric S). -> number of moves.
    trace / done: the objective after each move is written to trace[done + move] where there is room."""
    n = order.shape[0]
    moves = 0
    improved = True
    while improved:
        improved = False
        for i in range(n - 2):
            for j in range(i + 2, n):
                if i == 0 and j == n - 1:
                    continue  # the two edges are adjacent through the wrap-around
                a = order[i]
                b = order[i + 1]
                c = order[j]
                d = order[j + 1] if j + 1 < n else order[0]
                if S[a, c] + S[b, d] - S[a, b] - S[c, d] > _EPS:
                    _reverse(order, i + 1, j)
                    _record(S, order, trace, done + moves)
                    moves += 1
                    improved = True
    return moves


@numba.njit(cache=True)
def _or_opt(S, order, max_len, trace, done):
    """First-improvement Or-opt: move a segment of 1..max_len consecutive tasks (cyclically), forwards or reversed,
    between two other neighbours, until no move improves (maximising). -> number of moves. trace: see _two_opt."""
    n = order.shape[0]
    moves = 0
    if n < 4:
        return 0
    improved = True
    buf = np.empty(n, np.int64)
    while improved:
        improved = False
        for L in range(1, min(max_len, n - 2) + 1):
            for i in range(n):
                s0 = order[i]
                s1 = order[(i + L - 1) % n]
                p = order[(i - 1) % n]
                q = order[(i + L) % n]
                removed = S[p, s0] + S[s1, q] - S[p, q]
                best = _EPS
                best_k = -1
                best_rev = False
                # insertion edges: (x, y) for consecutive positions outside the segment, excluding (p, q)
                for k in range(n - L - 1):
                    xp = (i + L + k) % n
                    x = order[xp]
                    y = order[(xp + 1) % n]
                    g = S[x, s0] + S[s1, y] - S[x, y] - removed
                    if g > best:
                        best = g
                        best_k = k
                        best_rev = False
                    g = S[x, s1] + S[s0, y] - S[x, y] - removed
                    if g > best:
                        best = g
                        best_k = k
                        best_rev = True
                if best_k >= 0:
                    # rebuild: the tasks after the segment up to and including x, then the segment, then the rest
                    m = 0
                    for k in range(best_k + 1):
                        buf[m] = order[(i + L + k) % n]
                        m += 1
                    for t in range(L):
                        buf[m] = order[(i + (L - 1 - t if best_rev else t)) % n]
                        m += 1
                    for k in range(best_k + 1, n - L):
                        buf[m] = order[(i + L + k) % n]
                        m += 1
                    order[:] = buf
                    _record(S, order, trace, done + moves)
                    moves += 1
                    improved = True
                    break
            if improved:
                break
    return moves


@numba.njit(cache=True)
def _local_search(S, order, use_2opt, use_oropt, trace):
    total = 0
    while True:
        m = 0
        if use_2opt:
            m += _two_opt(S, order, trace, total + m)
        if use_oropt:
            m += _or_opt(S, order, 3, trace, total + m)
        total += m
        if m == 0 or not (use_2opt and use_oropt):
            break
    return total


@numba.njit(cache=True)
def _greedy(S, start):
    """Nearest (most similar) neighbour tour from ``start``."""
    n = S.shape[0]
    used = np.zeros(n, np.bool_)
    order = np.empty(n, np.int64)
    order[0] = start
    used[start] = True
    for p in range(1, n):
        last = order[p - 1]
        best = -np.inf
        bk = -1
        for k in range(n):
            if not used[k] and (bk < 0 or S[last, k] > best):
                best = S[last, k]
                bk = k
        order[p] = bk
        used[bk] = True
    return order


@numba.njit(cache=True)
def _ils(S, starts, kicks, seed):
    """Iterated local search: greedy starts + 2-opt / Or-opt, then double-bridge kicks, keeping the best."""
    np.random.seed(seed)
    n = S.shape[0]
    no_trace = np.empty(0)
    best = _greedy(S, 0)
    _local_search(S, best, True, True, no_trace)
    best_v = _objective(S, best)
    for s in range(1, starts):
        o = _greedy(S, np.random.randint(0, n))
        _local_search(S, o, True, True, no_trace)
        v = _objective(S, o)
        if v > best_v + _EPS:
            best_v = v
            best = o
    cur = best.copy()
    cur_v = best_v
    if n < 8:
        return best, best_v
    new = np.empty(n, np.int64)
    for _ in range(kicks):
        # double bridge: A B C D -> A C B D (three random cut points)
        a = 1 + np.random.randint(0, n - 3)
        b = a + 1 + np.random.randint(0, n - a - 2)
        c = b + 1 + np.random.randint(0, n - b - 1)
        m = 0
        for k in range(a):
            new[m] = cur[k]
            m += 1
        for k in range(b, c):
            new[m] = cur[k]
            m += 1
        for k in range(a, b):
            new[m] = cur[k]
            m += 1
        for k in range(c, n):
            new[m] = cur[k]
            m += 1
        cand = new.copy()
        _local_search(S, cand, True, True, no_trace)
        v = _objective(S, cand)
        if v >= cur_v - _EPS:
            cur = cand
            cur_v = v
            if v > best_v + _EPS:
                best_v = v
                best = cand.copy()
    return best, best_v


def local_search(S, order, moves: tuple[str, ...] = ("2opt", "oropt"), trace: np.ndarray | None = None):
    """Improve ``order`` with 2-opt and / or Or-opt moves until none improves (maximising; S symmetric).
    -> (order int64 [m], value). trace: a 1-d float64 array that receives the objective after each accepted move,
    in order, as many as it has room for; the entries after the last move are left as they were (fill it with NaN
    to count the moves)."""
    S = check_matrix(S)
    o = np.array(order, np.int64)
    if trace is not None and (trace.dtype != np.float64 or trace.ndim != 1):
        raise ValueError("local_search: trace must be a 1-d float64 array")
    if S.shape[0] >= 4:
        _local_search(S, o, "2opt" in moves, "oropt" in moves, np.empty(0) if trace is None else trace)
    return o, cyclic_objective(S, o)


def two_opt(S, *, seed: int = 0, starts: int = 8, kicks: int = 2000):
    """The stronger solver: iterated 2-opt + Or-opt local search (maximising; S symmetric). -> (order, value)."""
    S = check_matrix(S)
    n = S.shape[0]
    if n < 4:
        return held_karp(S)
    if not np.allclose(S, S.T, atol=1e-9):
        raise UserError("the 2opt solver needs a symmetric similarity matrix (fix: use --solver anneal)")
    o, _ = _ils(S, max(1, int(starts)), max(0, int(kicks)), int(seed) % (2 ** 32))
    return o.astype(np.int64), cyclic_objective(S, o)


# ----------------------------------------------------------------------------------------------- exact

@numba.njit(cache=True)
def _held_karp(S):
    n = S.shape[0]
    N = 1 << (n - 1)
    dp = np.full((N, n), -np.inf)
    parent = np.full((N, n), -1, np.int64)
    for k in range(1, n):
        dp[1 << (k - 1), k] = S[0, k]
    for mask in range(1, N):
        for k in range(1, n):
            bit = 1 << (k - 1)
            if not (mask & bit) or dp[mask, k] == -np.inf:
                continue
            base = dp[mask, k]
            for m in range(1, n):
                mb = 1 << (m - 1)
                if mask & mb:
                    continue
                v = base + S[k, m]
                if v > dp[mask | mb, m]:
                    dp[mask | mb, m] = v
                    parent[mask | mb, m] = k
    full = N - 1
    best = -np.inf
    last = -1
    for k in range(1, n):
        v = dp[full, k] + S[k, 0]
        if v > best:
            best = v
            last = k
    order = np.empty(n, np.int64)
    mask = full
    for p in range(n - 1, 0, -1):
        order[p] = last
        prev = parent[mask, last]
        mask ^= 1 << (last - 1)
        last = prev
    order[0] = 0
    return order, best


def held_karp(S):
    """The exact maximum of Eq. 6 by Held-Karp dynamic programming (m <= 16). -> (order int64 [m], value)."""
    S = check_matrix(S)
    n = S.shape[0]
    if n > EXACT_MAX_TASKS:
        raise UserError(f"the exact solver handles at most {EXACT_MAX_TASKS} tasks, got {n} "
                        "(fix: --solver anneal or 2opt)")
    if n < 3:
        o = np.arange(n, dtype=np.int64)
        return o, cyclic_objective(S, o)
    o, _ = _held_karp(S)
    return o, cyclic_objective(S, o)


# ----------------------------------------------------------------------------------------------- front door

@dataclasses.dataclass
class OrderResult:
    """A solved task order: ``order`` (indices into the matrix), its Eq. 6 value on the original S, and how."""

    order: np.ndarray
    value: float
    objective: str
    solver: str
    seconds: float
    iterations: int = 0
    accepted: int = 0
    params: dict = dataclasses.field(default_factory=dict)


def solve(S, *, objective: str = "max", solver: str = "anneal", iterations: int = 2_000_000,
          tau0: float | None = None, cooling: float | None = None, patience: int = 0, seed: int = 0,
          kicks: int = 2000) -> OrderResult:
    """A task order for S [m, m] (Eq. 6): ``objective`` max (Data-CUBE) | min (MQMin) | random (MQRand);
    ``solver`` anneal | 2opt | exact (ignored for random)."""
    S = check_matrix(S)
    if objective not in OBJECTIVES:
        raise UserError(f"--objective {objective!r}: one of {', '.join(OBJECTIVES)}")
    if solver not in SOLVERS:
        raise UserError(f"--solver {solver!r}: one of {', '.join(SOLVERS)}")
    t0 = time.perf_counter()
    n = S.shape[0]
    if objective == "random":
        order = np.random.default_rng(seed).permutation(n).astype(np.int64)
        return OrderResult(order, cyclic_objective(S, order), objective, "random", time.perf_counter() - t0,
                           params={"seed": seed})
    W = S if objective == "max" else -S
    its = acc = 0
    params: dict = {"seed": seed}
    if solver == "anneal":
        t = auto_tau0(W, seed) if tau0 is None else float(tau0)
        alpha = (1e-2 ** (1.0 / iterations)) if (cooling is None and iterations > 0) else cooling
        order, _, its, acc = anneal(W, iterations=iterations, tau0=t, cooling=alpha, patience=patience, seed=seed)
        params.update(iterations=iterations, tau0=t, cooling=alpha, patience=patience)
    elif solver == "2opt":
        order, _ = two_opt(W, seed=seed, kicks=kicks)
        params.update(kicks=kicks)
    else:
        order, _ = held_karp(W)
    return OrderResult(np.asarray(order, np.int64), cyclic_objective(S, order), objective, solver,
                       time.perf_counter() - t0, its, acc, params)


def random_baseline(S, samples: int = 1000, seed: int = 0) -> tuple[float, float]:
    """Mean and standard deviation of Eq. 6 over ``samples`` seeded random orders."""
    S = check_matrix(S)
    rng = np.random.default_rng(seed)
    v = [cyclic_objective(S, rng.permutation(S.shape[0])) for _ in range(samples)]
    return float(np.mean(v)), float(np.std(v))
