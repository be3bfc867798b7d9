"""Parquet, CSV / TSV, several (compressed) files and saved Hugging Face datasets read in parts by the processes of
a pod (jaxembed.data.split_plan): the store is the one a single process writes, and an error names the row or
line a single process stops at. The pod's steps run one process after the other here (``_simulated_pod``)."""

from __future__ import annotations

import gzip
import json

import pytest

from jaxembed.data import config as dc
from jaxembed.data import split_plan, store_pod, store_split
from jaxembed.data.store import write_store
from jaxembed.errors import UserError
from test_store_pod import _content
from test_store_split import _one_error, _rows, _simulated_pod, _write


@pytest.fixture(autouse=True)
def _split_small(monkeypatch):
    monkeypatch.setenv(store_split.MIN_BYTES_VAR, "1000")


def _config(path, on_error="skip", fmt="auto", **kw):
    c = dc.default_data_config()
    c.on_error = on_error
    c.datasets = [dc.dataset_config(name="big", path=path, format=fmt, task_type="retrieval", num_negatives=1,
                                    **kw)]
    return c


def _same(cfg, tmp_path, n: int, mode: str):
    """The store of ``n`` simulated processes equals one process's; every part read as ``mode``."""
    one = write_store(cfg, tmp_path / "one")
    work = store_pod.plan(cfg.datasets, n)
    assert {u.mode for x in work for u in x} == {mode}
    _simulated_pod(cfg, tmp_path / "pod", n)
    assert _content(tmp_path / "pod") == _content(tmp_path / "one")
    return one


# ------------------------------------------------------------------------------------------------ Parquet

def _parquet(path, rows, group: int = 100):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), str(path), row_group_size=group)
    return path


def _pq_rows(n: int, start: int = 0):
    """Triplets; an empty query every 97th row; content repeated across the file."""
    return [{"query": "" if i % 97 == 5 else f"q {i % 400}", "pos": [f"p {i % 400}"], "neg": [f"n {i % 400}"]}
            for i in range(start, start + n)]


def test_parquet_row_groups_are_parts_numbered_as_the_file(tmp_path):
    a = _parquet(tmp_path / "a.parquet", _pq_rows(700))
    b = _parquet(tmp_path / "b.parquet", _pq_rows(500, 700), group=128)
    cfg = _config([str(a), str(b)])
    parts = store_split.parts(cfg.datasets[0], 0, 3, "triplets")
    # 11 row groups of about equal bytes; the first part smaller by the merge its process does (MERGE_SHARE)
    assert [p.segments for p in parts] == [((0, 0, 2),), ((0, 2, 7),), ((1, 0, 4),)]
    one = _same(cfg, tmp_path, 3, "rows")
    assert [s.line for s in one.tally("big").skipped][:3] == [6, 103, 200] and one.tally("big").identical > 0
    rows = [{"query": f"q {i}", "pos": ["p"]} for i in range(500)]
    rows[399]["query"] = ""
    stop = _config(str(_parquet(tmp_path / "c.parquet", rows, group=128)), on_error="stop")
    err = _one_error(stop, tmp_path / "e1")
    assert "c.parquet:400: field 'query': empty text" in err  # in row group 4 of 4: the second part
    assert [u.segments for x in store_pod.plan(stop.datasets, 2) for u in x] == [((0, 0, 2),), ((0, 2, 4),)]
    with pytest.raises(UserError) as e:
        _simulated_pod(stop, tmp_path / "e2", 2)
    assert str(e.value) == err


# ------------------------------------------------------------------------------------------------ CSV / TSV

def _csv_text(n: int, quoted_newline: bool, sep: str = ",", end: str = "\n") -> str:
    rows = [sep.join(["anchor", "positive", "negative"])]
    for i in range(n):
        pos = f'"line one of {i}{" " * 60}\nline two"' if quoted_newline else f"p {i % 300}"
        rows.append(sep.join([f"a {i % 300}", pos, f"n {i}"]) if i % 131 != 7 else f"a {i}{sep}only two")
    return end.join(rows) + end


@pytest.mark.parametrize("sep,suffix,end", [(",", "csv", "\n"), ("\t", "tsv", "\r\n")])
def test_csv_parts_meet_at_line_starts(tmp_path, capsys, sep, suffix, end):
    path = tmp_path / f"big.{suffix}"
    path.write_bytes(_csv_text(900, False, sep, end).encode())
    one = _same(_config(str(path)), tmp_path, 3, "csv")
    assert [s.line for s in one.tally("big").skipped][:2] == [9, 140]  # the line of the row with two fields
    assert "read again whole" not in capsys.readouterr().err


def test_csv_quoted_newline_across_a_cut_is_read_again_whole(tmp_path, capsys):
    path = tmp_path / "big.csv"
    path.write_text(_csv_text(600, True))
    cfg = _config(str(path))
    parts = store_split.parts(cfg.datasets[0], 0, 2, "st")
    text = path.read_bytes()
    cut = parts[1].segments[0][1]
    assert text[:cut].count(b'"') % 2 == 1  # the cut is inside a quoted field
    one = _same(cfg, tmp_path, 2, "csv")
    assert [s.line for s in one.tally("big").skipped][:2] == [16, 277]  # two lines a row
    assert "big: CSV parts that do not meet at their cut" in capsys.readouterr().err


def test_csv_error_in_a_later_part_names_its_line(tmp_path):
    path = tmp_path / "big.csv"
    path.write_text(_csv_text(900, False))
    cfg = _config(str(path), on_error="stop")
    err = _one_error(cfg, tmp_path / "one")
    assert "big.csv:9: 2 fields, the header has 3" in err
    path.write_text(_csv_text(900, False).replace("a 7,only two", "a 7,x,y"))  # the first bad row is now line 140
    err = _one_error(cfg, tmp_path / "one2")
    assert "big.csv:140: 2 fields" in err
    with pytest.raises(UserError) as e:
        _simulated_pod(cfg, tmp_path / "pod", 3)
    assert str(e.value) == err


def test_a_csv_file_whose_header_is_bad_is_read_whole_and_the_whole_read_names_it(tmp_path):
    path = tmp_path / "big.csv"
    path.write_text("anchor,anchor,negative\n" + _csv_text(300, False).split("\n", 1)[1])
    cfg = _config(str(path), on_error="stop")
    assert store_split.split_format(cfg.datasets[0]) == (None, "a file that cannot be read in parts (the whole "
                                                                "read names what is wrong)")
    err = _one_error(cfg, tmp_path / "one")
    assert "big.csv:1: column 'anchor' appears twice in the header" in err
    with pytest.raises(UserError) as e:
        _simulated_pod(cfg, tmp_path / "pod", 2)
    assert str(e.value) == err


def test_csv_lines_are_counted_as_the_csv_module_counts_them(tmp_path):
    path = tmp_path / "a.csv"
    path.write_bytes(b"a\rb\r\nc\n\rd\r")  # lines: a, b, c, (empty), d
    assert [split_plan.count_csv_lines(path, k) for k in (0, 2, 5, 7, 8, 10)] == [0, 1, 2, 3, 4, 5]


# ------------------------------------------------------------------------------------------------ whole files

def test_several_compressed_files_are_parts_of_whole_files(tmp_path):
    paths, rows = [], _rows(900)
    for k in range(3):
        plain = _write(tmp_path, rows[300 * k:300 * k + 300], bad={40 + k: "{bad"}, name=f"f{k}.jsonl")
        paths.append(tmp_path / f"f{k}.jsonl.gz")
        paths[-1].write_bytes(gzip.compress(plain.read_bytes()))
    cfg = _config([str(p) for p in paths], fmt="triplets")
    assert [len(u.segments) for u in store_split.parts(cfg.datasets[0], 0, 2, "triplets")] == [2, 1]
    assert [u.count for u in store_split.parts(cfg.datasets[0], 0, 5, "triplets")] == [3] * 3  # a file each
    one = _same(cfg, tmp_path, 2, "files")
    assert [(s.path.rsplit("/", 1)[1], s.line) for s in one.tally("big").skipped] == [
        ("f0.jsonl.gz", 40), ("f1.jsonl.gz", 41), ("f2.jsonl.gz", 42)]
    # one compressed file is read whole; a mix of kinds is dealt out by whole files
    assert "compressed" in store_split.split_format(_config(str(paths[0])).datasets[0])[1]
    mixed = _config([str(paths[0]), str(_parquet(tmp_path / "m.parquet", _pq_rows(300)))], fmt="triplets")
    assert [u.mode for u in store_split.parts(mixed.datasets[0], 0, 2, "triplets")] == ["files"] * 2
    (tmp_path / "empty.jsonl.gz").write_bytes(gzip.compress(b""))  # the first file: no record to tell the format
    empty_first = _config([str(tmp_path / "empty.jsonl.gz"), str(paths[1])]).datasets[0]
    assert store_split.split_format(empty_first)[0] is None


# ------------------------------------------------------------------------------------------------ Hugging Face

def test_saved_hf_dataset_is_split_by_rows_and_a_hub_name_is_read_whole(tmp_path):
    import datasets

    datasets.Dataset.from_list(_pq_rows(800)).save_to_disk(str(tmp_path / "saved"))
    for fmt in ("hf", "auto"):
        cfg = _config(str(tmp_path / "saved"), fmt=fmt)
        one = _same(cfg, tmp_path / fmt, 3, "hf")
        assert [s.line for s in one.tally("big").skipped][:2] == [6, 103]
    files = tmp_path / "files"
    files.mkdir()
    (files / "train.jsonl").write_text("\n".join(json.dumps(r) for r in _pq_rows(300)) + "\n")
    fmt, why = store_split.split_format(_config(str(files), fmt="hf").datasets[0])
    assert fmt is None and "other files than Parquet" in why
    assert "hub name" in store_split.split_format(_config("org/name", fmt="hf").datasets[0])[1]


def test_hf_folder_of_parquet_files_is_split_as_load_dataset_reads_it(tmp_path, monkeypatch):
    """The hub's Parquet export layout (data/train-0000k-of-0000n.parquet, a test split beside it): the parts read
    the train files' row groups, numbered over the files as datasets.load_dataset numbers them."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    (tmp_path / "export" / "data").mkdir(parents=True)
    for k in range(3):
        _parquet(tmp_path / "export" / "data" / f"train-0000{k}-of-00003.parquet", _pq_rows(300, 300 * k))
    _parquet(tmp_path / "export" / "data" / "test-00000-of-00001.parquet", _pq_rows(50))
    cfg = _config(str(tmp_path / "export"), fmt="hf", record_format="triplets")
    files = split_plan.hf_data_files(cfg.datasets[0])[0]
    assert [f.rsplit("/", 1)[1] for f in files] == [f"train-0000{k}-of-00003.parquet" for k in range(3)]
    one = _same(cfg, tmp_path, 2, "hf_files")
    assert [s.line for s in one.tally("big").skipped][:4] == [6, 103, 200, 297]
    assert one.tally("big").skipped[0].path == f"{tmp_path / 'export'}[train]"
    (tmp_path / "export" / "README.md").write_text("---\nconfigs: []\n---\n")
    assert "dataset card" in store_split.split_format(cfg.datasets[0])[1]


def test_csv_line_over_the_limit_in_the_last_part_is_read_again_whole(tmp_path, monkeypatch, capsys):
    from jaxembed.data import jsonl

    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 500)
    text = _csv_text(900, False).split("\n")
    text[850] = "a x," + "y" * 600 + ",z"  # its length is not kept: where the part stopped is unknown
    path = tmp_path / "big.csv"
    path.write_text("\n".join(text))
    one = _same(_config(str(path)), tmp_path, 2, "csv")
    assert 851 in [s.line for s in one.tally("big").skipped]
    assert "big: CSV parts that do not meet at their cut" in capsys.readouterr().err


def test_the_first_part_is_smaller_by_the_merge_its_process_does(tmp_path):
    assert split_plan.targets(1600, 4) == [0, 100, 600, 1100]  # 100 + the merge (0.25 x 1600) = 500 each
    assert split_plan.targets(1000, 1) == [0] and split_plan.targets(800, 9)[:2] == [0, 0]  # never below 0
    path = _write(tmp_path, _rows())
    parts = store_split.parts(_config(str(path), fmt="triplets").datasets[0], 0, 4, "triplets")
    total = path.stat().st_size
    assert all(abs(p.size - 0.3125 * total) < 200 for p in parts)  # what each process has to do, about equal
    assert parts[0].segments[0][2] < 0.1 * total
