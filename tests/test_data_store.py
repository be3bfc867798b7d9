"""The dataset store: round trip, random access (also through Grain), the on_error policy and its report, atomic
writes, clear errors for folders that are not stores, the BGE fixtures and the whole shared train data."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from jaxembed.data import config as dc
from data_fakes import run_data_cli as _cli
from jaxembed.data.prepare_report import PrepareReport
from jaxembed.data.store import STORE_VERSION, DatasetInfo, Store, write_store
from jaxembed.errors import InputError, UserError


def _write(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


TRIPLETS = [{"query": f"q{i}", "pos": [f"p{i}"], "neg": [f"n{i}a", f"n{i}b"][: i % 3]} for i in range(7)]
PAIRS = [{"sentence1": "a", "sentence2": "b", "score": 4.5}, {"sentence1": "c", "sentence2": "d", "score": 1.0},
         {"sentence1": "e", "sentence2": "f", "score": 5.0}]
CLS = [{"text": "good", "label": "pos"}, {"text": "bad", "label": "neg"}, {"text": "fine", "label": "pos"}]


def _config(tmp_path, on_error="stop", triplets=TRIPLETS):
    t = _write(tmp_path / "t.jsonl", triplets)
    s = _write(tmp_path / "s.jsonl", PAIRS)
    c = _write(tmp_path / "c.jsonl", CLS)
    cfg = dc.default_data_config()
    cfg.on_error = on_error
    cfg.datasets = [
        dc.dataset_config(name="tri", path=str(t), task_type="retrieval", num_negatives=2, temperature=0.02,
                          max_query_length=32, max_doc_length=128, weight=2.0),
        dc.dataset_config(name="sts", path=str(s), format="scored_pairs", task_type="sts", score_threshold=4.0,
                          num_negatives=0, epochs=0.5),
        dc.dataset_config(name="cls", path=str(c), format="classification", task_type="classification",
                          task="sentiment", label_descriptions={"neg": "Negative.", "pos": "Positive."},
                          query_instruction="Instruct: Classify sentiment \n Query: "),
    ]
    return cfg


def test_round_trip_and_dataset_info(tmp_path):
    rep = write_store(_config(tmp_path), tmp_path / "store")
    assert isinstance(rep, PrepareReport) and rep.read == 13 and rep.written == 12 and rep.filtered == 1
    st = Store.open(tmp_path / "store")
    assert [d.name for d in st.datasets] == ["tri", "sts", "cls"] and st.size("tri") == 7 and st.size(1) == 2
    for i, row in enumerate(TRIPLETS):
        assert st.example("tri", i) == {"id": f"tri:{i + 1}", "query": row["query"], "pos": row["pos"],
                                        "neg": row["neg"]}
    assert st.examples(0, [5, 0, 5]) == [st.example(0, 5), st.example(0, 0), st.example(0, 5)]
    assert st.examples("sts", [0, 1]) == [{"id": "sts:1", "query": "a", "pos": ["b"], "neg": []},
                                          {"id": "sts:3", "query": "e", "pos": ["f"], "neg": []}]
    assert st.example("cls", 1) == {"id": "cls:2", "query": "bad", "pos": ["Negative."], "neg": ["Positive."],
                                    "label": "neg"}
    assert st.labels("cls") == ["pos", "neg", "pos"] and st.labels("tri") is None
    assert st.label_names("cls") == ["neg", "pos"]
    assert st.dataset("tri") == DatasetInfo(
        name="tri", task="tri", task_type="retrieval", size=7,
        query_instruction=dc.DEFAULT_QUERY_INSTRUCTIONS["retrieval"], doc_instruction="", temperature=0.02,
        batching="homogeneous", num_negatives=2, weight=2.0, epochs=None, max_query_length=32, max_doc_length=128,
        source=(str((tmp_path / "t.jsonl").resolve()),))
    sts, cls = st.dataset("sts"), st.dataset(2)
    assert sts.query_instruction == "" and sts.epochs == 0.5 and sts.batching == "homogeneous"
    assert cls.task == "sentiment" and cls.batching == "heterogeneous"
    assert cls.query_instruction == "Instruct: Classify sentiment \n Query: "
    m = json.loads((tmp_path / "store" / "manifest.json").read_text())
    assert m["version"] == STORE_VERSION and m["datasets"][0]["counts"]["neg_max"] == 2
    assert m["config"]["datasets"][1]["score_threshold"] == 4.0 and m["created"]
    with pytest.raises(IndexError):
        st.example("tri", 7)
    with pytest.raises(IndexError):
        st.examples("tri", [-1])
    with pytest.raises(UserError, match=r"no dataset 'nope' \(datasets: tri, sts, cls\)"):
        st.dataset("nope")
    st2 = pickle.loads(pickle.dumps(st))  # Grain workers get a copy
    assert st2.example("cls", 2) == st.example("cls", 2)
    st.close()


def test_grain_reads_the_store_at_random(tmp_path):
    grain = pytest.importorskip("grain")
    write_store(_config(tmp_path), tmp_path / "store")
    st = Store.open(tmp_path / "store")
    src = grain.sources.ArrayRecordDataSource([str(st.record_path("tri"))])
    assert len(src) == 7
    assert [Store.decode(src[i]) for i in (6, 2, 4)] == st.examples("tri", [6, 2, 4])


def test_stop_policy_writes_nothing(tmp_path):
    bad = TRIPLETS[:3] + ['{"query": "q", "pos": ["p"], "neg": "n"}'] + TRIPLETS[3:]
    with pytest.raises(InputError, match=r"t\.jsonl:4: field 'neg': expected a list of strings, got str "
                                         r"\(fix: "):
        write_store(_config(tmp_path, triplets=bad), tmp_path / "store")
    assert not (tmp_path / "store").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".store")]  # no temporary folder left


def test_skip_policy_report_lists_every_skipped_record(tmp_path):
    bad = TRIPLETS[:3] + ['{"query": "q", "pos": ["p"], "neg": "n"}', "{broken"] + TRIPLETS[3:] + \
        [{"query": " ", "pos": ["p"]}]
    rep = write_store(_config(tmp_path, on_error="skip", triplets=bad), tmp_path / "store")
    t = rep.tally("tri")
    assert (t.read, t.written, t.invalid, t.filtered) == (10, 7, 3, 0)
    assert [(s.line, s.field) for s in t.skipped] == [(4, "neg"), (5, None), (10, "query")]
    st = Store.open(tmp_path / "store")
    assert st.size("tri") == 7 and st.example("tri", 3)["id"] == "tri:6"  # ids keep the input line
    report = json.loads((tmp_path / "store" / "report.json").read_text())
    d = {x["name"]: x for x in report["datasets"]}
    assert d["tri"]["invalid"] == 3 and [x["line"] for x in d["tri"]["skipped"]] == [4, 5, 10]
    assert d["sts"]["filtered"] == 1 and d["sts"]["skipped"][0]["reason"] == "score below threshold 4"
    txt = (tmp_path / "store" / "report.txt").read_text()
    t_path = tmp_path / "t.jsonl"
    assert f"{t_path}:4: field 'neg': expected a list of strings, got str" in txt
    assert f"{t_path}:5: invalid JSON" in txt and f"{t_path}:10: field 'query': empty text" in txt
    assert f"{tmp_path / 's.jsonl'}:2: skipped: field 'score': score below threshold 4 (score 1)" in txt


def test_replace_and_refuse_out_dirs(tmp_path):
    cfg = _config(tmp_path)
    write_store(cfg, tmp_path / "store")
    cfg.datasets = cfg.datasets[:1]
    write_store(cfg, tmp_path / "store")  # an existing store is replaced
    assert [d.name for d in Store.open(tmp_path / "store").datasets] == ["tri"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="exists and is not a dataset store"):
        write_store(cfg, other)
    assert (other / "notes.txt").read_text() == "mine"


def test_prepare_replaces_only_its_own_unchanged_store(tmp_path, capsys):
    """The export's replace rule (jaxembed_export.json lists what was written): a file the user added to a store,
    or a store file changed since, is refused in one line naming it, before any work, and nothing is deleted; a
    model folder is not taken for a store, nor a store for an export folder."""
    from jaxembed.runs import atomic_files

    t = _write(tmp_path / "t.jsonl", TRIPLETS)
    cfg = tmp_path / "cfg.py"
    cfg.write_text(CONFIG_PY.format(path=str(t)))
    store = tmp_path / "s"
    argv = ["data", "prepare", "--config", str(cfg), "--out", str(store), "-q"]
    assert _cli(argv) == 0 and _cli(argv) == 0  # an unchanged store of its own is replaced
    (store / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert _cli(argv) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(f"error: --out {store}: holds files jaxembed did not write "
                                               "(notes.txt); a store replaces only a store"), out
    assert "(fix: choose a new or empty folder, or move those files elsewhere first)" in out[0]
    assert (store / "notes.txt").read_text() == "mine" and Store.open(store).size("tri") == 7
    (store / "notes.txt").unlink()
    with open(store / "report.txt", "a") as f:
        f.write("my note\n")
    with pytest.raises(UserError, match=r"holds files changed since jaxembed wrote them \(report.txt\)"):
        write_store(_config(tmp_path), store)
    assert (store / "report.txt").read_text().endswith("my note\n")
    with atomic_files.atomic_dir(tmp_path / "model") as d:  # an export's folder
        (d / "config.json").write_text("{}")
    with pytest.raises(UserError, match=r"exists and is not a dataset store \(jaxembed wrote a model folder"):
        write_store(_config(tmp_path), tmp_path / "model")
    (store / "report.txt").write_text((store / "report.txt").read_text()[:-len("my note\n")])
    assert atomic_files.replace_refusal(store, "store") is None
    assert atomic_files.replace_refusal(store) == ("exists and is not a model folder (jaxembed wrote a dataset "
                                                   "store there)")


def test_empty_dataset_is_an_error(tmp_path):
    cfg = _config(tmp_path)
    cfg.datasets[1].score_threshold = 9.0
    with pytest.raises(UserError, match=r"^\S*s\.jsonl: no examples left of 3 records read \(score below threshold "
                                        r"9: 3\) for data\.datasets\[1\] \(sts\) \(fix: "):
        write_store(cfg, tmp_path / "store")  # names the file first, then the config entry


def test_open_errors(tmp_path):
    with pytest.raises(UserError, match="no such dataset store"):
        Store.open(tmp_path / "none")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"not a dataset store \(no manifest\.json\)"):
        Store.open(tmp_path / "empty")
    write_store(_config(tmp_path), tmp_path / "store")
    mf = tmp_path / "store" / "manifest.json"
    m = json.loads(mf.read_text())
    mf.write_text(json.dumps(dict(m, version=STORE_VERSION + 1)))
    with pytest.raises(UserError, match=rf"store version {STORE_VERSION + 1}, this jaxembed reads version "
                                        rf"{STORE_VERSION} \(fix: run jaxembed data prepare again\)"):
        Store.open(tmp_path / "store")
    mf.write_text(json.dumps(m))
    (tmp_path / "store" / "sts.array_record").unlink()
    with pytest.raises(UserError, match=r"dataset 'sts': sts\.array_record is missing"):
        Store.open(tmp_path / "store")
    mf.write_text("{half")
    with pytest.raises(UserError, match="unreadable manifest"):
        Store.open(tmp_path / "store")


def test_bge_fixtures_store(shared_data, tmp_path):
    fx = shared_data / "fixtures" / "flagembedding"
    cfg = dc.default_data_config()
    cfg.datasets = [
        dc.dataset_config(name="msmarco", path=str(fx / "retrieval" / "msmarco.jsonl"), num_negatives=7),
        dc.dataset_config(name="sts", path=str(fx / "sts" / "sts.jsonl")),
        dc.dataset_config(name="banking", path=str(fx / "classification-no_in_batch_neg" /
                                                   "Banking77Classification.jsonl")),
        dc.dataset_config(name="arxiv", path=str(fx / "clustering-no_in_batch_neg" / "arXiv_title.jsonl")),
        dc.dataset_config(name="nli", path=str(fx / "retrieval" / "nli.jsonl"), task_type="nli",
                          query_instruction=""),
    ]
    write_store(cfg, tmp_path / "bge")
    st = Store.open(tmp_path / "bge")
    ms, sts, bank, arx, nli = st.datasets
    assert ms.task_type == "retrieval" and ms.query_instruction == \
        "Instruct: Given a web search query, retrieve relevant passages that answer the query. \n Query: "
    assert ms.doc_instruction == "" and ms.size == 10
    assert sts.task_type == "sts" and sts.doc_instruction == sts.query_instruction != ""  # same on both sides
    assert bank.task_type == "classification" and bank.batching == "heterogeneous"
    assert st.labels("banking")[0] == "When will my card arrive?"  # the positive label description
    assert arx.task_type == "clustering" and st.labels("arxiv")[1] == "astro-ph gr-qc"
    assert nli.task_type == "nli" and nli.query_instruction == ""
    row = json.loads((fx / "retrieval" / "msmarco.jsonl").read_text().splitlines()[3])
    # FlagEmbedding's teacher scores are kept (for distillation, jaxembed.losses.distill)
    assert st.example("msmarco", 3) == {"id": "msmarco:4", "query": row["query"], "pos": row["pos"],
                                        "neg": row["neg"], "pos_scores": row["pos_scores"],
                                        "neg_scores": row["neg_scores"]}
    assert st.manifest["datasets"][0]["counts"]["teacher_scores"] == 10


def test_hf_dataset_store(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"sentence1": ["a", "c", "e"], "sentence2": ["b", "d", "f"],
                                     "similarity": [5.0, 2.0, 4.2]})
    ds.save_to_disk(str(tmp_path / "hf"))
    cfg = dc.default_data_config()
    cfg.datasets = [dc.dataset_config(name="hfsts", path=str(tmp_path / "hf"), format="hf",
                                      record_format="scored_pairs", task_type="sts", score_threshold=4.0,
                                      columns={"score": "similarity"}, num_negatives=0)]
    rep = write_store(cfg, tmp_path / "store")
    assert rep.tally("hfsts").written == 2 and rep.tally("hfsts").filtered == 1
    st = Store.open(tmp_path / "store")
    assert st.examples("hfsts", [0, 1]) == [{"id": "hfsts:1", "query": "a", "pos": ["b"], "neg": []},
                                            {"id": "hfsts:3", "query": "e", "pos": ["f"], "neg": []}]


# ------------------------------------------------------------------------------------------------- data prepare



CONFIG_PY = '''
import ml_collections
from jaxembed.data.config import default_data_config, dataset_config

def get_config(arg=None):
    c = ml_collections.ConfigDict()
    c.data = default_data_config()
    c.data.datasets = [dataset_config(name="tri", path={path!r}, task_type="retrieval")]
    if arg == "typo":
        c.data.datasets[0].task_type = "retreival"
    return c
'''


def test_cli_prepare_config_file(tmp_path, capsys):
    t = _write(tmp_path / "t.jsonl", TRIPLETS + ["{bad"])
    cfg = tmp_path / "cfg.py"
    cfg.write_text(CONFIG_PY.format(path=str(t)))
    assert _cli(["data", "prepare", "--config", str(cfg), "--out", str(tmp_path / "s")]) == 2
    assert f"{t}:8: invalid JSON" in capsys.readouterr().out
    assert _cli(["data", "prepare", "--config", str(cfg), "--out", str(tmp_path / "s"), "--on-error", "skip"]) == 0
    out = capsys.readouterr().out
    assert "wrote" in out and "7 examples of 8 records (1 invalid skipped" in out
    assert Store.open(tmp_path / "s").size("tri") == 7
    assert _cli(["data", "prepare", "--config", f"{cfg}:typo", "--out", str(tmp_path / "s2")]) == 2
    assert f"{cfg}:typo: data.datasets[0].task_type: 'retreival' is not one of" in capsys.readouterr().out
    assert _cli(["data", "prepare", "--config", str(tmp_path / "no.py"), "--out", str(tmp_path / "s3")]) == 2
    assert "no such file" in capsys.readouterr().out


def test_cli_prepare_takes_a_run_config(tmp_path, capsys):
    """A training run's config (data section + the run-level data.store key) prepares its data section."""
    t = _write(tmp_path / "t.jsonl", TRIPLETS)
    cfg = tmp_path / "run.py"
    cfg.write_text(
        CONFIG_PY.format(path=str(t)).replace("def get_config(", "def _data_config(")
        + "\n\ndef get_config(arg=None):\n"
          "    from jaxembed.config import default_config\n"
          "    c = default_config()\n"
          "    c.data = _data_config(arg)['data']\n"
          "    c.data.store = ''\n"
          "    return c\n")
    assert _cli(["data", "prepare", "--config", str(cfg), "--out", str(tmp_path / "s")]) == 0, capsys.readouterr()
    assert Store.open(tmp_path / "s").size("tri") == 7


# the shared train data: records read / written / left out per dataset with the shared config
SHARED_COUNTS = {
    "snli": (2954, 2954, 0), "sick_nli": (81, 81, 0), "sick_sts": (3563, 1330, 2233), "stsb": (754, 199, 555),
    "mrpc": (2791, 2014, 777), "wikiqa": (857, 857, 0), "trecqa": (78, 78, 0), "trec": (5452, 5452, 0),
    "sst2": (67349, 67349, 0), "sst5": (8544, 8544, 0), "mr": (10662, 10662, 0), "cr": (3771, 3771, 0),
    "mpqa": (10603, 10603, 0), "subj": (10000, 10000, 0),
}


def test_prepare_all_shared_train_data(shared_data, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("JAXEMBED_DATA", str(shared_data))
    assert _cli(["data", "prepare", "--config", "shared", "--out", str(tmp_path / "shared")]) == 0
    assert "123894 examples of 127459 records" in capsys.readouterr().out
    st = Store.open(tmp_path / "shared")
    report = json.loads((tmp_path / "shared" / "report.json").read_text())
    got = {d["name"]: (d["read"], d["written"], d["filtered"]) for d in report["datasets"]}
    assert got == SHARED_COUNTS and all(d["invalid"] == 0 for d in report["datasets"])
    assert {d.name: d.size for d in st.datasets} == {k: v[1] for k, v in SHARED_COUNTS.items()}
    assert len({d.task_type for d in st.datasets}) == 6
    # spot checks against the input files
    first = json.loads((shared_data / "train" / "wikiqa.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert st.example("wikiqa", 0) == {"id": "wikiqa:1", "query": first["query"], "pos": first["pos"],
                                       "neg": first["neg"]}
    trec = st.example("trec", 0)
    assert trec["label"] == "description" and len(trec["neg"]) == 5 and trec["pos"][0] not in trec["neg"]
    assert st.labels("sst2").count("positive") == 37569
    assert all(e["pos"] and e["query"] for e in st.examples("stsb", range(0, 199, 7)))
    txt = (tmp_path / "shared" / "report.txt").read_text()
    assert txt.count("skipped: field 'label': negative pair") == 777
    assert txt.count("skipped: field 'score': score below threshold 4") == 2233 + 555
