"""Rotary position embeddings (RoPE, Su et al. 2021, "RoFormer", Eq. 34) of the decoder backbones, with the
frequency scalings of transformers' ``ROPE_INIT_FUNCTIONS`` that leave cos / sin unscaled:

- ``default``: inv_freq_j = theta^(-2j / D), j = 0 .. D/2 - 1 (D = head_dim).
- ``linear`` (position interpolation, Chen et al. 2023, Eq. 1): inv_freq / factor.
- ``llama3`` (Llama 3.1 / 3.2): wavelengths 2 pi / inv_freq longer than original_max_position_embeddings /
  low_freq_factor are divided by ``factor``, those shorter than original / high_freq_factor are kept, and those in
  between are interpolated with s = (original / wavelength - low) / (high - low): (1 - s) inv / factor + s inv.
- ``dynamic`` (NTK-aware): transformers rescales theta only once a batch's length exceeds
  max_position_embeddings; at or below it the frequencies are the default ones, which is what jaxembed computes.
  ``jaxembed.loading.load`` caps the tokenizer's max_length at max_position_embeddings, so texts never reach the
  rescaled regime (a padded row longer than that, fed to the model directly, would differ from transformers).

Any other type (``yarn``, ``longrope``, ...) is a one-line ValueError naming it. Tables are computed in float32
(as transformers' rotary embeddings) and cast to the compute dtype.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

ROPE_TYPES = ("default", "linear", "dynamic", "llama3")


@dataclasses.dataclass(frozen=True)
class RopeSpec:
    """One RoPE: base ``theta``, scaling ``type`` (``ROPE_TYPES``) and its parameters (None where unused)."""

    theta: float = 10000.0
    type: str = "default"
    factor: float | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None

    def inv_freq(self, head_dim: int) -> np.ndarray:
        """The inverse frequencies [head_dim / 2], float32 (module docstring)."""
        d = head_dim
        inv = (1.0 / (np.float32(self.theta) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)))).astype(
            np.float32)
        if self.type == "linear":
            return (inv / np.float32(self.factor)).astype(np.float32)
        if self.type == "llama3":
            factor, low, high = self.factor, self.low_freq_factor, self.high_freq_factor
            old = self.original_max_position_embeddings
            wavelen = (2 * math.pi / inv).astype(np.float32)
            scaled = np.where(wavelen > old / low, inv / np.float32(factor), inv).astype(np.float32)
            s = ((old / wavelen - low) / (high - low)).astype(np.float32)
            smoothed = ((1 - s) * scaled / np.float32(factor) + s * scaled).astype(np.float32)
            medium = ~(wavelen < old / high) & ~(wavelen > old / low)
            return np.where(medium, smoothed, scaled).astype(np.float32)
        return inv  # default; dynamic at or below max_position_embeddings (module docstring)

    def to_hf(self) -> dict[str, Any]:
        """transformers 5 ``rope_parameters``."""
        d: dict[str, Any] = {"rope_type": self.type, "rope_theta": self.theta}
        for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        return d


def from_params(params: Mapping[str, Any] | None, *, theta: float | None, max_positions: int | None,
                where: str = "config.json") -> RopeSpec:
    """A RopeSpec from one rope dict (transformers 5 ``rope_parameters``, or transformers 4 ``rope_scaling``;
    None: default RoPE); ``theta``: the base when the dict has no ``rope_theta`` (None: 10000);
    ``max_positions``: llama3's original length when the dict has none (as transformers)."""
    p = dict(params or {})
    kind = p.get("rope_type", p.get("type")) or "default"
    if kind not in ROPE_TYPES:
        raise ValueError(f"{where}: rope_type={kind!r} is not supported (supported: {', '.join(ROPE_TYPES)}; "
                         "fix: a model with one of these, or a default-RoPE config)")
    if float(p.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError(f"{where}: partial_rotary_factor={p['partial_rotary_factor']} is not supported (RoPE on "
                         "the whole head only)")
    base = p.get("rope_theta", theta)
    base = 10000.0 if base is None else float(base)
    if kind == "default":
        return RopeSpec(theta=base)
    if p.get("factor") is None:
        raise ValueError(f"{where}: rope_type={kind!r} needs a 'factor'")
    if kind == "llama3":
        missing = [k for k in ("low_freq_factor", "high_freq_factor") if p.get(k) is None]
        old = p.get("original_max_position_embeddings") or max_positions
        if missing or old is None:
            need = ", ".join(missing or ["original_max_position_embeddings"])
            raise ValueError(f"{where}: rope_type='llama3' needs {need}")
        return RopeSpec(theta=base, type=kind, factor=float(p["factor"]), low_freq_factor=float(p["low_freq_factor"]),
                        high_freq_factor=float(p["high_freq_factor"]), original_max_position_embeddings=int(old))
    return RopeSpec(theta=base, type=kind, factor=float(p["factor"]))


def from_hf(hf: Mapping[str, Any], where: str = "config.json") -> RopeSpec:
    """The RoPE of a transformers 5 (``rope_parameters``) or transformers 4 (``rope_theta`` + ``rope_scaling``)
    config dict; ``rope_scaling`` wins where both are present, as in transformers."""
    params = hf.get("rope_scaling") or hf.get("rope_parameters")
    return from_params(params, theta=hf.get("rope_theta"), max_positions=hf.get("max_position_embeddings"),
                       where=where)


def rope_tables(positions: jax.Array, inv_freq: np.ndarray, dtype) -> tuple[jax.Array, jax.Array]:
    """cos, sin of shape [B or 1, L, D] for integer positions [B or 1, L] and inv_freq [D / 2], computed in
    float32 (as transformers' rotary embeddings) and cast to ``dtype``."""
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x: [B, L, N, D]; cos, sin: [B or 1, L, D] -> [B, L, N, D]. transformers' rotate_half formulation."""
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin
