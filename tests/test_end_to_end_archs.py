"""End-to-end parity with sentence-transformers for the T5-encoder (GTR / sentence-T5, INSTRUCTOR) and the
Qwen2 / Qwen3 backbones, through real folders written by ``SentenceTransformer.save``.

Tiny random PyTorch backbones (vocab 30522, so that all-MiniLM-L6-v2's BERT tokenizer fits) are wrapped in a
sentence-transformers pipeline (Transformer, Pooling, [Dense], Normalize) and saved; jaxembed loads the folder and
must give the embeddings sentence-transformers gives for real sentences (../shared/data). The jaxembed export must
load again in sentence-transformers (same embeddings) and in PyTorch transformers (same weights)."""

import dataclasses
import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sentence_transformers")
transformers = pytest.importorskip("transformers")

from sentence_transformers import SentenceTransformer  # noqa: E402
from sentence_transformers.models import Dense, Normalize, Pooling, Transformer  # noqa: E402

from jaxembed import export, loading  # noqa: E402
from jaxembed.cli import main  # noqa: E402
from jaxembed.encode import Encoder  # noqa: E402
from jaxembed.models.embedding import EmbeddingModel  # noqa: E402

TOL = 1e-5
MAX_SEQ_LENGTH = 64
PROMPTS = {"query": "Represent the question for retrieving passages: ", "doc": "passage: "}
T5_TINY = dict(vocab_size=30522, d_model=32, num_layers=2, num_heads=4, d_kv=8, d_ff=64,
               feed_forward_proj="gated-gelu", decoder_start_token_id=0)
QWEN_TINY = dict(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=128,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


@pytest.fixture(scope="module")
def sentences(shared_data):
    rows = [json.loads(line) for line in open(shared_data / "dev" / "stsb_dev.jsonl", encoding="utf-8")][:10]
    out = [r["sentence1"] for r in rows] + [r["sentence2"] for r in rows]
    assert len(out) == 20
    return out


def _perturb(model, seed: int, scale: float | None = None):
    """Make every parameter matter: norm scales around 1 (HF initialises them to exactly 1), biases non-zero
    (HF: zero) and, when ``scale`` is given, all other weights ~ N(0, scale) instead of HF's small init."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name:
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.1 * noise)
            elif scale is not None:
                p.copy_(scale * noise)
    return model.float().eval()


def _t5(seed: int = 0):
    torch.manual_seed(seed)
    return _perturb(transformers.T5EncoderModel(transformers.T5Config(**T5_TINY)), seed)


def _qwen(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    if kind == "qwen2":
        m = transformers.Qwen2Model(transformers.Qwen2Config(**QWEN_TINY))
    else:
        m = transformers.Qwen3Model(transformers.Qwen3Config(**QWEN_TINY, head_dim=8))
    return _perturb(m, seed, scale=0.15)


def _st_folder(root, backbone, minilm_dir, *, pooling_mode="mean", include_prompt=True, dense=False,
               padding_side="right", prompts=None):
    """backbone + MiniLM's tokenizer saved as an HF folder, wrapped in Transformer / Pooling / [Dense 32->16,
    identity, no bias] / Normalize, saved with SentenceTransformer.save. Returns (folder, the model reloaded from
    it with sentence-transformers)."""
    hf_dir, st_dir = root / "hf", root / "st"
    backbone.save_pretrained(str(hf_dir))
    tok = transformers.AutoTokenizer.from_pretrained(str(minilm_dir))
    tok.padding_side = padding_side
    tok.save_pretrained(str(hf_dir))
    dim = backbone.config.hidden_size
    modules = [Transformer(str(hf_dir), max_seq_length=MAX_SEQ_LENGTH),
               Pooling(dim, pooling_mode=pooling_mode, include_prompt=include_prompt)]
    if dense:
        torch.manual_seed(1)
        modules.append(Dense(dim, 16, bias=False, activation_function=torch.nn.Identity()))
    modules.append(Normalize())
    st = SentenceTransformer(modules=modules, device="cpu")
    st.prompts = dict(prompts or {})
    st.save(str(st_dir))
    shutil.rmtree(hf_dir)  # everything must come from the saved folder
    ref = SentenceTransformer(str(st_dir), device="cpu")
    assert ref[0].tokenizer.padding_side == padding_side
    return st_dir, ref


def _maxdiff(ours, ref_model, texts, **kw):
    a = ours.encode(texts, batch_size=32, **kw)  # one batch: few XLA compilations
    b = ref_model.encode(texts, batch_size=8, convert_to_numpy=True, **kw)  # other padding lengths
    assert a.shape == b.shape, (a.shape, b.shape)
    assert np.isfinite(a).all()
    return float(np.abs(a - b).max())


def _assert_state_dict_equal(loaded, source):
    """Every tensor of the PyTorch model loaded from the export equals the source model's (tied aliases included)."""
    got, want = loaded.state_dict(), source.state_dict()
    assert set(got) == set(want), sorted(set(got) ^ set(want))
    for k, v in want.items():
        np.testing.assert_array_equal(got[k].numpy(), v.numpy(), err_msg=k)


# ---------------------------------------------------------------------------------------------- T5 encoders


@pytest.fixture(scope="module")
def t5_model():
    return _t5()


@pytest.fixture(scope="module")
def gtr(t5_model, minilm_dir, tmp_path_factory):
    """GTR / sentence-T5 layout: T5 encoder, mean pooling, Dense 32->16 (identity, no bias), Normalize."""
    return _st_folder(tmp_path_factory.mktemp("gtr"), t5_model, minilm_dir, dense=True, prompts=PROMPTS)


def test_t5_gtr_matches_sentence_transformers_and_round_trips(gtr, sentences, tmp_path):
    folder, ref = gtr
    loaded = loading.load(folder)
    assert loaded.hf_config["model_type"] == "t5" and loaded.model.dim == 16
    assert loaded.model.head.pooling == "mean" and loaded.model.head.normalize
    assert loaded.model.head.dense[0].activation == "identity" and not loaded.model.head.dense[0].bias
    assert loaded.tokenizer.max_length == MAX_SEQ_LENGTH
    assert loaded.st.prompts == PROMPTS
    enc = Encoder.from_loaded(loaded)
    for kw in ({}, {"prompt_name": "query"}, {"prompt": "summarize: "}):
        assert _maxdiff(enc, ref, sentences, **kw) <= TOL, kw

    out = export.export_loaded(loaded, tmp_path / "exp")
    again = SentenceTransformer(str(out), device="cpu")
    assert again.prompts == ref.prompts  # sentence-transformers 6 adds an empty "document" prompt on load
    for kw in ({}, {"prompt_name": "query"}):
        assert _maxdiff(enc, again, sentences, **kw) <= TOL, kw
    # and the export reads back into jaxembed with the same embeddings
    np.testing.assert_array_equal(Encoder.from_loaded(loading.load(out)).encode(sentences[:4]), enc.encode(sentences[:4]))


def test_t5_instructor_excludes_the_prompt_like_sentence_transformers(t5_model, minilm_dir, sentences, tmp_path):
    folder, ref = _st_folder(tmp_path, t5_model, minilm_dir, include_prompt=False, prompts=PROMPTS)
    loaded = loading.load(folder)
    assert not loaded.model.head.include_prompt
    enc = Encoder.from_loaded(loaded)
    for kw in ({"prompt_name": "query"}, {"prompt_name": "doc"}, {}):
        assert _maxdiff(enc, ref, sentences, **kw) <= TOL, kw
    # excluding the instruction really changes the vector (so the test above is not vacuous)
    inc = EmbeddingModel(loaded.model.backbone, dataclasses.replace(loaded.model.head, include_prompt=True))
    a = enc.encode(sentences[:8], prompt_name="query")
    b = Encoder(inc, loaded.tokenizer, PROMPTS).encode(sentences[:8], prompt_name="query")
    assert np.abs(a - b).max() > 1e-3


def test_t5_export_loads_in_transformers_with_the_same_weights(gtr, t5_model, tmp_path, capsys):
    folder, _ = gtr
    assert main(["export", "--model", str(folder), "--out", str(tmp_path / "exp")]) == 0
    assert "exported to" in capsys.readouterr().out
    tm = transformers.T5EncoderModel.from_pretrained(str(tmp_path / "exp")).eval()
    _assert_state_dict_equal(tm, t5_model)


# ---------------------------------------------------------------------------------------------- Qwen2 / Qwen3


@pytest.fixture(scope="module")
def qwen2_model():
    return _qwen("qwen2")


@pytest.fixture(scope="module")
def qwen3_model():
    return _qwen("qwen3")


@pytest.mark.parametrize("pooling_mode,padding_side,include_prompt", [
    ("lasttoken", "left", True), ("lasttoken", "right", True), ("mean", "left", True), ("mean", "right", True),
    ("mean", "left", False),  # instruction excluded from the mean: the prompt starts after the left padding
])
def test_qwen2_matches_sentence_transformers(qwen2_model, minilm_dir, sentences, tmp_path, pooling_mode,
                                             padding_side, include_prompt):
    folder, ref = _st_folder(tmp_path, qwen2_model, minilm_dir, pooling_mode=pooling_mode,
                             padding_side=padding_side, include_prompt=include_prompt, prompts=PROMPTS)
    loaded = loading.load(folder)
    assert loaded.hf_config["model_type"] == "qwen2" and loaded.model.config.causal
    assert loaded.model.head.pooling == pooling_mode and loaded.model.head.include_prompt == include_prompt
    assert loaded.tokenizer.padding_side == padding_side
    enc = Encoder.from_loaded(loaded)
    for kw in ({}, {"prompt_name": "query"}):
        assert _maxdiff(enc, ref, sentences, **kw) <= TOL, kw
    out = export.export_loaded(loaded, tmp_path / "exp")
    assert json.loads((out / "tokenizer_config.json").read_text())["padding_side"] == padding_side
    again = SentenceTransformer(str(out), device="cpu")
    for kw in ({}, {"prompt_name": "query"}):
        assert _maxdiff(enc, again, sentences, **kw) <= TOL, kw


def test_qwen3_qk_norm_lasttoken_left_padding(qwen3_model, minilm_dir, sentences, tmp_path):
    folder, ref = _st_folder(tmp_path, qwen3_model, minilm_dir, pooling_mode="lasttoken", padding_side="left",
                             dense=True, prompts=PROMPTS)
    loaded = loading.load(folder)
    assert loaded.model.config.model_type == "qwen3" and loaded.model.config.qk_norm
    assert loaded.model.dim == 16 and loaded.tokenizer.padding_side == "left"
    enc = Encoder.from_loaded(loaded)
    for kw in ({}, {"prompt_name": "query"}):
        assert _maxdiff(enc, ref, sentences, **kw) <= TOL, kw
    out = export.export_loaded(loaded, tmp_path / "exp")
    assert _maxdiff(enc, SentenceTransformer(str(out), device="cpu"), sentences) <= TOL


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_qwen_export_loads_in_transformers_with_the_same_weights(kind, qwen2_model, qwen3_model, minilm_dir,
                                                                 tmp_path):
    source = qwen2_model if kind == "qwen2" else qwen3_model
    folder, _ = _st_folder(tmp_path, source, minilm_dir, pooling_mode="lasttoken", padding_side="left")
    assert main(["export", "--model", str(folder), "--out", str(tmp_path / "exp")]) == 0
    tm = transformers.AutoModel.from_pretrained(str(tmp_path / "exp")).eval()
    assert type(tm) is type(source)
    _assert_state_dict_equal(tm, source)
