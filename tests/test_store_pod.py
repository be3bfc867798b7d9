"""`jaxembed data prepare` started on every process of a pod (jaxembed.data.store_pod): the processes share the
datasets and write one store, equal in content to one process's (records, labels, manifest and report), and stop
with the line one process prints when a record is bad. Unit level: the shares, a Tally rebuilt from its state,
the first error in config order."""

from __future__ import annotations

import json

import pytest

import runs
from jaxembed.config import load_data_config
from jaxembed.data.store import Store, write_store
from jaxembed.errors import UserError

CONFIG = '''
from jaxembed.data import config as dc


def get_config():
    c = dc.default_data_config()
    c.on_error = "{on_error}"
    c.datasets = [
        dc.dataset_config(name="big", path="{d}/big.jsonl", task_type="retrieval", num_negatives=1),
        dc.dataset_config(name="sts", path="{d}/sts.jsonl", format="scored_pairs", task_type="sts",
                          score_threshold=4.0, num_negatives=0),
        dc.dataset_config(name="cls", path="{d}/cls.jsonl", format="classification", task_type="classification"),
        dc.dataset_config(name="small", path="{d}/small.jsonl", task_type="retrieval", num_negatives=2),
    ]
    return c
'''


def _data(folder, bad: bool = False):
    """Four datasets of unequal sizes: a bad JSON line in each of 'sts' and 'small' (on_error='skip': skipped and
    listed), identical examples, negatives fewer than asked, labels."""
    rows = {"big": [{"query": f"q{i}", "pos": [f"p{i}"], "neg": [f"n{i}"]} for i in range(300)],
            "sts": [{"sentence1": f"a{i}", "sentence2": f"b{i}", "score": i % 6} for i in range(200)],
            "cls": [{"text": f"t{i}", "label": ["x", "y", "z"][i % 3]} for i in range(200)],
            "small": [{"query": "same", "pos": ["p"], "neg": ["n"]}] * 3 + [{"query": "q", "pos": ["p"]}]}
    for name, recs in rows.items():
        lines = [json.dumps(r) for r in recs]
        if name in ("sts", "small"):
            lines.insert(2, "{bad json")
        (folder / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def _config(folder, on_error):
    path = folder / f"data_{on_error}.py"
    path.write_text(CONFIG.format(d=folder, on_error=on_error))
    return path


def _content(store):
    """Everything a store holds but its creation time and own path: records, labels, manifest, report."""
    st = Store.open(store)
    manifest = json.loads((store / "manifest.json").read_text())
    manifest.pop("created")
    report = json.loads((store / "report.json").read_text())
    report.pop("out_dir")
    text = (store / "report.txt").read_text().split("\n", 1)[1]
    records = {d.name: st.examples(d.name, range(d.size)) for d in st.datasets}
    labels = {d.name: st.labels(d.name) for d in st.datasets}
    return {"manifest": manifest, "report": report, "report.txt": text, "records": records, "labels": labels}


def test_pod_prepares_one_store_equal_to_one_process(tmp_path):
    from jaxembed.data.store_pod import shares

    d = _data(tmp_path)
    cfg = _config(d, "skip")
    data_config = load_data_config(str(cfg))[0]
    assert shares(data_config.datasets, 2) == [[0, 3], [1, 2]]  # by input bytes: big + small, sts + cls
    rep = write_store(data_config, tmp_path / "one")
    assert rep.invalid == 2 and rep.filtered > 0 and rep.tally("small").identical == 2 and rep.notes["small"]
    bad = _config(d, "stop")
    one_error = None
    try:
        write_store(load_data_config(str(bad))[0], tmp_path / "e1")
    except UserError as e:
        one_error = f"error: {e}"
    assert one_error and "sts.jsonl:3: invalid JSON" in one_error, one_error

    procs = runs.start_pod(2, 1, ["data", "prepare", "--config", str(cfg), "--out", str(tmp_path / "pod"), "-q"],
                           tmp_path / "pod")
    outs = runs.wait_all(procs, timeout=300)
    assert "process 0 of 2 prepares 2 of 4 datasets (big, small)" in outs[0], outs[0][-2000:]
    assert "process 1 of 2 prepares 2 of 4 datasets (sts, cls)" in outs[1], outs[1][-2000:]
    for out in outs:
        assert (f"wrote {tmp_path / 'pod'}: 4 datasets, {rep.written} examples of {rep.read} records "
                f"({rep.invalid} invalid skipped, {rep.filtered} left out by a rule)") in out, out[-2000:]
    assert _content(tmp_path / "pod") == _content(tmp_path / "one")
    assert runs.leftovers(tmp_path) == []

    # a bad record in 'sts' (dataset 1, process 1's) and in 'small' (dataset 3, process 0's): both processes stop
    # with the line of 'sts', the one a single process prints
    procs = runs.start_pod(2, 1, ["data", "prepare", "--config", str(bad), "--out", str(tmp_path / "e2")],
                           tmp_path / "bad")
    outs = runs.wait_ended(procs, timeout=300)
    assert [p.returncode for p in procs] == [2, 2], runs.describe(procs)
    assert [out.strip().splitlines()[-1] for out in outs] == [one_error] * 2
    assert not (tmp_path / "e2").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".e2")]


def test_shares_balance_input_bytes(tmp_path):
    from jaxembed.data import config as dc
    from jaxembed.data.store_pod import shares

    sizes = [50, 400, 10, 300, 200, 0]
    ds = []
    for i, n in enumerate(sizes):
        (tmp_path / f"{i}.jsonl").write_bytes(b"x" * n)
        ds.append(dc.dataset_config(name=f"d{i}", path=str(tmp_path / f"{i}.jsonl"), task_type="retrieval"))
    assert shares(ds, 2) == [[0, 1, 2, 5], [3, 4]]  # largest first, each to the lighter: 461 and 500 bytes
    assert shares(ds, 1) == [list(range(6))]
    assert shares(ds[:1], 3) == [[0], [], []]


def test_tally_restored_from_its_state_reads_as_the_original():
    from jaxembed.data.parsers import Skip
    from jaxembed.data.tally import Tally, apply_policy

    t = Tally("d", keep_ids=False)
    items = [Skip("f", 1, "query", "empty text", "fix it"), {"id": "a", "query": "q", "pos": ["p"], "neg": []},
             Skip("f", 3, "score", "score below threshold 4", None, invalid=False, detail="score 1"),
             {"id": "b", "query": "q", "pos": ["p"], "neg": []}]
    list(apply_policy(items, "skip", t))
    t.resolve_ids(lambda idx: [["a", "b"][k] for k in idx])
    r = Tally.restored(json.loads(json.dumps(t.state())), t.iter_skipped())
    assert r.state() == t.state() and r.summary_dict() == t.summary_dict()
    assert r.reasons(invalid=True) == t.reasons(invalid=True) and r.identical_note() == t.identical_note()
    assert [str(s) for s in r.iter_skipped()] == [str(s) for s in t.iter_skipped()]


def test_first_error_in_config_order_wins():
    from jaxembed.data.store_pod import _raise_first

    mine = ValueError("boom")
    statuses = [json.dumps(None), json.dumps({"dataset": 3, "error": "later"}),
                json.dumps({"dataset": 1, "error": "first"})]
    with pytest.raises(UserError, match="^first$"):
        _raise_first(statuses, (3, mine))
    with pytest.raises(ValueError, match="^boom$"):  # this process's own error keeps its type
        _raise_first(statuses[:2], (3, mine))
    _raise_first([json.dumps(None)] * 2, None)
