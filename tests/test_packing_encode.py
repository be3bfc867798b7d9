"""Packed inference (Encoder.encode, the default) == padded inference on real all-MiniLM-L6-v2 and real texts; the
CLI's --no-packing."""

import json

import numpy as np
import pytest

from jaxembed.encode import Encoder
from jaxembed.models.embedding import EmbeddingModel, HeadConfig


@pytest.fixture(scope="module")
def texts(shared_data):
    """Short STS-B sentences and longer WikiQA answers (so rows mix lengths)."""
    sts = [json.loads(line) for line in open(shared_data / "eval" / "stsb_test.jsonl", encoding="utf-8")][:50]
    wiki = [json.loads(line) for line in open(shared_data / "dev" / "wikiqa_dev.jsonl", encoding="utf-8")][:12]
    return ([r["sentence1"] for r in sts] + [r["sentence2"] for r in sts]
            + [a for r in wiki for a in (r["pos"] + r["neg"])[:2]] + ["", "a"])


def test_packed_encode_equals_padded_on_minilm(minilm, texts):
    enc = Encoder.from_loaded(minilm)
    assert enc.packing
    padded = enc.encode(texts, batch_size=32, packing=False)
    pad_stats = enc.last_stats
    packed = enc.encode(texts, batch_size=32)
    stats = enc.last_stats
    assert packed.shape == padded.shape == (len(texts), 384)
    assert np.abs(packed - padded).max() <= 1e-5
    # several forward passes (the last one smaller), and almost no slot spent on padding
    assert stats["packing"] and len(stats["shapes"]) >= 1 and stats["real_tokens"] == pad_stats["real_tokens"]
    assert stats["real_fraction"] > 0.9 > pad_stats["real_fraction"]
    assert stats["slots"] < pad_stats["slots"]


def test_packed_encode_with_instruction_excluded_and_matryoshka(minilm, texts):
    """INSTRUCTOR-style pooling (the prompt's tokens excluded) and a truncated dimension, packed vs padded."""
    model = EmbeddingModel(minilm.model.backbone, HeadConfig("mean", include_prompt=False))
    enc = Encoder(model, minilm.tokenizer)
    kw = dict(prompt="Represent the sentence for retrieval: ", dim=128, batch_size=16)
    a = enc.encode(texts[:60], packing=False, **kw)
    b = enc.encode(texts[:60], **kw)
    assert b.shape == (60, 128)
    assert np.abs(a - b).max() <= 1e-5
    with_prompt = Encoder(minilm.model, minilm.tokenizer).encode(texts[:60], **kw)
    assert np.abs(with_prompt - b).max() > 1e-3  # the exclusion matters


def test_cli_no_packing_pads(minilm_dir, texts, tmp_path, monkeypatch):
    from jaxembed.cli import main

    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:20]), encoding="utf-8")
    calls = []

    def spy(name):
        orig = getattr(Encoder, name)

        def wrapped(self, *a, **k):
            calls.append(name)
            return orig(self, *a, **k)

        return wrapped

    for name in ("_encode_packed", "_encode_padded"):
        monkeypatch.setattr(Encoder, name, spy(name))
    assert main(["encode", "--model", str(minilm_dir), "--input", str(src), "--out", str(tmp_path / "a.npy"),
                 "-q"]) == 0
    assert main(["encode", "--model", str(minilm_dir), "--input", str(src), "--out", str(tmp_path / "b.npy"),
                 "-q", "--no-packing"]) == 0
    assert calls == ["_encode_packed", "_encode_padded"]
    assert np.abs(np.load(tmp_path / "a.npy") - np.load(tmp_path / "b.npy")).max() <= 1e-5


@pytest.fixture(scope="module")
def tiny_loaded():
    from jaxembed import loading
    from jaxembed.models.tiny import tiny_model_dir

    return loading.load(tiny_model_dir("bert", num_layers=1, max_length=32))


def test_encode_chunks_reads_one_chunk_at_a_time_and_equals_encode(tiny_loaded, texts):
    """The streamed encoder takes the next chunk from its reader only when the previous one is encoded, and gives
    the embeddings of one encode of all the texts."""
    from jaxembed.encode import batched

    enc = Encoder.from_loaded(tiny_loaded)
    pulled = []

    def reader():
        for i, t in enumerate(texts):
            pulled.append(i)
            yield t

    parts = []
    for part in enc.encode_chunks(batched(reader(), 40), batch_size=8):
        parts.append(part)
        assert len(pulled) <= 40 * len(parts)  # the reader is never ahead by more than one chunk
    assert [len(p) for p in parts] == [40, 40, 40, len(texts) - 120]
    ref = enc.encode(texts, batch_size=8)
    np.testing.assert_allclose(np.concatenate(parts), ref, atol=1e-5)


def test_encode_file_streams_a_file_and_stdin_into_one_npy(tiny_loaded, texts, tmp_path, monkeypatch):
    """checked_texts checks the whole input first and reads it again for encode_file (standard input from its
    temporary copy); encode_file appends the chunks to the .npy as they are encoded and writes the header last;
    the file equals encode's matrix; an empty input writes nothing."""
    import io

    from jaxembed.encode import checked_texts, encode_file
    from jaxembed.errors import UserError

    enc = Encoder.from_loaded(tiny_loaded)
    lines = [t.replace("\n", " ") for t in texts if t.strip()]
    src = tmp_path / "in.txt"
    src.write_text("".join(t + "\n" for t in lines), encoding="utf-8")
    ref = enc.encode(lines, batch_size=8, dim=16)
    n, again = checked_texts(str(src))
    assert n == len(lines) and list(again()) == lines
    assert encode_file(enc, again(), tmp_path / "a.npy", total=n, chunk=50, batch_size=8, dim=16) == (n, 16)
    monkeypatch.setattr("sys.stdin", io.StringIO(src.read_text(encoding="utf-8")))
    n, again = checked_texts("-")
    assert n == len(lines) and list(again()) == lines == list(again())
    assert encode_file(enc, again(), tmp_path / "b.npy", chunk=50, batch_size=8, dim=16) == (n, 16)
    for name in ("a.npy", "b.npy"):
        got = np.load(tmp_path / name)
        assert got.dtype == np.float32 and got.shape == ref.shape
        np.testing.assert_allclose(got, ref, atol=1e-5)
    with pytest.raises(UserError, match="no texts to encode"):
        encode_file(enc, iter([]), tmp_path / "c.npy")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy", "b.npy", "in.txt"]


def test_write_npy_rows_rewrites_the_header_in_place(tmp_path):
    from jaxembed.encode import write_npy_rows

    blocks = [np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros((0, 3), np.float32),
              np.ones((100_001, 3), np.float64)]
    with open(tmp_path / "x.npy", "wb") as f:
        assert write_npy_rows(f, iter(blocks), 3) == 100_003
    got = np.load(tmp_path / "x.npy")
    assert got.dtype == np.float32 and got.shape == (100_003, 3)
    np.testing.assert_array_equal(got, np.concatenate(blocks).astype(np.float32))
    with open(tmp_path / "y.npy", "wb") as f, pytest.raises(ValueError, match="expected"):
        write_npy_rows(f, iter([np.zeros((2, 4), np.float32)]), 3)
