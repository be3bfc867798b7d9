"""On 8 simulated CPU devices: the real all-MiniLM-L6-v2 encodes real sentences (../shared/data) over the 8 devices
(each pools the texts of its own packed rows) as on one device."""

from __future__ import annotations

import json

import jax
import numpy as np


def test_encode_on_8_devices_equals_one_device(minilm_dir, shared_data, monkeypatch):
    from jaxembed import encode

    assert jax.device_count() == 8
    rows = [json.loads(line) for line in open(shared_data / "eval" / "stsb_test.jsonl", encoding="utf-8")]
    texts = [r["sentence1"] for r in rows[:50]]
    out = encode.load_encoder(str(minilm_dir)).encode(texts, batch_size=16)
    one = jax.devices()[:1]
    monkeypatch.setattr(encode.jax, "devices", lambda *a: one)  # the Encoder sees (and runs on) one device
    single = encode.load_encoder(str(minilm_dir))
    monkeypatch.undo()
    assert single._mesh is None
    ref = single.encode(texts, batch_size=16)
    print("maxdiff", float(np.abs(out - ref).max()))
    assert out.shape == ref.shape == (50, 384) and np.abs(out - ref).max() <= 1e-5
