"""Hard-negative mining (jaxembed.mining, ``jaxembed mine``): exact blocked search, IVF, ranking-consistency filter,
window sampling, margin filter, the report; synthetic data with known answers and the real shared data with the
real all-MiniLM-L6-v2 weights, through the CLI and into ``jaxembed data prepare``. The search on 8 devices: the
8-device suite (tests/multidevice/test_mining_search.py)."""

from __future__ import annotations

import json
import sys
import textwrap

import numpy as np
import pytest

from jaxembed import mining
from jaxembed.errors import UserError

DIM = 32
N_WIKI, N_SNLI = 40, 100                      # slices of the real files: small, to keep the test fast
# the same model options in every real test, padded rows of 32 texts: every encode call takes one of three shapes
# (lengths 16, 24, 32; tests/test_curriculum.py's too), where packed rows take a shape per call, and a compilation
# of MiniLM each; both give the same embeddings (tests/test_packing_encode.py)
REAL_ARGS = ["--max-length", "32", "--batch-size", "32", "--no-packing"]


class TableEncoder:
    """An encoder-like object: each text's vector comes from a table (the prompt is ignored); counts its calls."""

    def __init__(self, table: dict[str, np.ndarray]):
        self.table = table
        self.calls = []

    def encode(self, texts, *, prompt="", max_length=None, batch_size=64, progress=False):
        self.calls.append(len(texts))
        return np.stack([self.table[t] for t in texts]).astype(np.float32)


def _unit(k, c, side=DIM - 1):
    """A vector with cosine c to e_k and the rest on the e_side axis (orthogonal to every other query)."""
    v = np.zeros(DIM)
    v[k] = c
    v[side] = np.sqrt(max(0.0, 1 - c * c))
    return v


POS0, DUP0 = "the positive zero", " the  positive zero"   # DUP0: the same text up to whitespace


def _synthetic():
    """Three queries (embedded as e0, e1, e2) and documents with known cosine similarities:

    x0 ("q0 text"): D0a .95 (rank 0), POS0 .90 (rank 1, the positive), DUP0 .899 (a whitespace duplicate of the
        positive, rank 2), FN0 .88 (a planted false negative, rank 3), the text "q0 text" itself as a document .87
        (rank 4), F0_k .50 - .01 k (ranks 5, 6, ...)
    x1 ("q1"): ten documents E1_k .95 - .01 k above its positive P1 .80 (rank 10)
    x2 ("q2"): positives A2 .90 and B2 .80 with C2 .85 and C2b .84 between them (rank of A2: 0, of B2: 2)
    The documents of one query are orthogonal to the other queries (score 0 for them).
    -> (examples, query embeddings [3, D], {document text: vector})."""
    docs = {"D0a": _unit(0, .95), POS0: _unit(0, .90), DUP0: _unit(0, .899), "FN0": _unit(0, .88),
            "q0 text": _unit(0, .87)}
    docs.update({f"F0_{k}": _unit(0, .50 - .01 * k) for k in range(12)})
    docs.update({f"E1_{k}": _unit(1, .95 - .01 * k) for k in range(10)})
    docs.update({"P1": _unit(1, .80), "A2": _unit(2, .90), "B2": _unit(2, .80), "C2": _unit(2, .85),
                 "C2b": _unit(2, .84)})
    examples = [
        {"id": "x0", "query": "q0 text", "pos": [POS0], "neg": ["D0a", DUP0, "FN0"] + [f"F0_{k}" for k in range(12)]},
        {"id": "x1", "query": "q1", "pos": ["P1"], "neg": [f"E1_{k}" for k in range(10)] + ["q0 text"]},
        {"id": "x2", "query": "q2", "pos": ["A2", "B2"], "neg": ["C2", "C2b"]},
    ]
    return examples, np.stack([_unit(k, 1.0) for k in range(3)]), docs


def _corpus(examples, docs):
    texts, _, _ = mining.build_corpus(examples)
    return texts, np.stack([docs[t] for t in texts])


def test_ranking_consistency_window_and_margin_with_known_answers():
    examples, Q, docs = _synthetic()
    cfg = mining.MineConfig(top_k=3, window=(1, 8), num_negatives=3, margin=0.95, seed=0)
    res = mining.mine_with_embeddings(examples, Q, *_corpus(examples, docs), cfg)
    rep = res.report
    by_id = {r["id"]: r for r in res.records}
    # x0: window ranks 1..7 = POS0 (positive), DUP0 (duplicate), FN0 (.88 > .95 x .90: the margin drops the planted
    # false negative), "q0 text" (the query itself), F0_0, F0_1, F0_2: the only candidates, kept in rank order
    assert by_id["x0"]["neg"] == ["F0_0", "F0_1", "F0_2"]
    assert by_id["x0"]["pos"] == [POS0]
    # x2's window holds its positive B2, and C2 / C2b, which score above .95 x .80 (its weakest kept positive)
    assert rep["window_candidates_excluded"] == {"positive of the query": 2, "duplicate of a positive": 1,
                                                 "the query itself": 1, "margin": 3}
    assert not {"C2", "C2b"} & set(by_id["x2"]["neg"])
    # x1: its positive ranks 10 >= top_k 3 -> the example is dropped, with its rank
    assert "x1" not in by_id
    assert rep["filtered_examples"] == [{"id": "x1", "best_rank": 10, "reason": "no positive within top-k"}]
    assert rep["kept"] == 2 and rep["examples"] == 3 and rep["filtered"] == {"no positive within top-k": 1}
    hist = rep["rank_histogram_best_positive"]
    assert (hist["0"], hist["1"], hist["10-19"], sum(hist.values())) == (1, 1, 1, 3)
    assert rep["negatives"]["examples with 3"] == 2 and rep["negatives"]["examples with fewer"] == 0
    # x2 alone: A2 ranks 0, B2 ranks 2 (C2, C2b above it; the other positive does not count) -> with top_k 2 only
    # A2 stays; the window 0:5 minus both positives leaves C2 and C2b
    res2 = mining.mine_with_embeddings(examples[2:], Q[2:], *_corpus(examples[2:], docs),
                                       mining.MineConfig(top_k=2, window=(0, 5), num_negatives=2, seed=0))
    assert res2.records[0]["pos"] == ["A2"] and set(res2.records[0]["neg"]) == {"C2", "C2b"}
    assert res2.report["positives"] == {"total": 2, "kept": 1, "dropped (rank >= top_k)": 1}
    allh = res2.report["rank_histogram_all_positives"]
    assert (allh["0"], allh["2-4"]) == (1, 1)
    # without the margin filter the planted false negative is sampled
    res3 = mining.mine_with_embeddings(examples[:1], Q[:1], *_corpus(examples[:1], docs),
                                       mining.MineConfig(top_k=3, window=(1, 8), num_negatives=5, seed=0))
    assert res3.records[0]["neg"] == ["FN0", "F0_0", "F0_1", "F0_2", "F0_3"]


def test_window_sampling_is_seeded_and_never_returns_excluded_texts():
    rng = np.random.default_rng(0)
    n_ex, n_docs = 40, 400
    docs = [f"doc {i}" for i in range(n_docs)]
    examples = []
    for i in range(n_ex):
        pos = [docs[(7 * i) % n_docs], docs[(7 * i + 1) % n_docs]]
        examples.append({"id": i, "query": f"query {i}", "pos": pos, "neg": [d for d in docs if d not in pos]})
    # a whitespace duplicate of each first positive inside the corpus
    for i in range(n_ex):
        examples[i]["neg"].append(examples[i]["pos"][0] + " ")
    texts, _, _ = mining.build_corpus(examples)
    Q = rng.normal(size=(n_ex, DIM))
    D = rng.normal(size=(len(texts), DIM))
    idx = {t: k for k, t in enumerate(texts)}
    for i, e in enumerate(examples):  # positives and their duplicates close to the query
        for t in e["pos"] + [e["pos"][0] + " "]:
            D[idx[t]] = Q[i] + 0.05 * rng.normal(size=DIM)
    cfg = mining.MineConfig(top_k=5, window=(0, 60), num_negatives=7, seed=3)
    a = mining.mine_with_embeddings(examples, Q, texts, D, cfg)
    b = mining.mine_with_embeddings(examples, Q, texts, D, cfg)
    assert a.records == b.records
    full = mining.normalize(Q) @ mining.normalize(D).T
    for r, e, i in zip(a.records, examples, range(n_ex)):
        banned = {mining.norm_text(t) for t in e["pos"]}
        assert len(r["neg"]) == 7
        for t in r["neg"]:
            assert mining.norm_text(t) not in banned and t not in e["pos"]
            rank = int((full[i] > full[i, idx[t]]).sum())
            assert rank < 60
    assert a.report["window_candidates_excluded"]["duplicate of a positive"] == n_ex
    assert a.report["window_candidates_excluded"]["positive of the query"] == 2 * n_ex
    c = mining.mine_with_embeddings(examples, Q, texts, D, mining.MineConfig(top_k=5, window=(0, 60),
                                                                             num_negatives=7, seed=4))
    assert c.records != a.records  # another seed, another sample


def _np_topk(Q, D, k):
    s = Q @ D.T
    order = np.argsort(-s, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(s, order, 1), s


def test_blocked_search_equals_full_topk_with_small_blocks():
    # small integer vectors: every score is exact in float32 and there are many exact ties, so the blocked search
    # must also break ties exactly like the full sort (lower corpus id first)
    rng = np.random.default_rng(1)
    Q = rng.integers(-3, 4, size=(45, 16)).astype(np.float32)
    D = rng.integers(-3, 4, size=(1000, 16)).astype(np.float32)
    thr = np.stack([Q @ D[3], Q @ D[10] + 0.5], 1).astype(np.float32)
    for k, bq, bc in ((100, 7, 64), (5, 64, 1000), (1000, 16, 128)):
        res = mining.blocked_search(Q, D, k, thresholds=thr, block_q=bq, block_c=bc)
        ids, sc, s = _np_topk(Q, D, k)
        np.testing.assert_array_equal(res.ids, ids)
        np.testing.assert_array_equal(res.scores, sc)
        np.testing.assert_array_equal(res.above, (s[:, :, None] > thr[:, None, :]).sum(1))
    with pytest.raises(UserError, match="empty"):
        mining.blocked_search(Q, D[:0], 5)


def test_search_memory_is_bounded_by_the_blocks():
    # XLA's own accounting of one compiled block search: the working memory does not grow with the corpus, and
    # stays far below one [block_q, N] score matrix (the inputs -- the corpus shard -- are not working memory)
    small = mining.search_memory(32, 4096, 32, 50, block_c=256)
    big = mining.search_memory(32, 65536, 32, 50, block_c=256)
    assert small["block_c"] == big["block_c"] == 256
    assert big["temp"] == small["temp"]
    assert big["temp"] < 32 * 65536 * 4 / 8
    assert big["arguments"] >= 65536 * 32 * 4


def test_ivf_index_is_exact_with_every_list_and_a_lower_bound_otherwise():
    rng = np.random.default_rng(3)
    centers = rng.normal(size=(8, 16))
    D = mining.normalize(np.repeat(centers, 60, 0) + 0.3 * rng.normal(size=(480, 16)))
    Q = mining.normalize(centers[rng.integers(0, 8, 20)] + 0.3 * rng.normal(size=(20, 16)))
    thr = (np.sum(Q * D[:20], 1)[:, None] + 1e-4).astype(np.float32)  # as mining does: score + tol
    index = mining.IVFIndex(D, 8, seed=0)
    assert index.counts.sum() == 480
    ex = mining.blocked_search(Q, D, 30, thresholds=thr)
    full = index.search(Q, 30, nprobe=8, thresholds=thr)
    np.testing.assert_allclose(full.scores, ex.scores, atol=1e-5)
    np.testing.assert_array_equal(full.above, ex.above)
    few = index.search(Q, 30, nprobe=2, thresholds=thr)
    assert (few.above <= ex.above).all()
    recall = np.mean([len(set(a) & set(b)) / 30 for a, b in zip(few.ids, ex.ids)])
    assert recall > 0.8
    with pytest.raises(UserError, match="nlist"):
        mining.IVFIndex(D, 0)


def _clustered(n=480, q=20, dim=16, seed=3):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(8, dim))
    D = mining.normalize(np.repeat(centers, n // 8, 0) + 0.3 * rng.normal(size=(n, dim)))
    Q = mining.normalize(centers[rng.integers(0, 8, q)] + 0.3 * rng.normal(size=(q, dim)))
    thr = (np.sum(Q * D[:q], 1)[:, None] + 1e-4).astype(np.float32)  # as mining does: score + tol
    return Q, D, thr


def test_faiss_ivf_with_every_list_is_exact_and_hnsw_finds_the_exact_top_k():
    """Where FAISS is installed, --approx ivf / hnsw run FAISS's IndexIVFFlat / IndexHNSWFlat: IVF with every list
    probed gives the exact search's top-k (ids, scores, ties by lower id) and counts of the rows above each positive
    among those found; HNSW finds the exact top-k here; the report names the engine."""
    import faiss  # the test extra installs it (faiss-cpu)

    from jaxembed.mining.search import approximate_search

    Q, D, thr = _clustered()
    ex = mining.blocked_search(Q, D, 30, thresholds=thr)
    for kind in ("ivf", "hnsw"):
        res, info = approximate_search(Q, D, 30, kind, nlist=8, nprobe=8, thresholds=thr)
        assert info["search"] == kind and info["engine"].startswith(f"faiss {faiss.__version__} Index")
        np.testing.assert_array_equal(res.ids, ex.ids)
        np.testing.assert_allclose(res.scores, ex.scores, atol=1e-5)
        np.testing.assert_array_equal(res.above, np.minimum(ex.above, 30))  # counted among the 30 found
    few, info = approximate_search(Q, D, 30, "ivf", nlist=8, nprobe=1, thresholds=thr)
    assert info["nprobe"] == 1 and (few.above <= ex.above).all()
    assert np.mean([len(set(a) & set(b)) / 30 for a, b in zip(few.ids, ex.ids)]) > 0.5


def test_an_approximate_search_ranks_positives_up_to_top_k_beyond_the_window():
    """top_k above the window's end: FAISS returns top_k rows and more, so x1's positive (rank 10 >= top_k 8) is
    dropped as the exact search drops it, not counted at the window's end (rank 5) and kept."""
    import faiss  # noqa: F401  (the test extra installs it; the approximate searches below need it)

    examples, Q, docs = _synthetic()
    texts, D = _corpus(examples, docs)
    for approx in (None, "ivf", "hnsw"):
        cfg = mining.MineConfig(top_k=8, window=(0, 5), num_negatives=2, seed=0, approx=approx, nlist=1, nprobe=1)
        res = mining.mine_with_embeddings(examples, Q, texts, D, cfg)
        assert [r["id"] for r in res.records] == ["x0", "x2"], approx
        assert res.report["filtered"] == {"no positive within top-k": 1}, approx
        # x2's B2 ranks 2 (C2, C2b above it; A2, the other positive, does not count): dropped at top_k 2, although
        # the window ends at 1 (the search returns top_k plus the positives of a query)
        res = mining.mine_with_embeddings(examples[2:], Q[2:], *_corpus(examples[2:], docs), mining.MineConfig(
            top_k=2, window=(0, 1), num_negatives=1, seed=0, approx=approx, nlist=1, nprobe=1))
        assert res.report["positives"] == {"total": 2, "kept": 1, "dropped (rank >= top_k)": 1}, approx


def test_without_faiss_ivf_is_jaxembeds_own_and_hnsw_is_refused_before_work(monkeypatch):
    from jaxembed.mining.search import approximate_search

    monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss -> ImportError, as where it is not installed
    Q, D, thr = _clustered()
    res, info = approximate_search(Q, D, 30, "ivf", nlist=8, nprobe=8, thresholds=thr)
    assert info["engine"] == "jaxembed (faiss not installed)" and info["nlist"] == 8
    np.testing.assert_array_equal(res.above, mining.blocked_search(Q, D, 30, thresholds=thr).above)
    with pytest.raises(UserError, match=r"^--approx hnsw needs FAISS, which is not installed \(fix: pip install "
                                        r"'jaxembed\[faiss\]'"):
        mining.MineConfig(approx="hnsw").check()
    with pytest.raises(UserError, match=r"--approx 'annoy': one of ivf, hnsw or none"):
        mining.MineConfig(approx="annoy").check()


def test_mine_with_an_encoder_dedups_corpus_and_queries_and_checks_config():
    examples, Q, docs = _synthetic()
    table = dict(docs, **{"q1": Q[1], "q2": Q[2]})
    table["q0 text"] = Q[0]  # as a query; as a document it is the same text: the table holds one vector per text
    enc = TableEncoder(table)
    examples = [dict(e) for e in examples]
    examples.append(dict(examples[0], id="x0b"))  # the same query twice
    res = mining.mine(enc, examples, mining.MineConfig(top_k=50, window=(0, 10), num_negatives=2), progress=False)
    texts, _, _ = mining.build_corpus(examples)
    assert enc.calls == [3, len(texts)]              # 3 distinct queries, each corpus text once
    assert res.report["queries_encoded"] == 3 and res.report["kept"] == 4
    with pytest.raises(UserError, match="window"):
        mining.MineConfig(window=(10, 5)).check()
    with pytest.raises(UserError, match="margin"):
        mining.MineConfig(margin=-1).check()
    assert mining.parse_window("50:100") == (50, 100)
    with pytest.raises(UserError, match="START:END"):
        mining.parse_window("50-100")
    # a given corpus: the positives are added when missing
    res = mining.mine(enc, examples[:1], mining.MineConfig(top_k=50, window=(0, 4), num_negatives=2),
                      corpus=["F0_0", "F0_1", "D0a"], progress=False)
    assert res.report["corpus"] == {"size": 4, "source": "given corpus + positives", "positives_added": 1}


def test_instruction_prompt_round_trip():
    from jaxembed.data.readers import kalm_instruction

    p = "Given a question, retrieve Wikipedia sentences that answer it."
    assert mining.instruction_prompt(kalm_instruction(p)) == p
    assert mining.instruction_prompt("") == ""
    assert mining.instruction_prompt("query: ") is None
    assert mining.rank_histogram([0, 1, 3, 60, 5000]) == {
        "0": 1, "1": 1, "2-4": 1, "5-9": 0, "10-19": 0, "20-49": 0, "50-99": 1, "100-199": 0, "200-499": 0,
        "500-999": 0, ">=1000": 1}


# --------------------------------------------------------------------------------------------- real data, CLI

@pytest.fixture(scope="module")
def snli_store(shared_data, tmp_path_factory):
    from jaxembed.data.shared_train import shared_train_config
    from jaxembed.data.store import write_store

    d = tmp_path_factory.mktemp("snli")
    src = shared_data / "train" / "snli_triplets.jsonl"
    (d / "snli.jsonl").write_text("".join(src.read_text(encoding="utf-8").splitlines(True)[:N_SNLI]),
                                  encoding="utf-8")
    cfg = shared_train_config(shared_data)
    cfg.datasets = [x for x in cfg.datasets if x.name == "snli"]
    cfg.datasets[0].path = str(d / "snli.jsonl")
    write_store(cfg, d / "store")
    return d / "store"


def _prepare(tmp_path, entries):
    """jaxembed data prepare on a config file holding ``entries`` (dataset_config fields)."""
    from jaxembed.cli import main
    from jaxembed.data.store import Store

    cfg = tmp_path / "mined_config.py"
    cfg.write_text(textwrap.dedent(f"""
        from jaxembed.data.config import dataset_config, default_data_config
        def get_config(arg=None):
            c = default_data_config()
            c.datasets = [dataset_config(**e) for e in {entries!r}]
            return c
    """), encoding="utf-8")
    assert main(["data", "prepare", "--config", str(cfg), "--out", str(tmp_path / "mined_store"), "-q"]) == 0
    return Store.open(tmp_path / "mined_store")


def test_mine_cli_on_real_wikiqa_and_snli_feeds_data_prepare(shared_data, minilm_dir, snli_store, tmp_path,
                                                             capsys):
    from jaxembed.cli import main

    src = shared_data / "train" / "wikiqa.jsonl"
    wiki = tmp_path / "wikiqa60.jsonl"
    lines = src.read_text(encoding="utf-8").splitlines(True)[:N_WIKI]
    wiki.write_text("".join(lines), encoding="utf-8")
    originals = [json.loads(x) for x in lines]
    instr = "Instruct: Given a question, retrieve Wikipedia sentences that answer it. \\n Query: "
    out = tmp_path / "wikiqa_mined.jsonl"
    assert main(["mine", "--model", str(minilm_dir), *REAL_ARGS, "--input", str(wiki), "--out", str(out),
                 "--query-instruction", instr, "--task-type", "retrieval", "--margin", "0.95", "-q"]) == 0
    text = capsys.readouterr().out
    assert "kept" in text and "rank of the best positive" in text
    rep = json.loads(out.with_suffix(".report.json").read_text())
    recs = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert rep["kept"] == len(recs) and rep["kept"] + rep["filtered"]["no positive within top-k"] == N_WIKI
    assert sum(rep["rank_histogram_best_positive"].values()) == N_WIKI
    assert len(rep["filtered_examples"]) == N_WIKI - len(recs)
    assert all(f["best_rank"] >= 50 for f in rep["filtered_examples"])
    assert rep["corpus"]["size"] == len({t for r in originals for t in r["pos"] + r["neg"]})
    assert rep["settings"]["margin"] == 0.95 and rep["settings"]["window"] == [50, 100]
    by_id = {f"wikiqa60:{i + 1}": r for i, r in enumerate(originals)}
    for r in recs:
        o = by_id[r["id"]]
        assert r["query"] == o["query"] and set(r["pos"]) <= set(o["pos"]) and r["pos"]
        assert not set(r["neg"]) & set(o["pos"]) and len(r["neg"]) <= 7
        assert r["prompt"] == "Given a question, retrieve Wikipedia sentences that answer it."
        assert r["type"] == "retrieval"
    assert rep["negatives"]["examples with 7"] >= 0.8 * len(recs)

    # snli from a store (a symmetric task, no instruction)
    out2 = tmp_path / "snli_mined.jsonl"
    assert main(["mine", "--model", str(minilm_dir), *REAL_ARGS, "--store", str(snli_store),
                 "--dataset", "snli", "--out", str(out2), "--report", str(tmp_path / "snli_report.json"), "-q"]) == 0
    rep2 = json.loads((tmp_path / "snli_report.json").read_text())
    recs2 = [json.loads(x) for x in out2.read_text(encoding="utf-8").splitlines()]
    assert rep2["kept"] == len(recs2) > 0.8 * N_SNLI and rep2["examples"] == N_SNLI
    assert all(r["prompt"] == "" and r["type"] == "nli" for r in recs2)
    assert rep2["data_config"]["query_instruction"] == "" and rep2["data_config"]["task_type"] == "nli"

    # both files are datasets `jaxembed data prepare` reads, with the instruction and task type restored
    e1 = dict(rep["data_config"], name="wikiqa_mined", task_type=None, query_instruction=None)
    e2 = dict(rep2["data_config"], name="snli_mined", task_type=None, query_instruction=None)
    store = _prepare(tmp_path, [e1, e2])
    w = store.dataset("wikiqa_mined")
    assert w.size == len(recs) and w.task_type == "retrieval" and w.num_negatives == 7
    assert w.query_instruction == "Instruct: Given a question, retrieve Wikipedia sentences that answer it. \n Query: "
    s = store.dataset("snli_mined")
    assert s.size == len(recs2) and s.task_type == "nli" and s.query_instruction == ""
    assert store.example("wikiqa_mined", 0)["neg"] == recs[0]["neg"]


def test_mine_cli_errors(minilm_dir, tmp_path, capsys):
    from jaxembed.cli import main

    f = tmp_path / "in.jsonl"
    f.write_text('{"query": "q", "pos": ["p"]}\n', encoding="utf-8")
    assert main(["mine", "--model", str(minilm_dir), "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "exactly one of --input" in capsys.readouterr().err
    assert main(["mine", "--model", str(minilm_dir), "--input", str(f), "--out", str(tmp_path / "o.jsonl"),
                 "--window", "100:50"]) == 2
    assert "--window 100:50" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "q", "pos": []}\n', encoding="utf-8")
    assert main(["mine", "--model", str(minilm_dir), "--input", str(bad), "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err


def test_mine_cli_corpus_file_and_ivf(shared_data, minilm_dir, tmp_path, monkeypatch):
    """`--corpus FILE`: negatives come only from that corpus (plus the positives, which are always added), never
    from the input's own negatives; `--approx ivf` with every list probed mines exactly what the exact search mines,
    and the report says which search ran. The ivf call encodes the very texts of the exact call with the same
    encoder: it is given the exact call's embeddings (the search is what the two calls compare)."""
    from jaxembed.cli import main
    from jaxembed.mining import negatives

    encoded, encode_texts = {}, negatives.encode_texts

    def encode_once(encoder, texts, **kw):
        key = (id(encoder), tuple(texts), repr(sorted((k, v) for k, v in kw.items() if k != "bar")))
        if key not in encoded:
            encoded[key] = encode_texts(encoder, texts, **kw)
        return encoded[key]

    monkeypatch.setattr(negatives, "encode_texts", encode_once)

    lines = (shared_data / "train" / "wikiqa.jsonl").read_text(encoding="utf-8").splitlines(True)
    src = tmp_path / "wiki.jsonl"
    src.write_text("".join(lines[:N_WIKI]), encoding="utf-8")
    ex = [json.loads(x) for x in lines[:N_WIKI]]
    own = {t for r in ex for t in r["pos"] + r["neg"]}
    positives = {t for r in ex for t in r["pos"]}
    corpus = sorted({t for x in lines[N_WIKI:N_WIKI + 20] for r in [json.loads(x)] for t in r["pos"] + r["neg"]}
                    - own)
    cfile = tmp_path / "corpus.jsonl"
    cfile.write_text("".join(json.dumps({"body": t}) + "\n" for t in corpus), encoding="utf-8")
    args = ["--model", str(minilm_dir), *REAL_ARGS, "--input", str(src), "--corpus", str(cfile),
            "--corpus-field", "body", "--top-k", "10", "--window", "10:40", "--num-negatives", "3", "-q"]

    def mine(name, *extra):
        out = tmp_path / f"{name}.jsonl"
        assert main(["mine", *args, "--out", str(out), *extra]) == 0
        return ([json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()],
                json.loads(out.with_suffix(".report.json").read_text()))

    exact, rep = mine("exact")
    assert rep["corpus"] == {"size": len(corpus) + len(positives), "source": "given corpus + positives",
                             "positives_added": len(positives)}
    assert exact and all(r["neg"] for r in exact)
    negs = {t for r in exact for t in r["neg"]}
    assert negs <= set(corpus) | positives  # the given corpus and the added positives (of other queries) ...
    assert not negs & (own - positives)    # ... never the input's own negatives
    assert negs - positives                # (and the corpus file was used)
    by_id = {f"wiki:{i + 1}": r for i, r in enumerate(ex)}
    assert all(not set(r["neg"]) & set(by_id[r["id"]]["pos"]) for r in exact)  # never a query's own positive
    assert len(encoded) == 2  # the queries and the corpus
    ivf, rep_ivf = mine("ivf", "--approx", "ivf", "--nlist", "8", "--nprobe", "8")
    assert len(encoded) == 2 and ivf == exact
    assert rep_ivf["settings"]["search"] == "ivf" and rep_ivf["settings"]["nlist"] == 8
    assert rep_ivf["settings"]["nprobe"] == 8 and rep["settings"]["search"] != "ivf"
