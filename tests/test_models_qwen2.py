"""Qwen2 / Qwen3 backbone against PyTorch ``transformers`` (tiny random models, CPU)."""

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

from jaxembed import models  # noqa: E402
from jaxembed.models import qwen2  # noqa: E402

TOL = 1e-4
TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64)
B, L = 3, 9
# lengths of the rows of the test batch; the last row has no padding
LENGTHS = (9, 5, 2)


def _torch_model(kind: str, seed: int = 0, scale: float = 0.3):
    torch.manual_seed(seed)
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(**TINY, rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
        m = transformers.Qwen2Model(cfg)
    else:  # explicit head_dim != hidden/heads, biases on all projections, q/k norms
        cfg = transformers.Qwen3Config(**TINY, head_dim=32, attention_bias=True,
                                       rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
        m = transformers.Qwen3Model(cfg)
    with torch.no_grad():  # random everything, norms around 1, so that every parameter matters
        for name, p in m.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(scale * torch.randn_like(p))
    return m.float().eval()


@functools.lru_cache(maxsize=None)
def _pair(kind: str, scale: float = 0.3):
    """(torch model, our model, our config) with the same weights (all but the norms ~ N(0, scale))."""
    tm = _torch_model(kind, scale=scale)
    tensors = {k: v.numpy() for k, v in tm.state_dict().items()}
    cfg = models.config_from_hf(tm.config.to_dict())
    model, cfg = models.load_weights(cfg, tensors)
    return tm, model, cfg


@pytest.fixture(scope="module", params=["qwen2", "qwen3"])
def pair(request):
    return _pair(request.param)


def _batch(left: bool, seed: int = 0):
    ids = np.random.RandomState(seed).randint(0, TINY["vocab_size"], (B, L))
    mask = np.zeros((B, L), np.int64)
    for b, n in enumerate(LENGTHS):
        if left:
            mask[b, L - n:] = 1
        else:
            mask[b, :n] = 1
    return ids, mask


def _torch_out(tm, ids, mask):
    with torch.no_grad():
        return tm(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()


def _ours(model, ids, mask, **kw):
    return np.asarray(model(jnp.asarray(ids), jnp.asarray(mask), **kw), np.float32)


def _maxdiff(a, b, mask):
    return float(np.abs(a - b)[mask.astype(bool)].max())


@pytest.mark.parametrize("left", [False, True], ids=["right_pad", "left_pad"])
def test_matches_transformers(pair, left):
    tm, model, cfg = pair
    ids, mask = _batch(left)
    diff = _maxdiff(_ours(model, ids, mask), _torch_out(tm, ids, mask), mask)
    print(f"{cfg.model_type} {'left' if left else 'right'} padding: max abs diff {diff:.3g}")
    assert diff <= TOL


def test_left_padding_equals_unpadded(pair):
    """RoPE is relative: a left-padded row gives the same real-token outputs as the unpadded sequence alone."""
    _, model, _ = pair
    ids, mask = _batch(left=True)
    out = _ours(model, ids, mask)
    n = LENGTHS[1]
    alone = _ours(model, ids[1:2, L - n:], np.ones((1, n), np.int64))
    assert np.abs(out[1, L - n:] - alone[0]).max() <= TOL


def test_export_reproduces_state_dict(pair):
    tm, model, _ = pair
    ignore = [re.compile(p) for p in qwen2.IGNORE]
    expected = {k: v.numpy() for k, v in tm.state_dict().items() if not any(r.search(k) for r in ignore)}
    exported = models.export_weights(model)
    assert set(exported) == set(expected)
    for k, v in expected.items():
        assert exported[k].shape == v.shape, k
        np.testing.assert_array_equal(exported[k], v, err_msg=k)


def test_to_hf_roundtrip_through_transformers(pair):
    _, model, cfg = pair
    hf = cfg.to_hf()
    tcfg = transformers.AutoConfig.for_model(**hf)
    assert type(tcfg).__name__ == {"qwen2": "Qwen2Config", "qwen3": "Qwen3Config"}[cfg.model_type]
    assert tcfg.architectures == [{"qwen2": "Qwen2Model", "qwen3": "Qwen3Model"}[cfg.model_type]]
    tm2 = transformers.AutoModel.from_config(tcfg).float().eval()
    missing, unexpected = tm2.load_state_dict({k: torch.tensor(v) for k, v in models.export_weights(model).items()},
                                              strict=True)
    assert not missing and not unexpected
    ids, mask = _batch(left=False, seed=1)
    assert _maxdiff(_ours(model, ids, mask), _torch_out(tm2, ids, mask), mask) <= TOL
    assert models.config_from_hf(tcfg.to_dict()) == cfg
    assert qwen2.Qwen2Config.from_hf(hf) == cfg


def test_causal_model_prefix_checkpoint_loads_quietly(pair, caplog):
    """Qwen2ForCausalLM-style keys (model. prefix, lm_head) load without warnings."""
    tm, model, cfg = pair
    tensors = {f"model.{k}": v.numpy() for k, v in tm.state_dict().items()}
    tensors["lm_head.weight"] = np.zeros((TINY["vocab_size"], TINY["hidden_size"]), np.float32)
    tensors["model.rotary_emb.inv_freq"] = np.zeros((8,), np.float32)
    with caplog.at_level(logging.WARNING):
        loaded, _ = models.load_weights(cfg, tensors)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    flat_a, flat_b = models.flat_params(model), models.flat_params(loaded)
    assert flat_a.keys() == flat_b.keys()
    assert all(np.array_equal(flat_a[k], flat_b[k]) for k in flat_a)


def test_bidirectional(pair):
    tm, model, cfg = pair
    bi_cfg = dataclasses.replace(cfg, causal=False)
    bi = models.model_from_params(bi_cfg, models.flat_params(model))
    ids, mask = _batch(left=False)
    out_bi = _ours(bi, ids, mask)
    assert np.abs(out_bi - _ours(model, ids, mask))[mask.astype(bool)].max() > 1e-2
    # token 0 of the unpadded row now depends on its last token (and causally it does not)
    ids2 = ids.copy()
    ids2[0, -1] = (ids2[0, -1] + 1) % TINY["vocab_size"]
    assert np.abs(_ours(bi, ids2, mask)[0, 0] - out_bi[0, 0]).max() > 1e-3
    assert np.abs(_ours(model, ids2, mask)[0, 0] - _ours(model, ids, mask)[0, 0]).max() == 0.0
    # transformers reference: an explicit 4D additive mask (padding only) is used as-is by Qwen2Model/Qwen3Model
    neg = torch.finfo(torch.float32).min
    mask4d = torch.where(torch.tensor(mask, dtype=torch.bool)[:, None, None, :], 0.0, neg).expand(B, 1, L, L)
    with torch.no_grad():
        ref = tm(input_ids=torch.tensor(ids), attention_mask=mask4d.contiguous()).last_hidden_state.numpy()
    diff = _maxdiff(out_bi, ref, mask)
    print(f"{cfg.model_type} bidirectional: max abs diff {diff:.3g}")
    assert diff <= TOL
    # to_hf/from_hf keep the setting (transformers' is_causal switch)
    assert bi_cfg.to_hf()["is_causal"] is False
    assert qwen2.Qwen2Config.from_hf(bi_cfg.to_hf()) == bi_cfg


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_bfloat16_close_to_float32(kind, param_dtype):
    """bfloat16 compute (and storage) against PyTorch's own bf16 model on the same weights (tests/bf16_reference.py).
    Weights ~ N(0, 0.15): with the other tests' N(0, 0.3) the model amplifies bf16 rounding so much (PyTorch's bf16
    model is 5.6 % off its float32 model) that a kernel 5 % off would hide in it."""
    from bf16_reference import assert_bf16_close, torch_bf16_out

    tm, model, cfg = _pair(kind, 0.15)
    bf_cfg = dataclasses.replace(cfg, dtype="bfloat16", param_dtype=param_dtype)
    bf = models.model_from_params(bf_cfg, models.flat_params(model))
    assert all(v.dtype == np.dtype(param_dtype) for v in models.flat_params(bf).values())
    ids, mask = _batch(left=False)
    out = bf(jnp.asarray(ids), jnp.asarray(mask))
    assert out.dtype == jnp.bfloat16
    # measured with the correct kernels: relative max 0.017 / 0.011, mean 0.011 (qwen2 / qwen3); attention scale off
    # by 5 %: max 0.044 / 0.026, mean 0.025 / 0.024
    assert_bf16_close(out, _torch_out(tm, ids, mask), torch_bf16_out(tm, input_ids=ids, attention_mask=mask), mask,
                      max_tol=0.025, mean_tol=0.017, label=f"{kind} ({param_dtype} params)")


def _loss(m, ids, mask):
    out = m(ids, mask)
    return jnp.sum(jnp.square(out) * mask[..., None])


def test_remat_same_output_and_grads():
    _, model, cfg = _pair("qwen3")  # one kind suffices (the layer loop is shared); keeps the file fast
    rm = models.model_from_params(dataclasses.replace(cfg, remat=True), models.flat_params(model))
    ids, mask = map(jnp.asarray, _batch(left=True))
    np.testing.assert_allclose(np.asarray(rm(ids, mask)), np.asarray(model(ids, mask)), atol=1e-6)
    grad = nnx.jit(nnx.value_and_grad(_loss))
    la, ga = grad(model, ids, mask)
    lb, gb = grad(rm, ids, mask)
    np.testing.assert_allclose(float(la), float(lb), rtol=1e-6)
    fa, fb = nnx.to_flat_state(ga), nnx.to_flat_state(gb)
    assert [p for p, _ in fa] == [p for p, _ in fb]
    for (p, a), (_, b) in zip(fa, fb):
        a, b = np.asarray(a[...]), np.asarray(b[...])
        assert np.isfinite(a).all(), p
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(a).max(), err_msg=str(p))


def test_dropout():
    _, model, cfg = _pair("qwen2")  # attention dropout lives in layers.attention, shared by both kinds
    dm = models.model_from_params(dataclasses.replace(cfg, attention_dropout=0.2), models.flat_params(model))
    ids, mask = map(jnp.asarray, _batch(left=False))
    det = np.asarray(dm(ids, mask))
    np.testing.assert_array_equal(det, np.asarray(model(ids, mask)))  # deterministic: dropout off
    a = np.asarray(dm(ids, mask, deterministic=False, rngs=nnx.Rngs(dropout=0)))
    b = np.asarray(dm(ids, mask, deterministic=False, rngs=nnx.Rngs(dropout=0)))
    c = np.asarray(dm(ids, mask, deterministic=False, rngs=nnx.Rngs(dropout=1)))
    assert np.abs(a - det).max() > 1e-3
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - c).max() > 1e-3


def test_config_from_hf_variants():
    base = dict(model_type="qwen2", **TINY)
    old = qwen2.Qwen2Config.from_hf({**base, "rope_theta": 1e6, "rope_scaling": None})
    new = qwen2.Qwen2Config.from_hf({**base, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})
    assert old == new and old.rope_theta == 1e6 and old.head_dim == 16 and old.attention_bias and not old.qk_norm
    assert not old.o_bias
    q3 = qwen2.Qwen2Config.from_hf({**base, "model_type": "qwen3", "head_dim": 32})
    assert q3.qk_norm and not q3.attention_bias and q3.head_dim == 32
    assert qwen2.Qwen2Config.from_hf(base, causal=False, dtype="bfloat16").causal is False
    with pytest.raises(ValueError, match="yarn"):
        qwen2.Qwen2Config.from_hf({**base, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}})
    with pytest.raises(ValueError, match="yarn"):
        qwen2.Qwen2Config.from_hf({**base, "rope_scaling": {"type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="sliding"):
        qwen2.Qwen2Config.from_hf({**base, "use_sliding_window": True})
    eos = qwen2.Qwen2Config.from_hf({**base, "eos_token_id": [1, 2]})
    hash(eos)  # hashable (usable as a static jit argument)
    assert eos.to_hf()["eos_token_id"] == [1, 2]
    assert "head_dim" not in old.to_hf()
