"""Llama, Mistral, Gemma 2 and Gemma 3 text backbones against PyTorch ``transformers`` (tiny random models, CPU,
float32, eager attention as the reference): right and left padding, bidirectional attention through transformers'
own switches, packed rows == padded rows (MoTE experts in them too), the Hugging Face state dict and config round
trip, and the export reloaded by sentence-transformers.

Every feature is exercised where it changes the result: Llama 3 RoPE scaling with original_max_position_embeddings
8 (the test rows are 12 tokens), a sliding window of 4 tokens, Gemma 2's attention soft-capping at 2, Gemma 3's
local RoPE base and linear scaling of the global one; ``test_matches_transformers`` also checks that switching
each feature off in the transformers reference moves its output beyond the tolerance (so the comparison would
catch the feature missing on our side)."""

import copy
import dataclasses
import functools
import logging
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from jaxembed import models, mote, packing  # noqa: E402
from jaxembed.models import gemma, llama  # noqa: E402
from jaxembed.models.rope import RopeSpec  # noqa: E402

TOL = 1e-4
V = 30522  # all-MiniLM-L6-v2's vocabulary: the sentence-transformers test tokenizes real text with it
L = 12
LENGTHS = (12, 7, 3)  # rows 0-2 right-padded, rows 3-5 the same lengths left-padded
BASE = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, attn_implementation="eager")
GEMMA = dict(head_dim=16, query_pre_attn_scalar=24, layer_types=["sliding_attention", "full_attention"])
LLAMA3 = dict(rope_type="llama3", rope_theta=1000.0, factor=4.0, low_freq_factor=1.0, high_freq_factor=2.0,
              original_max_position_embeddings=8)
GEMMA3_ROPE = {"full_attention": dict(rope_type="linear", factor=4.0, rope_theta=10000.0),
               "sliding_attention": dict(rope_type="default", rope_theta=100.0)}
DEFAULT_ROPE = dict(rope_type="default", rope_theta=1000.0)


def _hf_config(kind: str):
    """transformers config of each test model; ``-bi``: bidirectional through transformers' own switch."""
    bi = kind.endswith("-bi")
    arch = kind.removesuffix("-bi")
    extra = {"is_causal": False} if bi and arch != "gemma3" else {}
    if arch == "llama":
        return transformers.LlamaConfig(**BASE, **extra, attention_bias=True, mlp_bias=True, rope_parameters=LLAMA3)
    if arch == "mistral":
        return transformers.MistralConfig(**BASE, **extra, sliding_window=4, rope_parameters=DEFAULT_ROPE)
    if arch == "gemma2":
        return transformers.Gemma2Config(**BASE, **GEMMA, **extra, attn_logit_softcapping=2.0, sliding_window=4,
                                         rope_parameters=DEFAULT_ROPE)
    # Gemma 3: the soft-cap is set to show that it is ignored (as transformers does); EmbeddingGemma's switch
    # halves the window: |t - s| <= 6 // 2
    return transformers.Gemma3TextConfig(**BASE, **GEMMA, attn_logit_softcapping=1.0, sliding_window=6 if bi else 4,
                                         use_bidirectional_attention=bi, rope_parameters=GEMMA3_ROPE)


_CLASSES = {"llama": "LlamaModel", "mistral": "MistralModel", "gemma2": "Gemma2Model", "gemma3": "Gemma3TextModel"}


@functools.lru_cache(maxsize=None)
def _pair(kind: str, scale: float = 0.3):
    """(torch model, our model, our config) with the same random weights: all ~ N(0, scale), norms around 1
    (Gemma's (1 + w) norms: w ~ N(0, 0.2))."""
    torch.manual_seed(0)
    tm = getattr(transformers, _CLASSES[kind.removesuffix("-bi")])(_hf_config(kind))
    with torch.no_grad():
        for name, p in tm.named_parameters():
            if "norm" in name:
                p.copy_((0.0 if kind.startswith("gemma") else 1.0) + 0.2 * torch.randn_like(p))
            else:
                p.copy_(scale * torch.randn_like(p))
    tm = tm.float().eval()
    cfg = models.config_from_hf(tm.config.to_dict())
    model, cfg = models.load_weights(cfg, {k: v.numpy() for k, v in tm.state_dict().items()})
    return tm, model, cfg


def _batch(seed: int = 0):
    ids = np.random.RandomState(seed).randint(0, V, (2 * len(LENGTHS), L))
    mask = np.zeros(ids.shape, np.int64)
    for b, n in enumerate(LENGTHS):
        mask[b, :n] = 1
        mask[len(LENGTHS) + b, L - n:] = 1
    return ids, mask


def _torch_out(tm, ids, mask):
    with torch.no_grad():
        return tm(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()


@nnx.jit
def _forward(model, ids, mask, experts=None):
    return model(ids, mask, experts=experts)


@nnx.jit
def _packed_forward(model, ids, segment_ids, positions, experts=None):
    return model(ids, None, segment_ids=segment_ids, positions=positions, experts=experts)


def _ours(model, ids, mask):
    return np.asarray(_forward(model, jnp.asarray(ids), jnp.asarray(mask)), np.float32)


def _maxdiff(a, b, mask):
    return float(np.abs(a - b)[mask.astype(bool)].max())


def _set(path: str, value):
    """A knockout: set attribute ``path`` (dotted, ``layers.*`` for every layer) of the torch model."""
    def apply(tm):
        objs, *rest = [tm], *path.split(".")
        for name in rest[:-1]:
            objs = [x for o in objs for x in o] if name == "*" else [getattr(o, name) for o in objs]
        for o in objs:
            setattr(o, rest[-1], value(o) if callable(value) else value)
    return apply


def _default_inv_freq(theta, dim):
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))


# Each feature switched off in the transformers reference (a copy): its output must then move far from the
# reference with the feature on, which ours matches within TOL -- so ours without the feature would fail. The
# ``-bi`` windows are one token narrower: transformers' bidirectional window bounds are inclusive.
KNOCKOUTS = {
    "llama": {"llama3 RoPE scaling": _set("rotary_emb.inv_freq", _default_inv_freq(1000.0, 8))},
    "mistral": {"sliding window": _set("config.sliding_window", None)},
    "mistral-bi": {"window one narrower": _set("config.sliding_window", 3),
                   "bidirectional": _set("config.is_causal", True)},
    "gemma2": {"soft-capping": _set("layers.*.self_attn.attn_logit_softcapping", None),
               "sliding window": _set("config.sliding_window", 10 ** 6),
               "embedding scale": _set("embed_tokens.embed_scale", torch.tensor(1.0))},
    "gemma2-bi": {"window one narrower": _set("config.sliding_window", 3)},
    "gemma3": {"local RoPE base": _set("rotary_emb.sliding_attention_inv_freq", _default_inv_freq(10000.0, 16) / 4),
               "global RoPE scaling": _set("rotary_emb.full_attention_inv_freq", _default_inv_freq(10000.0, 16)),
               "sliding window": _set("config.sliding_window", 10 ** 6),
               "embedding scale": _set("embed_tokens.embed_scale", torch.tensor(1.0))},
    "gemma3-bi": {"window one narrower": _set("config.sliding_window", 3),  # transformers' halved window: 4 -> 3
                  "bidirectional": _set("config.use_bidirectional_attention", False)},
}


@pytest.mark.parametrize("kind", list(KNOCKOUTS))
def test_matches_transformers(kind):
    """Right- and left-padded rows in one batch; ``-bi``: bidirectional (transformers with ``is_causal: false``,
    Gemma 3 with ``use_bidirectional_attention``) against our ``causal=False``."""
    tm, model, cfg = _pair(kind)
    assert cfg.causal == (not kind.endswith("-bi"))
    ids, mask = _batch()
    ref = _torch_out(tm, ids, mask)
    diff = _maxdiff(_ours(model, ids, mask), ref, mask)
    print(f"{kind}: max abs diff {diff:.3g} (states up to {np.abs(ref).max():.1f})")
    assert diff <= TOL
    for what, knockout in KNOCKOUTS[kind].items():
        off = copy.deepcopy(tm)
        knockout(off)
        assert _maxdiff(_torch_out(off, ids, mask), ref, mask) > 1e-2, f"{kind}: {what} does not matter here"


def test_gemma2_bfloat16_close_to_pytorch_bfloat16():
    """bf16 compute and storage (the soft-capped attention's own path, the (1 + w) norms in float32, the embedding
    scale rounded to bf16) against PyTorch's bf16 model on the same weights (tests/bf16_reference.py). Measured:
    relative max 0.019, mean 0.0086 (PyTorch's bf16 model vs its float32 model: mean 0.011)."""
    from bf16_reference import assert_bf16_close, torch_bf16_out

    tm, model, cfg = _pair("gemma2", 0.15)
    bf = models.model_from_params(dataclasses.replace(cfg, dtype="bfloat16", param_dtype="bfloat16"),
                                  models.flat_params(model))
    ids, mask = _batch()
    out = _forward(bf, jnp.asarray(ids), jnp.asarray(mask))
    assert out.dtype == jnp.bfloat16
    assert_bf16_close(out, _torch_out(tm, ids, mask), torch_bf16_out(tm, input_ids=ids, attention_mask=mask), mask,
                      max_tol=0.028, mean_tol=0.013, label="gemma2 (bf16 params)")


# ---------------------------------------------------------------------------------------------- packed rows

TEXTS = (9, 14, 3, 1, 7, 20, 5, 24, 2, 11)
ROW = 24


def _packed_and_padded(model, experts=None):
    """(states of every text's real tokens from packed rows, the same from right-padded rows) of ``model``;
    experts: MoTE expert per text (None: the default expert, or a dense model)."""
    rng = np.random.default_rng(1)
    texts = [list(rng.integers(3, V, n)) for n in TEXTS]
    p = packing.pack(texts, None, ROW, prompt_lengths=0, pad_id=0)
    assert p["input_ids"].shape[0] < len(texts)
    ids = np.zeros((len(texts), ROW), np.int32)
    mask = np.zeros_like(ids)
    for i, t in enumerate(texts):
        ids[i, :len(t)], mask[i, :len(t)] = t, 1
    kw = {}
    if experts is not None:
        kw = dict(experts=jnp.asarray(np.where(p["token_text"] >= 0, experts[np.maximum(p["token_text"], 0)], -1)))
    packed = np.asarray(_packed_forward(model, jnp.asarray(p["input_ids"]), jnp.asarray(p["segment_ids"]),
                                        jnp.asarray(p["positions"]), **kw))
    if experts is not None:
        kw = dict(experts=jnp.asarray(experts))
    padded = np.asarray(_forward(model, jnp.asarray(ids), jnp.asarray(mask), **kw))
    got = [packed[p["text_row"][i], p["text_start"][i]:p["text_start"][i] + len(t)] for i, t in enumerate(texts)]
    want = [padded[i, :len(t)] for i, t in enumerate(texts)]
    return np.concatenate(got), np.concatenate(want)


def _perturbed_experts(model):
    """The up-cycled model with its experts moved apart (each expert's weights perturbed)."""
    rng = np.random.default_rng(7)
    params = models.flat_params(model)
    for path, a in params.items():
        if mote.is_expert_path(path):
            params[path] = a + 0.3 * rng.standard_normal(a.shape) * (np.abs(a).mean() + 0.1)
    return models.model_from_params(model.config, params)


@pytest.mark.parametrize("kind", ["mistral", "gemma2", "gemma3-bi"])
def test_packed_rows_equal_padded_rows(kind):
    """Texts packed into rows of 24 (segment ids, per-text positions): RoPE restarts per text, the sliding
    window and soft-capping act within each text."""
    got, want = _packed_and_padded(_pair(kind)[1])
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


def test_mote_experts_in_packed_gemma_rows():
    """MoTE on Gemma's feed-forward sublayer (its pre / post norms included in each expert): the experts' Hugging
    Face keys are Gemma's own and read back; texts of different experts share packed rows."""
    _, model, cfg = _pair("gemma2")
    spec = mote.MoTESpec.build(cfg.num_layers, experts=("a", "b", "c"), routing={"x": ("a", "b")}, default="a")
    up = mote.upcycle(model, spec)
    tensors = mote.hf_expert_tensors(up)
    assert {"experts.b.layers.0.pre_feedforward_layernorm.weight", "experts.a.layers.1.mlp.gate_proj.weight",
            "experts.c.layers.1.post_feedforward_layernorm.weight"} <= set(tensors)
    back = mote.from_hf_experts(model, spec, tensors)
    a, b = models.flat_params(back), models.flat_params(up)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    experts = np.array([0, 1, 2, 1, 0, 2, 2, 1, 0, 1], np.int32)
    got, want = _packed_and_padded(_perturbed_experts(up), experts)
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    dense_got, _ = _packed_and_padded(model)
    assert np.abs(got - dense_got).max() > 1e-2  # the experts really differ


# ---------------------------------------------------------------------------------- Hugging Face round trip


@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2", "gemma3", "gemma3-bi", "mistral-bi"])
def test_state_dict_and_config_round_trip(kind):
    tm, model, cfg = _pair(kind)
    mod = models.spec_for(cfg.model_type).module()
    ignore = [re.compile(p) for p in mod.IGNORE]
    expected = {k: v.numpy() for k, v in tm.state_dict().items() if not any(r.search(k) for r in ignore)}
    exported = models.export_weights(model)
    assert set(exported) == set(expected)
    for k, v in expected.items():
        np.testing.assert_array_equal(exported[k], v, err_msg=k)
    hf = cfg.to_hf()
    tcfg = transformers.AutoConfig.for_model(**hf)
    assert tcfg.architectures == [_CLASSES[kind.removesuffix("-bi")]]
    assert models.config_from_hf(tcfg.to_dict()) == cfg == type(cfg).from_hf(hf)
    tm2 = transformers.AutoModel.from_config(tcfg)
    assert type(tm2).__name__ == _CLASSES[kind.removesuffix("-bi")]
    tm2.load_state_dict({k: torch.tensor(v) for k, v in exported.items()}, strict=True)


# ------------------------------------------------------------------------------------- sentence-transformers

SENTENCES = ["A man is playing a large flute while sitting on the grass in the park.",
             "Three dogs run across the snowy field towards the old wooden barn.",
             "The stock market fell sharply on Tuesday after the central bank raised interest rates again.",
             "hello", "A woman slices an onion.", "Is this the right way to the railway station, please?"]


@pytest.mark.parametrize("kind,pooling_mode", [("llama", "lasttoken"), ("gemma2", "lasttoken"), ("gemma3-bi", "mean")])
def test_export_reloads_in_sentence_transformers(kind, pooling_mode, minilm_dir, tmp_path, caplog):
    """jaxembed's export (config.json, safetensors, pipeline) loads in sentence-transformers, which embeds real
    sentences (longer than the window) as jaxembed does; EmbeddingGemma-style bidirectional Gemma 3 included
    (transformers honours its switch: no warning that it would run causally)."""
    st = pytest.importorskip("sentence_transformers")
    from jaxembed import export, loading
    from jaxembed.encode import Encoder
    from jaxembed.models.embedding import EmbeddingModel, HeadConfig
    from jaxembed.tokenizer import Tokenizer

    _, model, cfg = _pair(kind, 0.15)
    tok = Tokenizer.from_folder(minilm_dir, 64)
    assert max(len(t) for t in tok.hf(SENTENCES)["input_ids"]) > 4 * 2
    with caplog.at_level(logging.WARNING):
        out = export.export(EmbeddingModel(model, HeadConfig(pooling_mode)), tok, tmp_path / "exp")
    assert not [r for r in caplog.records if "bidirectional" in r.getMessage()]
    loaded = loading.load(out)
    assert loaded.model.config == cfg and loaded.model.head.pooling == pooling_mode
    ours = Encoder.from_loaded(loaded).encode(SENTENCES, batch_size=8)
    ref = st.SentenceTransformer(str(out), device="cpu").encode(SENTENCES, batch_size=4, convert_to_numpy=True)
    diff = float(np.abs(ours - ref).max())
    print(f"{kind} ({pooling_mode}): max abs diff {diff:.2e}")
    assert np.isfinite(ours).all() and diff <= 1e-5


# ---------------------------------------------------------------------------------------------- configs


def test_rope_frequencies_match_transformers():
    """Our inverse frequencies against transformers' ROPE_INIT_FUNCTIONS (llama3, linear; dynamic at or below
    max_position_embeddings is the default RoPE); transformers 4 configs (rope_theta + rope_scaling) read the same."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    base = dict(hidden_size=64, num_attention_heads=4, max_position_embeddings=64)
    for params in (LLAMA3, dict(rope_type="linear", rope_theta=500.0, factor=3.0),
                   dict(rope_type="dynamic", rope_theta=500.0, factor=3.0),
                   dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0,
                        high_freq_factor=4.0, original_max_position_embeddings=8192)):
        tcfg = transformers.LlamaConfig(**base, rope_parameters=dict(params))
        ref, _ = ROPE_INIT_FUNCTIONS[params["rope_type"]](tcfg, None, seq_len=L)
        ours = llama.LlamaConfig.from_hf(tcfg.to_dict())
        np.testing.assert_allclose(ours.rope.inv_freq(16), ref.numpy(), rtol=1e-6, err_msg=str(params))
        old = {**base, "model_type": "llama", "rope_theta": params["rope_theta"],
               "rope_scaling": {("type" if params["rope_type"] == "linear" else "rope_type"): params["rope_type"],
                                **{k: v for k, v in params.items() if k not in ("rope_type", "rope_theta")}}}
        assert llama.LlamaConfig.from_hf(old) == ours
    with pytest.raises(ValueError, match=r"rope_type='yarn' is not supported") as e:
        models.config_from_hf({"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    assert "\n" not in str(e.value)


def test_config_defaults_and_errors():
    mistral = dict(model_type="mistral", vocab_size=V, hidden_size=32, num_attention_heads=4)
    assert llama.LlamaConfig.from_hf(mistral).sliding_window == 4096  # transformers' default
    assert llama.LlamaConfig.from_hf({**mistral, "sliding_window": None}).layer_window(0) is None
    assert llama.LlamaConfig.from_hf({**mistral, "attention_bias": True}).attention_bias is False
    assert llama.LlamaConfig.from_hf({"model_type": "llama", "sliding_window": 8}).sliding_window is None
    g2 = gemma.GemmaConfig.from_hf(dict(model_type="gemma2", num_hidden_layers=4))
    assert (g2.attn_logit_softcapping, g2.final_logit_softcapping) == (50.0, 30.0)
    assert [g2.layer_window(i) for i in range(4)] == [4096, None, 4096, None]
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        gemma.GemmaConfig.from_hf(dict(model_type="gemma2", use_bidirectional_attention=True))
    with pytest.raises(ValueError, match="use_bidirectional_attention=true"):
        gemma.GemmaConfig.from_hf(dict(model_type="gemma3_text", is_causal=False))


def test_gemma3_transformers4_config_reads_as_transformers_does():
    """A Gemma 3 config.json of transformers 4 (rope_theta, rope_local_base_freq, rope_scaling on the global
    layers, sliding_window_pattern): our reading equals our reading of transformers 5's parse of it."""
    old = dict(model_type="gemma3_text", vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=7,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=1e6, rope_local_base_freq=1e4,
               rope_scaling={"rope_type": "linear", "factor": 8.0}, sliding_window_pattern=3, sliding_window=512)
    ours = gemma.GemmaConfig.from_hf(old)
    assert ours == models.config_from_hf(transformers.Gemma3TextConfig(**old).to_dict())
    assert ours.layer_types == ("sliding_attention", "sliding_attention", "full_attention") * 2 + ("sliding_attention",)
    assert ours.rope == RopeSpec(theta=1e6, type="linear", factor=8.0) and ours.rope_local == RopeSpec(theta=1e4)
    assert ours.layer_rope(2) == ours.rope and ours.layer_rope(0) == ours.rope_local
    bi = gemma.GemmaConfig.from_hf({**old, "use_bidirectional_attention": True})
    assert not bi.causal and bi.layer_window(0) == 257 and bi.layer_window(2) is None  # |t - s| <= 512 // 2


def test_tiny_configs_of_the_new_decoders():
    """jaxembed.models.tiny: every new decoder's tiny config builds, with its window where it has one (the folder
    is written by the export, the same code for every architecture, which the test above exercises)."""
    from jaxembed.models.tiny import TINY_WINDOW, tiny_hf_config

    for arch, model_type in (("llama", "llama"), ("mistral", "mistral"), ("gemma2", "gemma2"),
                             ("gemma3", "gemma3_text")):
        c = models.config_from_hf(tiny_hf_config(arch))
        assert c.model_type == model_type and c.num_layers == 2
        assert c.layer_window(0) == (None if arch == "llama" else TINY_WINDOW)
