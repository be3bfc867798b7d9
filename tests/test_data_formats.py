"""Input formats, record validation and the data config: every class of bad input is named by file, line, field
and fix; the skip policy counts and lists; every format (incl. the BGE fixtures and the real train files) reads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from jaxembed.data import config as dc
from data_fakes import run_data_cli as _cli
from jaxembed.data.readers import (DEFAULT_FIELDS, ReadInfo, ReadOptions, Skip, Tally, apply_policy, read_dataset,
                                   read_hf, read_jsonl, read_tfds)
from jaxembed.data.shared_train import shared_train_config
from jaxembed.errors import InputError, UserError


def _write(path: Path, lines) -> Path:
    data = b"".join((ln if isinstance(ln, bytes) else ln.encode("utf-8")) + b"\n" for ln in lines)
    path.write_bytes(data)
    return path


def _j(**kw) -> str:
    return json.dumps(kw)


def _read(path, on_error="stop", **opts):
    tally = Tally("t")
    exs = list(apply_policy(read_jsonl(str(path), ReadOptions(**opts)), on_error, tally))
    return exs, tally


# ------------------------------------------------------------------------------------------ each class of bad input

GOOD_T = _j(query="q", pos=["p"], neg=["n"])

BAD_RECORDS = [
    # (format, lines, line, field, message regex)
    ("auto", [GOOD_T, '{"query": "q", "pos": ["p"'], 2, None, r"invalid JSON"),
    ("auto", [GOOD_T, '["q", "p"]'], 2, None, r"expected a JSON object, got list"),
    ("auto", [GOOD_T, ""], 2, None, r"empty line"),
    ("auto", [GOOD_T, b'{"query": "caf\xe9", "pos": ["p"]}'], 2, None, r"not valid UTF-8"),
    ("auto", [GOOD_T, '{"query": "\\ud800x", "pos": ["p"]}'], 2, "query", r"unpaired surrogate"),
    ("triplets", [GOOD_T, _j(pos=["p"])], 2, "query", r"missing \(keys present: pos\)"),
    ("auto", [GOOD_T, _j(query="  ", pos=["p"])], 2, "query", r"empty text"),
    ("auto", [GOOD_T, _j(query="q", pos="p")], 2, "pos", r"expected a list of strings, got str"),
    ("auto", [GOOD_T, _j(query="q", pos=[])], 2, "pos", r"at least one positive"),
    ("auto", [GOOD_T, _j(query="q", pos=["p"], neg=["n", 3])], 2, "neg[1]", r"expected a string, got int"),
    ("auto", [GOOD_T, _j(query="q", pos=["p", ""])], 2, "pos[1]", r"empty text"),
    ("auto", [GOOD_T, _j(query=5, pos=["p"])], 2, "query", r"expected a string, got int"),
    ("auto", [_j(id="a", query="q", pos=["p"]), _j(id="a", query="r", pos=["p"])], 2, "id", r"duplicate id 'a'"),
    ("auto", [_j(id=[1], query="q", pos=["p"])], 1, "id", r"expected a string or integer id"),
    ("auto", [_j(query="q", pos=["p"], type="weird")], 1, "type", r"'weird' is not a known type"),
    ("auto", [_j(query="q", pos=["p"], type="normal"), _j(query="q", pos=["p"], type="symmetric_sts")], 2, "type",
     r"means task type sts, but .*:1 set retrieval"),
    ("auto", [_j(query="q", pos=["p"], prompt="A."), _j(query="q", pos=["p"], prompt="B.")], 2, "prompt",
     r"'B.' differs from the prompt 'A.'"),
    ("auto", [_j(sentence1="a", sentence2="b", score=1), _j(sentence1="a", sentence2="b", score="high")], 2, "score",
     r"expected a number, got str"),
    ("auto", [_j(sentence1="a", sentence2="b", score=1), '{"sentence1": "a", "sentence2": "b", "score": NaN}'], 2,
     "score", r"not a finite number"),
    ("scored_pairs", [_j(sentence1="a", score=1)], 1, "sentence2", r"missing"),
    ("auto", [_j(sentence1="a", sentence2="b", label=1), _j(sentence1="a", sentence2="b", label=2)], 2, "label",
     r"2 is not a pair label"),
    ("auto", [_j(text="t", label="x"), _j(text="t", label=None)], 2, "label", r"expected a string .* got null"),
    ("auto", [_j(text="t", label="x"), _j(text="", label="x")], 2, "text", r"empty text"),
    ("classification", [_j(text="t", label="x"), _j(sentence="t", label="x")], 2, "text", r"missing"),
]


@pytest.mark.parametrize("fmt,lines,line,field,match", BAD_RECORDS)
def test_each_bad_record_names_file_line_field_and_fix(tmp_path, fmt, lines, line, field, match):
    p = _write(tmp_path / "bad.jsonl", lines)
    with pytest.raises(InputError) as ei:
        _read(p, format=fmt)
    e = ei.value
    assert (e.path, e.line, e.field) == (str(p), line, field), str(e)
    assert e.fix, str(e)
    assert re.search(match, str(e)), str(e)
    prefix = f"{p}:{line}: " + (f"field '{field}': " if field else "")
    assert str(e).startswith(prefix) and "(fix: " in str(e)
    # the skip policy keeps the good records and lists the bad one
    exs, tally = _read(p, on_error="skip", format=fmt)
    assert tally.read == len(lines) and tally.invalid == 1 and tally.written == len(exs) == len(lines) - 1
    assert tally.skipped[0].line == line and tally.skipped[0].field == field


def test_label_not_in_descriptions(tmp_path):
    p = _write(tmp_path / "cls.jsonl", [_j(text="good film", label="pos"), _j(text="meh", label="neutral")])
    ld = [("pos", "A positive review."), ("neg", "A negative review.")]
    with pytest.raises(InputError, match=r"cls\.jsonl:2: field 'label': 'neutral' is not in label_descriptions "
                                         r"\(known: 'pos', 'neg'\) \(fix: add the label"):
        _read(p, format="classification", label_descriptions=ld)


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        read_jsonl(str(tmp_path / "nope.jsonl"))
    with pytest.raises(InputError, match="is a folder"):
        read_jsonl(str(tmp_path))


def test_unknown_format_from_keys(tmp_path):
    p = _write(tmp_path / "x.jsonl", ["not json", _j(title="a", body="b")])
    with pytest.raises(InputError, match=r"x\.jsonl:2: cannot tell the format from the keys \(body, title\) "
                                         r"\(fix: set format"):
        _read(p)


def test_skip_policy_counts_and_lists_every_problem(tmp_path):
    lines = [GOOD_T, "oops", _j(query="", pos=["p"]), GOOD_T, b"\xff\xfe", _j(query="q", pos=["p"], neg="n")]
    p = _write(tmp_path / "mixed.jsonl", lines)
    exs, tally = _read(p, on_error="skip")
    assert len(exs) == 2 and tally.read == 6 and tally.written == 2 and tally.invalid == 4
    assert [s.line for s in tally.skipped] == [2, 3, 5, 6]
    assert [s.field for s in tally.skipped] == [None, "query", None, "neg"]
    assert all(isinstance(s, Skip) and s.invalid for s in tally.skipped)
    d = tally.to_dict()
    assert d["invalid"] == 4 and len(d["skipped"]) == 4 and d["skipped"][1]["file"] == str(p)
    with pytest.raises(InputError, match=r"mixed\.jsonl:2: invalid JSON"):
        _read(p, on_error="stop")


# ------------------------------------------------------------------------------------------------------ formats

def test_triplets_ids_and_neg_default(tmp_path):
    p = _write(tmp_path / "t.jsonl", [_j(query="q1", pos=["p1", "p2"]), _j(id=7, query="q2", pos=["p"], neg=["n"])])
    exs, _ = _read(p, name="ds")
    assert exs == [{"id": "ds:1", "query": "q1", "pos": ["p1", "p2"], "neg": []},
                   {"id": "7", "query": "q2", "pos": ["p"], "neg": ["n"]}]
    q = _write(tmp_path / "u.jsonl", [_j(query="q3", pos=["p"])])
    items = list(read_jsonl([str(p), str(q)], ReadOptions(name="ds")))
    assert [x["id"] for x in items] == ["ds:0:1", "7", "ds:1:1"]


def test_bom_crlf_and_unicode(tmp_path):
    p = tmp_path / "w.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + _j(query="caf\u00e9 \u4e2d", pos=["p"]).encode() + b"\r\n" +
                  json.dumps({"query": "na\u00efve", "pos": ["\u00fc"]}, ensure_ascii=False).encode() + b"\r\n")
    exs, tally = _read(p)
    assert [e["query"] for e in exs] == ["caf\u00e9 \u4e2d", "na\u00efve"] and exs[1]["pos"] == ["\u00fc"]


def test_scored_pairs_threshold(tmp_path):
    p = _write(tmp_path / "s.jsonl", [_j(sentence1="a", sentence2="b", score=4.5),
                                      _j(sentence1="c", sentence2="d", score=3.9),
                                      _j(sentence1="e", sentence2="f", score=4)])
    exs, tally = _read(p, name="sts", score_threshold=4.0)
    assert exs == [{"id": "sts:1", "query": "a", "pos": ["b"], "neg": []},
                   {"id": "sts:3", "query": "e", "pos": ["f"], "neg": []}]
    assert tally.invalid == 0 and tally.filtered == 1
    s = tally.skipped[0]
    assert (s.line, s.field, s.invalid) == (2, "score", False)
    assert str(s) == f"{p}:2: skipped: field 'score': score below threshold 4 (score 3.9)"
    assert tally.reasons() == {"score below threshold 4": 1}


def test_labelled_pairs(tmp_path):
    p = _write(tmp_path / "l.jsonl", [_j(sentence1="a", sentence2="b", label=1), _j(sentence1="c", sentence2="d",
                                                                                   label=0),
                                      _j(sentence1="e", sentence2="f", label="1"),
                                      _j(sentence1="g", sentence2="h", label=True)])
    exs, tally = _read(p)  # negative pairs are left out under the stop policy too: they are valid
    assert [e["query"] for e in exs] == ["a", "e", "g"] and all(e["neg"] == [] for e in exs)
    assert tally.filtered == 1 and tally.skipped[0].reason == "negative pair" and tally.skipped[0].line == 2


def test_classification_kalm_pairs(tmp_path):
    p = _write(tmp_path / "c.jsonl", [_j(text="great", label="positive"), _j(text="bad", label="negative"),
                                      _j(text="ok", label="neutral")])
    exs, _ = _read(p, name="c")  # labels from the data, sorted; the description is the label itself
    assert exs[0] == {"id": "c:1", "query": "great", "pos": ["positive"], "neg": ["negative", "neutral"],
                      "label": "positive"}
    ld = [("negative", "A negative text."), ("neutral", "A neutral text."), ("positive", "A positive text.")]
    info = ReadInfo()
    exs = list(read_jsonl(str(p), ReadOptions(label_descriptions=ld), info))
    assert exs[1]["pos"] == ["A negative text."] and exs[1]["neg"] == ["A neutral text.", "A positive text."]
    assert info.format == "classification" and info.labels == ["negative", "neutral", "positive"]
    q = _write(tmp_path / "d.jsonl", [_j(sentence="hi", cat=3), _j(sentence="yo", cat=4)])
    f = dict(DEFAULT_FIELDS, text="sentence", label="cat")
    exs = list(read_jsonl(str(q), ReadOptions(fields=f)))
    assert exs[0]["pos"] == ["3"] and exs[0]["neg"] == ["4"] and exs[0]["label"] == "3"


FIXTURES = "fixtures/flagembedding"


@pytest.mark.parametrize("rel,task_type,prompt_start", [
    ("classification-no_in_batch_neg/AmazonClassification.jsonl", "classification", "Classify the given Amazon"),
    ("classification-no_in_batch_neg/Banking77Classification.jsonl", "classification", "Given a online banking"),
    ("clustering-no_in_batch_neg/arXiv_title.jsonl", "clustering", "Identify the main and secondary"),
    ("clustering-no_in_batch_neg/bioRXiv_title.jsonl", "clustering", "Identify the main category"),
    ("retrieval/msmarco.jsonl", "retrieval", "Given a web search query"),
    ("retrieval/nli.jsonl", "retrieval", "Retrieve semantically similar text."),
    ("retrieval/nq.jsonl", "retrieval", "Given a question, retrieve Wikipedia"),
    ("sts/sts.jsonl", "sts", "Retrieve semantically similar text."),
])
def test_bge_fixtures(shared_data, rel, task_type, prompt_start):
    path = shared_data / FIXTURES / rel
    info = ReadInfo()
    tally = Tally("bge")
    exs = list(apply_policy(read_jsonl(str(path), ReadOptions(name="bge"), info), "stop", tally))
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    assert tally.read == len(rows) == len(exs) == 10 and tally.invalid == 0
    assert info.format == "triplets" and info.task_type == task_type and info.prompt.startswith(prompt_start)
    for ex, row in zip(exs, rows):
        assert ex["query"] == row["query"] and ex["pos"] == row["pos"] and ex["neg"] == row["neg"]
        if "category" in row:
            assert ex["label"] == row["category"]


TRAIN_FILES = {  # file: (format, records, written with the shared config's thresholds)
    "snli_triplets.jsonl": ("triplets", 2954), "sick_triplets.jsonl": ("triplets", 81),
    "sick_pairs.jsonl": ("scored_pairs", 3563), "stsb_pairs.jsonl": ("scored_pairs", 754),
    "mrpc_pairs.jsonl": ("labelled_pairs", 2791), "wikiqa.jsonl": ("triplets", 857),
    "trecqa.jsonl": ("triplets", 78), "trec_cls.jsonl": ("classification", 5452),
    "sst5_cls.jsonl": ("classification", 8544), "mr_cls.jsonl": ("classification", 10662),
    "cr_cls.jsonl": ("classification", 3771), "mpqa_cls.jsonl": ("classification", 10603),
    "subj_cls.jsonl": ("classification", 10000),
}  # sst2 (67k) is read in the store test of the whole shared config


EXTRA_FIELDS = {"sick_pairs.jsonl": "entailment", "trec_cls.jsonl": "fine_label"}  # as in shared_train_config


@pytest.mark.parametrize("name", sorted(TRAIN_FILES))
def test_real_train_files_auto_detected_and_valid(shared_data, name):
    fmt, n = TRAIN_FILES[name]
    info, tally = ReadInfo(), Tally(name)
    extra = frozenset([EXTRA_FIELDS[name]] if name in EXTRA_FIELDS else [])
    for _ in apply_policy(read_jsonl(str(shared_data / "train" / name), ReadOptions(extra_fields=extra), info),
                          "stop", tally):
        pass
    assert info.format == fmt and tally.read == n and tally.invalid == 0
    if extra:  # undeclared, the extra key of every record is reported, not ignored
        t = Tally(name)
        for _ in apply_policy(read_jsonl(str(shared_data / "train" / name), ReadOptions()), "skip", t):
            pass
        assert t.invalid == n and t.written == 0
        assert {s.field for s in t.skipped if s.invalid} == set(extra)
    if fmt == "labelled_pairs":
        assert tally.filtered == 777 and tally.written == 2014


# ------------------------------------------------------------------------------------------- HF datasets / TFDS

def test_hf_dataset_in_memory_and_saved(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"question": ["q1", "q2", ""], "answers": [["a1"], ["a2", "a3"], ["x"]],
                                     "hard": [["n1"], [], ["y"]]})
    f = dict(DEFAULT_FIELDS, query="question", pos="answers", neg="hard")
    tally = Tally("hfq")
    exs = list(apply_policy(read_hf(ds, ReadOptions(name="hfq", fields=f)), "skip", tally))
    assert exs == [{"id": "hfq:1", "query": "q1", "pos": ["a1"], "neg": ["n1"]},
                   {"id": "hfq:2", "query": "q2", "pos": ["a2", "a3"], "neg": []}]
    assert tally.invalid == 1 and tally.skipped[0].line == 3 and tally.skipped[0].field == "question"
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "saved"))
    cfg = dc.dataset_config(name="hfq", path=str(tmp_path / "saved"), format="hf", task_type="retrieval",
                            columns={"query": "question", "pos": "answers", "neg": "hard"})
    items = list(read_dataset(cfg))
    assert items[:2] == exs and isinstance(items[2], Skip)
    with pytest.raises(UserError, match=r"no split 'test' \(splits: train\)"):
        read_hf(str(tmp_path / "saved"), split="test")
    cls = datasets.Dataset.from_dict({"text": ["a", "b"], "label": [0, 1]})  # integer class labels
    exs = list(read_hf(cls, ReadOptions()))
    assert exs[0]["pos"] == ["0"] and exs[0]["neg"] == ["1"] and exs[1]["label"] == "1"


def test_tfds_missing_is_a_clear_error():
    try:
        import tensorflow_datasets  # noqa: F401
    except ImportError:
        with pytest.raises(UserError, match=r"pip install jaxembed\[tfds\]"):
            read_tfds("glue/sst2")
    else:  # pragma: no cover
        pytest.skip("tensorflow_datasets is installed")


# ---------------------------------------------------------------------------------------------------- the config

def _cfg(tmp_path, **kw):
    p = _write(tmp_path / "t.jsonl", [GOOD_T])
    c = dc.default_data_config()
    c.datasets = [dc.dataset_config(name="a", path=str(p), task_type="retrieval"),
                  dc.dataset_config(**dict(dict(name="b", path=str(p), task_type="nli"), **kw))]
    return c


@pytest.mark.parametrize("kw,match", [
    (dict(task_type="retreival"), r"data\.datasets\[1\]\.task_type: 'retreival' is not one of retrieval, "
                                  r"reranking, sts, pair_classification, classification, clustering, nli"),
    (dict(format="csv"), r"data\.datasets\[1\]\.format: 'csv' is not one of auto, triplets"),
    (dict(batching="mixed"), r"data\.datasets\[1\]\.batching: 'mixed' is not one of random"),
    (dict(temperature=0.0), r"data\.datasets\[1\]\.temperature: 0\.0 must be a number > 0"),
    (dict(temperature=-1.0), r"temperature: -1\.0 must be a number > 0"),
    (dict(num_negatives=-1), r"data\.datasets\[1\]\.num_negatives: -1 must be an integer >= 0"),
    (dict(max_query_length=0), r"data\.datasets\[1\]\.max_query_length = 0 is too short: .* at least 2"),
    (dict(max_doc_length=1), r"data\.datasets\[1\]\.max_doc_length = 1 is too short: a max length counts the "
                             r"special tokens"),  # the same rule as model.max_length, also outside training
    (dict(max_doc_length=64.0), r"max_doc_length = 64\.0 is not a whole number of tokens"),
    (dict(weight=-2.0), r"weight: -2\.0 must be a number > 0"),
    (dict(weight=1.0, epochs=2.0), r"data\.datasets\[1\]: set weight or epochs, not both"),
    (dict(name="a"), r"data\.datasets\[1\]\.name: 'a' is used by another dataset"),
    (dict(name="a b"), r"data\.datasets\[1\]\.name: 'a b' is not a valid name"),
    (dict(name=""), r"data\.datasets\[1\]\.name: required"),
    (dict(path="/no/such/file.jsonl"), r"data\.datasets\[1\]\.path: /no/such/file\.jsonl does not exist"),
    (dict(path=[]), r"data\.datasets\[1\]\.path: expected a path or a non-empty list"),
    (dict(format="scored_pairs", task_type="sts"), r"score_threshold: required for scored_pairs"),
    (dict(score_threshold=4.0, format="triplets"), r"score_threshold: only used by scored_pairs"),
    (dict(format="classification", task_type=None), r"data\.datasets\[1\]\.task_type: required"),
    (dict(format="classification", task_type="classification", label_descriptions={"x": "y"}),
     r"label_descriptions: needs at least 2 labels"),
    (dict(format="classification", task_type="classification", label_descriptions={"x": "", "y": "z"}),
     r"label_descriptions\['x'\]: value '' must be a non-empty string"),
    (dict(columns={"question": "q"}), r"columns: 'question' is not a field name"),
    (dict(query_instruction=3), r"query_instruction: expected a string"),
    (dict(record_format="triplets"), r"record_format: only used with format hf or tfds"),
])
def test_bad_config_values_name_their_key_path(tmp_path, kw, match):
    c = _cfg(tmp_path, **kw)
    with pytest.raises(UserError, match=match):
        dc.validate_data_config(c, where="data")


@pytest.mark.parametrize("key,value,match", [
    ("on_error", "ignore", r"data\.on_error: 'ignore' is not one of stop, skip"),
    ("sampling", "uniform", r"data\.sampling: 'uniform' is not one of size, weights, temperature"),
    ("sampling_temperature", 0.0, r"data\.sampling_temperature: 0\.0 must be a number > 0"),
    ("datasets", [], r"data\.datasets: expected a non-empty list"),
])
def test_bad_top_level_values(tmp_path, key, value, match):
    c = _cfg(tmp_path)
    c[key] = value
    with pytest.raises(UserError, match=match):
        dc.validate_data_config(c, where="data")


def test_unknown_keys(tmp_path):
    c = _cfg(tmp_path)
    c.datasets[0].tempreature = 0.1
    with pytest.raises(UserError, match=r"data\.datasets\[0\]\.tempreature: unknown key"):
        dc.validate_data_config(c, where="data")
    with pytest.raises(UserError, match=r"unknown key\(s\) tempreature"):
        dc.dataset_config(name="x", path="y", tempreature=0.1)
    c = _cfg(tmp_path)
    c.on_eror = "skip"
    with pytest.raises(UserError, match=r"config\.on_eror: unknown key"):
        dc.validate_data_config(c)


def test_shared_train_config(shared_data):
    c = shared_train_config(shared_data)
    dc.validate_data_config(c, where="data")
    assert len(c.datasets) >= 8 and len({d.task_type for d in c.datasets}) >= 5
    files = {Path(p).name for d in c.datasets for p in dc.dataset_paths(d)}
    assert files == {p.name for p in (shared_data / "train").glob("*.jsonl")}
    for d in c.datasets:
        if d.task_type in dc.SYMMETRIC_TASK_TYPES:
            assert d.query_instruction == "" and not d.doc_instruction
        else:
            assert d.query_instruction.startswith("Instruct: ") and d.query_instruction.endswith(" \n Query: ")
    by = {d.name: d for d in c.datasets}
    assert by["stsb"].score_threshold == 4.0 and by["sick_sts"].score_threshold == 4.0
    assert by["mrpc"].format == "labelled_pairs" and by["mrpc"].task_type == "pair_classification"


# ------------------------------------------------------------------------------------------------ data validate



def test_cli_validate_exit_status_and_messages(tmp_path, capsys):
    good = _write(tmp_path / "good.jsonl", [GOOD_T, _j(query="r", pos=["s"])])
    bad = _write(tmp_path / "bad.jsonl", [GOOD_T, "{oops", _j(query="q", pos=[3])])
    assert _cli(["data", "validate", str(good)]) == 0
    assert "all 2 records valid in 1 files" in capsys.readouterr().out
    assert _cli(["data", "validate", str(good), str(bad)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert f"{bad}:2: invalid JSON (Expecting property name enclosed in double quotes at column 2) " \
           f"(fix: each line must be one complete JSON object)" in out
    assert f"{bad}:3: field 'pos[0]': expected a string, got int (fix: store the text as a JSON string)" in out
    assert out[-1] == "2 invalid records in 1 of 2 files (5 records read)"
    assert _cli(["data", "validate", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().out
    cls = _write(tmp_path / "c.jsonl", [_j(sentence="a", cat="x"), _j(sentence="b", cat="y")])
    assert _cli(["data", "validate", str(cls), "--format", "classification", "--text-field", "sentence",
                 "--label-field", "cat"]) == 0
    pairs = _write(tmp_path / "p.jsonl", [_j(sentence1="a", sentence2="b", score=1.0),
                                          _j(sentence1="a", sentence2="b", score=5.0)])
    assert _cli(["data", "validate", str(pairs), "--score-threshold", "4"]) == 0
    assert "1 valid but left out: score below threshold 4: 1" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        _cli(["data", "validate", str(good), "--format", "csv"])
