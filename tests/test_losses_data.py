"""What the new losses need from the data, end to end on small files: the store keeps FlagEmbedding's teacher scores
and every scored pair of a CoSENT / AnglE dataset; the loader hands each batch row the teacher scores of the very
candidates it chose (sampled negatives too) and the pair's score; the data a loss needs is checked before any work
(one line naming the dataset and the fix); ``jaxembed teacher-score`` writes a teacher's cosines, atomically and
resumably."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from jaxembed.errors import UserError


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _score(text: str) -> float:
    """A teacher score that names its text (so a batch's scores can be checked against its texts)."""
    return round(sum(map(ord, text)) % 997 / 1000, 3)


TRIPLETS = [{"query": f"query {i}", "pos": [f"pos {i} a", f"pos {i} b"], "neg": [f"neg {i} {j}" for j in range(4)]}
            for i in range(12)]
for _i, _r in enumerate(TRIPLETS):
    if _i != 5:  # one example without teacher scores
        _r["pos_scores"] = [_score(t) for t in _r["pos"]]
        _r["neg_scores"] = [_score(t) for t in _r["neg"]]
PAIRS = [{"sentence1": f"first {i}", "sentence2": f"second {i}", "score": float(i % 6)} for i in range(12)]


def test_store_and_loader_carry_teacher_and_pair_scores(tmp_path, minilm_dir):
    """Sampled negatives (plan negatives='sample'): every filled slot's teacher score is its own text's; slots of an
    example without scores, and empty slots, are NaN; a CoSENT dataset keeps every pair (scores 0..5, no threshold)
    and each row's pair score is its pair's."""
    from jaxembed.data import config as dc
    from jaxembed.data.pipeline import make_loader, text_hash
    from jaxembed.data.plan import build_plan
    from jaxembed.data.store import Store, write_store
    from jaxembed.tokenizer import Tokenizer

    cfg = dc.default_data_config()
    cfg.datasets = [
        dc.dataset_config(name="tri", path=str(_jsonl(tmp_path / "tri.jsonl", TRIPLETS)), task_type="retrieval",
                          num_negatives=2, query_instruction=""),
        dc.dataset_config(name="sts", path=str(_jsonl(tmp_path / "sts.jsonl", PAIRS)), format="scored_pairs",
                          task_type="sts", num_negatives=0, loss="cosent"),
    ]
    report = write_store(cfg, tmp_path / "store")
    assert report.tally("sts").written == 12 and report.tally("sts").filtered == 0  # no threshold: every pair
    store = Store.open(tmp_path / "store")
    counts = {d["name"]: d["counts"] for d in store.manifest["datasets"]}
    assert counts["tri"]["teacher_scores"] == 11 and counts["sts"]["scores"] == 12
    assert store.example("sts", 3)["score"] == 3.0
    plan = build_plan(store, {"global_batch_size": 8, "seed": 3, "negatives": "sample", "steps": 6})
    texts = {t for r in TRIPLETS for t in [r["query"]] + r["pos"] + r["neg"]} | {
        t for r in PAIRS for t in (r["sentence1"], r["sentence2"])}
    by_hash = {text_hash(t): t for t in texts}
    no_scores = set(TRIPLETS[5]["pos"] + TRIPLETS[5]["neg"])
    pair_of = {r["sentence1"]: r["score"] for r in PAIRS}
    seen = {"scored": 0, "nan": 0, "pair": 0}
    loader = make_loader(store, plan, Tokenizer.from_folder(minilm_dir, 32))
    K = loader.shapes["candidates"]
    for b in loader:
        for r in range(8):
            q = by_hash[tuple(int(x) for x in b["query_hash"][r])]
            if q in pair_of:
                assert b["pair_score"][r] == pair_of[q]
                seen["pair"] += 1
            else:
                assert np.isnan(b["pair_score"][r])
            for k in range(K):
                t = b["teacher_score"][r * K + k]
                if not b["doc_valid"][r * K + k]:
                    assert np.isnan(t)
                    continue
                text = by_hash[tuple(int(x) for x in b["doc_hash"][r * K + k])]
                if text in no_scores or q in pair_of:
                    assert np.isnan(t)
                    seen["nan"] += 1
                else:
                    assert t == np.float32(_score(text)), (text, t)
                    seen["scored"] += 1
    assert min(seen.values()) > 0, seen


def _run_config(tmp_path, model_dir, datasets, **loss):
    from jaxembed.config import default_config

    c = default_config()
    c.model.name = str(model_dir)
    c.data.datasets = datasets
    for k, v in loss.items():
        c.loss[k] = v
    return c


def test_loss_data_checks_are_one_line_before_any_work(tmp_path, minilm_dir):
    from jaxembed.config import validate
    from jaxembed.data.config import dataset_config as ds

    plain = _jsonl(tmp_path / "plain.jsonl", [{k: v for k, v in r.items() if "scores" not in k} for r in TRIPLETS])
    scored = _jsonl(tmp_path / "scored.jsonl", TRIPLETS)
    pairs = _jsonl(tmp_path / "pairs.jsonl", PAIRS)
    tri = lambda p, **kw: ds(name="tri", path=str(p), task_type="retrieval", **kw)
    sts = lambda **kw: ds(name="sts", path=str(pairs), format="scored_pairs", task_type="sts", num_negatives=0, **kw)
    cases = [
        # distillation on a dataset without teacher scores: the file, the dataset and the teacher-score fix
        (dict(datasets=[tri(plain)], distill="kl"),
         r"plain\.jsonl:1: loss\.distill='kl' needs teacher scores .* dataset 'tri' has none \(fix: score it with "
         r"the teacher: jaxembed teacher-score --model TEACHER"),
        # ... also when only the dataset's rows are contrastive and another dataset is scored pairs
        (dict(datasets=[tri(plain), sts(loss="cosent")], distill="margin_mse"), r"dataset 'tri' has none"),
        # scored-pair losses need scored pairs, all of them
        (dict(datasets=[tri(scored, loss="cosent")]),
         r"scored\.jsonl:1: dataset 'tri' trains with 'cosent', which learns from scored pairs .* its records are "
         r"triplets \(config\.data\.datasets\[0\]\) \(fix: loss='infonce'"),
        (dict(datasets=[sts(score_threshold=3.0)], type="angle"),
         r"datasets\[0\]\.score_threshold: dataset 'sts' trains with 'angle', which learns from every pair .* "
         r"\(fix: remove score_threshold"),
        (dict(datasets=[sts(score_threshold=3.0, loss="cosent")]), r"would drop the low-scored pairs"),
        # distillation / GIST with no contrastive dataset to act on
        (dict(datasets=[sts(loss="cosent")], distill="kl"),
         r"config\.loss\.distill = 'kl': no dataset trains a contrastive loss"),
        (dict(datasets=[tri(scored)], gist_guide=str(tmp_path / "nowhere")),
         r"config\.loss\.gist_guide = .*nowhere.*: no model folder there"),
        (dict(datasets=[tri(scored)], distill="kld"), r"config\.loss\.distill = 'kld' is not valid"),
        (dict(datasets=[tri(scored)], distill_weight=0.0), r"config\.loss\.distill_weight = 0\.0 is not valid"),
    ]
    for kw, match in cases:
        kw = dict(kw)
        c = _run_config(tmp_path, minilm_dir, kw.pop("datasets"), **kw)
        with pytest.raises(UserError, match=match) as e:
            validate(c)
        assert "\n" not in str(e.value)
    # the same run with the teacher scores, or with the pairs under CoSENT, is valid (nothing else is refused)
    validate(_run_config(tmp_path, minilm_dir, [tri(scored), sts(loss="cosent")], distill="kl",
                         gist_guide=str(minilm_dir)))
    validate(_run_config(tmp_path, minilm_dir, [sts()], type="cosent"))


def test_store_checks_for_prepared_stores(tmp_path, minilm_dir):
    """With data.store (or a store the trainer prepared, loss_setup): the store's counts say whether a dataset has
    teacher scores / every pair's score."""
    from jaxembed.config import validate
    from jaxembed.data import config as dc
    from jaxembed.data.store import write_store

    cfg = dc.default_data_config()
    cfg.datasets = [dc.dataset_config(name="tri", path=str(_jsonl(tmp_path / "p.jsonl", [
        {k: v for k, v in r.items() if "scores" not in k} for r in TRIPLETS])), task_type="retrieval"),
        dc.dataset_config(name="sts", path=str(_jsonl(tmp_path / "s.jsonl", PAIRS)), format="scored_pairs",
                          task_type="sts", num_negatives=0, score_threshold=2.0)]
    write_store(cfg, tmp_path / "store")
    c = _run_config(tmp_path, minilm_dir, [], distill="kl")
    c.data.store = str(tmp_path / "store")
    with pytest.raises(UserError, match=r"manifest\.json: datasets\[0\]: loss\.distill='kl' needs teacher scores .* "
                                        r"dataset 'tri' has none in the store"):
        validate(c)
    c.loss.distill = "none"
    c.loss.type = "cosent"  # both datasets' rows would be CoSENT: the triplets cannot, and the pairs were thresholded
    with pytest.raises(UserError, match=r"datasets\[0\]\.loss: dataset 'tri' trains with 'cosent'"):
        validate(c)


def test_bad_teacher_scores_are_record_errors(tmp_path):
    from jaxembed.data.readers import ReadOptions, read_files

    rows = [dict(TRIPLETS[0]), dict(TRIPLETS[1], neg_scores=[0.1, 0.2]), dict(TRIPLETS[2], pos_scores=["high", 1])]
    items = list(read_files(str(_jsonl(tmp_path / "t.jsonl", rows)), ReadOptions(name="t")))
    assert items[0]["pos_scores"] == TRIPLETS[0]["pos_scores"]
    assert "field 'neg_scores': 2 scores for 4 neg texts" in str(items[1])
    assert "field 'pos_scores': expected a list of numbers" in str(items[2])


# ------------------------------------------------------------------------------------------ jaxembed teacher-score

def test_teacher_score_writes_cosines_atomically_and_resumes(tmp_path, monkeypatch, capsys):
    from jaxembed import loading, teacher
    from jaxembed.cli import main
    from jaxembed.encode import Encoder
    from jaxembed.models.tiny import tiny_model_dir

    model = tiny_model_dir("bert")
    rows = [{k: v for k, v in r.items() if "scores" not in k} | {"extra": i} for i, r in enumerate(TRIPLETS)]
    src = _jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    args = ["teacher-score", "--model", str(model), "--input", str(src), "--out", str(out), "-q",
            "--prompt", "query: "]
    # a bad record is one line, before the model loads
    bad = _jsonl(tmp_path / "bad.jsonl", rows[:2] + [{"query": "q", "pos": []}])
    assert main(["teacher-score", "--model", str(model), "--input", str(bad), "--out", str(out)]) == 2
    assert "bad.jsonl:3: field 'pos': expected a list of non-empty texts (at least one)" in capsys.readouterr().err
    # stopped after the first chunk: OUT does not exist, the partial file holds the finished records
    monkeypatch.setattr(teacher, "CHUNK_RECORDS", 5)
    real, calls = teacher.score_records, []

    def stop_after_one(*a, **kw):
        if calls:
            raise KeyboardInterrupt
        calls.append(len(a[1]))
        return real(*a, **kw)

    monkeypatch.setattr(teacher, "score_records", stop_after_one)
    capsys.readouterr()
    assert main(args) == 130  # Ctrl-C: one line and exit status 130 (jaxembed.cli.main), not a traceback
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: interrupted (Ctrl-C): `jaxembed teacher-score` stopped before it finished (run the same command "
        "again to do the work)")
    assert not out.exists() and len(Path(f"{out}.partial").read_text().splitlines()) == 5
    # the same command resumes after record 5 and scores only the rest
    monkeypatch.setattr(teacher, "score_records", lambda *a, **kw: calls.append(len(a[1])) or real(*a, **kw))
    assert main(args) == 0
    assert calls == [5, 5, 2] and "resumed after 5 records" in capsys.readouterr().out
    assert not Path(f"{out}.partial").exists() and not Path(f"{out}.partial.json").exists()
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert [g["extra"] for g in got] == list(range(12))  # input order, other fields kept
    enc = Encoder.from_loaded(loading.load(model))
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
    q = unit(enc.encode([r["query"] for r in rows], prompt="query: "))
    for i in (0, 7, 11):
        d = unit(enc.encode(rows[i]["pos"] + rows[i]["neg"]))
        np.testing.assert_allclose(got[i]["pos_scores"] + got[i]["neg_scores"], d @ q[i], atol=1e-5)
    # the scored file trains with distillation: its first record has the teacher scores
    from jaxembed.data.readers import ReadOptions, read_files

    ex = next(iter(read_files(str(out), ReadOptions(name="x", extra_fields=frozenset({"extra"})))))
    assert len(ex["pos_scores"]) == 2 and len(ex["neg_scores"]) == 4
