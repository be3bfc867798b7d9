"""The attention interface (jaxembed.models.attention): every kernel against the XLA reference on packed rows,
and a one-line error for a kernel that cannot run. Pallas kernels run in interpret mode on CPU; the GPU checks
(``-m gpu``) run them, and cuDNN / Transformer Engine, on the accelerator. Sliding windows and logit soft-capping
(Mistral, Gemma): xla and splash against a numpy loop; the kernels without them refuse a window shorter than the
row in one line and serve a longer one; ``auto`` falls back to xla on GPU."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxembed import config as cfglib
from jaxembed import models
from jaxembed.errors import UserError
from jaxembed.models import attention as attn

# Two packed rows of 40 slots: texts of 9, 17, 6 and 30, 8 tokens, then padding.
SEGMENTS = np.zeros((2, 40), np.int32)
SEGMENTS[0, :9], SEGMENTS[0, 9:26], SEGMENTS[0, 26:32] = 1, 2, 3
SEGMENTS[1, :30], SEGMENTS[1, 30:38] = 1, 2


def _qkv(n=4, kv=2, d=16, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    b, l = SEGMENTS.shape
    q = rng.standard_normal((b, l, n, d))
    k = rng.standard_normal((b, l, kv, d))
    v = rng.standard_normal((b, l, kv, d))
    return tuple(jnp.asarray(x, dtype) for x in (q, k, v))


def _real(x):
    """Outputs at real tokens only (padding slots are finite but meaningless)."""
    return np.asarray(x, np.float32)[SEGMENTS > 0]


def _naive(q, k, v, causal, window=None, softcap=None):
    """Attention of each text alone, in numpy: logits scaled, soft-capped, then the causal / sliding-window mask
    (causal: t - s < window; bidirectional: |t - s| < window)."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    rep = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2)
    out = np.zeros_like(q)
    for b in range(q.shape[0]):
        for s in set(SEGMENTS[b]) - {0}:
            idx = np.flatnonzero(SEGMENTS[b] == s)
            logits = np.einsum("tnd,snd->nts", q[b, idx], k[b, idx]) / np.sqrt(q.shape[-1])
            if softcap is not None:
                logits = softcap * np.tanh(logits / softcap)
            d = idx[:, None] - idx[None, :]  # t - s
            keep = (d >= 0) if causal else np.ones_like(d, bool)
            if window is not None:
                keep &= np.abs(d) < window
            logits = np.where(keep, logits, -np.inf)
            p = np.exp(logits - logits.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            out[b, idx] = np.einsum("nts,snd->tnd", p, v[b, idx])
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_xla_reference_is_each_text_alone(causal):
    q, k, v = _qkv()
    out = attn.attention(q, k, v, attn.Segments(jnp.asarray(SEGMENTS)), causal=causal, implementation="xla")
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_allclose(_real(out), _naive(q, k, v, causal)[SEGMENTS > 0], atol=1e-5)


class _Rngs:
    """The ``rngs.dropout()`` the attention call draws its dropout key from."""

    def dropout(self):
        return jax.random.key(3)


@pytest.mark.parametrize("case", ["plain", "causal", "bias", "softcap", "window", "dropout", "bf16"])
def test_heads_first_xla_path_equals_the_einsum_path_with_gradients(case):
    """The CPU formulation (heads-first products, normalised after the product, its own backward, dropout mask
    drawn as the einsum path draws it) gives the einsum path's outputs and gradients of q, k, v and the bias."""
    dtype = jnp.bfloat16 if case == "bf16" else jnp.float32
    q, k, v = _qkv(dtype=dtype)
    b, l = SEGMENTS.shape
    bias = jnp.asarray(np.random.default_rng(5).standard_normal((1, 4, l, l)), jnp.float32)
    kw = {"causal": dict(causal=True), "softcap": dict(softcap=2.0), "window": dict(window=7),
          "dropout": dict(dropout_rate=0.25, deterministic=False, rngs=_Rngs())}.get(case, {})
    seg = attn.Segments(jnp.asarray(SEGMENTS))

    def loss(q, k, v, bias, heads_first):
        out = attn.xla_attention(q, k, v, seg, heads_first=heads_first, bias=bias if case == "bias" else None, **kw)
        return jnp.sum(jnp.sin(out.astype(jnp.float32)) * (jnp.asarray(SEGMENTS) > 0)[:, :, None, None])

    tol = 2e-2 if case == "bf16" else 2e-6
    for hf in (True, False):
        assert attn.xla_attention(q, k, v, seg, heads_first=hf, **kw).dtype == dtype
    np.testing.assert_allclose(_real(attn.xla_attention(q, k, v, seg, heads_first=True, **kw)),
                               _real(attn.xla_attention(q, k, v, seg, heads_first=False, **kw)), atol=tol)
    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)), static_argnums=4)  # one program per path, not op by op
    new = grad(q, k, v, bias, True)
    ref = grad(q, k, v, bias, False)
    for a, r in zip(new, ref):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(r, np.float32), atol=tol * 4)
    if case == "bias":
        assert float(jnp.abs(new[3]).max()) > 1e-3  # the bias gets a gradient (T5's is a parameter)
    if case == "dropout":  # the mask is used: dropout changes the output
        plain = attn.xla_attention(q, k, v, seg, heads_first=True)
        assert float(jnp.abs(attn.xla_attention(q, k, v, seg, heads_first=True, **kw) - plain).max()) > 1e-2
    if case in ("plain", "causal"):  # and both equal each text alone (numpy)
        np.testing.assert_allclose(_real(attn.xla_attention(q, k, v, seg, heads_first=True, **kw)),
                                   _real(_naive(q, k, v, case == "causal")), atol=1e-5)


@pytest.mark.parametrize("kernel", ["pallas", "splash"])
def test_pallas_kernels_interpreted_match_xla(kernel):
    """The GPU Triton kernel (mha with segment_ids) and TPU splash attention (SegmentIds), run in Pallas interpret
    mode on CPU, against the reference: packed rows, causal and not, grouped-query heads."""
    fn = {"pallas": attn.pallas_attention, "splash": attn.splash_attention}[kernel]
    q, k, v = _qkv()
    seg = attn.Segments(jnp.asarray(SEGMENTS))
    for causal in (False, True):
        ref = attn.xla_attention(q, k, v, seg, causal=causal)
        out = fn(q, k, v, seg, causal=causal, interpret=True)
        assert out.shape == q.shape and np.isfinite(np.asarray(out)).all()
        np.testing.assert_allclose(_real(out), _real(ref), atol=2e-5)


def test_pallas_gpu_kernel_gradient_interpreted_matches_xla():
    q, k, v = _qkv(n=2, kv=2, d=8)
    seg = attn.Segments(jnp.asarray(SEGMENTS))
    w = jnp.asarray(SEGMENTS > 0, jnp.float32)[:, :, None, None]  # real outputs only

    def loss(fn, q, k, v):
        return jnp.sum(fn(q, k, v) * w * jnp.cos(jnp.arange(8.0)))

    # each gradient one compiled program (the interpreted kernel's grid loop included), not op by op
    ref = jax.jit(jax.grad(lambda *a: loss(lambda *b: attn.xla_attention(*b, seg), *a), argnums=(0, 1, 2)))(q, k, v)
    got = jax.jit(jax.grad(lambda *a: loss(lambda *b: attn.pallas_attention(*b, seg, interpret=True), *a),
                           argnums=(0, 1, 2)))(q, k, v)
    for a, b in zip(ref, got):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=5e-5)


def test_pallas_gpu_kernel_interpreted_on_a_long_row_matches_xla_with_gradients():
    """Long rows (benchmarks/gpu part 5 packs 512-2,048 slots): a row of 256 slots, two of the Pallas GPU kernel's
    128-slot blocks, with a text across the block boundary and padding at the end; the GPU kernel in interpret
    mode, both directions, outputs and gradients against xla."""
    seg = np.zeros((1, 256), np.int32)
    seg[0, :100], seg[0, 100:190], seg[0, 190:240] = 1, 2, 3
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.standard_normal((1, 256, n, 8)), jnp.float32) for n in (2, 1, 1))
    s = attn.Segments(jnp.asarray(seg))
    w = jnp.broadcast_to(jnp.asarray(seg > 0, jnp.float32)[:, :, None, None] * jnp.cos(jnp.arange(8.0)), q.shape)

    @jax.jit(static_argnums=0)  # one compiled program per kernel and direction, not op by op
    def out_and_grads(fn):
        out, vjp = jax.vjp(fn, q, k, v)
        return (out * (w != 0),) + vjp(w)

    for causal in (False, True):
        ref = out_and_grads(lambda *a: attn.xla_attention(*a, s, causal=causal))
        got = out_and_grads(lambda *a: attn.pallas_attention(*a, s, causal=causal, interpret=True))
        for a, b in zip(got, ref):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, err_msg=f"causal={causal}")


def test_segment_runs_give_cudnn_lengths_and_offsets():
    runs = jax.jit(attn.segment_runs, static_argnums=1)  # one program per shape (as in the model), not op by op
    lengths, offsets = runs(jnp.asarray(SEGMENTS))
    np.testing.assert_array_equal(np.asarray(lengths)[0, :5], [9, 17, 6, 8, -1])
    np.testing.assert_array_equal(np.asarray(offsets)[0, :5], [0, 9, 26, 32, -1])
    np.testing.assert_array_equal(np.asarray(lengths)[1, :4], [30, 8, 2, -1])
    np.testing.assert_array_equal(np.asarray(offsets)[1, :4], [0, 30, 38, -1])
    assert offsets.shape == (2, 41) and (np.asarray(offsets)[:, -1] == -1).all()
    # a left-padded row: padding, then the text
    left = jnp.asarray([[0, 0, 0, 1, 1, 1, 1, 1]])
    l2, o2 = runs(left)
    np.testing.assert_array_equal(np.asarray(l2)[0, :3], [3, 5, -1])
    np.testing.assert_array_equal(np.asarray(o2)[0, :3], [0, 3, -1])
    np.testing.assert_array_equal(np.asarray(attn.positions_from_segments(left))[0], [0, 1, 2, 0, 1, 2, 3, 4])
    # a bound on the runs per row: the same runs, M columns (+1 for offsets, still ending in -1)
    l5, o5 = runs(jnp.asarray(SEGMENTS), 5)
    assert l5.shape == (2, 5) and o5.shape == (2, 6)
    np.testing.assert_array_equal(np.asarray(l5), np.asarray(lengths)[:, :5])
    np.testing.assert_array_equal(np.asarray(o5)[:, :5], np.asarray(offsets)[:, :5])
    assert (np.asarray(o5)[:, -1] == -1).all()


def test_auto_resolves_per_platform_and_feature():
    kw = dict(dtype=jnp.float32, head_dim=16)
    expected = {"cpu": "xla", "tpu": "splash", "gpu": "xla"}[jax.default_backend()]  # GPU: cudnn needs bf16
    assert attn.resolve("auto", bias=False, dropout=False, **kw) == expected
    assert attn.resolve("auto", bias=True, dropout=False, **kw) == "xla"
    assert attn.resolve("auto", bias=False, dropout=True, **kw) == "xla"
    with pytest.raises(UserError, match="no attention dropout.*fix: model.attention='auto'"):
        attn.resolve("pallas", bias=False, dropout=True, **kw)


def _one_line(e):
    msg = str(e.value)
    assert "\n" not in msg and "model.attention" in msg and "fix:" in msg, msg
    return msg


def test_a_kernel_that_cannot_run_is_a_one_line_error_when_the_model_is_built():
    bert = dict(model_type="bert", vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=32)
    platform = jax.default_backend()
    wrong = [(n, p) for n, p in (("cudnn", "gpu"), ("pallas", "gpu"), ("splash", "tpu")) if p != platform]
    assert wrong  # on any platform some kernel belongs elsewhere
    for name, where in wrong:
        with pytest.raises(UserError) as e:
            models.init_model(models.config_from_hf(bert, attention=name))
        assert f"runs on {where.upper()} only" in _one_line(e)
    try:
        import transformer_engine.jax  # noqa: F401
    except ImportError:
        with pytest.raises(UserError) as e:
            models.init_model(models.config_from_hf(bert, attention="te"))
        assert "Transformer Engine" in _one_line(e)
    t5 = dict(model_type="t5", vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2)
    with pytest.raises(UserError) as e:
        models.init_model(models.config_from_hf(t5, attention="pallas"))
    assert "position bias" in _one_line(e)
    with pytest.raises(UserError) as e:
        models.init_model(models.config_from_hf(bert, attention="flash"))
    assert "not valid" in str(e.value) and "xla" in str(e.value)
    models.init_model(models.config_from_hf(bert, attention="xla"))  # the reference always builds


def test_config_validates_model_attention():
    c = cfglib.default_config()
    assert c.model.attention == "auto"
    c.model.name = "x"
    c.model.attention = "flash"
    with pytest.raises(UserError, match=r"config.model.attention = 'flash' is not valid.*cudnn"):
        cfglib.validate(c)



def test_run_config_and_cli_flag_reach_the_model(tmp_path, capsys):
    """model.attention (jaxembed train) and --attention (encode / eval) build the model with that kernel: a kernel of
    another platform is refused in one line, xla builds."""
    from jaxembed import loading
    from jaxembed.cli import main
    from jaxembed.models.tiny import tiny_model_dir
    from jaxembed.train import model_kwargs

    folder = tiny_model_dir("bert")
    c = cfglib.default_config()
    c.model.attention = "xla"
    assert loading.load(folder, **model_kwargs(c)).model.config.attention == "xla"
    wrong = {"gpu": "splash", "tpu": "pallas"}.get(jax.default_backend(), "pallas")
    c.model.attention = wrong
    with pytest.raises(UserError, match=f"model.attention={wrong!r} runs on"):
        loading.load(folder, **model_kwargs(c))
    texts = tmp_path / "t.txt"
    texts.write_text("a b\nc\n")
    for cmd in (["encode", "--input", str(texts), "--out", str(tmp_path / "e.npy")], ["eval", "--tasks", "STSBenchmark"]):
        assert main([*cmd, "--model", str(folder), "--attention", wrong]) == 2
        assert f"model.attention={wrong!r} runs on" in capsys.readouterr().err
    assert main(["encode", "--input", str(texts), "--out", str(tmp_path / "e.npy"), "--model", str(folder),
                 "--attention", "xla"]) == 0
    assert np.load(tmp_path / "e.npy").shape[0] == 2


# ------------------------------------------------------------------------------------------ on the accelerator


def _gpu_case(name, dtype):
    q, k, v = _qkv(n=4, kv=2, d=64, dtype=dtype)
    seg = attn.Segments(jnp.asarray(SEGMENTS), attn.positions_from_segments(jnp.asarray(SEGMENTS)))
    # float32: Triton's dots in the Pallas kernel take TensorFloat-32 inputs (10-bit mantissa, relative error
    # ~5e-4: 7.7e-4 seen on an H200), where the XLA reference multiplies in full float32
    tol = (2e-3 if name == "pallas" else 2e-5) if dtype == jnp.float32 else 2e-2
    for causal in (False, True):
        ref = attn.attention(q, k, v, seg, causal=causal, implementation="xla")
        out = jax.jit(lambda q, k, v: attn.attention(q, k, v, seg, causal=causal, implementation=name))(q, k, v)
        np.testing.assert_allclose(_real(out), _real(ref), atol=tol)

        def loss(impl, q, k, v):
            y = attn.attention(q, k, v, seg, causal=causal, implementation=impl).astype(jnp.float32)
            return jnp.sum(jnp.where(jnp.asarray(SEGMENTS > 0)[:, :, None, None], y, 0.0) * jnp.sin(jnp.arange(64.0)))

        g_ref = jax.grad(loss, argnums=(1, 2, 3))("xla", q, k, v)
        g = jax.jit(jax.grad(loss, argnums=(1, 2, 3)), static_argnums=0)(name, q, k, v)
        for a, b in zip(g_ref, g):
            np.testing.assert_allclose(np.asarray(b, np.float32), np.asarray(a, np.float32), atol=10 * tol)


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="CUDA GPU kernels")
@pytest.mark.parametrize("name,dtype", [("cudnn", jnp.bfloat16), ("pallas", jnp.float32), ("pallas", jnp.bfloat16)])
def test_gpu_kernels_match_xla(name, dtype):
    if name == "cudnn" and attn._cudnn_ok(dtype, 64) is not None:
        with pytest.raises(UserError):
            attn.check("cudnn", dtype=dtype, head_dim=64)
        return
    _gpu_case(name, dtype)


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="CUDA GPU kernels")
def test_transformer_engine_matches_xla_or_says_it_is_missing():
    try:
        import transformer_engine.jax  # noqa: F401
    except ImportError:
        with pytest.raises(UserError) as e:
            attn.check("te", dtype=jnp.bfloat16, head_dim=64)
        assert "pip install" in _one_line(e)
        return
    _gpu_case("te", jnp.bfloat16)


@pytest.mark.tpu
def test_splash_on_tpu_matches_xla():
    _gpu_case("splash", jnp.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["cudnn", "pallas"])
def test_fused_kernel_packed_model_matches_xla_on_the_accelerator(kernel):
    """A tiny BERT on packed rows with a GPU kernel against the XLA reference (what auto runs on GPU), bf16."""
    cfg = models.config_from_hf(dict(model_type="bert", vocab_size=128, hidden_size=128, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=256), dtype="bfloat16")
    ref_model = models.init_model(dataclasses.replace(cfg, attention="xla"), seed=0)
    auto_model = models.model_from_params(dataclasses.replace(cfg, attention=kernel), models.flat_params(ref_model))
    ids = jnp.asarray(np.random.default_rng(0).integers(3, 128, SEGMENTS.shape), jnp.int32)
    pos = attn.positions_from_segments(jnp.asarray(SEGMENTS))
    a = ref_model(ids, segment_ids=jnp.asarray(SEGMENTS), positions=pos)
    b = auto_model(ids, segment_ids=jnp.asarray(SEGMENTS), positions=pos)
    np.testing.assert_allclose(_real(b), _real(a), atol=5e-2)


# ------------------------------------------------------------------------- sliding window, logit soft-capping

WINDOW, CAP = 5, 1.0


@pytest.mark.parametrize("causal", [True, False])
def test_xla_window_and_softcap_are_each_text_alone(causal):
    q, k, v = _qkv()
    seg = attn.Segments(jnp.asarray(SEGMENTS))
    plain = _naive(q, k, v, causal)[SEGMENTS > 0]
    for window, softcap in ((WINDOW, None), (None, CAP), (WINDOW, CAP)):
        out = attn.attention(q, k, v, seg, causal=causal, window=window, softcap=softcap, implementation="xla")
        ref = _naive(q, k, v, causal, window, softcap)[SEGMENTS > 0]
        np.testing.assert_allclose(_real(out), ref, atol=2e-5, err_msg=f"window={window} softcap={softcap}")
        assert np.abs(ref - plain).max() > 1e-2  # each setting changes the result
    # a window as long as the row is no window
    full = attn.attention(q, k, v, seg, causal=causal, window=SEGMENTS.shape[1], implementation="xla")
    np.testing.assert_allclose(_real(full), plain, atol=2e-5)


def test_splash_window_and_softcap_interpreted_match_the_reference():
    q, k, v = _qkv()
    seg = attn.Segments(jnp.asarray(SEGMENTS))
    for causal in (True, False):
        out = attn.splash_attention(q, k, v, seg, causal=causal, window=WINDOW, softcap=CAP, interpret=True)
        np.testing.assert_allclose(_real(out), _naive(q, k, v, causal, WINDOW, CAP)[SEGMENTS > 0], atol=5e-5)


def test_kernels_without_window_or_softcap_refuse_in_one_line(monkeypatch):
    kw = dict(dtype=jnp.bfloat16, head_dim=64, bias=False, dropout=False)
    for name in ("cudnn", "pallas", "te"):
        with pytest.raises(UserError) as e:
            attn.resolve(name, window=True, **kw)  # when the step is traced (the window vs the row length)
        assert "sliding-window" in _one_line(e)
        with pytest.raises(UserError) as e:
            attn.check(name, dtype=jnp.bfloat16, head_dim=64, softcap=True)  # when the model is built
        assert "soft-capping" in _one_line(e)
    assert attn.resolve("splash", window=True, softcap=True, **kw) == "splash"
    # auto on a Hopper GPU: xla (cuDNN's packed layout was 27x slower on an H200: the module docstring), on a TPU
    # splash, with its window and soft-capping
    monkeypatch.setattr(attn, "_platform", lambda: "gpu")
    monkeypatch.setattr(attn, "_cudnn_ok", lambda dtype, head_dim: None)
    assert attn.resolve("auto", **kw) == attn.resolve("auto", window=True, softcap=True, **kw) == "xla"
    monkeypatch.setattr(attn, "_platform", lambda: "tpu")
    assert attn.resolve("auto", window=True, softcap=True, **kw) == "splash"


def test_a_window_as_long_as_the_row_reaches_any_kernel(monkeypatch):
    """Mistral's 4096-token window on 512-token rows: the fused kernel runs (no window), nothing refuses."""
    q, k, v = _qkv()
    calls = []

    def fake_pallas(q, k, v, seg, *, causal=False, scale=None):
        calls.append(causal)
        return attn.xla_attention(q, k, v, seg, causal=causal, scale=scale)

    monkeypatch.setattr(attn, "pallas_attention", fake_pallas)
    seg = attn.Segments(jnp.asarray(SEGMENTS))
    attn.attention(q, k, v, seg, causal=True, window=4096, implementation="pallas")
    assert calls == [True]
    with pytest.raises(UserError, match="sliding-window"):
        attn.attention(q, k, v, seg, causal=True, window=WINDOW, implementation="pallas")
