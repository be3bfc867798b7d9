"""A dataset read in parts by the processes of a pod (jaxembed.data.store_split): the store is the one a single
process writes (records in order, labels, manifest, report with every skipped record and its line), and an error
names the line a single process stops at. Unit level: the pod's steps run one process after the other in this
process (``_simulated_pod``); one real check starts two `jaxembed data prepare` processes."""

from __future__ import annotations

import json

import pytest

import runs
from jaxembed.config import load_data_config
from jaxembed.data import config as dc
from jaxembed.data import jsonl, store_pod, store_split
from jaxembed.data.prepare_report import PrepareReport
from jaxembed.data.store import finish, store_folder, write_store
from jaxembed.errors import UserError
from test_store_pod import _content

N = 1200  # records of the big dataset: about 90 KB


@pytest.fixture(autouse=True)
def _split_small(monkeypatch):
    monkeypatch.setenv(store_split.MIN_BYTES_VAR, "1000")


def _rows(n: int = N):
    """Triplets with labels, a few explicit ids, examples identical to earlier ones in the other half, fewer
    negatives than asked."""
    rows = []
    for i in range(n):
        r = {"query": f"query {i}", "pos": [f"pos {i}"], "neg": [f"neg {i}"] * (i % 3), "label": f"l{i % 5}"}
        if i % 7 == 0:  # the same content, all through the file
            r = {"query": f"same {i // 7 % 20}", "pos": ["shared"], "neg": [], "label": "l0"}
        if i % 11 == 0:
            r["id"] = f"x{i}"
        rows.append(r)
    return rows


def _write(folder, rows, bad: dict[int, str] | None = None, name: str = "big.jsonl"):
    """rows as JSON Lines; ``bad``: line number -> the text of that line instead."""
    lines = [json.dumps(r) for r in rows]
    for line, text in sorted((bad or {}).items()):
        lines.insert(line - 1, text)
    path = folder / name
    path.write_text("\n".join(lines) + "\n")
    return path


def _config(paths, on_error="skip", **kw):
    c = dc.default_data_config()
    c.on_error = on_error
    c.datasets = [dc.dataset_config(name="big", path=[str(p) for p in paths] if len(paths) > 1 else str(paths[0]),
                                    format="triplets", num_negatives=2, **kw)]
    return c


def _simulated_pod(data_config, out, n: int) -> PrepareReport:
    """``store_pod.prepare`` on ``n`` processes, their steps run one after the other here."""
    report = PrepareReport(out_dir=str(out), on_error=data_config.on_error)
    work = store_pod.plan(data_config.datasets, n)
    with store_folder(out) as tmp:
        failed = [store_pod._write_mine(data_config, work[p], tmp, report.on_error, "data", False) for p in range(n)]
        statuses = [store_pod._status(f) for f in failed]
        first = min([f[0] for f in failed if f is not None], default=len(data_config.datasets))
        for u in sorted({u for x in work for u in x if u.count > 1 and u.index == 0}, key=lambda u: u.dataset):
            if u.dataset < first:
                try:
                    store_split.settle(data_config.datasets[u.dataset], u.dataset, u.count, tmp, report.on_error,
                                       "data", False)
                except UserError as e:
                    statuses.append(store_pod._status((u.dataset, e)))
        store_pod._raise_first(statuses, None)
        done = store_pod._read_parts(tmp, len(data_config.datasets), with_skipped=True)
        finish(tmp, data_config, report, done, "data")
        for i in range(len(data_config.datasets)):
            store_pod._part(tmp, i).unlink()
            store_pod._part(tmp, i, ".skipped.jsonl").unlink()
        assert sorted(p.name for p in tmp.iterdir() if p.name.startswith(".part")) == []
    return report


def _one_error(data_config, out) -> str:
    with pytest.raises(UserError) as e:
        write_store(data_config, out)
    return str(e.value)


def test_parts_are_cut_at_line_starts_and_number_lines_as_the_file(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"query": "a", "pos": ["b"]}\r\n' * 50 + b"x" * 300 + b"\n" + b"{}\n" * 7)
    ds = _config([path]).datasets[0]
    parts = store_split.parts(ds, 0, 3, "triplets")
    assert [p.index for p in parts] == [0, 1, 2] and parts[0].segments[0][1] == 0
    lines = []
    for p in parts:
        for f, start, end in p.segments:
            assert start == 0 or path.read_bytes()[start - 1:start] == b"\n"
            first = jsonl.count_lines(path, start) + 1
            lines += [(i, raw) for i, raw in jsonl.iter_byte_lines(path, start=start, end=end, first_line=first)]
    assert lines == list(jsonl.iter_byte_lines(path))  # the same lines, numbers, BOM removed at line 1
    assert len(lines) == 58


def test_an_explicit_pod_is_joined_without_jax_only_when_valid():
    from jaxembed.pod import _explicit

    env = {"JAXEMBED_COORDINATOR": "10.0.0.1:1234", "JAXEMBED_NUM_PROCESSES": "4", "JAXEMBED_PROCESS_ID": "3"}
    assert _explicit(env) == ("10.0.0.1:1234", 4, 3)
    # anything else is JAX's initialize (parallel.cluster_plan words the error, or reads SLURM / TPU / MPI)
    assert _explicit(dict(env, JAXEMBED_PROCESS_ID="4")) is None
    assert _explicit(dict(env, JAXEMBED_COORDINATOR="10.0.0.1")) is None
    assert _explicit(dict(env, JAXEMBED_DISTRIBUTED="off")) is None
    assert _explicit({"SLURM_JOB_ID": "1"}) is None


def test_what_is_read_whole_and_why(tmp_path):
    import gzip

    big = _write(tmp_path, _rows(50))
    gz = tmp_path / "big.jsonl.gz"
    gz.write_bytes(gzip.compress(big.read_bytes()))
    cls = tmp_path / "cls.jsonl"
    cls.write_text("\n".join(json.dumps({"text": f"t{i}", "label": "a"}) for i in range(50)) + "\n")
    ds = lambda p, **kw: dc.dataset_config(name="d", path=str(p), task_type="classification", **kw)  # noqa: E731
    assert store_split.split_format(ds(big)) == ("triplets", "")
    assert store_split.split_format(ds(gz))[0] is None
    assert "label_descriptions" in store_split.split_format(ds(cls))[1]
    assert store_split.split_format(ds(cls, label_descriptions=[("a", "A")]))[0] == "classification"
    assert store_split.split_format(ds("org/name", format="hf"))[0] is None
    # split: larger than its share, or fewer datasets than processes; never under the minimum size
    small = _write(tmp_path, _rows(20), name="small.jsonl")
    both = [ds(big), dc.dataset_config(name="s", path=str(small), task_type="retrieval")]
    assert [[(u.dataset, u.count) for u in x] for x in store_pod.plan(both, 2)] == [[(0, 2)], [(0, 2), (1, 1)]]
    assert store_pod.shares(both[:1], 3) == [[0], [0], [0]]


@pytest.mark.parametrize("n", [2, 3])
def test_split_store_equals_one_process(tmp_path, n):
    """Skipped records in both halves (their lines), identical examples across the halves, labels, notes."""
    path = _write(tmp_path, _rows(), bad={5: "{bad json", 900: "[1, 2]", 1100: '{"query": ""}'})
    cfg = _config([path], task_type="retrieval")
    one = write_store(cfg, tmp_path / "one")
    assert [(s.line, s.reason.split(" (")[0]) for s in one.tally("big").skipped] == [
        (5, "invalid JSON"), (900, "expected a JSON object, got list"), (1100, "empty text")]
    assert one.tally("big").identical > 0 and one.notes["big"]
    work = store_pod.plan(cfg.datasets, n)
    assert sorted((u.dataset, u.index) for x in work for u in x) == [(0, k) for k in range(n)]
    assert [len(x) for x in work] == [1] * n  # a part each
    pod = _simulated_pod(cfg, tmp_path / "pod", n)
    assert pod.to_dict()["datasets"] == one.to_dict()["datasets"]
    assert _content(tmp_path / "pod") == _content(tmp_path / "one")


def test_error_deep_in_the_second_half_names_its_line(tmp_path):
    path = _write(tmp_path, _rows(), bad={1000: "{bad json", 1150: "{also bad"})
    cfg = _config([path], on_error="stop", task_type="retrieval")
    one = _one_error(cfg, tmp_path / "one")
    assert "big.jsonl:1000: invalid JSON" in one
    part = store_pod.plan(cfg.datasets, 2)[1][0]
    assert store_split.write_part(cfg.datasets[0], part, tmp_path, "stop", "data") == one  # the part's own count
    with pytest.raises(UserError) as e:
        _simulated_pod(cfg, tmp_path / "pod", 2)
    assert str(e.value) == one and not (tmp_path / "pod").exists()


def test_multi_file_dataset_keeps_its_default_ids(tmp_path):
    a = _write(tmp_path, _rows(300), bad={40: "{bad"}, name="a.jsonl")
    b = _write(tmp_path, _rows(500), bad={450: "{bad"}, name="b.jsonl")
    cfg = _config([a, b], task_type="retrieval")
    write_store(cfg, tmp_path / "one")
    _simulated_pod(cfg, tmp_path / "pod", 3)
    assert _content(tmp_path / "pod") == _content(tmp_path / "one")


@pytest.mark.parametrize("on_error", ["skip", "stop"])
def test_an_id_in_two_parts_is_found_as_one_process_finds_it(tmp_path, on_error, capsys):
    rows = _rows()
    rows[1000]["id"] = "x11"  # the id of record 11, in the other half
    rows[1001]["id"] = "big:3"  # shaped like the default id of line 3
    cfg = _config([_write(tmp_path, rows)], on_error=on_error, task_type="retrieval")
    if on_error == "stop":
        one = _one_error(cfg, tmp_path / "one")
        assert "big.jsonl:1001: field 'id': duplicate id 'x11' (first at big.jsonl:12)" in one
        with pytest.raises(UserError, match="^" + one.replace("(", r"\(").replace(")", r"\)") + "$"):
            _simulated_pod(cfg, tmp_path / "pod", 2)
        return
    one = write_store(cfg, tmp_path / "one")
    assert [s.line for s in one.tally("big").skipped] == [1001, 1002]
    _simulated_pod(cfg, tmp_path / "pod", 2)
    assert _content(tmp_path / "pod") == _content(tmp_path / "one")
    assert "dataset big: an id in two parts: read again whole" in capsys.readouterr().err


def test_bge_type_and_prompt_are_the_first_records(tmp_path):
    rows = [{"query": f"q{i}", "pos": [f"p{i}"], "type": "normal" if i < 900 else "symmetric_sts",
             "prompt": "Find it." if i < 1000 else "Other."} for i in range(N)]
    cfg = _config([_write(tmp_path, rows)])
    one = write_store(cfg, tmp_path / "one")
    assert one.invalid == N - 900  # every record after line 900 differs from line 1
    _simulated_pod(cfg, tmp_path / "pod", 2)
    assert _content(tmp_path / "pod") == _content(tmp_path / "one")


def test_two_real_processes_split_one_dataset(tmp_path):
    path = _write(tmp_path, _rows(), bad={1100: "{bad json"})
    cfg_file = tmp_path / "data.py"
    cfg_file.write_text(f'''
from jaxembed.data import config as dc


def get_config():
    c = dc.default_data_config()
    c.on_error = "skip"
    c.datasets = [dc.dataset_config(name="big", path="{path}", format="triplets", task_type="retrieval",
                                    num_negatives=2)]
    return c
''')
    one = write_store(load_data_config(str(cfg_file))[0], tmp_path / "one")
    procs = runs.start_pod(2, 1, ["data", "prepare", "--config", str(cfg_file), "--out", str(tmp_path / "pod"),
                                  "-q"], tmp_path / "pod")
    outs = runs.wait_all(procs, timeout=300)
    for k, out in enumerate(outs):
        assert f"process {k} of 2 (explicit: coordinator" in out and "JAX not started" in out, out[-2000:]
        assert f"process {k} of 2 prepares 1 of 1 datasets (big (part {k + 1} of 2))" in out, out[-2000:]
        assert f"{one.written} examples of {one.read} records ({one.invalid} invalid skipped" in out, out[-2000:]
    assert _content(tmp_path / "pod") == _content(tmp_path / "one")
    assert runs.leftovers(tmp_path) == []
