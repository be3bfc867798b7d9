"""``model.attention=pallas_flash`` (jaxembed.models.flash_dropout): the Pallas flash attention whose dropout mask
is computed inside the kernel. On the CPU it runs in Pallas interpret mode against the einsum path
(``xla_attention(heads_first=False)``, jaxembed's attention with dropout on): the hash, the mask of a block, the
outputs and the gradients of q, k, v on packed rows (segment ids), with and without dropout, causal, grouped-query
heads. ``-m gpu`` runs the compiled kernel on the accelerator against the same reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.random import threefry2x32_p

from jaxembed.errors import UserError
from jaxembed.models import attention as attn
from jaxembed.models import dropout as dr
from jaxembed.models import flash_dropout as fd

# Two packed rows of 20 slots (blocks of 8: the row is padded to 24, a text crosses each block boundary).
SEGMENTS = np.zeros((2, 20), np.int32)
SEGMENTS[0, :9], SEGMENTS[0, 9:18] = 1, 2
SEGMENTS[1, :13], SEGMENTS[1, 13:19] = 1, 2
KEY = 3


def _tokens(segments):
    """Each slot's text id (unique in the step) and position in its text, as the train step states them."""
    ids = jnp.asarray(segments)
    text = jnp.arange(ids.shape[0], dtype=jnp.int32)[:, None] * 10 + ids
    return dr.Tokens(text, attn.positions_from_segments(ids))


def _qkv(n, kv, d, dtype=jnp.float32, segments=SEGMENTS):
    rng = np.random.default_rng(0)
    b, l = segments.shape
    return tuple(jnp.asarray(rng.standard_normal((b, l, h, d)), dtype) for h in (n, kv, kv))


class _Rngs:
    def dropout(self):
        return jax.random.key(KEY)


def _loss_and_grads(fn, q, k, v, segments=SEGMENTS):
    """jit(value_and_grad) of a weighted sum of the real slots' outputs: (outputs, (dq, dk, dv))."""
    w = jnp.cos(jnp.arange(q.size, dtype=jnp.float32).reshape(q.shape)) * (jnp.asarray(segments) > 0)[..., None, None]

    def loss(q, k, v):
        out = fn(q, k, v)
        return jnp.sum(out.astype(jnp.float32) * w), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return out, grads


def _einsum_path(rate, causal, tokens):
    def fn(q, k, v):
        with dr.tokens(tokens.text, tokens.position):
            return attn.xla_attention(q, k, v, attn.Segments(jnp.asarray(SEGMENTS)), causal=causal,
                                      dropout_rate=rate, deterministic=False, rngs=_Rngs(), heads_first=False)
    return fn


def test_the_kernel_hash_is_threefry2x32_and_a_block_mask_is_the_einsum_paths():
    rng = np.random.default_rng(1)
    words = [jnp.asarray(rng.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)) for _ in range(4)]
    for a, b in zip(fd.threefry2x32(*words), threefry2x32_p.bind(*words)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    tok = _tokens(SEGMENTS)
    key = jax.random.key(KEY)
    n, (b, l) = 6, SEGMENTS.shape  # 6 heads: groups of the hash P = 2, parts 0..2
    kd = jax.random.key_data(key)
    st = round(0.7 * (1 << 16))
    block = jax.vmap(lambda h, text, pos: fd._keep(fd._head_key(kd, h, 2), text, pos, pos, st), (0, None, None))
    got, ref = jax.jit(lambda text, pos: (jax.vmap(block, (None, 0, 0))(jnp.arange(n), text, pos),
                                          dr.attention_keep_mask(key, 0.7, (b, n, l, l), dr.Tokens(text, pos))))(
        tok.text, tok.position)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))


@pytest.mark.parametrize("case", ["no_dropout_gqa", "dropout_gqa", "dropout_causal"])
def test_interpreted_kernel_equals_the_einsum_path_with_gradients(case):
    """Packed rows (segment ids) and dropout coordinates per text; grouped-query heads (4 query heads on 2 key/value
    heads) or causal; a head dimension of 6 (padded to 8 inside); outputs and gradients of q, k, v."""
    rate = 0.0 if case.startswith("no_dropout") else 0.3
    causal = case.endswith("causal")
    n, kv = (4, 2) if case.endswith("gqa") else (2, 2)
    q, k, v = _qkv(n, kv, 6)
    tok = _tokens(SEGMENTS)

    def flash(q, k, v):
        return fd.flash_attention(q, k, v, attn.Segments(jnp.asarray(SEGMENTS)), causal=causal, dropout_rate=rate,
                                  key=jax.random.key(KEY), tokens=tok, block=8, interpret=True)

    ref_out, ref_grads = _loss_and_grads(_einsum_path(rate, causal, tok), q, k, v)
    out, grads = _loss_and_grads(flash, q, k, v)
    real = SEGMENTS > 0
    assert out.shape == q.shape and np.isfinite(np.asarray(out)).all()
    np.testing.assert_allclose(np.asarray(out)[real], np.asarray(ref_out)[real], atol=2e-6)
    for g, r in zip(grads, ref_grads):
        assert g.shape == r.shape
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=5e-6)
    if rate:  # the mask is applied: without dropout the output differs
        plain, _ = _loss_and_grads(_einsum_path(0.0, causal, tok), q, k, v)
        assert float(jnp.abs(plain - out)[real].max()) > 1e-2


def test_model_attention_pallas_flash_is_allowed_with_dropout_and_routes_to_the_kernel(monkeypatch):
    kw = dict(dtype=jnp.bfloat16, head_dim=64, bias=False)
    assert attn.resolve("pallas_flash", dropout=True, **kw) == "pallas_flash"
    monkeypatch.setattr(attn, "_platform", lambda: "gpu")
    assert attn.resolve("auto", dropout=True, **kw) == "xla"  # never measured on a device: auto keeps xla
    assert attn.resolve("auto", dropout=False, **kw) == "xla"
    attn.check("pallas_flash", dtype=jnp.bfloat16, head_dim=64)
    monkeypatch.setattr(attn, "_platform", lambda: "cpu")
    with pytest.raises(UserError, match="runs on GPU only"):
        attn.check("pallas_flash", dtype=jnp.float32, head_dim=64)
    calls = []
    monkeypatch.setattr(fd, "flash_attention", lambda *a, **k: calls.append(k) or a[0])
    q, k, v = _qkv(2, 2, 8)
    attn.attention(q, k, v, jnp.asarray(SEGMENTS), implementation="pallas_flash", dropout_rate=0.1,
                   deterministic=False, rngs=_Rngs())
    assert calls[0]["dropout_rate"] == 0.1 and calls[0]["key"] is not None and calls[0]["interpret"]
    attn.attention(q, k, v, jnp.asarray(SEGMENTS), implementation="pallas_flash", dropout_rate=0.1)
    assert calls[1]["dropout_rate"] == 0.0 and calls[1]["key"] is None


def test_a_decoder_trains_alike_with_pallas_flash_and_the_einsum_path(monkeypatch):
    """A one-layer Qwen2 (causal, 4 query heads on 2 key/value heads) with attention dropout on packed rows, in a
    dropout.tokens block as the train step runs it: the interpreted kernel gives xla's outputs and parameter
    gradients (the same dropout keys are drawn in the same order)."""
    import dataclasses

    from flax import nnx

    from jaxembed import models

    cfg = models.config_from_hf(dict(model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                     attention_dropout=0.25))
    ref = models.init_model(dataclasses.replace(cfg, attention="xla"), seed=0)
    monkeypatch.setattr(attn, "_platform", lambda: "gpu")  # the kernel is built for a GPU ...
    flash = models.model_from_params(dataclasses.replace(cfg, attention="pallas_flash"), models.flat_params(ref))
    monkeypatch.undo()  # ... and runs here interpreted
    ids = jnp.asarray(np.random.default_rng(0).integers(3, 64, SEGMENTS.shape), jnp.int32)
    tok = _tokens(SEGMENTS)
    w = jnp.asarray(SEGMENTS > 0, jnp.float32)[..., None]

    def loss(model):
        with dr.tokens(tok.text, tok.position):
            out = model(ids, segment_ids=jnp.asarray(SEGMENTS), positions=tok.position, deterministic=False,
                        rngs=nnx.Rngs(dropout=5))
        return jnp.sum(jnp.sin(out) * w), out

    grad = nnx.jit(nnx.value_and_grad(loss, has_aux=True))  # one program each, not every operation eagerly
    (_, a), ga = grad(ref)
    (_, b), gb = grad(flash)
    np.testing.assert_allclose(np.asarray(b)[SEGMENTS > 0], np.asarray(a)[SEGMENTS > 0], atol=1e-5)
    for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=2e-5, atol=1e-5)  # float32 rounding


def test_a_dropout_key_of_another_prng_is_a_one_line_error():
    q, k, v = _qkv(2, 2, 8)
    with pytest.raises(UserError, match="threefry2x32.*fix:") as e:
        fd.flash_attention(q, k, v, jnp.asarray(SEGMENTS), dropout_rate=0.1, key=jax.random.key(0, impl="rbg"),
                           interpret=True)
    assert "\n" not in str(e.value)


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="the compiled Pallas (Triton) kernel")
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_compiled_kernel_on_the_gpu_equals_the_einsum_path(dtype, causal):
    """Rows of 200 slots (blocks of 64), 12 query heads on 4 key/value heads, head dimension 64, dropout 0.1."""
    segments = np.zeros((2, 200), np.int32)
    segments[0, :70], segments[0, 70:190] = 1, 2
    segments[1, :130], segments[1, 130:199] = 1, 2
    q, k, v = _qkv(12, 4, 64, dtype, segments)
    tok, seg = _tokens(segments), attn.Segments(jnp.asarray(segments))

    def ref(q, k, v):
        with dr.tokens(tok.text, tok.position):
            return attn.xla_attention(q, k, v, seg, causal=causal, dropout_rate=0.1, deterministic=False,
                                      rngs=_Rngs(), heads_first=False)

    def flash(q, k, v):
        return fd.flash_attention(q, k, v, seg, causal=causal, dropout_rate=0.1, key=jax.random.key(KEY),
                                  tokens=tok)

    # float32: Triton's dots take TensorFloat-32 inputs (relative error ~5e-4), XLA's reference full float32
    tol = 3e-2 if dtype == jnp.bfloat16 else 2e-3
    ref_out, ref_grads = _loss_and_grads(ref, q, k, v, segments)
    out, grads = _loss_and_grads(flash, q, k, v, segments)
    real = segments > 0
    np.testing.assert_allclose(np.asarray(out, np.float32)[real], np.asarray(ref_out, np.float32)[real], atol=tol)
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r, np.float32), atol=10 * tol)
