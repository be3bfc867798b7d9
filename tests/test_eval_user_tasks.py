"""A user's own dev sets in eval.tasks (an IR folder in the BEIR layout, STS / pair / reranking / classification /
clustering files in JSON Lines, Parquet or CSV, named MTEB tasks available offline): scored exactly like the
registry's tasks on the same rows, every bad spec or file a one-line error before any work, MTEB entries through
mteb.evaluate, and best_metric checked against them."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("MTEB_CACHE", str(Path(tempfile.gettempdir()) / "jaxembed-test-mteb-cache"))

from jaxembed.errors import InputError, UserError  # noqa: E402
from jaxembed.evaluate.dev import DevEvaluator, parse_eval_tasks, validate_eval  # noqa: E402


class WordsEncoder:
    """Deterministic fake encoder with signal: normalised sum of fixed random vectors of the words (crc32 seeds)."""

    prompts: dict = {}
    model = None

    def __init__(self, dim=32):
        self.dim, self.vectors = dim, {}

    def encode(self, texts, *, prompt=None, batch_size=32, progress=None):
        out = np.zeros((len(texts), self.dim))
        for i, t in enumerate(texts):
            for w in re.findall(r"\w+", f"{prompt or ''} {t}".lower()):
                if w not in self.vectors:
                    self.vectors[w] = np.random.default_rng(zlib.crc32(w.encode())).normal(size=self.dim)
                out[i] += self.vectors[w]
        out[:, 0] += 1e-3
        return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


def _rows(path):
    return [json.loads(x) for x in Path(path).read_text(encoding="utf-8").splitlines()]


def _write_jsonl(path, rows):
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def user_sets(shared_data, tmp_path_factory):
    """The shared dev rows in other layouts and formats, as a user would bring them."""
    import csv

    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    d = tmp_path_factory.mktemp("user_sets")
    sts = _rows(shared_data / "dev/stsb_dev.jsonl")
    with open(d / "sts.csv", "w", newline="", encoding="utf-8") as f:  # renamed columns, CSV quoting
        w = csv.writer(f)
        w.writerow(["s1", "s2", "similarity"])
        w.writerows([r["sentence1"], r["sentence2"], r["score"]] for r in sts)
    mrpc = _rows(shared_data / "dev/mrpc_val.jsonl")
    pq.write_table(pa.table({k: [r[k] for r in mrpc] for k in ("sentence1", "sentence2", "label")}),
                   d / "pairs.parquet")
    wiki = _rows(shared_data / "dev/wikiqa_dev.jsonl")
    _write_jsonl(d / "rerank.jsonl", [{"question": r["query"], "pos": r["pos"], "neg": r["neg"]} for r in wiki])
    sst = _rows(shared_data / "dev/sst2_dev.jsonl")
    with open(d / "sst2_dev.tsv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter="\t")
        w.writerow(["text", "label"])
        w.writerows([r["text"], r["label"]] for r in sst)
    _write_jsonl(d / "sst2_train.jsonl", _rows(shared_data / "train/sst2_cls.jsonl")[:600])
    # an IR folder in the BEIR layout: the Cranfield files with integer ids and two qrels splits
    beir = d / "beir"
    (beir / "qrels").mkdir(parents=True)
    src = shared_data / "eval/cranfield"
    shutil.copy(src / "corpus.jsonl", beir / "corpus.jsonl")
    _write_jsonl(beir / "queries.jsonl", [dict(r, _id=int(r["_id"])) for r in _rows(src / "queries.jsonl")])
    shutil.copy(src / "qrels/test.tsv", beir / "qrels/dev.tsv")
    shutil.copy(src / "qrels/test.tsv", beir / "qrels/test.tsv")
    _write_jsonl(d / "clusters.jsonl", [{"text": f"{w} {w} {i}", "label": w} for i, w in
                                        enumerate(["apple", "stone", "river"] * 10)])
    return d


def test_user_sets_score_like_the_registered_tasks(user_sets, shared_data):
    d = user_sets
    tasks = ("STSBenchmark-dev", "MRPC-dev", "WikiQA-dev", "Cranfield",
             dict(name="my-sts", type="sts", path=str(d / "sts.csv"),
                  columns={"sentence1": "s1", "sentence2": "s2", "score": "similarity"}),
             dict(name="my-pairs", type="PairClassification", path=str(d / "pairs.parquet")),
             dict(name="my-rerank", type="reranking", path=str(d / "rerank.jsonl"), columns={"query": "question"}),
             dict(name="my-sst2", type="classification", path=str(d / "sst2_dev.tsv"),
                  train=str(d / "sst2_train.jsonl")),
             dict(name="my-ir", type="retrieval", path=str(d / "beir"), split="dev"),
             dict(name="my-clusters", type="clustering", path=str(d / "clusters.jsonl")))
    dev = DevEvaluator(tasks, max_examples=40)
    res = dev(WordsEncoder())
    # SST2-dev with the user's (smaller) training file: the registry's task on the same files
    import dataclasses

    from jaxembed.evaluate import TASKS, EvalEncoder
    from jaxembed.evaluate.runner import evaluate_task

    sst2 = dataclasses.replace(TASKS["SST2-dev"], files={"train": str(d / "sst2_train.jsonl"),
                                                         "test": str(shared_data / "dev/sst2_dev.jsonl")})
    res["SST2-dev"] = evaluate_task(EvalEncoder(WordsEncoder()), sst2, max_examples=40)
    pairs = {"my-sts": "STSBenchmark-dev", "my-pairs": "MRPC-dev", "my-rerank": "WikiQA-dev", "my-sst2": "SST2-dev",
             "my-ir": "Cranfield"}
    for mine, theirs in pairs.items():  # the same rows, the same seeded sample, the same protocol: the same score
        assert res[mine] == res[theirs], mine
        assert 0 < res[mine]["main_score"] <= 100
    assert res["my-sts"]["main_score"] == res["my-sts"]["cosine_spearman"]
    assert res["my-ir"]["main_score"] == res["my-ir"]["ndcg_at_10"]
    assert res["my-clusters"]["main_score"] > 90  # three word-separated groups
    # a user set's instruction is its prompt, used as it is (registered tasks keep the model's prompts)
    seen = []

    class Recording(WordsEncoder):
        def encode(self, texts, *, prompt=None, **kw):
            seen.append(prompt)
            return super().encode(texts, prompt=prompt, **kw)

    DevEvaluator([dict(name="ins", type="sts", path=str(d / "sts.csv"), query_instruction="Same meaning: ",
                       columns={"sentence1": "s1", "sentence2": "s2", "score": "similarity"})],
                 max_examples=5)(Recording())
    assert seen == ["Same meaning: "]


def test_bad_eval_tasks_are_one_line_errors(user_sets, tmp_path):
    d = user_sets
    two = tmp_path / "two_qrels"
    shutil.copytree(d / "beir", two)
    no_q = tmp_path / "no_queries"
    shutil.copytree(d / "beir", no_q)
    (no_q / "queries.jsonl").unlink()
    bad_header = tmp_path / "bad_header"
    shutil.copytree(d / "beir", bad_header)
    shutil.rmtree(bad_header / "qrels")
    (bad_header / "qrels").mkdir()
    (bad_header / "qrels/dev.tsv").write_text("q\td\t1\n")
    sts = str(d / "sts.csv")
    cases = [
        ("STSBenchmark-dv", r"tasks\[0\]: unknown task 'STSBenchmark-dv'; did you mean STSBenchmark-dev"),
        (dict(name="x", type="sts", path=sts, colums={}), r"tasks\[0\]\.colums: unknown key \(did you mean "
                                                          r"'columns'\?\)"),
        (dict(name="x", type="similarity", path=sts), r"tasks\[0\]\.type: 'similarity' is not a task type"),
        (dict(name="x", type="sts", path=str(tmp_path / "nope.csv")), r"tasks\[0\]\.path: .*nope\.csv does not "
                                                                      r"exist \(fix: a file of sentence1"),
        (dict(name="x", type="sts", path=sts), r"sts\.csv:2: field 'sentence1': missing \(keys present: s1, s2, "
                                               r"similarity\) \(fix: add the field, or map it with columns"),
        (dict(name="x", type="sts", path=sts, columns={"text": "s1"}), r"columns: 'text' is not a field of STS rows"),
        (dict(name="STSBenchmark-dev", type="sts", path=sts), r"name: 'STSBenchmark-dev' is a registered task"),
        (dict(name="a/b", type="sts", path=sts), r"name: 'a/b' is not a task name"),
        (dict(name="c", type="classification", path=str(d / "sst2_dev.tsv")), r"tasks\[0\]\.train: required"),
        (dict(name="r", type="retrieval", path=str(two)), r"tasks\[0\]\.split: required: .*holds dev\.tsv, "
                                                          r"test\.tsv \(fix: split='dev'"),
        (dict(name="r", type="retrieval", path=str(d / "beir"), split="train"), r"qrels/train\.tsv does not exist"),
        (dict(name="r", type="retrieval", path=str(no_q)), r"has no queries\.jsonl \(fix: the BEIR layout"),
        (dict(name="r", type="retrieval", path=str(bad_header)), r"dev\.tsv:1: expected the header query-id"),
        (dict(name="x", type="sts", path=sts, main_score="accuracy"), r"main_score: 'accuracy' is not a STS metric"),
        (dict(name="x", type="sts", path=sts, split="dev"), r"split: only used by retrieval tasks"),
    ]
    for entry, match in cases:
        with pytest.raises(UserError, match=match):
            parse_eval_tasks((entry,))
    ok = dict(name="x", type="sts", path=sts, columns={"sentence1": "s1", "sentence2": "s2", "score": "similarity"})
    with pytest.raises(UserError, match=r"tasks\[1\]: 'x' appears twice \(also config\.eval\.tasks\[0\]\)"):
        parse_eval_tasks((ok, dict(ok)))
    cfg = {"tasks": (ok, "STSBenchmark-dev"), "best_metric": "x/cosine_spearmann"}
    with pytest.raises(UserError, match=r"best_metric = 'x/cosine_spearmann': STS tasks report main_score, "
                                        r"cosine_spearman, cosine_pearson \(did you mean cosine_spearman\?\)"):
        validate_eval(cfg)
    with pytest.raises(UserError, match=r"best_metric = 'y/main_score': 'y' is not in eval\.tasks .*tasks: x, "
                                        r"STSBenchmark-dev"):
        validate_eval(dict(cfg, best_metric="y/main_score"))
    validate_eval(dict(cfg, best_metric="x/cosine_pearson"))
    # a bad row deep in a file is found when the evaluator is made -- before training -- not at the first evaluation
    rows = _rows(user_sets / "rerank.jsonl")[:6]
    rows[4]["neg"] = "one negative, not a list"
    _write_jsonl(tmp_path / "rr.jsonl", rows)
    spec = dict(name="rr", type="reranking", path=str(tmp_path / "rr.jsonl"), columns={"query": "question"})
    parse_eval_tasks((spec,))  # the first row is fine
    with pytest.raises(InputError, match=r"rr\.jsonl:5: field 'neg': expected a list of strings, got str"):
        DevEvaluator((spec,))


@pytest.mark.slow
def test_mteb_entries_run_through_mteb_and_must_be_available_offline(shared_data, monkeypatch):
    pytest.importorskip("mteb")
    import datasets
    import huggingface_hub

    with pytest.raises(UserError, match=r"tasks\[0\]: 'mteb:Bankng77Classification': no such MTEB task \(did you "
                                        r"mean mteb:Banking77Classification\?"):
        parse_eval_tasks(("mteb:Bankng77Classification",))
    # a real MTEB task whose data is not in the local cache: one line at evaluator time (before training)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(UserError, match=r"tasks: mteb:Banking77Classification: its dataset mteb/banking77 cannot be "
                                        r"loaded .*\(fix: download it once"):
        DevEvaluator(("mteb:Banking77Classification",))
    # an MTEB task whose data is available offline is scored by mteb.evaluate, keyed by the entry as written, equal
    # to the local evaluator on the same rows: test_eval_cli_takes_the_trainers_entries (through the DevEvaluator)
    validate_eval({"tasks": ("mteb:STSBenchmark",), "best_metric": "mteb:STSBenchmark/main_score"})


def test_eval_cli_takes_the_trainers_entries(user_sets, tmp_path, capsys, monkeypatch):
    """`jaxembed eval` takes what eval.tasks takes: registered names, a user's own sets (--task KEY=VALUE or a JSON
    object; a .json file of --tasks holding a list like eval.tasks: a BEIR folder, STS / pair / classification
    files) and mteb:NAME (through mteb.evaluate). A user set scores like the registered task on the same rows (the
    trainer's DevEvaluator does too: test_user_sets_score_like_the_registered_tasks), its instruction is its prompt.
    A bad entry is one line before the model loads (here: a model that does not exist)."""
    mteb = pytest.importorskip("mteb")
    from jaxembed.cli import main
    from jaxembed.evaluate.mteb_adapter import mteb_task
    from jaxembed.models.tiny import tiny_model_dir

    d, model = user_sets, tiny_model_dir("bert")
    beir = tmp_path / "beir"  # a small BEIR folder: 20 queries, their relevant documents and 100 others
    (beir / "qrels").mkdir(parents=True)
    qrels = (d / "beir/qrels/dev.tsv").read_text().splitlines()
    queries = _rows(d / "beir/queries.jsonl")[:20]
    keep_q = {str(q["_id"]) for q in queries}
    qrels = [qrels[0]] + [x for x in qrels[1:] if x.split("\t")[0] in keep_q]
    docs = {x.split("\t")[1] for x in qrels[1:]}
    corpus = [r for i, r in enumerate(_rows(d / "beir/corpus.jsonl")) if str(r["_id"]) in docs or i < 100]
    _write_jsonl(beir / "queries.jsonl", queries)
    _write_jsonl(beir / "corpus.jsonl", corpus)
    (beir / "qrels/dev.tsv").write_text("\n".join(qrels) + "\n")
    cols = {"sentence1": "s1", "sentence2": "s2", "score": "similarity"}
    sts = dict(name="my-sts", type="sts", path=str(d / "sts.csv"), columns=cols)
    listed = [sts, dict(sts, name="my-sts-i", query_instruction="Same meaning: "),
              dict(name="my-ir", type="retrieval", path=str(beir))]
    (tmp_path / "tasks.json").write_text(json.dumps(listed))
    sst2 = dict(name="my-sst2", type="classification", path=str(d / "sst2_dev.tsv"), train=str(d / "sst2_train.jsonl"))
    local = mteb_task("STSBenchmark-dev", max_examples=40)  # an MTEB task available offline: the local rows
    real_get = mteb.get_task
    monkeypatch.setattr(mteb, "get_task", lambda name, *a, **k: local if name == "STSBenchmark" else
                        real_get(name, *a, **k))
    out = tmp_path / "res.json"
    assert main(["eval", "--model", str(model), "--tasks",
                 f"MRPC-dev,STSBenchmark-dev,mteb:STSBenchmark,{tmp_path / 'tasks.json'}",
                 "--task", f"name=my-pairs,type=pair_classification,path={d / 'pairs.parquet'}",
                 "--task", json.dumps(sst2), "--max-examples", "40", "--out", str(out), "-q"]) == 0
    got = json.loads(out.read_text())
    assert set(got) == {"MRPC-dev", "STSBenchmark-dev", "mteb:STSBenchmark", "my-sts", "my-sts-i", "my-ir",
                        "my-pairs", "my-sst2"}
    assert got["my-pairs"] == got["MRPC-dev"] and got["my-sts"] == got["STSBenchmark-dev"]  # the same rows
    assert got["mteb:STSBenchmark"]["main_score"] == pytest.approx(got["STSBenchmark-dev"]["main_score"], abs=1e-6)
    assert got["my-sts-i"] != got["my-sts"]  # its instruction was its prompt
    assert all(0 < got[t]["main_score"] <= 100 for t in ("my-ir", "my-sst2")), got
    assert got["my-ir"]["main_score"] == got["my-ir"]["ndcg_at_10"]
    assert "my-ir" in capsys.readouterr().out
    bad = [(["--task", "name=x,type=sts,path=" + str(tmp_path / "nope.csv")], r"--task\[0\]\.path: .*nope\.csv "
                                                                                r"does not exist"),
           (["--task", "name=x,type=sts"], r"--task\[0\]\.path: required"),
           (["--task", "name=x,type"], r"--task\[0\]: 'type' is not KEY=VALUE"),
           (["--tasks", str(tmp_path / "missing.json")], r"--tasks .*missing\.json: no such file"),
           (["--tasks", f"{tmp_path / 'tasks.json'}", "--task", json.dumps(sts)],
            r"--task: task 'my-sts' is also in --tasks .*tasks\.json"),
           (["--tasks", "STSBenchmark-dv"], r"--tasks\[0\]: unknown task 'STSBenchmark-dv'")]
    for args, match in bad:
        assert main(["eval", "--model", str(tmp_path / "no-model"), *args, "-q"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and re.search(match, err), err


def test_eval_cli_no_packing_pads_and_scores_the_same(tmp_path, monkeypatch, shared_data):
    """`jaxembed eval --no-packing` (local evaluators and --mteb) encodes padded rows, one text per row, and scores
    what the packed default scores."""
    mteb = pytest.importorskip("mteb")
    from jaxembed.cli import main
    from jaxembed.encode import Encoder
    from jaxembed.evaluate.mteb_adapter import mteb_task
    from jaxembed.models.tiny import tiny_model_dir

    seen = []
    real_encode = Encoder.encode

    def spy(self, *a, **k):
        out = real_encode(self, *a, **k)
        seen.append(self.last_stats["packing"])
        return out

    monkeypatch.setattr(Encoder, "encode", spy)
    local = mteb_task("STSBenchmark-dev", max_examples=30)
    monkeypatch.setattr(mteb, "get_task", lambda name, *a, **k: local)
    model, scores = tiny_model_dir("bert"), {}
    for flag in ([], ["--no-packing"]):
        seen.clear()
        out = tmp_path / f"r{len(flag)}.json"
        assert main(["eval", "--model", str(model), "--tasks", "STSBenchmark-dev", "--max-examples", "30",
                     "--out", str(out), "-q", *flag]) == 0
        assert main(["eval", "--model", str(model), "--mteb", "STSBenchmark", "--out", str(tmp_path / f"m{len(flag)}"),
                     "-q", *flag]) == 0
        assert seen and set(seen) == {not flag}, seen
        scores[bool(flag)] = json.loads(out.read_text())["STSBenchmark-dev"]["main_score"]
    assert scores[True] == pytest.approx(scores[False], abs=1e-4)


def test_sentence_transformers_shaped_reranking_sets_are_read_as_training_reads_them(user_sets, tmp_path):
    """A dev set in sentence-transformers' Parquet shape (anchor, positive, negative: one text each) is a reranking
    set, with its columns named or mapped (a renamed pos / neg column may hold one text, as in training); each row is
    the query with its one positive and its negatives, exactly as the list-shaped file of the same rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jaxembed.evaluate.tasks import load_task_data

    rows = [r for r in _rows(user_sets / "rerank.jsonl") if r["pos"] and len(r["neg"]) >= 2][:30]
    st = {"anchor": [r["question"] for r in rows], "positive": [r["pos"][0] for r in rows],
          "negative_1": [r["neg"][0] for r in rows], "negative_2": [r["neg"][1] for r in rows]}
    pq.write_table(pa.table(st), tmp_path / "st.parquet")
    _write_jsonl(tmp_path / "lists.jsonl", [{"query": r["question"], "pos": r["pos"][:1], "neg": r["neg"][:2]}
                                            for r in rows])
    pq.write_table(pa.table({"q": st["anchor"], "p": st["positive"], "n": [r["neg"][:2] for r in rows]}),
                   tmp_path / "renamed.parquet")
    specs = {"lists": dict(name="lists", type="reranking", path=str(tmp_path / "lists.jsonl")),
             "st": dict(name="st", type="reranking", path=str(tmp_path / "st.parquet")),
             "renamed": dict(name="renamed", type="reranking", path=str(tmp_path / "renamed.parquet"),
                             columns={"query": "q", "pos": "p", "neg": "n"})}
    dev = validate_eval({"tasks": tuple(specs.values())})
    data = {t.name: load_task_data(t) for t in dev.local}
    for name in ("st", "renamed"):
        assert vars(data[name]) == vars(data["lists"]), name
    res = DevEvaluator(tuple(specs.values()))(WordsEncoder())
    assert res["st"] == res["renamed"] == res["lists"] and 0 < res["st"]["main_score"] <= 100


def test_a_bad_dev_row_stops_the_run_before_any_work(user_sets, shared_data, tmp_path, capsys):
    """A bad row deep in a dev set is refused by the config check, in one line naming file, row and field, before
    the store, the plan or any file of the run directory is written: the corrected config then starts afresh."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jaxembed.cli import main
    from jaxembed.models.tiny import tiny_model_dir

    rows = _rows(user_sets / "rerank.jsonl")[:40]
    positives = [r["pos"][0] if r["pos"] else "an answer" for r in rows]
    positives[30] = None  # row 31
    pq.write_table(pa.table({"anchor": [r["question"] for r in rows], "positive": positives}),
                   tmp_path / "dev.parquet")
    cfg = tmp_path / "cfg.py"
    cfg.write_text("from jaxembed.config import default_config\nfrom jaxembed.data.config import dataset_config\n\n\n"
                   "def get_config(arg=None):\n    c = default_config()\n"
                   f"    c.model.name = {str(tiny_model_dir('bert', num_layers=1))!r}\n"
                   f"    c.data.datasets = [dataset_config(name='w', path={str(shared_data / 'train/wikiqa.jsonl')!r},"
                   " task_type='retrieval', num_negatives=1)]\n    c.plan.steps = 2\n    c.plan.global_batch_size = 4\n"
                   f"    c.eval.tasks = (dict(name='st', type='reranking', path={str(tmp_path / 'dev.parquet')!r}),)\n"
                   "    return c\n")
    wd = tmp_path / "run"
    assert main(["train", "--config", str(cfg), "--workdir", str(wd)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: config.eval.tasks: st: {tmp_path / 'dev.parquet'}:31: field 'positive': expected a "
                   "string, got NoneType (fix: store a string in the field)"], err
    assert not wd.exists()
