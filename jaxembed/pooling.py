"""Pooling of token states into one vector per text, L2 normalisation and Matryoshka truncation.

Pure functions on arrays, computed in float32. Modes follow sentence-transformers' ``Pooling`` module:
``mean``, ``cls``, ``lasttoken``, ``max``, ``mean_sqrt_len``; ``mean`` can exclude the instruction (prompt)
tokens as INSTRUCTOR does and as sentence-transformers does with ``include_prompt=False``.

``pool`` works on padded rows [B, L, H] (one text per row); ``pool_packed`` on packed rows (several texts per row,
``jaxembed.packing``), per segment, returning [N, H] in the pack's text order with the same values.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxembed.choices import POOLING_MODES as MODES


def first_token_index(attention_mask: jax.Array) -> jax.Array:
    """attention_mask: [B, L] -> [B] index of the first real token (0 with right padding)."""
    return jnp.argmax(attention_mask > 0, axis=1)


def content_mask(attention_mask: jax.Array, prompt_lengths: jax.Array | None) -> jax.Array:
    """attention_mask: [B, L] (1 = token; right or left padding); prompt_lengths: [B] number of prompt tokens at
    the start of each text to exclude, or None. -> [B, L] float32 mask of the tokens to pool over.

    The prompt starts at the first real token, so with left padding the padding and then the prompt are skipped
    (as sentence-transformers' Pooling does)."""
    m = attention_mask.astype(jnp.float32)
    if prompt_lengths is not None:
        pos = jnp.arange(m.shape[1])[None, :]
        start = first_token_index(attention_mask) + prompt_lengths
        m = m * (pos >= start[:, None]).astype(jnp.float32)
    return m


def mean_pool(hidden: jax.Array, mask: jax.Array) -> jax.Array:
    """hidden: [B, L, H], mask: [B, L] -> [B, H] mean over masked tokens (clamped count >= 1e-9 like ST)."""
    m = mask.astype(jnp.float32)[..., None]
    s = jnp.sum(hidden.astype(jnp.float32) * m, axis=1)
    return s / jnp.maximum(jnp.sum(m, axis=1), 1e-9)


def mean_sqrt_len_pool(hidden: jax.Array, mask: jax.Array) -> jax.Array:
    """hidden: [B, L, H], mask: [B, L] -> [B, H] sum / sqrt(count)."""
    m = mask.astype(jnp.float32)[..., None]
    s = jnp.sum(hidden.astype(jnp.float32) * m, axis=1)
    return s / jnp.sqrt(jnp.maximum(jnp.sum(m, axis=1), 1e-9))


def max_pool(hidden: jax.Array, mask: jax.Array) -> jax.Array:
    """hidden: [B, L, H], mask: [B, L] -> [B, H] max over masked tokens (padding set to -1e9 like ST)."""
    h = hidden.astype(jnp.float32)
    return jnp.max(jnp.where(mask[..., None] > 0, h, -1e9), axis=1)


def cls_pool(hidden: jax.Array, attention_mask: jax.Array) -> jax.Array:
    """hidden: [B, L, H], attention_mask: [B, L] -> [B, H], the first real token (position 0 with right padding,
    after the padding with left padding)."""
    idx = first_token_index(attention_mask)
    return jnp.take_along_axis(hidden, idx[:, None, None], axis=1)[:, 0].astype(jnp.float32)


def last_token_index(attention_mask: jax.Array) -> jax.Array:
    """attention_mask: [B, L] -> [B] index of the last real token; correct for right and for left padding."""
    l = attention_mask.shape[1]
    rev_first = jnp.argmax(attention_mask[:, ::-1] > 0, axis=1)
    return l - 1 - rev_first


def last_token_pool(hidden: jax.Array, attention_mask: jax.Array) -> jax.Array:
    """hidden: [B, L, H], attention_mask: [B, L] -> [B, H], the state of the last real token."""
    idx = last_token_index(attention_mask)
    return jnp.take_along_axis(hidden, idx[:, None, None], axis=1)[:, 0].astype(jnp.float32)


def pool(mode: str, hidden: jax.Array, attention_mask: jax.Array,
         prompt_lengths: jax.Array | None = None) -> jax.Array:
    """Pool token states [B, L, H] into [B, H]. ``prompt_lengths`` ([B]) excludes leading instruction tokens
    from mean / max / mean_sqrt_len pooling (None = include them)."""
    if mode == "cls":
        return cls_pool(hidden, attention_mask)
    if mode == "lasttoken":
        return last_token_pool(hidden, attention_mask)
    m = content_mask(attention_mask, prompt_lengths)
    if mode == "mean":
        return mean_pool(hidden, m)
    if mode == "max":
        return max_pool(hidden, m)
    if mode == "mean_sqrt_len":
        return mean_sqrt_len_pool(hidden, m)
    raise ValueError(f"unknown pooling mode {mode!r}; allowed: {', '.join(MODES)}")


def pool_packed(mode: str, hidden: jax.Array, token_text: jax.Array, positions: jax.Array, text_row: jax.Array,
                text_start: jax.Array, text_len: jax.Array, text_prompt: jax.Array | None = None) -> jax.Array:
    """Pool packed rows per text (``jaxembed.packing`` layout): hidden [R, L, H]; token_text [R, L] (the text of
    each slot, -1 = padding); positions [R, L] (within the text); text_row, text_start, text_len [N];
    text_prompt [N] leading instruction tokens to exclude from mean / max / mean_sqrt_len (None = include them).
    -> [N, H] float32, equal to ``pool`` on each text's padded row.

    mean / mean_sqrt_len / max: ``jax.ops.segment_sum`` / ``segment_max`` over the slots of each text (padding and
    excluded prompt tokens go to a discarded extra segment); a text without pooled tokens gets 0 (mean) or -1e9
    (max), as in ``pool``. cls / lasttoken: the text's first / last slot."""
    n = text_row.shape[0]
    r, l, h = hidden.shape
    if mode in ("cls", "lasttoken"):
        col = text_start if mode == "cls" else text_start + jnp.maximum(text_len - 1, 0)
        return hidden[text_row, jnp.minimum(col, l - 1)].astype(jnp.float32)
    if mode not in MODES:
        raise ValueError(f"unknown pooling mode {mode!r}; allowed: {', '.join(MODES)}")
    tok = token_text.reshape(-1)
    real = tok >= 0
    content = real
    if text_prompt is not None:
        content = real & (positions.reshape(-1) >= text_prompt[jnp.where(real, tok, 0)])
    seg = jnp.where(content, tok, n)  # n: the discarded segment
    x = hidden.reshape(r * l, h).astype(jnp.float32)
    if mode == "max":
        # as pool: excluded prompt tokens count as -1e9 (only a text with no pooled token ends at -1e9)
        y = jnp.where(content[:, None], x, -1e9)
        m = jax.ops.segment_max(y, jnp.where(real, tok, n), num_segments=n + 1)[:n]
        return jnp.where((text_len > 0)[:, None], m, -1e9)
    s = jax.ops.segment_sum(jnp.where(content[:, None], x, 0.0), seg, num_segments=n + 1)[:n]
    count = jax.ops.segment_sum(content.astype(jnp.float32), seg, num_segments=n + 1)[:n, None]
    if mode == "mean":
        return s / jnp.maximum(count, 1e-9)
    return s / jnp.sqrt(jnp.maximum(count, 1e-9))  # mean_sqrt_len


def l2_normalize(x: jax.Array, eps: float = 1e-12) -> jax.Array:
    """x: [..., D] -> x / max(||x||, eps) (torch.nn.functional.normalize). The norm is sqrt(max(sum x^2, eps^2)):
    the same value, and a finite gradient at x = 0 (a text with nothing to pool) where jnp.linalg.norm's is NaN."""
    n = jnp.sqrt(jnp.maximum(jnp.sum(jnp.square(x), axis=-1, keepdims=True), eps * eps))
    return x / n


def matryoshka(x: jax.Array, dim: int | None, normalize: bool = True) -> jax.Array:
    """Keep the first ``dim`` dimensions of x [..., D] (Matryoshka truncation), re-normalised when asked."""
    if dim is None or dim >= x.shape[-1]:
        return l2_normalize(x) if normalize else x
    if dim <= 0:
        raise ValueError(f"Matryoshka dimension must be positive, got {dim}")
    y = x[..., :dim]
    return l2_normalize(y) if normalize else y
