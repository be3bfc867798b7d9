"""Data-CUBE curriculum (jaxembed.curriculum, ``jaxembed score`` / ``jaxembed curriculum``): the O(1) swap delta of
the cyclic objective, the annealer against the exact optimum, the solvers and objective directions, task
similarity and phi, resumable scoring, and the real pipeline score -> curriculum -> plan build with all-MiniLM-L6-v2
on a store built from slices of ../shared/data/train."""

from __future__ import annotations

import itertools
import json
import sys
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from jaxembed.curriculum import difficulty as dif
from jaxembed.curriculum import order as O
from jaxembed.curriculum import similarity as sim
from jaxembed.errors import UserError


def _cosine_matrix(n: int, seed: int, d: int = 16) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x @ x.T


# ------------------------------------------------------------------------------------------------ objective

def test_swap_delta_equals_recomputation_including_adjacent_and_wraparound_swaps():
    rng = np.random.default_rng(0)
    for n in range(2, 10):
        for S in (_cosine_matrix(n, n), rng.normal(size=(n, n))):   # symmetric and asymmetric
            order = rng.permutation(n)
            base = O.cyclic_objective(S, order)
            for i, j in itertools.permutations(range(n), 2):         # every pair: adjacent, wrap (0, n-1), far
                o2 = order.copy()
                o2[i], o2[j] = o2[j], o2[i]
                assert abs(O.swap_delta(S, order, i, j) - (O.cyclic_objective(S, o2) - base)) < 1e-9, (n, i, j)
    S = _cosine_matrix(330, 1)
    order = rng.permutation(330)
    base = O.cyclic_objective(S, order)
    pairs = [(0, 329), (329, 0), (5, 6), (328, 329), (0, 1)] + [tuple(rng.choice(330, 2, replace=False))
                                                                for _ in range(300)]
    for i, j in pairs:
        o2 = order.copy()
        o2[i], o2[j] = o2[j], o2[i]
        assert abs(O.swap_delta(S, order, i, j) - (O.cyclic_objective(S, o2) - base)) < 1e-9
    # Eq. 6 by hand: 3 tasks in order (0, 2, 1): S02 + S21 + S10
    S = np.array([[1, .1, .2], [.1, 1, .3], [.2, .3, 1]])
    assert O.cyclic_objective(S, [0, 2, 1]) == pytest.approx(.2 + .3 + .1)


def test_held_karp_is_exact_against_brute_force():
    for n in range(3, 8):
        S = _cosine_matrix(n, 100 + n)
        best = max(O.cyclic_objective(S, (0,) + p) for p in itertools.permutations(range(1, n)))
        order, value = O.held_karp(S)
        assert sorted(order.tolist()) == list(range(n)) and value == pytest.approx(best)
    with pytest.raises(UserError, match="at most 16"):
        O.held_karp(np.eye(17))


@pytest.mark.parametrize("n", [8, 9, 10, 11, 12])
def test_annealer_reaches_the_exact_optimum_within_one_percent(n):
    for seed in range(2):
        S = _cosine_matrix(n, 1000 * n + seed)
        for objective, W in (("max", S), ("min", -S)):
            opt = O.held_karp(W)[1]                                   # the best of sign * Eq. 6
            res = O.solve(S, objective=objective, solver="anneal", iterations=300_000, seed=seed)
            got = res.value if objective == "max" else -res.value
            assert opt - got <= 0.01 * abs(opt) + 1e-12, (n, seed, objective, opt, got)
            assert res.iterations == 300_000 and sorted(res.order.tolist()) == list(range(n))
            two = O.solve(S, objective=objective, solver="2opt", seed=seed)
            got2 = two.value if objective == "max" else -two.value
            assert opt - got2 <= 0.01 * abs(opt) + 1e-12
            ex = O.solve(S, objective=objective, solver="exact")
            assert (ex.value if objective == "max" else -ex.value) == pytest.approx(opt)


def test_objective_directions_mqmax_mqmin_mqrand():
    # two clusters of tasks: the best cycle visits each cluster in one run (2 crossings), the worst alternates
    rng = np.random.default_rng(5)
    c = np.repeat(np.eye(2), 10, axis=0) + 0.1 * rng.normal(size=(20, 2))
    S = sim.task_similarity(c)
    mx = O.solve(S, objective="max", iterations=400_000, seed=0)
    mn = O.solve(S, objective="min", iterations=400_000, seed=0)
    rnd = O.solve(S, objective="random", seed=0)
    mean, std = O.random_baseline(S, 500, seed=1)
    assert mx.value > mean + 3 * std > mean - 3 * std > mn.value
    labels = (np.arange(20) >= 10).astype(int)
    crossings = lambda o: int(np.sum(labels[o] != labels[np.roll(o, -1)]))
    assert crossings(mx.order) == 2 and crossings(mn.order) == 20
    assert rnd.solver == "random" and rnd.value == pytest.approx(O.cyclic_objective(S, rnd.order))
    np.testing.assert_array_equal(rnd.order, O.solve(S, objective="random", seed=0).order)
    assert not np.array_equal(rnd.order, O.solve(S, objective="random", seed=1).order)
    # seeded annealing is reproducible; patience stops early
    a = O.anneal(S, iterations=100_000, seed=3)
    b = O.anneal(S, iterations=100_000, seed=3)
    np.testing.assert_array_equal(a[0], b[0])
    assert O.anneal(S, iterations=2_000_000, patience=5_000, seed=3)[2] < 2_000_000
    with pytest.raises(UserError, match="objective"):
        O.solve(S, objective="maximum")
    with pytest.raises(UserError, match="cooling"):
        O.anneal(S, iterations=10, cooling=1.5)


def test_local_search_moves_only_improve_and_the_stronger_solver_beats_annealing_at_330_tasks():
    S = _cosine_matrix(330, 7)
    start = np.random.default_rng(0).permutation(330)
    v0 = O.cyclic_objective(S, start)
    for moves in (("2opt",), ("oropt",), ("2opt", "oropt")):
        trace = np.full(100_000, np.nan)  # the objective after every accepted move
        o, v = O.local_search(S, start, moves, trace=trace)
        made = trace[~np.isnan(trace)]
        assert 50 < len(made) < len(trace) and np.isnan(trace[len(made):]).all()
        assert made[0] > v0 and (np.diff(made) > 0).all(), moves     # every move improves
        assert made[-1] == pytest.approx(v, abs=1e-9) and sorted(o.tolist()) == list(range(330))
    an = O.solve(S, iterations=2_000_000, seed=0)
    ils = O.solve(S, solver="2opt", kicks=20, seed=0)
    assert an.iterations == 2_000_000 and ils.value > an.value > O.random_baseline(S, 50)[0]


# ------------------------------------------------------------------------------------------------ similarity, phi

def test_task_representation_and_similarity_eq4_eq5(tmp_path, monkeypatch):
    q = np.array([[3.0, 0, 0], [0, 2.0, 0]])                         # normalised, then averaged
    np.testing.assert_allclose(sim.task_representation(q), [0.5, 0.5, 0])
    S = sim.task_similarity(np.array([[1.0, 0], [1, 1], [0, 2]]))
    np.testing.assert_allclose(S, [[1, 2 ** -.5, 0], [2 ** -.5, 1, 2 ** -.5], [0, 2 ** -.5, 1]], atol=1e-12)
    units = {"a": [0, 1], "b": [2]}
    s1 = sim.sample_queries(units, [5, 3, 100], 6, seed=0)
    assert s1["a"].shape == (6, 2) and s1["b"].shape == (6, 2)
    assert len({tuple(r) for r in s1["a"]}) == 6 and set(s1["a"][:, 0]) <= {0, 1}
    np.testing.assert_array_equal(s1["b"], sim.sample_queries(units, [5, 3, 100], 6, seed=0)["b"])
    assert sim.sample_queries(units, [1, 1, 100], 6, seed=0)["a"].shape == (2, 2)   # capped by the pool
    sim.save_similarity(tmp_path / "s.npz", S, ["x", "y", "z"], "dataset", [1, 2, 3], {"model": "m"})
    S2, names, unit, meta = sim.load_similarity(tmp_path / "s.npz")
    np.testing.assert_array_equal(S, S2)
    assert (names, unit, meta) == (["x", "y", "z"], "dataset", {"model": "m"})
    assert sim.render_heatmap(S, names, tmp_path / "h.png")
    assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setitem(sys.modules, "matplotlib", None)            # without matplotlib: no heat map, and why
    assert sim.render_heatmap(S, names, tmp_path / "h.png") == ("skipped: matplotlib is not installed "
                                                                "(fix: pip install 'jaxembed[viz]')")
    assert not (tmp_path / "h.png").exists()                         # not the stale picture of the earlier call
    with pytest.raises(UserError, match="no task similarity"):
        sim.load_similarity(tmp_path / "none.npz")


def test_phi_eq8_min_and_mean_and_sampled_negatives():
    # example 0: pos .9, negs .2 and .5; example 1: pos .6 and .4 (mean .5), neg .1
    ps, po = np.array([.9, .6, .4]), np.array([0, 1, 3])
    ns, no = np.array([.2, .5, .1]), np.array([0, 2, 3])
    np.testing.assert_allclose(dif.phi(ps, po, ns, no, "min"), [.9 - .5, .5 - .1])
    np.testing.assert_allclose(dif.phi(ps, po, ns, no, "mean"), [.9 - .35, .5 - .1])
    with pytest.raises(UserError, match="negatives"):
        dif.phi(ps, po, ns, no, "max")
    pos = [[0], [1], [2, 0], [3]]
    got = dif.sampled_negatives(pos, 2, seed=0)
    for i, g in enumerate(got):
        assert not set(g) & set(pos[i]) and len(g) <= 2
    assert got == dif.sampled_negatives(pos, 2, seed=0)


def test_instance_orders_match_the_plan_and_the_mask_weights():
    from jaxembed.data.plan import build_plan

    rng = np.random.default_rng(0)
    infos = [SimpleNamespace(name=n, task=t, size=s, batching="homogeneous", epochs=None, weight=None,
                             temperature=None, num_negatives=1)
             for n, t, s in (("a", "T1", 12), ("b", "T1", 8), ("c", "T2", 16))]
    scores = {i.name: np.round(rng.normal(size=i.size), 1) for i in infos}   # rounded: ties to break
    units = {"T1": [0, 1], "T2": [2]}
    names, sizes = [i.name for i in infos], [i.size for i in infos]
    for io in ("e2d", "d2e", "random"):
        given = dif.instance_orders(units, sizes, names, io, scores, seed=0)
        cfg = {"global_batch_size": 4, "scores": "x", "mask": {"delta": 0.0},
               "curriculum": {"enabled": True, "unit": "task", "task_order": ["T2", "T1"], "instance_order": "given",
                              "instance_orders": "x"}}
        p_given = build_plan(infos, cfg, scores=scores, instance_orders=given)
        if io != "random":
            cfg["curriculum"]["instance_order"] = io
            p_own = build_plan(infos, cfg, scores=scores)
            np.testing.assert_array_equal(p_given.dataset_ids, p_own.dataset_ids)
            np.testing.assert_array_equal(p_given.example_ids, p_own.example_ids)
        for d, e, w in zip(p_given.dataset_ids.ravel(), p_given.example_ids.ravel(), p_given.weights.ravel()):
            assert w == (0.0 if scores[names[d]][e] < 0 else 1.0)
    e2d = dif.instance_orders(units, sizes, names, "e2d", scores)["T1"]
    sc = np.array([scores[names[d]][e] for d, e in e2d])
    assert (np.diff(sc) <= 0).all()
    assert dif.mask_counts(scores, 0.0) == {k: int((v < 0).sum()) for k, v in scores.items()}
    with pytest.raises(UserError, match="no scores"):
        dif.instance_orders(units, sizes, names, "e2d", {"a": scores["a"]})


# ------------------------------------------------------------------------------------------------ resumable score

class HashEncoder:
    """Deterministic fake embeddings from the text (and prompt); raises after ``fail_after`` encode calls."""

    def __init__(self, fail_after: int | None = None):
        self.calls, self.texts, self.fail_after = 0, 0, fail_after

    def encode(self, texts, *, prompt="", max_length=None, batch_size=64, progress=False):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt("killed")
        self.calls += 1
        self.texts += len(texts)
        out = [np.random.default_rng(zlib.crc32((prompt + "|" + t).encode())).normal(size=8) for t in texts]
        return np.array(out, np.float32)


@pytest.fixture(scope="module")
def small_store(shared_data, tmp_path_factory):
    """A store of slices of eleven shared datasets (nine tasks: enough task orders, 20,160, that finding the best
    is a search), the demo's lengths, small enough for CI."""
    from jaxembed.data.shared_train import shared_train_config
    from jaxembed.data.store import write_store

    d = tmp_path_factory.mktemp("cstore")
    keep = {"snli": 24, "sick_nli": 24, "stsb": 120, "wikiqa": 12, "trec": 40, "sst2": 24, "mr": 24, "sst5": 16,
            "cr": 16, "mpqa": 16, "subj": 16}
    cfg = shared_train_config(shared_data)
    ds = []
    for x in cfg.datasets:
        if x.name in keep:
            src = Path(x.path)
            (d / src.name).write_text("".join(src.read_text(encoding="utf-8").splitlines(True)[:keep[x.name]]),
                                      encoding="utf-8")
            x.path, x.max_query_length, x.max_doc_length = str(d / src.name), 32, 32
            ds.append(x)
    cfg.datasets = ds
    write_store(cfg, d / "store")
    from jaxembed.data.store import Store

    return Store.open(d / "store")


def test_score_resumes_from_cached_shards_after_a_kill(small_store, tmp_path):
    from jaxembed.curriculum.cli import run_score

    kw = dict(unit="task", n_task_queries=8, shard_size=8, model_key="hash")
    full = run_score(HashEncoder(), small_store, tmp_path / "full", **kw)
    n_shards = len(list((tmp_path / "full" / "cache").glob("*.npz")))
    killed = HashEncoder(fail_after=5)
    with pytest.raises(KeyboardInterrupt):
        run_score(killed, small_store, tmp_path / "run", **kw)
    assert len(list((tmp_path / "run" / "cache").glob("*.npz"))) == 5
    again = HashEncoder()
    res = run_score(again, small_store, tmp_path / "run", **kw)
    assert again.calls == n_shards - 5                      # only the unfinished shards are encoded
    assert again.texts == full["texts_encoded"] - killed.texts
    with np.load(tmp_path / "full" / "scores.npz") as a, np.load(tmp_path / "run" / "scores.npz") as b:
        assert sorted(a.files) == sorted(d.name for d in small_store.datasets)
        for k in a.files:
            np.testing.assert_array_equal(a[k], b[k])
    assert res["similarity"] == full["similarity"]
    # another model (key) does not reuse the cache
    other = HashEncoder()
    run_score(other, small_store, tmp_path / "run", **dict(kw, model_key="other"))
    assert other.calls == n_shards
    # dataset units, and the similarity alone (only the sampled queries)
    only = HashEncoder()
    s = run_score(only, small_store, tmp_path / "sim", **dict(kw, unit="dataset", similarity_only=True))
    assert s["unit"] == "dataset" and len(s["units"]) == len(small_store.datasets)
    assert only.texts <= 8 * len(small_store.datasets) and not (tmp_path / "sim" / "scores.npz").exists()
    # task units pool their datasets: with n_t = 1 some datasets get no sampled query at all
    one = run_score(HashEncoder(), small_store, tmp_path / "one", **dict(kw, n_task_queries=1, similarity_only=True))
    assert set(one["queries_per_unit"].values()) == {1}


# ------------------------------------------------------------------------------------------------ real pipeline

# padded rows of 32 texts: every encode call of the test (a dozen datasets, their queries and documents) takes one of
# three shapes (lengths 16, 24, 32), where packed rows take a shape per call (and a compilation of MiniLM each);
# both give the same embeddings (tests/test_packing_encode.py)
REAL_ARGS = ["--max-length", "32", "--batch-size", "32", "--no-packing"]


def test_score_curriculum_plan_build_end_to_end_with_minilm(small_store, minilm_dir, tmp_path, capsys,
                                                            monkeypatch):
    from jaxembed.cli import main
    from jaxembed.data.plan import Plan, load_task_order

    store_dir = str(small_store.path)
    sc = tmp_path / "score"
    assert main(["score", "--model", str(minilm_dir), *REAL_ARGS, "--store", store_dir, "--out", str(sc),
                 "--unit", "task", "--n-task-queries", "16", "-q"]) == 0
    out = capsys.readouterr().out
    assert "phi mean" in out and "task similarity over 9 tasks" in out
    for f in ("task_similarity.npz", "task_similarity.png", "scores.npz", "score_summary.json"):
        assert (sc / f).exists(), f
    S, names, unit, _ = sim.load_similarity(sc / "task_similarity.npz")
    assert unit == "task" and names == ["nli", "sts", "answer_retrieval", "question_type", "sentiment", "sentiment_5",
                                        "product_sentiment", "opinion_polarity", "subjectivity"]
    assert np.allclose(S, S.T) and np.allclose(np.diag(S), 1)
    summary = json.loads((sc / "score_summary.json").read_text())
    stsb = next(d for d in summary["datasets"] if d["name"] == "stsb")
    assert stsb["negatives_sampled"] == stsb["size"]             # pairs: scored against sampled negatives
    with np.load(sc / "scores.npz") as z:
        scores = {k: z[k] for k in z.files}
    # phi of one wikiqa example by hand, with the encoder on the instructed texts as training sees them
    from jaxembed.mining.encoding import _LOADED  # the encoder cache score used

    enc = next(iter(_LOADED.values()))[1]
    info = small_store.dataset("wikiqa")
    ex = small_store.example("wikiqa", 3)
    kw = dict(max_length=32, batch_size=32, progress=False)
    q = enc.encode([ex["query"]], prompt=info.query_instruction, **kw)
    d = enc.encode(ex["pos"] + ex["neg"], prompt=info.doc_instruction, **kw)
    s = (d / np.linalg.norm(d, axis=1, keepdims=True)) @ (q[0] / np.linalg.norm(q[0]))
    k = len(ex["pos"])
    assert scores["wikiqa"][3] == pytest.approx(s[:k].mean() - s[k:].max(), abs=1e-5)

    cur = tmp_path / "cur"
    assert main(["curriculum", "--scores-dir", str(sc), "--out", str(cur), "--delta", "0", "--iterations",
                 "200000"]) == 0
    out = capsys.readouterr().out
    assert "Eq. 6 cyclic similarity" in out and "Eq. 9 mask" in out
    order = json.loads((cur / "task_order.json").read_text())
    assert load_task_order(cur / "task_order.json", names) == order["order"]
    best = O.held_karp(S)[1]
    assert order["value"] == pytest.approx(best, abs=1e-9)          # 9 units (20,160 orders): the annealer finds
    mean, std = O.random_baseline(S, 500, seed=1)                   # the optimum, far above a random order
    assert best > mean + 2 * std
    plan_out = tmp_path / "plan.npz"
    assert main(["plan", "build", "--store", store_dir, "--config", str(cur / "plan_curriculum.json"),
                 "--set", "global_batch_size=8", "--out", str(plan_out), "-q"]) == 0
    plan = Plan.load(plan_out)
    assert plan.meta["mode"] == "curriculum" and plan.meta["curriculum"]["order"] == order["order"]
    # the batches walk the task order cyclically (exhausted tasks skipped), one task per batch
    seq = [plan.task_names[t] for t in plan.task_ids]
    first_round = list(dict.fromkeys(seq))
    assert first_round == [t for t in order["order"] if t in first_round]
    # easy to difficult inside each task, and weight 0 exactly where phi < delta = 0 (Eq. 9, the text's reading)
    ds_names = plan.dataset_names
    for t in set(plan.task_ids.tolist()):
        rows = [(ds_names[d], e) for st in np.flatnonzero(plan.task_ids == t)
                for d, e in zip(plan.dataset_ids[st], plan.example_ids[st])]
        phis = [scores[n][e] for n, e in rows]
        assert all(a >= b for a, b in zip(phis, phis[1:]))
    w = plan.weights.ravel()
    phi_rows = np.array([scores[ds_names[d]][e] for d, e in zip(plan.dataset_ids.ravel(), plan.example_ids.ravel())])
    np.testing.assert_array_equal(w, (phi_rows >= 0).astype(np.float32))
    assert 0 < (w == 0).sum() < w.size
    cs = json.loads((cur / "curriculum_summary.json").read_text())
    assert cs["mask_counts"]["0"]["masked"] == sum(int((v < 0).sum()) for v in scores.values())

    # dataset units (the default, Data-CUBE's task = a dataset) from the cached embeddings (nothing is encoded
    # again), MQMin, the exact solver, the balanced walk
    calls = []
    real_encode = enc.encode
    monkeypatch.setattr(enc, "encode", lambda *a, **k: calls.append(1) or real_encode(*a, **k))
    assert main(["score", "--model", str(minilm_dir), *REAL_ARGS, "--store", store_dir, "--out", str(sc),
                 "--n-task-queries", "16", "-q"]) == 0
    assert calls == []
    cur2 = tmp_path / "cur2"
    assert main(["curriculum", "--scores-dir", str(sc), "--out", str(cur2), "--objective", "min", "--solver",
                 "exact", "--instance-order", "d2e", "--walk", "balanced"]) == 0
    o2 = json.loads((cur2 / "task_order.json").read_text())
    S2, _, _, _ = sim.load_similarity(sc / "task_similarity.npz")
    assert o2["unit"] == "dataset" and sorted(o2["order"]) == sorted(d.name for d in small_store.datasets)
    assert o2["value"] == pytest.approx(-O.held_karp(-S2)[1])
    assert main(["plan", "build", "--store", store_dir, "--config", str(cur2 / "plan_curriculum.json"),
                 "--set", "global_batch_size=8", "--out", str(tmp_path / "plan2.npz"), "-q"]) == 0
    p2 = Plan.load(tmp_path / "plan2.npz")
    assert p2.meta["curriculum"]["unit"] == "dataset" and (p2.weights == 1).all()
    assert p2.meta["curriculum"]["walk"] == "balanced" and p2.meta["curriculum"]["order"] == o2["order"]

    # --config: the run config's store and model (the same encoder: nothing is loaded or compiled again)
    cfg = tmp_path / "run.py"
    cfg.write_text("from jaxembed.config import default_config\n"
                   "def get_config(arg=None):\n"
                   "    c = default_config()\n"
                   f"    c.model.name = {str(minilm_dir)!r}\n"
                   "    c.model.max_length = 32\n"
                   "    c.plan.curriculum.unit = 'task'\n"  # the config's unit is score's default unit
                   f"    c.data.store = {store_dir!r}\n"
                   "    return c\n", encoding="utf-8")
    n_loaded = len(_LOADED)
    assert main(["score", "--config", str(cfg), "--batch-size", "32", "--no-packing", "--out",
                 str(tmp_path / "sc3"), "--n-task-queries", "16", "--similarity-only", "-q"]) == 0
    assert len(_LOADED) == n_loaded and next(iter(_LOADED.values()))[1] is enc
    S3, names3, _, _ = sim.load_similarity(tmp_path / "sc3" / "task_similarity.npz")
    np.testing.assert_allclose(S3, S, atol=1e-5)        # the same sampled queries as the full run
    assert not (tmp_path / "sc3" / "scores.npz").exists()


def test_cli_errors(small_store, tmp_path, capsys):
    from jaxembed.cli import main

    assert main(["score", "--model", "x", "--out", str(tmp_path)]) == 2
    assert "exactly one of --store" in capsys.readouterr().err
    assert main(["curriculum", "--scores-dir", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
    assert "no task similarity file" in capsys.readouterr().err
    sim.save_similarity(tmp_path / "task_similarity.npz", np.eye(2), ["nli", "x"], "task", [1, 1], {})
    assert main(["curriculum", "--scores-dir", str(tmp_path), "--out", str(tmp_path / "o"), "--store",
                 str(small_store.path)]) == 2
    assert "no similarity for tasks" in capsys.readouterr().err
