"""T5 / mT5 encoder: numerical parity with ``transformers.T5EncoderModel`` and the HF mapping in both directions."""

import dataclasses
import functools
import json
import logging

import numpy as np
import pytest

import runs

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from jaxembed import models  # noqa: E402
from jaxembed.models.t5 import T5Config  # noqa: E402
from jaxembed.models.t5.model import relative_position_buckets  # noqa: E402

TINY = dict(vocab_size=128, d_model=64, d_kv=16, num_heads=4, num_layers=2, d_ff=96,
            relative_attention_num_buckets=8, relative_attention_max_distance=20)
L = 40  # > max_distance: exercises the exact, logarithmic and clipped buckets
TOL = 1e-4


def _randomise_norms(module):
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "layer_norm" in name:
                p.uniform_(0.5, 1.5)


def _torch_encoder(feed_forward_proj="relu", model_type="t5", seed=0):
    cls_cfg = transformers.MT5Config if model_type == "mt5" else transformers.T5Config
    cls = transformers.MT5EncoderModel if model_type == "mt5" else transformers.T5EncoderModel
    torch.manual_seed(seed)
    tc = cls_cfg(**TINY, feed_forward_proj=feed_forward_proj)
    tm = cls(tc).eval()
    _randomise_norms(tm)
    return tc, tm


def _state_dict(tm):
    return {k: v.detach().numpy().copy() for k, v in tm.state_dict().items()}


def _batch():
    """Right-padded batch: full row, a half row, a short row."""
    rng = np.random.default_rng(0)
    mask = np.ones((3, L), np.int64)
    mask[1, 25:] = 0
    mask[2, 7:] = 0
    ids = rng.integers(2, TINY["vocab_size"], (3, L)) * mask
    return ids, mask


def _torch_out(tm, ids, mask):
    with torch.no_grad():
        return tm(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.float().numpy()


def _max_diff(a, b, mask):
    return float(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))[mask.astype(bool)].max())


_CACHE = {}


def _case(proj="relu", model_type="t5"):
    """(torch config, torch model, state dict, our config, our model, reference output), built once per case."""
    key = (proj, model_type)
    if key not in _CACHE:
        tc, tm = _torch_encoder(proj, model_type)
        sd = _state_dict(tm)
        cfg = models.config_from_hf(tc.to_dict())
        model, cfg = models.load_weights(cfg, sd)
        ids, mask = _batch()
        _CACHE[key] = (tc, tm, sd, cfg, model, _torch_out(tm, ids, mask))
    return _CACHE[key]


@pytest.mark.parametrize("proj,model_type", [("relu", "t5"), ("gated-gelu", "t5"), ("gated-silu", "t5"),
                                             ("gated-gelu", "mt5")])
def test_matches_transformers(proj, model_type):
    _, _, _, cfg, model, ref = _case(proj, model_type)
    assert cfg.model_type == model_type and cfg.num_layers == 2 and cfg.hidden_size == 64
    ids, mask = _batch()
    out = model(jnp.asarray(ids), jnp.asarray(mask))
    assert out.shape == (3, L, 64) and out.dtype == jnp.float32
    diff = _max_diff(out, ref, mask)
    print(f"{model_type}/{proj}: max abs diff {diff:.2e}")
    assert diff <= TOL


def test_jit_matches_eager():
    _, _, _, _, model, ref = _case("gated-gelu")
    ids, mask = _batch()
    out = nnx.jit(lambda m, i, a: m(i, a))(model, jnp.asarray(ids), jnp.asarray(mask))
    assert _max_diff(out, ref, mask) <= TOL


@pytest.mark.parametrize("num_buckets,max_distance", [(8, 20), (32, 128), (32, 64)])
def test_relative_position_buckets_match_hf(num_buckets, max_distance):
    from transformers.models.t5.modeling_t5 import T5Attention

    n = 700
    rel = torch.arange(n)[None, :] - torch.arange(n)[:, None]
    ref = T5Attention._relative_position_bucket(rel, bidirectional=True, num_buckets=num_buckets,
                                                max_distance=max_distance).numpy()
    ours = relative_position_buckets(n, n, num_buckets, max_distance)
    np.testing.assert_array_equal(ours, ref)
    assert ours.min() == 0 and ours.max() == num_buckets - 1


@pytest.mark.parametrize("proj", ["relu", "gated-gelu"])
def test_export_reproduces_state_dict(proj):
    _, _, sd, _, model, _ = _case(proj)
    out = models.export_weights(model)
    # state_dict() carries both the shared table and its tied alias; the import recorded both, so both come back.
    assert set(out) == set(sd)
    for k, v in sd.items():
        np.testing.assert_array_equal(out[k], v, err_msg=k)


def _save_hf(folder, hf_config, weights):
    from safetensors.numpy import save_file

    (folder / "config.json").write_text(json.dumps(hf_config))
    save_file({k: np.ascontiguousarray(v) for k, v in weights.items()}, str(folder / "model.safetensors"))


@pytest.mark.parametrize("proj", ["relu", "gated-gelu"])
def test_export_loads_in_transformers(proj, tmp_path):
    _, _, _, cfg, model, ref = _case(proj)
    _save_hf(tmp_path, cfg.to_hf(), models.export_weights(model))
    hf, info = transformers.T5EncoderModel.from_pretrained(str(tmp_path), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert hf.config.feed_forward_proj == proj and hf.config.num_layers == 2
    ids, mask = _batch()
    assert _max_diff(_torch_out(hf.eval(), ids, mask), ref, mask) <= TOL


def test_fresh_model_exports_shared_weight_and_loads_in_transformers(tmp_path):
    cfg = T5Config(**TINY, feed_forward_proj="gated-gelu", dropout_rate=0.0)
    model = models.init_model(cfg, seed=3)
    weights = models.export_weights(model)
    assert "shared.weight" in weights and "encoder.embed_tokens.weight" not in weights
    _save_hf(tmp_path, cfg.to_hf(), weights)
    hf, info = transformers.T5EncoderModel.from_pretrained(str(tmp_path), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ids, mask = _batch()
    diff = _max_diff(model(jnp.asarray(ids), jnp.asarray(mask)), _torch_out(hf.eval(), ids, mask), mask)
    assert diff <= TOL
    # and back: reimporting the saved tensors gives the same parameters
    again, _ = models.load_weights(models.config_from_hf(json.loads((tmp_path / "config.json").read_text())), weights)
    a, b = models.flat_params(model), models.flat_params(again)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_import_from_alias_key_only():
    tc, _, sd, _, _, ref = _case("relu")
    alias_only = {k: v for k, v in sd.items() if k != "shared.weight"}
    model, cfg = models.load_weights(models.config_from_hf(tc.to_dict()), alias_only)
    assert cfg.hf_embed_keys == ("encoder.embed_tokens.weight",)
    ids, mask = _batch()
    assert _max_diff(model(jnp.asarray(ids), jnp.asarray(mask)), ref, mask) <= TOL
    assert set(models.export_weights(model)) == set(alias_only)


def test_import_from_full_t5_ignores_decoder(caplog):
    torch.manual_seed(1)
    tc = transformers.T5Config(**TINY, feed_forward_proj="gated-gelu")
    full = transformers.T5ForConditionalGeneration(tc).eval()
    _randomise_norms(full)
    sd = _state_dict(full)
    assert any(k.startswith("decoder.") for k in sd) and "lm_head.weight" in sd
    with caplog.at_level(logging.WARNING, logger="jaxembed.models"):
        model, cfg = models.load_weights(models.config_from_hf(tc.to_dict()), sd, source="full-t5")
    assert not [r for r in caplog.records if r.name.startswith("jaxembed")], caplog.text
    ids, mask = _batch()
    with torch.no_grad():
        ref = full.get_encoder()(input_ids=torch.tensor(ids),
                                 attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    assert _max_diff(model(jnp.asarray(ids), jnp.asarray(mask)), ref, mask) <= TOL
    assert not any(k.startswith(("decoder.", "lm_head.")) for k in models.export_weights(model))


def test_bfloat16_compute_close():
    """bf16 compute against PyTorch's own bf16 T5 on the same weights (tests/bf16_reference.py)."""
    from bf16_reference import assert_bf16_close, torch_bf16_out

    tc, tm, sd, _, _, ref = _case("gated-gelu")
    cfg = models.config_from_hf(tc.to_dict(), dtype="bfloat16")
    model, cfg = models.load_weights(cfg, sd)
    ids, mask = _batch()
    out = model(jnp.asarray(ids), jnp.asarray(mask))
    assert out.dtype == jnp.bfloat16
    # measured with the correct kernels: relative max 0.012, mean 0.006 (attention scale off by 5 %: 0.03, 0.02)
    assert_bf16_close(out, ref, torch_bf16_out(tm, input_ids=ids, attention_mask=mask), mask, max_tol=0.02,
                      mean_tol=0.012, label="t5")


def _loss_and_grads(model, ids, mask):
    """The loss and gradients, in one program compiled with runs.fusion_emitter_options (there: why the
    remat comparison needs XLA's own CPU emitters)."""
    graphdef, state = nnx.split(model)

    @functools.partial(jax.jit, compiler_options=runs.fusion_emitter_options())
    def run(state, ids, mask):
        def loss(m):
            y = m(ids, mask)
            return jnp.sum(jnp.square(y) * mask[..., None])

        return nnx.value_and_grad(loss)(nnx.merge(graphdef, state))

    return run(state, ids, mask)


def test_remat_same_output_and_grads():
    tc, _, sd, _, model, _ = _case("gated-gelu")
    remat_model, cfg = models.load_weights(models.config_from_hf(tc.to_dict(), remat=True), sd)
    assert cfg.remat
    ids, mask = (jnp.asarray(a) for a in _batch())
    np.testing.assert_allclose(remat_model(ids, mask), model(ids, mask), atol=1e-6)
    l0, g0 = _loss_and_grads(model, ids, mask)
    l1, g1 = _loss_and_grads(remat_model, ids, mask)
    np.testing.assert_allclose(l0, l1, rtol=1e-6)
    f0 = {tuple(p): v[...] for p, v in nnx.to_flat_state(g0)}
    f1 = {tuple(p): v[...] for p, v in nnx.to_flat_state(g1)}
    assert f0.keys() == f1.keys()
    assert any(p[0] == "relative_attention_bias" for p in f0)  # the shared bias table gets a gradient
    for p in f0:
        np.testing.assert_allclose(f1[p], f0[p], rtol=1e-5, atol=1e-5, err_msg=str(p))
    assert float(jnp.abs(f0[("relative_attention_bias", "embedding")]).max()) > 0


def test_dropout_train_mode():
    _, _, _, cfg, model, _ = _case("relu")
    assert cfg.dropout_rate > 0
    ids, mask = (jnp.asarray(a) for a in _batch())
    eval_out = model(ids, mask)
    a = model(ids, mask, deterministic=False, rngs=nnx.Rngs(dropout=0))
    b = model(ids, mask, deterministic=False, rngs=nnx.Rngs(dropout=0))
    c = model(ids, mask, deterministic=False, rngs=nnx.Rngs(dropout=1))
    assert not np.allclose(a, eval_out, atol=1e-3)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c, atol=1e-3)
    np.testing.assert_array_equal(model(ids, mask), eval_out)  # eval mode unaffected


def test_config_round_trip_and_parsing():
    tc = transformers.T5Config(**TINY, feed_forward_proj="gated-gelu", dropout_rate=0.05, layer_norm_epsilon=1e-5)
    cfg = models.config_from_hf(tc.to_dict(), dtype="bfloat16")
    assert (cfg.d_model, cfg.num_heads, cfg.d_kv, cfg.d_ff) == (64, 4, 16, 96)
    assert cfg.hidden_size == 64 and cfg.num_layers == 2 and cfg.dtype == "bfloat16"
    assert cfg.is_gated_act and cfg.dense_act_fn == "gelu_new"
    hf = cfg.to_hf()
    assert hf["architectures"] == ["T5EncoderModel"] and hf["model_type"] == "t5"
    back = transformers.T5Config(**{k: v for k, v in hf.items() if k != "model_type"})
    for k in T5Config.HF_FIELDS:
        if k != "tie_word_embeddings":
            assert getattr(back, k) == getattr(cfg, k), k
    assert back.dense_act_fn == "gelu_new" and back.is_gated_act
    assert T5Config.from_hf(hf) == dataclasses.replace(cfg, dtype="float32")
    assert T5Config(feed_forward_proj="gated-silu").dense_act_fn == "silu"
    gelu = T5Config(feed_forward_proj="gelu")
    assert gelu.dense_act_fn == "gelu" and not gelu.is_gated_act
    assert T5Config(feed_forward_proj="relu").dense_act_fn == "relu"
    with pytest.raises(ValueError):
        T5Config(feed_forward_proj="fancy-gelu")
    mt5 = models.config_from_hf({"model_type": "mt5"})
    assert mt5.feed_forward_proj == "gated-gelu" and mt5.vocab_size == 250112
    assert mt5.to_hf()["architectures"] == ["MT5EncoderModel"]

