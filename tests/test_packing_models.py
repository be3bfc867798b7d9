"""Packed rows == padded rows (docs/design.md, Architecture): hidden states of real tokens and embeddings, per
architecture and pooling mode, with and without instruction exclusion, MoTE rows mixing experts, the loss and its
gradients; and packed rows against PyTorch ``transformers`` run on each text alone. float32, tiny random models."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxembed import models, mote, packing, pooling
from jaxembed.models.embedding import EmbeddingModel, HeadConfig

TOL = 1e-5
V = 128
# One layer, except T5: what packing changes (positions, the attention mask per text, pooling per text) acts in
# every layer alike; T5 keeps two, since its later layers reuse the relative-position bias the first one computes.
CONFIGS = {
    "bert": dict(model_type="bert", vocab_size=V, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=64, type_vocab_size=2),
    "roberta": dict(model_type="roberta", vocab_size=V, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                    intermediate_size=64, max_position_embeddings=64, type_vocab_size=1, pad_token_id=1),
    "qwen2": dict(model_type="qwen2", vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2, rope_theta=1000.0),
    "qwen2-bidirectional": dict(model_type="qwen2", vocab_size=V, hidden_size=32, intermediate_size=64,
                                num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, rope_theta=1000.0,
                                is_causal=False),
    "qwen3": dict(model_type="qwen3", vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=1000.0),
    "t5": dict(model_type="t5", vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
               feed_forward_proj="gated-gelu", relative_attention_num_buckets=8, relative_attention_max_distance=12),
}
# Text lengths: a text longer than T5's max_distance (log buckets), one of a single token, one filling a row.
LENGTHS = (9, 14, 3, 1, 7, 20, 5, 24, 2, 11)
ROW = 24
PROMPT = 2


def _params(config, seed=0):
    """Random weights of order one (attention far from uniform, norms away from 1), so that a wrong position,
    mask or route shows up well above rounding. Built from the shapes: no initialisation pass."""
    rng = np.random.default_rng(seed)
    out = {}
    for path, shape in models.param_shapes(models.abstract_model(config)).items():
        name = "/".join(map(str, path))
        if len(shape) == 1 and ("norm" in name or "scale" in name):
            out[path] = 1.0 + 0.2 * rng.standard_normal(shape)
        elif len(shape) == 1:
            out[path] = 0.1 * rng.standard_normal(shape)
        else:
            out[path] = rng.standard_normal(shape) / (1.0 if "embedding" in name else np.sqrt(shape[-2]))
    return out


@nnx.jit
def _padded_states(model, ids, mask, types=None):
    return model(ids, mask, types)


@nnx.jit
def _packed_states(model, ids, segment_ids, positions, types=None, experts=None):
    return model(ids, None, types, segment_ids=segment_ids, positions=positions, experts=experts)


_MODELS = {}


def _model(arch):
    if arch not in _MODELS:
        cfg = models.config_from_hf(CONFIGS[arch])
        _MODELS[arch] = models.model_from_params(cfg, _params(cfg))
    return _MODELS[arch]


def _texts(seed=0, lengths=LENGTHS):
    rng = np.random.default_rng(seed)
    return [list(rng.integers(3, V, n)) for n in lengths]


def _padded(texts, pad_id, length=ROW, left=False):
    ids = np.full((len(texts), length), pad_id, np.int32)
    mask = np.zeros_like(ids)
    for i, t in enumerate(texts):
        if left:
            ids[i, length - len(t):], mask[i, length - len(t):] = t, 1
        else:
            ids[i, :len(t)], mask[i, :len(t)] = t, 1
    return ids, mask


def _pack(texts, pad_id, types=None, num_texts=None):
    p = packing.pack(texts, None, ROW, prompt_lengths=PROMPT, token_types=types, num_texts=num_texts, pad_id=pad_id)
    assert p["input_ids"].shape[0] < len(texts)  # several texts share rows
    return p


def _pad_id(arch):
    return 1 if arch == "roberta" else 0


def _real_diff(h_pad, h_packed, p, texts, left=False):
    """Max |difference| over the real tokens of every text: padded row i vs its slots in the packed rows."""
    worst = 0.0
    for i, t in enumerate(texts):
        k = len(t)
        a = h_pad[i, ROW - k:] if left else h_pad[i, :k]
        r, s = p["text_row"][i], p["text_start"][i]
        worst = max(worst, float(np.abs(a - h_packed[r, s:s + k]).max()))
    return worst


@jax.jit
def _all_pools(h_pad, mask, h_packed, p):
    """Every pooling mode, with and without instruction exclusion: per padded row (ref) and per segment (got)."""
    n = h_pad.shape[0]
    ref, got = {}, {}
    for mode in pooling.MODES:
        for prompt in (False, True):
            ref[mode, prompt] = pooling.pool(mode, h_pad, mask, jnp.full((n,), PROMPT) if prompt else None)
            got[mode, prompt] = pooling.pool_packed(mode, h_packed, p["token_text"], p["positions"], p["text_row"],
                                                    p["text_start"], p["text_len"],
                                                    p["text_prompt"] if prompt else None)
    return ref, got


@nnx.jit
def _embed_both(emb_model, ids, mask, types, p):
    n = ids.shape[0]
    return (emb_model(ids, mask, jnp.full((n,), PROMPT), types, dim=16), emb_model.encode_packed(p, dim=16))


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_packed_equals_padded_per_architecture_and_pooling(arch):
    model = _model(arch)
    texts = _texts()
    pad = _pad_id(arch)
    types = None
    if arch == "bert":  # token types: a second segment in the second half of each text
        types = [[int(j >= len(t) // 2) for j in range(len(t))] for t in texts]
    ids, mask = _padded(texts, pad)
    tt = None if types is None else _padded(types, 0)[0]
    h_pad = np.asarray(_padded_states(model, jnp.asarray(ids), jnp.asarray(mask),
                                      None if tt is None else jnp.asarray(tt)))
    p = _pack(texts, pad, types, num_texts=len(texts) + 2)
    h_packed = np.asarray(_packed_states(model, jnp.asarray(p["input_ids"]), jnp.asarray(p["segment_ids"]),
                                         jnp.asarray(p["positions"]), p.get("token_type_ids")))
    assert _real_diff(h_pad, h_packed, p, texts) <= TOL
    # every pooling mode, with and without instruction exclusion, per segment == per padded row
    n = len(texts)
    ref, got = _all_pools(jnp.asarray(h_pad), jnp.asarray(mask), jnp.asarray(h_packed),
                          {k: jnp.asarray(v) for k, v in p.items()})
    for key in ref:
        assert got[key].shape == (n + 2, h_pad.shape[-1])
        assert np.isfinite(np.asarray(got[key])).all()
        assert float(jnp.abs(got[key][:n] - ref[key]).max()) <= TOL, key
    # the embedding model's packed entry point (pooling, normalisation, Matryoshka) in input order
    emb_model = EmbeddingModel(model, HeadConfig("mean", include_prompt=False))
    ref, got = _embed_both(emb_model, jnp.asarray(ids), jnp.asarray(mask), None if tt is None else jnp.asarray(tt),
                           {k: jnp.asarray(v) for k, v in p.items()})
    assert float(jnp.abs(got[:n] - ref).max()) <= TOL


def test_left_padded_qwen_rows_equal_packed_rows():
    """Decoder tokenizers pad on the left; RoPE is relative, so left-padded rows give the packed states too."""
    model = _model("qwen2")
    texts = _texts(1)
    ids, mask = _padded(texts, 0, left=True)
    h_pad = np.asarray(_padded_states(model, jnp.asarray(ids), jnp.asarray(mask)))
    p = _pack(texts, 0)
    h_packed = np.asarray(_packed_states(model, jnp.asarray(p["input_ids"]), jnp.asarray(p["segment_ids"]),
                                         jnp.asarray(p["positions"])))
    assert _real_diff(h_pad, h_packed, p, texts, left=True) <= 1e-4  # RoPE at shifted positions: rounding


@pytest.mark.parametrize("arch", ["bert", "t5", "qwen2"])
def test_packed_equals_padded_with_dropout(arch):
    """Dropout on (hidden states and attention probabilities; Qwen2 with attention dropout 0.1, its rows padded on
    the left): a text's masks follow its id and its positions, not its row (jaxembed.models.dropout), so its packed
    embedding is its padded one, with the same ids (default: the text's index); dropout acts, and other ids give
    other masks."""
    base = _model(arch)
    model = base
    if arch == "qwen2":
        model = models.model_from_params(dataclasses.replace(base.config, attention_dropout=0.1),
                                         models.flat_params(base))
    emb = EmbeddingModel(model, HeadConfig("mean"))
    texts = _texts(5)
    ids, mask = _padded(texts, 0, left=arch == "qwen2")
    p = {k: jnp.asarray(v) for k, v in _pack(texts, 0).items()}
    key = jax.random.key(3)

    @nnx.jit
    def run(m, ids, mask, p, other):
        on = lambda: dict(deterministic=False, rngs=nnx.Rngs(dropout=key))  # noqa: E731 (each call: the same key)
        return (m(ids, mask, **on()), m.encode_packed(p, **on()), m(ids, mask),
                m.encode_packed(p, text_ids=other, **on()))

    other = jnp.arange(len(texts)) + 100
    padded, packed, plain, shifted = run(emb, jnp.asarray(ids), jnp.asarray(mask), p, other)
    assert float(jnp.abs(packed - padded).max()) <= (1e-4 if arch == "qwen2" else TOL)
    assert float(jnp.abs(padded - plain).max()) > 1e-2  # dropout acts
    assert float(jnp.abs(shifted - packed).max()) > 1e-2  # the masks follow the ids


def _mote_model(arch):
    """A MoTE model with three experts that really differ (each expert's weights perturbed apart)."""
    spec = mote.MoTESpec.build(_model(arch).config.num_layers, experts=("a", "b", "c"), routing={"x": ("a", "b")},
                                default="a")
    m = mote.upcycle(_model(arch), spec)
    rng = np.random.default_rng(7)
    graphdef, state = nnx.split(m)
    flat = []
    for path, var in nnx.to_flat_state(state):
        if isinstance(var, nnx.Param) and mote.is_expert_path(path):
            a = np.asarray(var[...])
            var = var.replace(jnp.asarray(a + 0.3 * rng.standard_normal(a.shape) * (np.abs(a).mean() + 0.1),
                                          a.dtype))
        flat.append((path, var))
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


@nnx.jit
def _mote_padded(emb, ids, mask, experts):
    """The hidden states and the embeddings of padded rows routed per row, in one program."""
    return emb.backbone(ids, mask, experts=experts), emb(ids, mask, experts=experts)


@nnx.jit
def _mote_packed(emb, p, experts):
    return emb.encode_packed(p, experts=experts)


def test_mote_rows_mix_experts_per_text():
    """The routing is architecture-independent (jaxembed.mote): one backbone suffices."""
    model = _mote_model("bert")
    texts = _texts(2)
    experts = np.array([0, 1, 2, 1, 0, 2, 2, 1, 0, 1], np.int32)
    ids, mask = _padded(texts, 0)
    p = _pack(texts, 0, num_texts=len(texts) + 1)
    rows_mixed = [len(set(experts[p["token_text"][r][p["token_text"][r] >= 0]])) for r in range(len(p["input_ids"]))]
    assert max(rows_mixed) >= 2  # some row holds texts of different experts
    emb = EmbeddingModel(model, HeadConfig("mean"))
    h_pad, ref = _mote_padded(emb, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(experts))
    h_pad = np.asarray(h_pad)
    pj = {k: jnp.asarray(v) for k, v in p.items()}
    got = _mote_packed(emb, pj, jnp.asarray(np.r_[experts, 0]))  # per text (dummy slot: any expert)
    assert float(jnp.abs(got[:len(texts)] - ref).max()) <= TOL
    # the experts really differ: routing everything to expert 0 changes the embeddings
    one = _mote_packed(emb, pj, jnp.int32(0))
    assert float(jnp.abs(one[:len(texts)] - ref).max()) > 1e-2
    # one expert for the call (the fast path) == per-text routing with that expert everywhere
    same = _mote_packed(emb, pj, jnp.zeros(len(texts) + 1, jnp.int32))
    assert float(jnp.abs(one - same).max()) <= TOL
    h_packed = np.asarray(_packed_states(model, jnp.asarray(p["input_ids"]), jnp.asarray(p["segment_ids"]),
                                         jnp.asarray(p["positions"]),
                                         experts=jnp.asarray(np.where(p["token_text"] >= 0,
                                                                      experts[np.maximum(p["token_text"], 0)], -1))))
    assert _real_diff(h_pad, h_packed, p, texts) <= TOL


def _info_nce(e):
    """A contrastive loss on [2M, D] embeddings (queries then documents, pairs by index), tau 0.05."""
    m = e.shape[0] // 2
    logits = e[:m] @ e[m:].T / 0.05
    return jnp.mean(jax.nn.logsumexp(logits, axis=1) - jnp.diagonal(logits))


@pytest.mark.parametrize("arch,remat", [("bert", True), ("qwen2", False), ("t5", False)])
def test_loss_and_gradients_equal_packed_and_padded(arch, remat):
    base = _model(arch)
    backbone = models.model_from_params(dataclasses.replace(base.config, remat=remat), models.flat_params(base))
    emb = EmbeddingModel(backbone, HeadConfig("mean", include_prompt=False))
    texts = _texts(3, LENGTHS[:8])
    ids, mask = _padded(texts, 0)
    p = {k: jnp.asarray(v) for k, v in _pack(texts, 0, num_texts=8).items()}
    pl = jnp.full((8,), PROMPT)

    def padded_loss(m):
        return _info_nce(m(jnp.asarray(ids), jnp.asarray(mask), pl))

    def packed_loss(m):
        return _info_nce(m.encode_packed(p))

    la, ga = nnx.jit(nnx.value_and_grad(padded_loss))(emb)
    lb, gb = nnx.jit(nnx.value_and_grad(packed_loss))(emb)
    assert abs(float(la) - float(lb)) <= TOL
    flat_a, flat_b = jax.tree.leaves(ga), jax.tree.leaves(gb)
    assert len(flat_a) == len(flat_b) > 0
    scale = max(float(jnp.abs(g).max()) for g in flat_a)
    assert scale > 0
    for a, b in zip(flat_a, flat_b):
        assert float(jnp.abs(a - b).max()) <= TOL * max(scale, 1.0)


# ------------------------------------------------------------------------------ against PyTorch transformers


def _torch_model(arch):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if arch == "bert":
        m = transformers.BertModel(transformers.BertConfig(
            vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, type_vocab_size=2))
    elif arch == "qwen2":
        m = transformers.Qwen2Model(transformers.Qwen2Config(
            vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, rope_parameters={"rope_type": "default", "rope_theta": 1000.0}))
    else:
        m = transformers.T5EncoderModel(transformers.T5Config(
            vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, feed_forward_proj="gated-gelu",
            relative_attention_num_buckets=8, relative_attention_max_distance=12))
    with torch.no_grad():  # weights of order one, norms away from 1 (as _randomise)
        for name, w in m.named_parameters():
            if "norm" in name.lower():
                w.copy_(1.0 + 0.2 * torch.randn_like(w))
            elif w.ndim == 1:
                w.copy_(0.1 * torch.randn_like(w))
            else:
                w.copy_(torch.randn_like(w) / (w.shape[-1] ** 0.5 if "embed" not in name and "shared" not in name
                                               and "relative" not in name else 1.0))
    return m.float().eval()


@pytest.mark.parametrize("arch", ["bert", "qwen2", "t5"])
def test_packed_rows_match_transformers_on_each_text(arch):
    torch = pytest.importorskip("torch")
    tm = _torch_model(arch)
    cfg = models.config_from_hf(tm.config.to_dict())
    model, _ = models.load_weights(cfg, {k: v.numpy() for k, v in tm.state_dict().items()})
    texts = _texts(4)
    p = _pack(texts, 0)
    h = np.asarray(_packed_states(model, jnp.asarray(p["input_ids"]), jnp.asarray(p["segment_ids"]),
                                  jnp.asarray(p["positions"])))
    ids, mask = _padded(texts, 0)
    with torch.no_grad():
        ref = tm(input_ids=torch.tensor(ids, dtype=torch.long),
                 attention_mask=torch.tensor(mask, dtype=torch.long)).last_hidden_state.numpy()
    scale = float(np.abs(ref[mask.astype(bool)]).max())
    diff = _real_diff(ref, h, p, texts)
    print(f"{arch}: packed vs transformers max abs diff {diff:.2e} (states up to {scale:.1f})")
    assert diff <= TOL * max(scale, 1.0)
