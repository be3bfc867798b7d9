"""Sliding-window attention and attention logit soft-capping in the attention interface
(jaxembed.models.attention): the XLA reference and TPU splash attention (Pallas interpret mode on CPU) against a
numpy loop over each text alone; the kernels without them refuse a window shorter than the row (one line), serve
one at least as long; ``auto`` falls back to xla on GPU."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxembed.errors import UserError
from jaxembed.models import attention as attn

# Two packed rows of 40 slots: texts of 9, 17, 6 and 30, 8 tokens, then padding.
SEGMENTS = np.zeros((2, 40), np.int32)
SEGMENTS[0, :9], SEGMENTS[0, 9:26], SEGMENTS[0, 26:32] = 1, 2, 3
SEGMENTS[1, :30], SEGMENTS[1, 30:38] = 1, 2
WINDOW, CAP = 5, 1.5


def _qkv(n=4, kv=2, d=16, seed=0):
    rng = np.random.default_rng(seed)
    b, l = SEGMENTS.shape
    return tuple(jnp.asarray(2.0 * rng.standard_normal((b, l, h, d)), jnp.float32) for h in (n, kv, kv))


def _naive(q, k, v, causal, window=None, softcap=None):
    """Attention of each text alone, float64: logits scaled, soft-capped, then the causal / window mask."""
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
            out[b, idx] = np.einsum("nts,snd->tnd", p / p.sum(-1, keepdims=True), v[b, idx])
    return out[SEGMENTS > 0]


def _real(x):
    return np.asarray(x, np.float32)[SEGMENTS > 0]


@pytest.mark.parametrize("causal", [True, False])
def test_xla_window_and_softcap_are_each_text_alone(causal):
    q, k, v = _qkv()
    seg = attn.Segments(jnp.asarray(SEGMENTS))
    for window, softcap in ((WINDOW, None), (None, CAP), (WINDOW, CAP)):
        out = attn.attention(q, k, v, seg, causal=causal, window=window, softcap=softcap, implementation="xla")
        ref = _naive(q, k, v, causal, window, softcap)
        np.testing.assert_allclose(_real(out), ref, atol=2e-5, err_msg=f"window={window} softcap={softcap}")
        assert np.abs(ref - _naive(q, k, v, causal)).max() > 1e-2  # each setting changes the result
    # a window as long as the row is no window
    full = attn.attention(q, k, v, seg, causal=causal, window=SEGMENTS.shape[1], implementation="xla")
    np.testing.assert_allclose(_real(full), _naive(q, k, v, causal), atol=2e-5)


def test_splash_window_and_softcap_interpreted_match_the_reference():
    q, k, v = _qkv()
    seg = attn.Segments(jnp.asarray(SEGMENTS))
    for causal in (True, False):
        out = attn.splash_attention(q, k, v, seg, causal=causal, window=WINDOW, softcap=CAP, interpret=True)
        np.testing.assert_allclose(_real(out), _naive(q, k, v, causal, WINDOW, CAP), atol=5e-5)


def _one_line(e):
    msg = str(e.value)
    assert "\n" not in msg and "model.attention" in msg and "fix:" in msg, msg
    return msg


def test_kernels_without_window_or_softcap_refuse_in_one_line(monkeypatch):
    kw = dict(dtype=jnp.bfloat16, head_dim=64, bias=False, dropout=False)
    for name in ("cudnn", "pallas", "te"):
        with pytest.raises(UserError) as e:
            attn.resolve(name, window=True, **kw)
        assert "sliding-window" in _one_line(e)
        with pytest.raises(UserError) as e:
            attn.check(name, dtype=jnp.bfloat16, head_dim=64, softcap=True)  # when the model is built
        assert "soft-capping" in _one_line(e)
    assert attn.resolve("splash", window=True, softcap=True, **kw) == "splash"
    # auto on a Hopper GPU: cudnn, but xla for a window shorter than the row or soft-capping
    monkeypatch.setattr(attn, "_platform", lambda: "gpu")
    monkeypatch.setattr(attn, "_cudnn_ok", lambda dtype, head_dim: None)
    assert attn.resolve("auto", **kw) == "cudnn"
    assert attn.resolve("auto", window=True, **kw) == attn.resolve("auto", softcap=True, **kw) == "xla"


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
