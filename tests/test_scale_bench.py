"""benchmarks/scale.py's synthetic triplets (benchmarks/_harness/triplets.py): written with array operations a
block of records at a time, they are byte for byte what a loop of ``json.dumps`` per record writes from the same
generator's draws, so the text lengths are those of the earlier records; a size of whole chunks is a prefix of a
larger one."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from _harness import triplets as T  # noqa: E402


def loop_writer(path: Path, n: int, chunk: int, seed: int = 0) -> None:
    """The records one at a time: numpy's weighted choice and json.dumps of each record."""
    rng = np.random.default_rng(seed)
    vocab, zipf = T.vocabulary(rng)
    with open(path, "w", encoding="utf-8") as f:
        for c0 in range(0, n, chunk):
            m = min(chunk, n - c0)
            qn = 4 + rng.poisson(6, m)
            dn = 20 + rng.poisson(50, (m, 2))
            words = vocab[rng.choice(len(vocab), int(qn.sum() + dn.sum()), p=zipf)]
            at = 0
            for i in range(m):
                q, p, g = (" ".join(words[at + a:at + b]) for a, b in
                           ((0, qn[i]), (qn[i], qn[i] + dn[i, 0]), (qn[i] + dn[i, 0], qn[i] + dn[i].sum())))
                at += qn[i] + dn[i].sum()
                f.write(json.dumps({"query": f"{c0 + i} {q}", "pos": [p], "neg": [g]}) + "\n")


@pytest.fixture
def small_blocks(monkeypatch):
    """Chunks of 500 records put together 150 at a time: the sizes below cross both boundaries."""
    monkeypatch.setattr(T, "CHUNK", 500)
    monkeypatch.setattr(T, "BLOCK", 150)


def test_triplets_are_the_loop_writers_bytes(tmp_path, small_blocks):
    ref, new = tmp_path / "loop.jsonl", tmp_path / "array.jsonl"
    loop_writer(ref, 1_234, chunk=500)
    meta = T.write_triplets(new, 1_234)
    assert new.read_bytes() == ref.read_bytes()
    assert meta == {"records": 1_234, "bytes": ref.stat().st_size}
    last = json.loads(new.read_text().splitlines()[1_233])
    assert last["query"].startswith("1233 ") and len(last["pos"]) == len(last["neg"]) == 1


def test_whole_chunks_are_a_prefix(tmp_path, small_blocks):
    T.write_triplets(tmp_path / "a", 1_000)
    T.write_triplets(tmp_path / "b", 1_300)
    small, large = (tmp_path / "a").read_bytes(), (tmp_path / "b").read_bytes()
    assert large.startswith(small) and small.count(b"\n") == 1_000


@pytest.mark.parametrize("p", [T.vocabulary(np.random.default_rng(0))[1], np.array([0.5, 1e-9, 0.25, 0.25 - 1e-9]),
                               np.full(70_000, 1 / 70_000)])
def test_zipf_draw_is_numpys_weighted_choice(p):
    draw = T.ZipfDraw(p)
    a, b = np.random.default_rng(3), np.random.default_rng(3)
    for size in (1, 50_000, 7):
        assert np.array_equal(draw(a, size), b.choice(len(p), size, p=p))


def test_write_data_leaves_a_whole_file(tmp_path, monkeypatch):
    import scale

    monkeypatch.setattr(scale, "write_triplets", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        scale.write_data(tmp_path / "t.jsonl", 10)
    assert not (tmp_path / "t.jsonl").exists()  # a later --keep run writes it again, not from a broken file
    monkeypatch.undo()
    assert scale.write_data(tmp_path / "t.jsonl", 10)["records"] == 10
    assert [x.name for x in tmp_path.iterdir()] == ["t.jsonl"]


def test_reuse_keeps_where_a_row_was_measured(tmp_path):
    import argparse

    import scale

    def record(name, rows):
        path = tmp_path / name
        path.write_text(json.dumps({"batch": 8, "hosts": 1, "gradcache_chunk": 0, "code": name[:3],
                                    "results": rows}))
        return str(path)

    first = record("aaa.json", [{"store_records": 1, "epochs": 1}])
    second = record("bbb.json", [{"store_records": 1, "epochs": 1, "reused_from": {"record": "aaa.json",
                                                                                   "code": "aaa"}},
                                 {"store_records": 2, "epochs": 1}])
    args = argparse.Namespace(reuse=f"{first},{second}", batch=8, hosts=1, gradcache_chunk=0)
    rows = scale.reused_rows(args)
    assert rows[(1, 1)]["reused_from"] == {"record": "aaa.json", "code": "aaa"}
    assert rows[(2, 1)]["reused_from"] == {"record": "bbb.json", "code": "bbb"}
