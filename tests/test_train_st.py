"""A sentence-transformers user's run through `jaxembed train` with a config file: their datasets as they are (an
ST triplet Parquet file and a save_to_disk pair-score folder, as ST's dict of datasets) and their own dev sets in
eval.tasks (an STS CSV and a BEIR folder, beside a registered task) feeding eval.best_metric and the best
checkpoint (the trainer's dev-evaluation hook: evaluations at eval.every, the best step kept); a bad dev file stops
the run with one line before any work."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

CONFIG = '''
from jaxembed.config import default_config
from jaxembed.data.config import datasets_from_dict

def get_config(arg=None):
    c = default_config()
    c.model.name = {model!r}
    c.model.max_length = 32
    c.data.datasets = datasets_from_dict({{
        "nli": dict(path={nli!r}, task_type="nli", num_negatives=1),               # anchor, positive, negative
        "stsb": dict(path={stsb!r}, task_type="sts", score_threshold=0.6, num_negatives=0, temperature=0.05),
    }}, max_query_length=16, max_doc_length=16)
    c.plan.global_batch_size = 8
    c.plan.steps = 4
    c.optim.lr = 1e-3
    c.train.log_every = 2
    c.train.checkpoint_every = 1
    c.train.keep_checkpoints = 1
    c.export.at_end = False
    c.eval.tasks = (
        dict(name="my-sts", type="sts", path={sts!r}, columns={{"score": "similarity"}}),
        dict(name="my-ir", type="retrieval", path={beir!r}),
        "STSBenchmark-dev",
    )
    c.eval.every = 2
    c.eval.max_examples = 40
    c.eval.best_metric = "my-sts/main_score"
    return c
'''


def _rows(path):
    return [json.loads(x) for x in Path(path).read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def st_run_files(tmp_path_factory, shared_data):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    datasets = pytest.importorskip("datasets")
    from jaxembed.models.tiny import tiny_model_dir

    d = tmp_path_factory.mktemp("st_run")
    snli = _rows(shared_data / "train/snli_triplets.jsonl")[:48]
    pq.write_table(pa.table({"anchor": [r["query"] for r in snli], "positive": [r["pos"][0] for r in snli],
                             "negative": [r["neg"][0] for r in snli]}), d / "nli.parquet")
    stsb = _rows(shared_data / "train/stsb_pairs.jsonl")[:120]
    datasets.disable_progress_bars()
    datasets.Dataset.from_dict({"sentence1": [r["sentence1"] for r in stsb],
                                "sentence2": [r["sentence2"] for r in stsb],
                                "score": [r["score"] / 5 for r in stsb]}).save_to_disk(str(d / "stsb"))
    dev = _rows(shared_data / "dev/stsb_dev.jsonl")[:40]
    (d / "sts.csv").write_text("sentence1,sentence2,similarity\n" + "".join(
        f'"{r["sentence1"]}","{r["sentence2"]}",{r["score"]}\n' for r in dev if '"' not in r["sentence1"] + r[
            "sentence2"]), encoding="utf-8")
    beir = d / "beir"
    (beir / "qrels").mkdir(parents=True)
    wiki = [r for r in _rows(shared_data / "dev/wikiqa_dev.jsonl") if r["pos"]][:15]
    docs = {t: f"d{i}" for i, t in enumerate(dict.fromkeys(t for r in wiki for t in r["pos"] + r["neg"]))}
    (beir / "corpus.jsonl").write_text("".join(json.dumps({"_id": k, "title": "", "text": t}) + "\n"
                                               for t, k in docs.items()), encoding="utf-8")
    (beir / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": r["query"]}) + "\n"
                                                for i, r in enumerate(wiki)), encoding="utf-8")
    (beir / "qrels/dev.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"q{i}\t{docs[t]}\t1\n" for i, r in enumerate(wiki) for t in r["pos"]), encoding="utf-8")
    cfg = d / "st_train.py"
    cfg.write_text(CONFIG.format(model=str(tiny_model_dir("bert", num_layers=1)), nli=str(d / "nli.parquet"),
                                 stsb=str(d / "stsb"), sts=str(d / "sts.csv"), beir=str(beir)))
    return d, cfg


def test_st_data_and_own_dev_sets_through_jaxembed_train(st_run_files, tmp_path, capsys):
    from jaxembed.cli import main
    from jaxembed.data.store import Store

    d, cfg = st_run_files
    wd = tmp_path / "run"
    assert main(["train", "--config", str(cfg), "--workdir", str(wd)]) == 0
    st = Store.open(wd / "store")
    assert [(x.name, x.task_type, x.size) for x in st.datasets] == [("nli", "nli", 48), ("stsb", "sts", 63)]
    assert st.example("nli", 0)["neg"] and st.example("stsb", 0)["neg"] == []
    evals = [x for x in map(json.loads, (wd / "metrics.jsonl").read_text().splitlines()) if x["split"] == "eval"]
    assert [x["step"] for x in evals] == [2, 4]
    for x in evals:
        assert -100 <= x["my-sts/main_score"] <= 100 and x["my-sts/main_score"] == x["my-sts/cosine_spearman"]
        assert 0 <= x["my-ir/ndcg_at_10"] <= 100 and "my-ir/recall_at_100" in x
        assert -100 <= x["STSBenchmark-dev/main_score"] <= 100
    scores = {x["step"]: x["my-sts/main_score"] for x in evals}
    summary = json.loads((wd / "summary.json").read_text())
    assert summary["best_step"] == max(scores, key=scores.get)
    kept = sorted(int(p.name) for p in (wd / "checkpoints").iterdir() if p.name.isdigit())
    assert summary["best_step"] in kept
    # a bad dev file is one line before any work (no store, no step); so is a best_metric naming no dev task
    (d / "bad.csv").write_text("sentence1,sentence2\na,b\n")
    capsys.readouterr()
    bad = tmp_path / "bad"
    assert main(["train", "--config", str(cfg), "--workdir", str(bad),
                 f"--config.eval.tasks=({{'name': 'x', 'type': 'sts', 'path': {str(d / 'bad.csv')!r}}},)",
                 "--config.eval.best_metric=x/main_score"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(r"eval\.tasks\[0\]: .*bad\.csv:2: field 'score': missing \(keys present: "
                                       r"sentence1, sentence2\)", err[0]), err
    assert not (bad / "store").exists() and not (bad / "checkpoints").exists()
    assert main(["train", "--config", str(cfg), "--workdir", str(bad), "--config.eval.best_metric=my-st/main_score"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did you mean my-sts/main_score?" in err[0], err

