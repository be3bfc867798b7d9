"""Analytic FLOP counts for MFU (model FLOPs utilisation) estimates.

Per token, a transformer layer's forward pass costs 2 FLOPs per matrix parameter (one multiply-add) plus the
attention products (QK^T and AV: 2 x 2 x seq x heads x head_dim). A training step costs 3x forward (forward +
backward), and the gradient cache adds one more forward pass (the recomputation). Each architecture declares its
matrix parameters and attention width in its folder (``jaxembed.models.architecture``: ``matrix_params``,
``attention_width``).
"""

from __future__ import annotations

import jax

from jaxembed import models

# Dense bf16 peak FLOP/s per device (datasheets); None where unknown (CPU): MFU is then not reported.
# First match wins (a device kind contains the key): the PCIe H100 before the SXM one.
PEAK_FLOPS = {
    "H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12,
    "V100": 125e12,
    "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12, "TPU v6 lite": 918e12,
}
def layer_matrix_params(config) -> int:
    """Weights of the matrices of all layers (embeddings excluded: a lookup costs no FLOPs)."""
    return models.spec_for(config.model_type).matrix_params(config)


def attention_width(config) -> int:
    """Heads x head dimension of the attention products."""
    return models.spec_for(config.model_type).attention_width(config)


def forward_flops(config, rows: int, seq_len: int) -> float:
    """Forward FLOPs of ``rows`` sequences padded to ``seq_len`` tokens."""
    tokens = rows * seq_len
    return 2.0 * layer_matrix_params(config) * tokens + 4.0 * config.num_layers * tokens * seq_len * \
        attention_width(config)


def train_step_flops(config, q_rows: int, q_len: int, d_rows: int, d_len: int, emb_dim: int,
                     gradcache: bool) -> float:
    """FLOPs of one training step on the global batch: encoder forward x (3, or 4 with the gradient cache) +
    the similarity matrix (forward and two gradient products)."""
    enc = forward_flops(config, q_rows, q_len) + forward_flops(config, d_rows, d_len)
    return enc * (4.0 if gradcache else 3.0) + 3 * 2.0 * q_rows * d_rows * emb_dim


def peak_flops_for(kind: str) -> float | None:
    """The dense bf16 peak FLOP/s of a device kind (``jax.Device.device_kind``, e.g. 'NVIDIA H100 80GB HBM3'),
    None when the table has no entry for it (CPU)."""
    for name, v in PEAK_FLOPS.items():
        if name.lower() in kind.lower():
            return v
    return None


def peak_flops_per_device() -> float | None:
    return peak_flops_for(jax.devices()[0].device_kind)


def device_memory_peak_gib() -> float | None:
    """The peak device memory this process has allocated on its first local device (GiB, the allocator's
    ``peak_bytes_in_use``), None where the backend keeps no such count (CPU)."""
    stats = jax.local_devices()[0].memory_stats()
    if not stats or "peak_bytes_in_use" not in stats:
        return None
    return stats["peak_bytes_in_use"] / 2**30
