"""Clustering training data from classification files (jaxembed.data.clustering, for MoTE's clustering expert):
the triplets' invariants, the file and its report, the store reading it as a clustering set with its instruction,
the cache, the command and its errors."""

import json

import pytest

from jaxembed.data import clustering as C
from jaxembed.errors import UserError


def _labelled():
    texts = [f"text {i}" for i in range(40)] + ["text 3", "alone"]  # a duplicate text; a label with one text
    labels = ["a" if i < 15 else "b" if i < 30 else "c" for i in range(40)] + ["a", "d"]
    return texts, labels


def test_triplets_positive_same_label_negatives_other_labels_seeded():
    texts, labels = _labelled()
    label_of = {}
    for t, x in zip(texts, labels):
        label_of.setdefault(t, set()).add(x)
    recs, skipped = C.clustering_triplets(texts, labels, num_negatives=4, seed=3)
    assert skipped == {C.NO_POSITIVE: 1} and len(recs) == len(texts) - 1  # 'alone' has no positive: counted
    for r in recs:
        assert r["pos"][0] != r["query"] and r["label"] in label_of[r["pos"][0]]  # same label, another text
        neg = r["neg"]
        assert len(neg) == 4 and len(set(neg)) == 4 and not {r["query"], r["pos"][0]} & set(neg)
        assert all(r["label"] not in label_of[n] for n in neg)  # other labels only
        other = sorted({x for x in set(labels) if x != r["label"]})
        # the other labels in turn (cycled): 3 other labels, 4 negatives -> every other label, one twice
        assert sorted({next(iter(label_of[n])) for n in neg}) == other
    again, _ = C.clustering_triplets(texts, labels, num_negatives=4, seed=3)
    assert again == recs                                                      # seeded
    assert C.clustering_triplets(texts, labels, num_negatives=4, seed=4)[0] != recs
    small, _ = C.clustering_triplets(["x1", "x2", "y1"], ["x", "x", "y"], num_negatives=3)
    assert [r["neg"] for r in small] == [["y1"], ["y1"]]                      # fewer texts than asked: all of them
    with pytest.raises(UserError, match="at least 2 labels"):
        C.clustering_triplets(["p", "q"], ["x", "x"])


def test_file_store_cache_and_command(tmp_path, monkeypatch, capsys):
    from jaxembed.cli import main
    from jaxembed.data.config import dataset_config, default_data_config
    from jaxembed.data.store import Store, write_store

    texts, labels = _labelled()
    src = tmp_path / "cls.jsonl"
    src.write_text("".join(json.dumps({"text": t, "label": x, "fine": 1}) + "\n" for t, x in zip(texts, labels)))
    out = tmp_path / "clu.jsonl"
    assert main(["data", "clustering", "--input", str(src), "--out", str(out), "--extra-field", "fine",
                 "--instruction", "Identify the group of the given text.", "--num-negatives", "2"]) == 0
    assert "41 clustering triplets" in capsys.readouterr().out
    report = json.loads(out.with_suffix(".report.json").read_text())
    assert report["written"] == 41 and report["left_out"] == {C.NO_POSITIVE: 1} and report["labels"]["d"] == 1
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert {(r["type"], r["prompt"]) for r in rows} == {("clustering", "Identify the group of the given text.")}
    # the store: task type clustering and the instruction from the file's BGE fields (TA-CL: heterogeneous)
    dc = default_data_config()
    dc.datasets = [dataset_config(name="clu", path=str(out), format="triplets", num_negatives=2)]
    write_store(dc, tmp_path / "store", progress=False)
    info = Store.open(tmp_path / "store").dataset("clu")
    assert (info.task_type, info.batching, info.size) == ("clustering", "heterogeneous", 41)
    assert info.query_instruction == "Instruct: Identify the group of the given text. \n Query: "
    assert info.doc_instruction == ""  # clustering instructs the query (docs/design.md, Common core)
    # a bad record is named by file and line; unknown keys need --extra-field
    assert main(["data", "clustering", "--input", str(src), "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "cls.jsonl:1: field 'fine': unknown key" in capsys.readouterr().err
    # the cache: made once per (source bytes, settings), atomically, then reused
    monkeypatch.setenv("JAXEMBED_CACHE", str(tmp_path / "cache"))
    kw = dict(instruction="Identify the group of the given text.", num_negatives=2, extra_fields=("fine",))
    p = C.clustering_file(src, **kw)
    assert p.parent == tmp_path / "cache" / "clustering" and p.read_text() == out.read_text()
    mtime = p.stat().st_mtime_ns
    assert C.clustering_file(src, **kw) == p and p.stat().st_mtime_ns == mtime
    assert C.clustering_file(src, **dict(kw, seed=1)) != p
    assert sorted(f.name for f in p.parent.iterdir() if f.name.startswith(".")) == []  # no temporary left
    with pytest.raises(UserError, match="no such classification file"):
        C.clustering_file(tmp_path / "none.jsonl", **kw)


def test_shared_clustering_sets_come_from_train(shared_data, tmp_path, monkeypatch):
    monkeypatch.setenv("JAXEMBED_CACHE", str(tmp_path))
    sets = C.shared_clustering_datasets(shared_data)
    assert [d.name for d in sets] == ["trec_clustering", "sst5_clustering"]
    for d in sets:
        rep = json.loads(open(d.path[:-len(".jsonl")] + ".report.json").read())
        assert rep["source"].startswith(str(shared_data / "train")) and rep["written"] == rep["examples"]
        assert d.task_type == "clustering" and d.num_negatives == 4
