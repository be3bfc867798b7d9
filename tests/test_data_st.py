"""sentence-transformers / FlagEmbedding users' data as it is: the ST row format (columns in order, label / score),
every source (JSON Lines, Parquet, CSV / TSV, save_to_disk folders, datasets.load_dataset names with subsets,
streaming), a dict of datasets with per-dataset settings, one-line errors for each bad input, the optional
packages, and the store writer's bounded memory (hashes, spooled skips, progress bar)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from data_fakes import run_data_cli as _cli
from jaxembed.data import config as dc
from jaxembed.data.readers import ReadOptions, Tally, apply_policy, read_dataset, read_files
from jaxembed.data.hashindex import HashIndex, key_of
from jaxembed.data.store import Store, write_store
from jaxembed.errors import InputError, UserError

ST_ROWS = [{"anchor": f"a{i}", "positive": f"p{i}", "negative": f"n{i}"} for i in range(6)]
TRIPLES = [(r["anchor"], [r["positive"]], [r["negative"]]) for r in ST_ROWS]


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _csv(path: Path, header, rows, sep=",") -> Path:
    path.write_text(sep.join(header) + "\n" + "".join(sep.join(map(str, r)) + "\n" for r in rows), encoding="utf-8")
    return path


def _read(ds, on_error="stop"):
    t = Tally(ds["name"])
    return list(apply_policy(read_dataset(ds), on_error, t)), t


def _triples(exs):
    return [(e["query"], e["pos"], e["neg"]) for e in exs]


# ------------------------------------------------------------------------------------------------ every source

def test_st_triplets_from_every_source_read_the_same(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    datasets.disable_progress_bars()
    cols = {k: [r[k] for r in ST_ROWS] for k in ("anchor", "positive", "negative")}
    pq.write_table(pa.table(cols), tmp_path / "tri.parquet")
    _csv(tmp_path / "tri.csv", list(cols), [[r[k] for k in cols] for r in ST_ROWS])
    _csv(tmp_path / "tri.tsv", list(cols), [[r[k] for k in cols] for r in ST_ROWS], sep="\t")
    _jsonl(tmp_path / "tri.jsonl", ST_ROWS)
    ds = datasets.Dataset.from_dict(cols)
    ds.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": ds.select(range(2)), "dev": ds}).save_to_disk(str(tmp_path / "saved_dict"))
    repo = tmp_path / "repo"  # a hub-style repository: one subset per folder, named in the README's configs
    (repo / "triplet").mkdir(parents=True)
    ds.to_parquet(str(repo / "triplet" / "train-00000-of-00001.parquet"))
    (repo / "README.md").write_text("---\nconfigs:\n- config_name: triplet\n  data_files:\n  - split: train\n"
                                    "    path: triplet/train-*\n---\n")
    sources = {
        "parquet": dict(path=str(tmp_path / "tri.parquet")),
        "csv": dict(path=str(tmp_path / "tri.csv")),
        "tsv": dict(path=str(tmp_path / "tri.tsv")),
        "jsonl": dict(path=str(tmp_path / "tri.jsonl")),
        "saved": dict(path=str(tmp_path / "saved")),                               # load_from_disk, no format
        "saved_dict": dict(path=str(tmp_path / "saved_dict"), split="dev"),
        "hub": dict(path=str(repo), format="hf", subset="triplet"),                # datasets.load_dataset
        "stream": dict(path=str(repo), format="hf", subset="triplet", streaming=True),
        "glob": dict(path=str(tmp_path / "tri.p*quet")),
    }
    for name, kw in sources.items():
        cfg = dc.dataset_config(name=name, task_type="nli", **kw)
        dc.validate_data_config(_data([cfg]), where="data")
        exs, tally = _read(cfg)
        assert _triples(exs) == TRIPLES, name  # auto-detected from anchor + positive: the st row format
        assert tally.read == 6 and tally.invalid == 0, name
    assert list((tmp_path / "hf_cache").iterdir())  # the non-streaming load went through the datasets cache
    exs, _ = _read(dc.dataset_config(name="c", path=str(tmp_path / "tri.csv"), task_type="nli"))
    assert [e["id"] for e in exs][:2] == ["c:2", "c:3"]  # CSV ids keep the line (the header is line 1)
    # the store through `jaxembed data prepare`, with the sentence-transformers dict of datasets
    cfg_file = tmp_path / "st_data.py"
    cfg_file.write_text(
        "from jaxembed.data.config import datasets_from_dict, default_data_config\n"
        "def get_config(arg=None):\n"
        "    c = default_data_config()\n"
        f"    c.datasets = datasets_from_dict({{'nli': {str(tmp_path / 'tri.parquet')!r},\n"
        f"                                     'nli_hf': dict(path={str(tmp_path / 'saved')!r}, num_negatives=1)}},\n"
        "                                    task_type='nli', max_query_length=16)\n"
        "    return c\n")
    assert _cli(["data", "prepare", "--config", str(cfg_file), "--out", str(tmp_path / "store"), "-q"]) == 0
    st = Store.open(tmp_path / "store")
    assert [(d.name, d.task, d.task_type, d.size, d.max_query_length) for d in st.datasets] == [
        ("nli", "nli", "nli", 6, 16), ("nli_hf", "nli_hf", "nli", 6, 16)]
    assert st.example("nli_hf", 2) == {"id": "nli_hf:3", "query": "a2", "pos": ["p2"], "neg": ["n2"]}


def _data(datasets_):
    c = dc.default_data_config()
    c.datasets = datasets_
    return c


# ------------------------------------------------------------------------------------------- the st row format

def test_st_rows_by_column_order_pairs_and_labels(tmp_path):
    # names do not matter, order does: (question, answer, negative_1, negative_2) = (anchor, positive, negatives)
    p = _jsonl(tmp_path / "qa.jsonl", [{"question": "q", "answer": "a", "negative_1": "x", "negative_2": "y"},
                                       {"id": "r7", "question": "q2", "answer": "a2", "negative_1": "z",
                                        "negative_2": "w"}])
    exs, _ = _read(dc.dataset_config(name="qa", path=str(p), format="st", task_type="retrieval"))
    assert exs == [{"id": "qa:1", "query": "q", "pos": ["a"], "neg": ["x", "y"]},
                   {"id": "r7", "query": "q2", "pos": ["a2"], "neg": ["z", "w"]}]
    # (sentence1, sentence2, label): 1 = positive, 0 = left out and counted; 1.0 from Parquet / pandas too
    p = _csv(tmp_path / "pc.csv", ["premise", "hypothesis", "label"], [["s", "t", 1], ["u", "v", 0], ["w", "x", "1.0"]])
    exs, t = _read(dc.dataset_config(name="pc", path=str(p), format="st", task_type="pair_classification"))
    assert _triples(exs) == [("s", ["t"], []), ("w", ["x"], [])] and t.filtered == 1
    assert t.reasons(invalid=False) == {"negative pair": 1}
    # (sentence1, sentence2, score): a score column needs score_threshold -- one line naming file, line, field
    p = _csv(tmp_path / "sc.csv", ["sentence1", "sentence2", "score"], [["a", "b", 0.9], ["c", "d", 0.2]])
    with pytest.raises(InputError, match=r"sc\.csv:2: field 'score': scored pairs need score_threshold .*"
                                         r"\(fix: set score_threshold in the dataset config"):
        _read(dc.dataset_config(name="sc", path=str(p), format="st", task_type="sts"))
    exs, t = _read(dc.dataset_config(name="sc", path=str(p), format="st", task_type="sts", score_threshold=0.5))
    assert _triples(exs) == [("a", ["b"], [])] and t.filtered == 1
    # the auto format read as scored pairs (sentence1, sentence2, score) needs the threshold too (not every pair
    # silently a positive)
    with pytest.raises(InputError, match=r"sc\.csv:2: the records are scored pairs .* need score_threshold"):
        _read(dc.dataset_config(name="sc", path=str(p), task_type="sts"))
    # each bad row is one record, named by line and field, with the fix
    bad = [
        ([{"anchor": "a", "positive": "p", "label": 2}], "label", r"2 is not a pair label .*3-way NLI labels"),
        ([{"anchor": "a", "positive": "p", "negative": "n", "label": 1}], "label",
         r"a 'label' column with 3 text columns .*extra_fields=\['label'\]"),
        ([{"anchor": "a"}], "anchor", r"1 text column: an \(anchor, positive, negatives\.\.\.\) row needs"),
        ([{"anchor": "a", "positive": None}], "positive", r"expected a string, got null"),
        ([{"anchor": "a", "positive": "p", "label": 1, "score": 0.5}], "score", r"both a 'label' and a 'score'"),
    ]
    for rows, field, match in bad:
        p = _jsonl(tmp_path / "bad.jsonl", [{"anchor": "ok", "positive": "fine"}] + rows)
        with pytest.raises(InputError) as ei:
            _read(dc.dataset_config(name="b", path=str(p), format="st", task_type="nli"))
        assert (ei.value.line, ei.value.field) == (2, field) and ei.value.fix, str(ei.value)
        assert re.search(match, str(ei.value)), str(ei.value)
        exs, t = _read(dc.dataset_config(name="b", path=str(p), format="st", task_type="nli"), "skip")
        assert len(exs) == 1 and t.invalid == 1
    # a CSV row with another number of fields than the header is one skipped record
    p = tmp_path / "ragged.csv"
    p.write_text('anchor,positive\n"a, with comma",p\nonly-one\n"multi\nline",p2\n', encoding="utf-8")
    exs, t = _read(dc.dataset_config(name="r", path=str(p), task_type="nli"), "skip")
    assert _triples(exs) == [("a, with comma", ["p"], []), ("multi\nline", ["p2"], [])]
    assert [(s.line, s.reason) for s in t.skipped] == [(3, "1 fields, the header has 2")]
    assert [e["id"] for e in exs] == ["r:2", "r:4"]  # a quoted multi-line row is named by its first line


def test_triplets_with_renamed_columns_take_one_text(tmp_path):
    """An ST triplet file read as triplets with its columns renamed: a renamed `pos` column takes one text (not
    only a list)."""
    p = _jsonl(tmp_path / "st.jsonl", ST_ROWS[:2])
    cfg = dc.dataset_config(name="t", path=str(p), format="triplets", task_type="nli",
                            columns={"query": "anchor", "pos": "positive", "neg": "negative"})
    exs, _ = _read(cfg)
    assert _triples(exs) == TRIPLES[:2]
    # our own 'pos' / 'neg' keys stay lists: a string there is still the error it was
    p = _jsonl(tmp_path / "own.jsonl", [{"query": "q", "pos": "p"}])
    with pytest.raises(InputError, match=r"own\.jsonl:1: field 'pos': expected a list of strings, got str"):
        _read(dc.dataset_config(name="o", path=str(p), format="triplets", task_type="nli"))


def test_cli_validate_reads_parquet_and_st(tmp_path, capsys):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"anchor": ["a", "b"], "positive": ["p", ""]}), tmp_path / "x.parquet")
    assert _cli(["data", "validate", str(tmp_path / "x.parquet"), "--format", "st"]) == 1
    out = capsys.readouterr().out
    assert f"{tmp_path / 'x.parquet'}:2: field 'positive': empty text" in out
    assert "2 records (st): 1 valid, 1 invalid" in out


# ------------------------------------------------------------------------------- the dict of datasets, losses

def test_dataset_dict_and_per_dataset_loss(tmp_path, minilm_dir):
    p = _jsonl(tmp_path / "t.jsonl", ST_ROWS)
    got = dc.datasets_from_dict({
        "nli": str(p),
        "sts": dict(path=str(p), task_type="sts", temperature=0.02, loss="infonce"),
        "own": dc.dataset_config(path=str(p), task_type="retrieval", num_negatives=0),
    }, task_type="nli", num_negatives=1)
    assert [(d.name, d.task_type, d.num_negatives, d.temperature, d.loss) for d in got] == [
        ("nli", "nli", 1, None, None), ("sts", "sts", 1, 0.02, "infonce"), ("own", "retrieval", 0, None, None)]
    dc.validate_data_config(_data(got), where="data")
    with pytest.raises(UserError, match=r"datasets_from_dict\['x'\]\.name: 'y' differs from its key 'x'"):
        dc.datasets_from_dict({"x": dict(path=str(p), name="y")})
    with pytest.raises(UserError, match=r"datasets_from_dict: default key\(s\) tempreature .*did you mean "
                                        r"temperature"):
        dc.datasets_from_dict({"x": str(p)}, tempreature=0.1)
    with pytest.raises(UserError, match=r"datasets_from_dict\['x'\]: dataset_config: unknown key\(s\) lost"):
        dc.datasets_from_dict({"x": dict(path=str(p), lost="infonce")})
    # a dataset's loss is one of the losses jaxembed has (jaxembed.config.LOSSES), checked before any work
    from jaxembed.config import LOSSES, default_config, validate

    bad = _data([dc.dataset_config(name="a", path=str(p), task_type="nli", loss="focal")])
    with pytest.raises(UserError, match=rf"data\.datasets\[0\]\.loss: 'focal' is not one of {', '.join(LOSSES)}"):
        dc.validate_data_config(bad, where="data")
    c = default_config()
    c.model.name = str(minilm_dir)
    c.loss.type = "peg"
    c.data.datasets = dc.datasets_from_dict({"a": str(p), "b": dict(path=str(p), loss="peg")}, task_type="nli")
    validate(c)
    c.data.datasets[1].loss = "focal"
    with pytest.raises(UserError, match=r"config\.data\.datasets\[1\]\.loss: 'focal' is not one of"):
        validate(c)
    # ... and goes into the store with the dataset, where the trainer reads it
    rep = write_store(_data(list(c.data.datasets[:1]) + [dc.dataset_config(name="b", path=str(p), task_type="nli",
                                                                           loss="peg")]), tmp_path / "store")
    assert rep.written == 12
    assert [d.loss for d in Store.open(tmp_path / "store").datasets] == [None, "peg"]


def test_bad_values_of_the_new_fields_name_their_key(tmp_path):
    p = _jsonl(tmp_path / "t.jsonl", ST_ROWS)
    (tmp_path / "plain_dir").mkdir()
    cases = [
        (dict(subset="triplet"), r"datasets\[0\]\.subset: only used with format hf"),
        (dict(format="hf", path=str(tmp_path / "x"), streaming="yes"), r"streaming: expected True or False"),
        (dict(path=str(tmp_path / "plain_dir")), r"is a folder, neither a data file nor a datasets\.save_to_disk"),
        (dict(path=str(tmp_path / "*.parquet")), r"the pattern .*\*\.parquet matches no file"),
        (dict(format="st", columns={"query": "q"}), r"columns: 'query': format st reads the texts by column order"),
        (dict(format="st", task_type=None), r"task_type: required .*sentence-transformers data has no task type"),
        (dict(format="triplets", score_threshold=1.0), r"only used by scored_pairs and st pairs"),
    ]
    for kw, match in cases:
        cfg = _data([dc.dataset_config(**{**dict(name="a", path=str(p), task_type="nli"), **kw})])
        with pytest.raises(UserError, match=match):
            dc.validate_data_config(cfg, where="data")
    with pytest.raises(UserError, match=r"data\.datasets: a mapping name -> dataset .* datasets_from_dict"):
        dc.validate_data_config({"datasets": {"a": {}}}, where="data")


def test_optional_packages_are_one_line_errors_and_the_core_imports_without_them(tmp_path):
    code = (
        "import sys; sys.modules['datasets'] = None; sys.modules['pyarrow'] = None\n"
        "sys.modules['pyarrow.parquet'] = None\n"
        "import jaxembed.config, jaxembed.data.store, jaxembed.data.cli, jaxembed.evaluate.dev\n"
        "from jaxembed.data.readers import read_files, read_hf\n"
        "from jaxembed.errors import UserError\n"
        "for f in (lambda: read_files(sys.argv[1]), lambda: read_hf(sys.argv[2])):\n"
        "    try:\n"
        "        f()\n"
        "    except UserError as e:\n"
        "        print(e)\n")
    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    (tmp_path / "csv.csv").write_text("anchor,positive\na,p\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "x.parquet"), "some/hub-name"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2
    assert "x.parquet: reading Parquet needs pyarrow: pip install 'jaxembed[hf]'" in lines[0]
    assert "format hf needs the Hugging Face datasets package: pip install 'jaxembed[hf]'" in lines[1]
    exs = list(read_files(str(tmp_path / "csv.csv"), ReadOptions(format="st")))  # CSV needs neither
    assert _triples(exs) == [("a", ["p"], [])]


# ---------------------------------------------------------------------------------------------- bounded memory

def test_hash_index_agrees_with_a_dict():
    import random

    rnd = random.Random(0)
    idx, ref = HashIndex(capacity=4), {}
    for i in range(20_000):
        s = f"id-{rnd.randrange(8000)}"
        got = idx.get_or_put(key_of(s), i)
        assert got == ref.get(s), s
        ref.setdefault(s, i)
    assert len(idx) == len(ref) and idx.nbytes <= 24 * 4 * len(ref)


def test_duplicate_ids_without_a_table_of_ids(tmp_path):
    """Default ids (<dataset>:<line>) cost a byte; explicit ids are hashed; an explicit id written like a default
    one is still a duplicate of that line's default id, whichever comes first (as with a table of every id)."""
    rows = [{"query": "q1", "pos": ["p"]},                     # line 1: default id d:1
            {"id": "d:1", "query": "q2", "pos": ["p"]},        # repeats line 1's default id
            {"id": "d:5", "query": "q3", "pos": ["p"]},        # claims line 5's default id first
            {"id": "a", "query": "q4", "pos": ["p"]},
            {"query": "q5", "pos": ["p"]},                     # line 5: its default id d:5 is taken
            {"id": "a", "query": "q6", "pos": ["p"]}]          # explicit twice
    p = _jsonl(tmp_path / "d.jsonl", rows)
    exs, t = _read(dc.dataset_config(name="d", path=str(p), task_type="retrieval"), "skip")
    assert [e["id"] for e in exs] == ["d:1", "d:5", "a"]
    assert [(s.line, s.reason) for s in t.skipped] == [
        (2, "duplicate id 'd:1' (first at d.jsonl:1)"), (5, "duplicate id 'd:5' (first at d.jsonl:3)"),
        (6, "duplicate id 'a' (first at d.jsonl:4)")]
    # two files: default ids carry the file index (d:0:1, d:1:1)
    q = _jsonl(tmp_path / "e.jsonl", [{"query": "x", "pos": ["p"]}, {"id": "d:0:1", "query": "y", "pos": ["p"]}])
    exs, t = _read(dc.dataset_config(name="d", path=[str(p), str(q)], task_type="retrieval"), "skip")
    assert [e["id"] for e in exs][-2:] == ["a", "d:1:1"]
    assert (t.skipped[-1].line, t.skipped[-1].reason) == (2, "duplicate id 'd:0:1' (first at d.jsonl:1)")


def test_prepare_streams_skips_hashes_and_names_identical_pairs(tmp_path, monkeypatch, capsys):
    """What the store writer keeps per record is bounded (hashes, label indices): skipped records past the
    in-memory limit are spooled and still all reported; identical pairs are named from the store itself."""
    import jaxembed.data.store as store_mod

    monkeypatch.setattr(store_mod, "SKIPPED_IN_MEMORY", 3)
    rows = []
    for i in range(40):
        if i % 4 == 1:
            rows.append('{"text": ""')  # invalid JSON: 10 records
        elif i % 4 == 2:
            rows.append(json.dumps({"id": f"x{i}", "text": "same text", "label": "b"}))  # identical content
        else:
            rows.append(json.dumps({"text": f"t{i}", "label": "a" if i % 3 else "b"}))
    p = tmp_path / "cls.jsonl"
    p.write_text("\n".join(rows) + "\n", encoding="utf-8")
    cfg = _data([dc.dataset_config(name="c", path=str(p), format="classification", task_type="classification")])
    cfg.on_error = "skip"
    rep = write_store(cfg, tmp_path / "store", progress=True)
    err = capsys.readouterr().err
    assert "prepare c" in err and "40" in err and "records" in err  # the progress bar
    t = rep.tally("c")
    assert (t.read, t.written, t.invalid) == (40, 30, 10)
    assert len(t._mem) == 3 and not t._ids  # 3 skipped records in memory, the rest spooled; no ids kept
    assert [s.line for s in t.iter_skipped()] == [i + 1 for i in range(40) if i % 4 == 1]
    report = json.loads((tmp_path / "store" / "report.json").read_text())
    assert [s["line"] for s in report["datasets"][0]["skipped"]] == [i + 1 for i in range(40) if i % 4 == 1]
    assert report["datasets"][0]["invalid"] == 10 and report["invalid"] == 10
    txt = (tmp_path / "store" / "report.txt").read_text()
    assert txt.count(": invalid JSON (") == 10  # every skipped record, one line each
    assert t.identical == 9 and t.identical_examples[:2] == [("x6", "x2"), ("x10", "x2")]
    st = Store.open(tmp_path / "store")
    labels = st.labels("c")
    assert len(labels) == 30 and labels == [st.example("c", i)["label"] for i in range(30)]
    assert st.label_names("c") == ["a", "b"]
    assert not [x for x in (tmp_path / "store").iterdir() if x.name.startswith(".")]  # no spool file left

