"""The Grain loader: batch layout and content, determinism, exact resume, host slices, worker processes,
length buckets, the length cache, and the real store. Global arrays on 8 simulated devices: the 8-device suite
(tests/multidevice/test_to_global.py)."""

import numpy as np
import pytest

from data_fakes import make_store, real_store_dir
from jaxembed.data import pipeline as L
from jaxembed.data.pipeline import choose_docs, make_loader, row_key, text_hash
from jaxembed.data.plan import build_plan
from jaxembed.errors import UserError
from jaxembed.tokenizer import Tokenizer, bucket_for

KEYS = {"query_input_ids": np.int32, "query_attention_mask": np.int32, "query_prompt_length": np.int32,
        "doc_input_ids": np.int32, "doc_attention_mask": np.int32, "doc_prompt_length": np.int32,
        "doc_valid": np.bool_, "doc_hash": np.uint32, "query_hash": np.uint32, "task_id": np.int32,
        "dataset_id": np.int32, "weight": np.float32, "example_index": np.int64, "teacher_score": np.float32,
        "pair_score": np.float32, "temperature": np.float32, "step": np.int64}


@pytest.fixture(scope="module")
def tok(minilm_dir):
    return Tokenizer.from_folder(minilm_dir)


def _store():
    return make_store([
        ("ra", "ret", 64, dict(batching="homogeneous", temperature=0.03, num_negatives=3,
                               query_instruction="Instruct: find the passage \n Query: ",
                               doc_instruction="passage: ")),
        ("ca", "cls", 48, dict(batching="heterogeneous", temperature=0.05, num_negatives=1,
                               query_instruction="Instruct: classify the text \n Query: ", max_query_length=20)),
        ("cb", "cls", 40, dict(batching="heterogeneous", temperature=0.05, num_negatives=2)),
        ("sa", "sts", 56, dict(batching="random", num_negatives=0)),
        ("sb", "sts2", 24, dict(batching="random", num_negatives=0)),
    ])


def _plan(store, **kw):
    return build_plan(store, dict({"global_batch_size": 8, "seed": 1}, **kw))


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _strip(ids, mask):
    return [int(t) for t, m in zip(ids, mask) if m]


def test_batch_layout_and_content(tok):
    store = _store()
    plan = _plan(store)
    loader = make_loader(store, plan, tok)
    K = loader.shapes["candidates"]
    assert K == 4  # 1 + max num_negatives
    batches = list(loader)
    assert len(batches) == plan.steps and [int(b["step"]) for b in batches] == list(range(plan.steps))
    qb, db = loader.shapes["query_buckets"], loader.shapes["doc_buckets"]
    seen_invalid = 0
    for s, b in enumerate(batches):
        assert set(b) == set(KEYS)
        for k, dt in KEYS.items():
            assert b[k].dtype == dt, k
        Lq, Ld = b["query_input_ids"].shape[1], b["doc_input_ids"].shape[1]
        assert b["query_input_ids"].shape == (8, Lq) and b["doc_input_ids"].shape == (8 * K, Ld)
        assert b["doc_valid"].shape == (8 * K,) and b["doc_hash"].shape == (8 * K, 2)
        assert b["query_hash"].shape == (8, 2)
        assert b["teacher_score"].shape == (8 * K,) and b["pair_score"].shape == (8,)
        assert Lq in qb and Ld in db
        np.testing.assert_array_equal(b["dataset_id"], plan.dataset_ids[s])
        np.testing.assert_array_equal(b["example_index"], plan.example_ids[s])
        np.testing.assert_array_equal(b["weight"], plan.weights[s])
        np.testing.assert_array_equal(b["task_id"], plan.dataset_tasks[plan.dataset_ids[s]])
        np.testing.assert_equal(float(b["temperature"]), float(plan.temperatures[s]))
        q_lens, d_lens = [], []
        for r in range(8):
            d, i = int(b["dataset_id"][r]), int(b["example_index"][r])
            info, ex = store.datasets[d], store.example(d, i)
            q_ids = tok.tokenize([info.query_instruction + ex["query"]], max_length=info.max_query_length)[0]
            assert _strip(b["query_input_ids"][r], b["query_attention_mask"][r]) == q_ids
            assert b["query_prompt_length"][r] == tok.prompt_length(info.query_instruction)
            assert tuple(b["query_hash"][r]) == text_hash(ex["query"])
            q_lens.append(len(q_ids))
            pos, negs = choose_docs(ex, info.num_negatives, row_key(1, s, r), "first")
            assert pos in ex["pos"] and negs == ex["neg"][:info.num_negatives]  # positive first, then negatives
            docs = [pos] + negs
            for j in range(K):
                row = r * K + j
                if j < len(docs):
                    want = tok.tokenize([info.doc_instruction + docs[j]], max_length=info.max_doc_length)[0]
                    assert b["doc_valid"][row]
                    assert _strip(b["doc_input_ids"][row], b["doc_attention_mask"][row]) == want
                    assert tuple(b["doc_hash"][row]) == text_hash(docs[j])
                    assert b["doc_prompt_length"][row] == tok.prompt_length(info.doc_instruction)
                    d_lens.append(len(want))
                else:  # empty slot: a well-formed empty text, masked out by doc_valid
                    seen_invalid += 1
                    assert not b["doc_valid"][row] and tuple(b["doc_hash"][row]) == (0, 0)
                    assert _strip(b["doc_input_ids"][row], b["doc_attention_mask"][row]) == tok.tokenize([""])[0]
        assert Lq == bucket_for(max(q_lens), qb) and Ld == bucket_for(max(d_lens), db)  # smallest bucket that fits
    assert seen_invalid > 0


def test_sampled_positives_and_negatives_are_deterministic(tok):
    ex = {"id": "x", "query": "q", "pos": ["p0", "p1", "p2"], "neg": [f"n{i}" for i in range(6)]}
    picks = {choose_docs(ex, 3, row_key(0, s, 0), "sample")[0] for s in range(40)}
    assert picks == {"p0", "p1", "p2"}
    a = choose_docs(ex, 3, row_key(0, 7, 2), "sample")
    assert a == choose_docs(ex, 3, row_key(0, 7, 2), "sample") and len(set(a[1])) == 3 and set(a[1]) <= set(ex["neg"])
    assert choose_docs(ex, 3, 5, "first")[1] == ["n0", "n1", "n2"]
    assert choose_docs(ex, 9, 5, "sample")[1] == ex["neg"]  # fewer negatives than asked: all of them
    store = _store()
    plan = _plan(store, negatives="sample")
    b1, b2 = list(make_loader(store, plan, tok)), list(make_loader(store, plan, tok))
    for x, y in zip(b1, b2):
        _assert_same(x, y)
    first = list(make_loader(store, _plan(store), tok))
    assert any(not np.array_equal(x["doc_hash"], y["doc_hash"]) for x, y in zip(b1, first))


def test_same_plan_same_batches_and_exact_resume(tok):
    store = _store()
    plan = _plan(store)
    full = list(make_loader(store, plan, tok))
    again = list(make_loader(_store(), _plan(_store()), tok))  # a fresh process would rebuild the same
    for a, b in zip(full, again):
        _assert_same(a, b)
    s = 5
    it = make_loader(store, plan, tok, start_step=s)  # "after a restart at step s"
    assert it.next_step == s
    resumed = list(it)
    assert len(resumed) == plan.steps - s
    for a, b in zip(full[s:], resumed):
        _assert_same(a, b)
    _assert_same(it.batch(s + 1), full[s + 1])


@pytest.mark.parametrize("hosts", [2, 4])
def test_host_slices_are_disjoint_and_form_the_global_batch(tok, hosts):
    store = _store()
    plan = _plan(store)
    glob = list(make_loader(store, plan, tok))
    per_host = [list(make_loader(store, plan, tok, process_index=h, process_count=hosts)) for h in range(hosts)]
    b = 8 // hosts
    for s, g in enumerate(glob):
        parts = [per_host[h][s] for h in range(hosts)]
        for p in parts:  # static shapes agree on every host
            assert p["query_input_ids"].shape == (b, g["query_input_ids"].shape[1])
            assert p["doc_input_ids"].shape == (b * 4, g["doc_input_ids"].shape[1])
            assert float(p["temperature"]) == float(g["temperature"]) or np.isnan(g["temperature"])
        for k in KEYS:
            if g[k].ndim:
                np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), g[k], err_msg=k)
        rows = [set(zip(p["dataset_id"].tolist(), p["example_index"].tolist())) for p in parts]
        assert sum(len(r) for r in rows) == len(set().union(*rows)) == 8


def test_worker_processes_give_identical_batches(tok):
    store = _store()
    plan = _plan(store)
    ref = list(make_loader(store, plan, tok, workers=0))
    with make_loader(store, plan, tok, workers=2, start_step=1) as loader:
        got = list(loader)
    assert len(got) == len(ref) - 1
    for a, b in zip(ref[1:], got):
        _assert_same(a, b)


def test_length_cache_is_written_and_reused(tok, tmp_path, monkeypatch):
    store = _store()
    plan = _plan(store)
    cache = tmp_path / "plan.lengths.npz"
    ref = list(make_loader(store, plan, tok, lengths_cache=cache))
    assert cache.exists()

    def boom(*a, **k):
        raise AssertionError("recomputed although cached")

    monkeypatch.setattr(L, "step_lengths", boom)
    for a, b in zip(ref, make_loader(store, plan, tok, lengths_cache=cache)):
        _assert_same(a, b)
    monkeypatch.undo()
    other = _plan(store, seed=2)  # another plan: the key differs, the table is recomputed
    assert len(list(make_loader(store, other, tok, lengths_cache=cache))) == other.steps


def test_fixed_number_of_candidates(tok):
    store = _store()
    plan = _plan(store)
    b = make_loader(store, plan, tok, num_candidates=6).batch(0)
    assert b["doc_input_ids"].shape[0] == 8 * 6 and b["doc_valid"].reshape(8, 6)[:, 4:].sum() == 0
    ref = make_loader(store, plan, tok).batch(0)
    np.testing.assert_array_equal(b["doc_hash"].reshape(8, 6, 2)[:, :4], ref["doc_hash"].reshape(8, 4, 2))
    with pytest.raises(UserError, match="num_candidates 3"):
        make_loader(store, plan, tok, num_candidates=3)


def test_loader_errors(tok):
    store = _store()
    plan = _plan(store)
    with pytest.raises(UserError, match="not divisible by process_count 3"):
        make_loader(store, plan, tok, process_count=3)
    with pytest.raises(UserError, match="outside the plan"):
        make_loader(store, plan, tok, start_step=plan.steps + 1)
    with pytest.raises(UserError, match="rebuild the plan"):
        make_loader(make_store([("ra", "ret", 64, {})]), plan, tok)


# ------------------------------------------------------------------------------------------------ real store

@pytest.fixture(scope="module")
def real_store(tmp_path_factory):
    from jaxembed.data.store import Store

    return Store.open(real_store_dir(tmp_path_factory))


def test_real_store_batches(real_store, tok):
    """The shared data prepared by the real store writer: K = 1 + 7 (WikiQA / TrecQA), short negatives lists
    leave invalid slots, instructions and their prompt lengths, worker processes with the real Store."""
    plan = build_plan(real_store, {"global_batch_size": 16, "seed": 0})
    wikiqa = real_store.datasets.index(real_store.dataset("wikiqa"))
    steps = np.flatnonzero(plan.dataset_ids[:, 0] == wikiqa)[:2].tolist() + [0, 1]
    steps = sorted(set(steps))
    loader = make_loader(real_store, plan, tok, start_step=steps[0], end_step=steps[-1] + 1)
    assert loader.shapes["candidates"] == 8
    for s in steps:
        b = loader.batch(s)
        assert b["doc_input_ids"].shape[0] == 16 * 8
        for r in range(16):
            info = real_store.datasets[int(b["dataset_id"][r])]
            ex = real_store.example(int(b["dataset_id"][r]), int(b["example_index"][r]))
            n = min(info.num_negatives, len(ex["neg"]))
            np.testing.assert_array_equal(b["doc_valid"][r * 8:(r + 1) * 8], [True] * (1 + n) + [False] * (7 - n))
            assert b["query_prompt_length"][r] == tok.prompt_length(info.query_instruction)
            if info.name == "wikiqa":
                text = tok.hf.decode(_strip(b["query_input_ids"][r], b["query_attention_mask"][r]))
                assert text.startswith("[CLS] instruct : given a question")
        assert np.isnan(b["temperature"])  # the shared config leaves temperatures to the run
    with make_loader(real_store, plan, tok, start_step=steps[0], end_step=steps[0] + 2, workers=1) as w:
        for got in w:
            _assert_same(got, loader.batch(int(got["step"])))
