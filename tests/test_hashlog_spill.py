"""HashLog beyond ``hashindex.IN_MEMORY`` entries (sorted runs on disk, merged): the same identical examples, the
same first pairs and the same ids in two parts as the in-memory sort, in one process and in a pod's split
prepare."""

from __future__ import annotations

import numpy as np
import pytest

from jaxembed.data import hashindex
from jaxembed.data.store import write_store
from jaxembed.errors import UserError
from test_store_pod import _content
from test_store_split import _config, _rows, _simulated_pod, _split_small, _write  # noqa: F401 (fixture)


def _log(values: np.ndarray, by_one: bool) -> hashindex.HashLog:
    log = hashindex.HashLog()
    if by_one:
        for v in values:
            log.append(int(v))
    else:
        log.extend(values.tobytes())
    return log


@pytest.mark.parametrize("seed", range(4))
def test_spilled_log_finds_what_the_in_memory_sort_finds(monkeypatch, seed):
    rng = np.random.default_rng(seed)
    for n, vocab in ((0, 1), (1, 1), (50, 1), (700, 40), (900, 5000), (1500, 600)):
        values = rng.integers(0, vocab, n).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        starts = sorted({0, *rng.integers(0, max(n, 1), 3).tolist()})
        memory = _log(values, True)
        monkeypatch.setattr(hashindex, "IN_MEMORY", int(rng.integers(8, 90)))
        monkeypatch.setattr(hashindex, "RUN", int(rng.integers(4, 40)))  # runs shorter than what is held
        monkeypatch.setattr(hashindex, "FAN_IN", int(rng.integers(2, 6)))  # runs merged in groups first
        spilled = _log(values, bool(seed % 2))
        assert spilled.duplicates(5) == memory.duplicates(5)
        assert spilled.duplicates(0)[0] == memory.duplicates(0)[0]
        assert spilled.in_two_segments(starts) == memory.in_two_segments(starts)
        segment = np.searchsorted(np.asarray(starts[1:]), np.arange(n), side="right")
        pairs = {(int(v), int(k)) for v, k in zip(values, segment)}  # (value, segment) met
        assert spilled.in_two_segments(starts) == (len({v for v, _ in pairs}) < len(pairs))
        assert len(spilled) == n and (n < 90 or spilled._runs)
        spilled.close()
        monkeypatch.undo()


def test_spilled_pairs_name_the_smallest_indices_with_their_first():
    hashindex_in_memory = hashindex.IN_MEMORY
    try:
        hashindex.IN_MEMORY = 3
        log = _log(np.array([9, 4, 9, 4, 4, 7, 9, 7, 1, 4], dtype=np.uint64), True)
        assert log._runs
        assert log.duplicates(5) == (6, [(2, 0), (3, 1), (4, 1), (6, 0), (7, 5)])
    finally:
        hashindex.IN_MEMORY = hashindex_in_memory


@pytest.fixture
def spills(monkeypatch):
    """HashLog spilled every 7 entries; the number of runs written."""
    runs = []
    spill = hashindex.HashLog._spill

    def counted(self):
        runs.append(len(self._h))
        spill(self)

    monkeypatch.setattr(hashindex, "IN_MEMORY", 7)
    monkeypatch.setattr(hashindex, "FAN_IN", 4)
    monkeypatch.setattr(hashindex.HashLog, "_spill", counted)
    return runs


def _data(tmp_path):
    rows = _rows()
    rows[1000]["id"] = "x11"  # a duplicate id in the other half
    return _write(tmp_path, rows, bad={5: "{bad json", 900: "[1, 2]"})


def test_store_from_spilled_hashes_equals_the_in_memory_one(tmp_path, monkeypatch, spills):
    cfg = _config([_data(tmp_path)], task_type="retrieval")
    monkeypatch.setattr(hashindex, "IN_MEMORY", 1 << 20)
    one = write_store(cfg, tmp_path / "memory")
    assert not spills and one.tally("big").identical > 5
    monkeypatch.setattr(hashindex, "IN_MEMORY", 7)
    spilled = write_store(cfg, tmp_path / "spilled")
    assert len(spills) > 100
    assert spilled.to_dict()["datasets"] == one.to_dict()["datasets"] and spilled.notes == one.notes
    assert _content(tmp_path / "spilled") == _content(tmp_path / "memory")
    assert [s.line for s in spilled.tally("big").skipped] == [5, 900, 1003]  # the duplicate id, after the two bad lines


def test_duplicate_id_stops_at_its_line_when_spilled(tmp_path, spills):
    cfg = _config([_data(tmp_path)], on_error="stop", task_type="retrieval")
    with pytest.raises(UserError, match=r"big\.jsonl:5: invalid JSON"):
        write_store(cfg, tmp_path / "a")
    path = _write(tmp_path, [dict(r, id="x11") if i == 1000 else r for i, r in enumerate(_rows())], name="c.jsonl")
    with pytest.raises(UserError) as e:
        write_store(_config([path], on_error="stop", task_type="retrieval"), tmp_path / "b")
    assert "c.jsonl:1001: field 'id': duplicate id 'x11' (first at c.jsonl:12)" in str(e.value)
    assert spills and not (tmp_path / "b").exists()


@pytest.mark.parametrize("n", [2, 3])
def test_split_prepare_merges_spilled_hashes_as_one_process(tmp_path, monkeypatch, spills, n, capsys):
    cfg = _config([_data(tmp_path)], task_type="retrieval")
    monkeypatch.setattr(hashindex, "IN_MEMORY", 1 << 20)
    write_store(cfg, tmp_path / "one")
    monkeypatch.setattr(hashindex, "IN_MEMORY", 7)
    _simulated_pod(cfg, tmp_path / "pod", n)
    assert len(spills) > 100
    assert _content(tmp_path / "pod") == _content(tmp_path / "one")
    assert "dataset big: an id in two parts: read again whole" in capsys.readouterr().err
