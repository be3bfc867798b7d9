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
