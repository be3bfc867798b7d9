"""Evaluation: metric functions against hand-computed values and their references (sklearn, pytrec_eval, mteb),
the task registry, prompt resolution and MoTE routing (local and mteb alike), ``jaxembed eval``, and the
agreement test: each local evaluator's main score equals mteb's on the same data and embeddings.
"""

import argparse
import json
import math
import os
import re
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest

# mteb creates its result cache when imported: keep it out of ~/.cache/mteb
os.environ.setdefault("MTEB_CACHE", str(Path(tempfile.gettempdir()) / "jaxembed-test-mteb-cache"))

from jaxembed.errors import UserError  # noqa: E402
from jaxembed.evaluate import (dev_tasks, eval_tasks, evaluate, get_task, load_task_data,  # noqa: E402
                               lookup_prompt, make_router, resolve_model_path, resolve_tasks, scoring, task_names)
from jaxembed.evaluate.runner import classification_samples  # noqa: E402

# ------------------------------------------------------------------------------------ metrics, hand-computed


def test_ranking_metrics_hand_computed():
    qrels = {"q": {"d1": 2, "d3": 1, "d5": 0}}
    run = {"q": ["d2", "d1", "d3", "d4"]}
    m = scoring.ranking_metrics(run, qrels, ndcg_k=(3,), recall_k=(2, 3), mrr_k=(1, 10), map_k=(10,))
    dcg = 2 / math.log2(3) + 1 / math.log2(4)
    idcg = 2 / math.log2(2) + 1 / math.log2(3)
    assert m["ndcg_at_3"] == pytest.approx(dcg / idcg)  # 0.66967
    assert m["recall_at_2"] == pytest.approx(0.5) and m["recall_at_3"] == pytest.approx(1.0)
    assert m["mrr_at_1"] == 0.0 and m["mrr_at_10"] == pytest.approx(0.5)
    assert m["map_at_10"] == pytest.approx((1 / 2 + 2 / 3) / 2)
    # two queries average; a query whose relevant document is not retrieved scores 0
    m2 = scoring.ranking_metrics({"a": ["x", "y"], "b": ["y"]}, {"a": {"x": 1}, "b": {"z": 3}}, ndcg_k=(10,),
                                 mrr_k=(10,))
    assert m2["ndcg_at_10"] == pytest.approx(0.5) and m2["mrr_at_10"] == pytest.approx(0.5)


def test_ranking_metrics_equal_pytrec_eval():
    pytrec_eval = pytest.importorskip("pytrec_eval")
    rng = np.random.default_rng(0)
    docs = [f"d{i}" for i in range(40)]
    qrels, runs = {}, {}
    for q in range(25):
        qid = f"q{q}"
        qrels[qid] = {d: int(rng.integers(0, 4)) for d in rng.choice(docs, size=6, replace=False)}
        if not any(qrels[qid].values()):
            qrels[qid][docs[0]] = 2
        # scores with ties (rounded) to exercise the doc-id tie-break
        runs[qid] = {d: float(np.round(rng.random(), 1)) for d in docs}
    ev = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.10", "map_cut.20"})
    ref = ev.evaluate(runs)
    ids = list(runs["q0"])
    tie = scoring.tie_rank(ids)
    rankings = {}
    for qid, sc in runs.items():
        s = np.array([sc[d] for d in ids])
        order = np.lexsort((tie, s))[::-1]  # score descending, then doc id descending
        rankings[qid] = [ids[i] for i in order]
    ours = scoring.ranking_metrics(rankings, qrels, ndcg_k=(10,), recall_k=(10,), map_k=(20,))
    for ours_key, ref_key in (("ndcg_at_10", "ndcg_cut_10"), ("recall_at_10", "recall_10"),
                              ("map_at_20", "map_cut_20")):
        assert ours[ours_key] == pytest.approx(np.mean([ref[q][ref_key] for q in ref]), abs=1e-9), ours_key


def test_top_k_blocked_is_exact_with_tie_break():
    rng = np.random.default_rng(1)
    q = rng.normal(size=(7, 16)).astype(np.float32)
    d = rng.normal(size=(50, 16)).astype(np.float32)
    d[10] = d[3]  # a duplicate document: equal scores, order decided by the tie key
    tie = scoring.tie_rank([f"doc{i:02d}" for i in range(50)])
    for block in (1 << 24, 64, 7):  # one block, blocks of documents, tiny blocks
        idx, sc = scoring.top_k(q, d, 12, tie=tie, block_elements=block)
        full = scoring.normalize(q) @ scoring.normalize(d).T
        for r in range(7):
            ref = np.lexsort((tie, full[r]))[::-1][:12]
            assert list(idx[r]) == list(ref)
            np.testing.assert_allclose(sc[r], full[r][ref], rtol=1e-6)
    # the duplicate pair: the larger id (doc10) comes first wherever both appear
    idx, _ = scoring.top_k(q, d, 50, tie=tie)
    for row in idx:
        assert list(row).index(10) < list(row).index(3)


def test_average_precision_hand_and_sklearn():
    assert scoring.average_precision([1, 0, 1, 0], [0.9, 0.8, 0.7, 0.1]) == pytest.approx((1 + 2 / 3) / 2)
    # ties form one threshold: both at 0.5 -> precision 1/2 at recall 1
    assert scoring.average_precision([1, 0], [0.5, 0.5]) == pytest.approx(0.5)
    skm = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(2)
    for _ in range(5):
        y = rng.integers(0, 2, size=200)
        s = np.round(rng.random(200), 2)  # many ties
        assert scoring.average_precision(y, s) == pytest.approx(skm.average_precision_score(y, s), abs=1e-12)


def test_best_threshold_accuracy_and_f1_hand():
    scores, labels = [0.9, 0.8, 0.6, 0.4, 0.3], [1, 1, 0, 1, 0]
    acc, thr = scoring.best_accuracy(scores, labels)
    assert acc == pytest.approx(0.8) and thr == pytest.approx(0.7)  # 0.9, 0.8 positive -> 4/5 right
    f1, p, r, thr = scoring.best_f1(scores, labels)
    # top 4 as positive: precision 3/4, recall 1 -> F1 6/7 (beats top 2: precision 1, recall 2/3, F1 0.8)
    assert f1 == pytest.approx(6 / 7) and p == pytest.approx(0.75) and r == pytest.approx(1.0)
    assert thr == pytest.approx(0.35)


def test_v_measure_hand_and_sklearn():
    assert scoring.v_measure([0, 0, 1, 1], [5, 5, 7, 7]) == pytest.approx(1.0)
    assert scoring.v_measure([0, 0, 1, 1], [0, 1, 0, 1]) == pytest.approx(0.0)
    assert scoring.v_measure(["a", "a", "a"], [0, 0, 0]) == pytest.approx(1.0)
    skm = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(3)
    for k in (2, 3, 7):
        t, p = rng.integers(0, 3, 300), rng.integers(0, k, 300)
        assert scoring.v_measure(t, p) == pytest.approx(skm.v_measure_score(t, p), abs=1e-12)


def test_sts_correlations_and_truncation():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    assert scoring.spearman(x, x ** 3) == pytest.approx(1.0)
    assert scoring.pearson(x, 2 * x + 1) == pytest.approx(1.0)
    e = np.array([[3.0, 4.0, 12.0]], np.float32)
    np.testing.assert_allclose(scoring.truncate(e, 2), [[0.6, 0.8]], rtol=1e-6)
    np.testing.assert_allclose(scoring.truncate(e, 2, renormalize=False), [[3.0, 4.0]])


# -------------------------------------------------------------------------------------------- the registry


def test_registry_names_files_and_resolution(shared_data):
    assert task_names("eval") == ["STSBenchmark", "SICK-R", "MRPC", "WikiQA", "Cranfield", "TREC", "SST2", "SST5",
                                  "Newsgroups"]
    assert [t.name for t in dev_tasks()] == ["STSBenchmark-dev", "SICK-R-dev", "MRPC-dev", "WikiQA-dev",
                                             "TrecQA-dev", "SST2-dev", "SST5-dev"]
    assert get_task("STSBenchmark").files == {"test": "eval/stsb_test.jsonl"}
    assert get_task("SICK-R").files == {"test": "eval/sick_test.jsonl"}
    for t in dev_tasks() + eval_tasks():
        assert t.split in ("dev", "eval") and all(t.path(r).exists() for r in t.files), t.name
        assert all(f.startswith(("train/", t.split + "/")) for f in t.files.values())  # dev never reads eval/
    assert [t.name for t in resolve_tasks("STSBenchmark,SST2", split="dev")] == ["STSBenchmark-dev", "SST2-dev"]
    assert [t.name for t in resolve_tasks(["WikiQA"], split="both")] == ["WikiQA", "WikiQA-dev"]
    assert [t.name for t in resolve_tasks("dev")] == [t.name for t in dev_tasks()]
    assert len(resolve_tasks("all")) == len(dev_tasks()) + len(eval_tasks())
    with pytest.raises(UserError, match="did you mean STSBenchmark"):
        resolve_tasks("STSBenchmrk")
    with pytest.raises(UserError, match="no dev variant"):
        resolve_tasks("Cranfield", split="dev")


def test_task_data_and_subsampling(shared_data):
    d = load_task_data("Newsgroups")
    assert len(d.texts) == 200 and set(d.labels) == {"alt.atheism", "sci.space"}
    # the header block (whose Newsgroups: line is the label) is removed; one body quotes a forwarded header
    assert sum("Newsgroups:" in t for t in d.texts) == 1
    assert not any(t.startswith(("Path:", "From:", "Newsgroups:")) for t in d.texts)
    cran = load_task_data("Cranfield")
    assert len(cran.queries) == 225 and len(cran.docs) == 1400
    sub = load_task_data("Cranfield", max_examples=10, seed=3)
    assert len(sub.queries) == 10 and len(sub.docs) == 100
    assert {d for q in sub.query_ids for d in sub.qrels[q]} <= set(sub.doc_ids)  # every judged doc is kept
    a, b = load_task_data("MRPC", max_examples=50, seed=1), load_task_data("MRPC", max_examples=50, seed=1)
    assert a.sentence1 == b.sentence1 and len(a.sentence1) == 50


def test_resolve_model_path(tmp_path, minilm_dir):
    work = tmp_path / "run1"
    (work / "export").mkdir(parents=True)
    (work / "export" / "model.safetensors").write_bytes(b"")
    (work / "config.json").write_text("{}")  # the training config of the run, not a model config
    assert resolve_model_path(work) == str(work / "export")
    (tmp_path / "run2" / "checkpoints").mkdir(parents=True)
    with pytest.raises(UserError, match="without export/"):
        resolve_model_path(tmp_path / "run2")
    assert resolve_model_path(minilm_dir) == str(minilm_dir)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="workdir"):
        resolve_model_path(tmp_path / "empty")


# -------------------------------------------------------------------------------- prompts and MoTE routing


class RecordingEncoder:
    """A fake encoder: deterministic embeddings from the text hash; records (prompt, text, expert)."""

    def __init__(self, prompts=None, dim=16, with_expert=True):
        self.prompts = dict(prompts or {})
        self.calls = []
        self.dim = dim
        if not with_expert:
            self.encode = self._encode_no_expert

    def _emb(self, texts, prompt):
        out = []
        for t in texts:
            rng = np.random.default_rng(abs(hash((prompt, t))) % (1 << 32))
            out.append(rng.normal(size=self.dim))
        return np.asarray(out, np.float32)

    def encode(self, texts, *, prompt=None, batch_size=32, expert=None):
        self.calls += [(prompt, t, expert) for t in texts]
        return self._emb(texts, prompt)

    def _encode_no_expert(self, texts, *, prompt=None, batch_size=32):
        self.calls += [(prompt, t, None) for t in texts]
        return self._emb(texts, prompt)


def test_lookup_prompt_is_mteb_order():
    mteb_abs = pytest.importorskip("mteb.models.abs_encoder")
    from mteb.types import PromptType

    from jaxembed.evaluate import mteb_task

    meta = {n: mteb_task(n).metadata for n in ("WikiQA-dev", "STSBenchmark-dev")}
    dicts = [{"query": "q", "document": "d", "Reranking": "r", "Reranking-query": "rq", "WikiQA-dev": "w",
              "WikiQA-dev-query": "wq", "STS": "s"},
             {"query": "q", "Reranking": "r", "STSBenchmark-dev": "x"}, {"document": "d"}, {}]
    for prompts in dicts:
        for name, m in meta.items():
            for side in (None, PromptType.query, PromptType.document):
                ref = mteb_abs.get_prompt_name(prompts, m, side)
                assert lookup_prompt(prompts, m.name, m.type, side.value if side else None) == ref


def test_prompts_resolve_the_same_locally_and_in_mteb(shared_data):
    from jaxembed.evaluate import MTEBEncoder, mteb_task
    import mteb

    model_prompts = {"query": "q: ", "document": "d: ", "STS": "sts: "}  # the model's own (config) prompts
    caller = {"WikiQA-dev-query": "wikiqa q: "}
    names = ["STSBenchmark-dev", "WikiQA-dev", "SST2-dev"]
    for task_instructions in (False, True):
        local, remote = RecordingEncoder(model_prompts), RecordingEncoder(model_prompts)
        evaluate(local, names, max_examples=6, task_instructions=task_instructions, prompts=caller)
        mteb.evaluate(MTEBEncoder(remote, task_instructions=task_instructions, prompts=caller),
                      [mteb_task(n, max_examples=6) for n in names], cache=None, show_progress_bar=False)
        assert set(local.calls) == set(remote.calls)  # same texts with the same prompts
        used = {p for p, _, _ in local.calls}
        if task_instructions:  # the task's instruction beats the model's type-level prompt
            assert "Instruct: Retrieve semantically similar text.\nQuery: " in used and "sts: " not in used
            assert "wikiqa q: " in used and "d: " in used  # the caller's prompts win; documents: no instruction
        else:
            assert {"sts: ", "wikiqa q: ", "d: "} <= used
            assert None in used  # SST2-dev: no matching key -> the encoder's default


def test_mote_routing_by_task_type(shared_data):
    from jaxembed.evaluate import MTEBEncoder, mteb_task
    import mteb

    table = {"STS": 1, "Reranking": 2, "default": 0}
    local = RecordingEncoder()
    evaluate(local, ["STSBenchmark-dev", "TrecQA-dev", "SST5-dev"], max_examples=4, experts=table)
    by_expert = {e for _, _, e in local.calls}
    assert by_expert == {0, 1, 2}
    sts = load_task_data("STSBenchmark-dev", max_examples=4, seed=42)
    sts_texts = set(sts.sentence1) | set(sts.sentence2)
    assert all(e == 1 for _, t, e in local.calls if t in sts_texts)

    remote = RecordingEncoder()
    mteb.evaluate(MTEBEncoder(remote, experts=lambda task_type: 7 if task_type == "STS" else None),
                  [mteb_task("STSBenchmark-dev", max_examples=4), mteb_task("TrecQA-dev", max_examples=4)],
                  cache=None, show_progress_bar=False)
    assert {e for _, t, e in remote.calls if t in sts_texts} == {7}
    assert {e for _, t, e in remote.calls if t not in sts_texts} == {None}

    assert make_router({"STS": 3})("STS") == 3
    with pytest.raises(UserError, match="no expert for task type 'Clustering'"):
        make_router({"STS": 3})("Clustering")
    with pytest.raises(UserError, match="takes expert="):
        evaluate(RecordingEncoder(with_expert=False), "STSBenchmark-dev", max_examples=2, experts=table)


# ---------------------------------------------------------------------------------- mteb's own protocol parts


def test_classification_undersampling_equals_mteb():
    pytest.importorskip("mteb")
    from datasets import Dataset
    from mteb.abstasks.classification import AbsTaskClassification

    rng = np.random.default_rng(4)
    labels = [str(x) for x in rng.choice(["a", "b", "c"], size=300, p=[0.6, 0.3, 0.1])]
    ds = Dataset.from_dict({"text": [str(i) for i in range(300)], "label": labels})

    class Stub:  # the attributes mteb's method reads
        seed, label_column_name, samples_per_label = 42, "label", 8

    ref, idxs = [], None
    for i in range(10):
        _, idxs, sel = AbsTaskClassification._undersample_data(Stub(), ds, i, idxs)
        ref.append(sel)
    assert classification_samples(labels, 10, 8, 42) == ref


def test_pair_thresholds_equal_mteb():
    pytest.importorskip("mteb")
    from mteb.abstasks.pair_classification import AbsTaskPairClassification as PC

    rng = np.random.default_rng(5)
    s = np.round(rng.random(300), 2)
    y = (rng.random(300) < s).astype(np.int64)
    acc, _ = PC._find_best_acc_and_threshold(None, s.tolist(), y, True)
    f1, p, r, _ = PC._find_best_f1_and_threshold(None, s.tolist(), y, True)
    assert scoring.best_accuracy(s, y)[0] == pytest.approx(acc)
    assert scoring.best_f1(s, y)[:3] == pytest.approx((f1, p, r))


# ------------------------------------------------------------------------------ real model: agreement with mteb


class CachedEncoder:
    """An encoder behind a (prompt, text) cache, so that mteb scores exactly the embeddings the local evaluators
    scored; ``misses`` counts texts actually encoded."""

    def __init__(self, encoder):
        self.encoder, self.prompts, self.model = encoder, encoder.prompts, encoder.model
        self.cache, self.misses = {}, 0

    def encode(self, texts, *, prompt=None, batch_size=32, progress=None):
        new = [t for t in dict.fromkeys(texts) if (prompt, t) not in self.cache]
        if new:
            self.misses += len(new)
            for t, e in zip(new, self.encoder.encode(new, prompt=prompt, batch_size=batch_size, progress=False)):
                self.cache[(prompt, t)] = e
        return np.stack([self.cache[(prompt, t)] for t in texts])


class BagOfWordsEncoder:
    """A deterministic fake encoder with real signal (texts sharing words are similar): the normalised sum of fixed
    random vectors of the prompt's and the text's lower-cased words (seeded by crc32, the same in every process)."""

    prompts: dict = {}
    model = None

    def __init__(self, dim=64):
        self.dim, self.vectors = dim, {}

    def _vector(self, word):
        if word not in self.vectors:
            self.vectors[word] = np.random.default_rng(zlib.crc32(word.encode())).normal(size=self.dim)
        return self.vectors[word]

    def encode(self, texts, *, prompt=None, batch_size=32, progress=None):
        out = np.zeros((len(texts), self.dim))
        for i, t in enumerate(texts):
            for w in re.findall(r"\w+", f"{prompt or ''} {t}".lower()):
                out[i] += self._vector(w)
        out[:, 0] += 1e-3  # no zero vector for a text without words
        return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


# Test sets, subsampled (the same seeded sample on both sides); None = the whole file.
AGREEMENT = {"STSBenchmark": None, "SICK-R": 800, "MRPC": 500, "WikiQA": 60, "Cranfield": 12, "TREC": None,
             "SST2": 800, "SST5": 500, "Newsgroups": 80}


@pytest.mark.slow
def test_local_scores_equal_mteb(shared_data):
    """Each local evaluator's main score equals mteb's on the same data and the same embeddings (a fake encoder with
    signal behind a cache: mteb is served exactly the embeddings the local side scored). Classification and
    clustering draw random training examples / bootstrap samples: both sides run mteb's seeded procedure (seed 42)
    and land on the same number, up to float rounding in the classifiers.

    The embeddings themselves are checked elsewhere (tests/test_real_minilm.py: all-MiniLM-L6-v2 equals
    sentence-transformers to 1e-5), so equal scoring here means equal scores for the real model."""
    import mteb

    from jaxembed.evaluate import MTEBEncoder, mteb_task

    enc = CachedEncoder(BagOfWordsEncoder())
    tasks = [get_task(name) for name in AGREEMENT]
    ours = {}
    for t in tasks:
        ours.update(evaluate(enc, [t], max_examples=AGREEMENT[t.name], batch_size=64))
    encoded = enc.misses
    res = mteb.evaluate(MTEBEncoder(enc, batch_size=64), [mteb_task(t, max_examples=AGREEMENT[t.name]) for t in tasks],
                        cache=None, show_progress_bar=False, co2_tracker=False)
    theirs = {r.task_name: 100 * r.get_score() for r in res.task_results}
    assert enc.misses == encoded, "mteb asked for texts the local evaluators never encoded"
    report = {n: (round(ours[n]["main_score"], 6), round(theirs[n], 6)) for n in AGREEMENT}
    for t in tasks:  # mteb rounds retrieval metrics to 5 decimals (of a fraction): 5e-4 points
        tol = 5e-4 + 1e-9 if t.type in ("Retrieval", "Reranking") else 1e-4
        assert abs(ours[t.name]["main_score"] - theirs[t.name]) <= tol, (t.name, report)
    # the fake encoder carries signal: the STS correlations are far from chance (0)
    assert ours["STSBenchmark"]["main_score"] > 30 and ours["SICK-R"]["main_score"] > 30


# ------------------------------------------------------------------------------------------------- the CLI


def _cli(argv):
    from jaxembed.evaluate import cli as eval_cli

    p = argparse.ArgumentParser(prog="jaxembed")
    eval_cli.add_parsers(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)
    return args.func(args)


def test_cli_eval_local_and_mteb(minilm_dir, shared_data, tmp_path, capsys):
    work = tmp_path / "run"
    work.mkdir()
    (work / "export").symlink_to(minilm_dir, target_is_directory=True)  # a workdir: --model takes its export/
    out = tmp_path / "res.json"
    assert _cli(["eval", "--model", str(work), "--tasks", "STSBenchmark,MRPC", "--split", "dev", "--dims", "64",
                 "--max-examples", "40", "--out", str(out), "-q"]) == 0
    table = capsys.readouterr().out
    assert "STSBenchmark-dev" in table and "cosine_spearman" in table and "@64" in table
    res = json.loads(out.read_text())
    assert set(res) == {"STSBenchmark-dev", "MRPC-dev"}
    assert 50 < res["STSBenchmark-dev"]["main_score"] <= 100 and "64" in res["MRPC-dev"]["dims"]
    assert res["MRPC-dev"]["main_score"] == res["MRPC-dev"]["cosine_ap"]

    mout = tmp_path / "mteb"
    assert _cli(["eval", "--model", str(minilm_dir), "--mteb", "STSBenchmark-dev", "--max-examples", "40",
                 "--out", str(mout), "-q"]) == 0
    files = list(mout.glob("results/*/*/STSBenchmark-dev.json"))
    assert len(files) == 1
    score = json.loads(files[0].read_text())["scores"]["dev"][0]["main_score"]
    assert 100 * score == pytest.approx(res["STSBenchmark-dev"]["main_score"], abs=0.1)

    assert _cli(["eval", "--list"]) == 0 and "Newsgroups" in capsys.readouterr().out
    with pytest.raises(UserError, match="unknown task"):
        _cli(["eval", "--model", str(minilm_dir), "--tasks", "NoSuchTask"])
    with pytest.raises(UserError, match="--model is required"):
        _cli(["eval", "--tasks", "dev"])
    with pytest.raises(UserError, match="neither a local task nor"):
        _cli(["eval", "--model", str(minilm_dir), "--mteb", "NoSuchTaskXYZ", "--out", str(mout)])
    from jaxembed.cli import main  # wired into the main CLI: a user error is one line and exit status 2

    assert main(["eval", "--model", str(minilm_dir), "--tasks", "STSBenchmrk"]) == 2
    assert "did you mean STSBenchmark" in capsys.readouterr().err


def test_model_label_names_a_model_by_its_hub_id_or_its_base_and_run(tmp_path, minilm_dir):
    """Results are named after the model, not the folder that holds it: the bundled MiniLM by its hub id, a
    jaxembed export by its base model fine-tuned by its run (mteb's result folder: jaxembed/<base>-<run>)."""
    from jaxembed.evaluate.mteb_adapter import _model_name
    from jaxembed.evaluate.prompts import model_label

    assert model_label(minilm_dir) == _model_name(minilm_dir, None) == "sentence-transformers/all-MiniLM-L6-v2"
    export = tmp_path / "my-run" / "export"
    export.mkdir(parents=True)
    (export / "model.safetensors").write_bytes(b"")
    (export / "README.md").write_text("---\nbase_model: sentence-transformers/all-MiniLM-L6-v2\ntags:\n- jaxembed\n"
                                      "---\n\n# card\n")
    for given in (export.parent, export):  # the run directory or its export/
        assert model_label(given) == "all-MiniLM-L6-v2 fine-tuned (my-run)"
        assert _model_name(given, None) == "jaxembed/all-MiniLM-L6-v2-my-run"
    assert model_label("BAAI/bge-small-en-v1.5") == "BAAI/bge-small-en-v1.5"
    assert _model_name(export, "mine") == "jaxembed/mine"  # --name wins


def test_format_comparison_is_the_demos_before_after_table():
    from jaxembed.evaluate.runner import format_comparison

    before = {"STSBenchmark": {"main_score": 82.031}, "MRPC": {"main_score": 83.69}}
    after = {"STSBenchmark": {"main_score": 82.534}, "MRPC": {"main_score": 85.33}}
    assert format_comparison(before, after).splitlines() == [
        "task            metric                  before   after   change",
        "STSBenchmark    cosine_spearman          82.03   82.53    +0.50",
        "MRPC            cosine_ap                83.69   85.33    +1.64",
        "average                                  82.86   83.93    +1.07"]


def test_cli_eval_compare_prints_base_and_model_side_by_side(tmp_path, capsys):
    """`jaxembed eval --model M --compare BASE`: both scored on the same tasks, one table with each main score and
    the change, named after the models; --out holds both, with their names and folders."""
    from jaxembed.models.tiny import tiny_model_dir

    base, model = tiny_model_dir("bert", num_layers=1, seed=0), tiny_model_dir("bert", num_layers=1, seed=1)
    out = tmp_path / "cmp.json"
    assert _cli(["eval", "--model", str(model), "--compare", str(base), "--tasks", "MRPC-dev",
                 "--max-examples", "8", "--out", str(out), "-q"]) == 0
    printed = capsys.readouterr().out
    res = json.loads(out.read_text())
    assert set(res) == {"base", "model"} and res["base"]["source"] == str(base)
    assert res["model"]["name"] == model.name and res["base"]["name"] == base.name
    lines = printed.splitlines()
    table = lines[lines.index("task            metric                    base   model   change"):]
    b, m = res["base"]["results"]["MRPC-dev"]["main_score"], res["model"]["results"]["MRPC-dev"]["main_score"]
    assert table[1].split() == ["MRPC-dev", "cosine_ap", f"{b:.2f}", f"{m:.2f}", f"{m - b:+.2f}"]
    assert table[2].split() == ["average", f"{b:.2f}", f"{m:.2f}", f"{m - b:+.2f}"]
    assert f"base:  {base.name} ({base})" in printed and f"model: {model.name} ({model})" in printed
