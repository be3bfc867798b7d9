"""An independent hand count of a training step's FLOPs (what jaxembed.flops computes for MFU), written op by op
from the architectures' hf configs: one multiply-add = 2 FLOPs, a matrix product [m, k] x [k, n] = 2 m k n."""

from __future__ import annotations


def _matmul(m: int, k: int, n: int) -> int:
    return 2 * m * k * n


def layer_forward_flops(hf: dict, seq: int) -> int:
    """One transformer layer on one sequence of ``seq`` tokens (norms, softmax, activations and biases not
    counted: they are O(seq x hidden), not matrix products)."""
    t = hf["model_type"]
    if t == "bert":
        h, ff, heads = hf["hidden_size"], hf["intermediate_size"], hf["num_attention_heads"]
        q = kv = h
        ff_mats = [(h, ff), (ff, h)]
    elif t == "qwen2":
        h, ff, heads = hf["hidden_size"], hf["intermediate_size"], hf["num_attention_heads"]
        hd = h // heads
        q, kv = heads * hd, hf["num_key_value_heads"] * hd
        ff_mats = [(h, ff), (h, ff), (ff, h)]  # gate, up, down (SwiGLU)
    elif t == "t5":
        h, ff, heads = hf["d_model"], hf["d_ff"], hf["num_heads"]
        q = kv = heads * hf["d_kv"]
        gated = hf.get("feed_forward_proj", "relu").startswith("gated")
        ff_mats = [(h, ff), (h, ff), (ff, h)] if gated else [(h, ff), (ff, h)]
    else:
        raise ValueError(t)
    proj = _matmul(seq, h, q) + 2 * _matmul(seq, h, kv) + _matmul(seq, q, h)   # Q, K, V, output
    head_dim = q // heads
    attn = heads * (_matmul(seq, head_dim, seq) + _matmul(seq, seq, head_dim))  # Q K^T and A V, every head
    ffn = sum(_matmul(seq, a, b) for a, b in ff_mats)
    return proj + attn + ffn


def train_step_flops(hf: dict, q_rows: int, q_len: int, d_rows: int, d_len: int, dim: int,
                     gradcache: bool, n_queries: int | None = None, n_candidates: int | None = None) -> int:
    """Forward of every query and document row, the backward at twice the forward (one product for the input
    gradient, one for the weight gradient, per forward product), the gradient cache's second forward; plus the
    [n_queries, n_candidates] similarity: forward and its two gradient products. The rows are the computed rows:
    one text each when padded (the default: n_queries = q_rows, n_candidates = d_rows), several when packed."""
    layers = hf.get("num_hidden_layers", hf.get("num_layers"))
    forward = layers * (q_rows * layer_forward_flops(hf, q_len) + d_rows * layer_forward_flops(hf, d_len))
    sim = _matmul(q_rows if n_queries is None else n_queries, dim, d_rows if n_candidates is None else n_candidates)
    return (4 if gradcache else 3) * forward + 3 * sim


def computed_rows(b: dict) -> tuple[int, int, int, int]:
    """(query rows, their length, candidate rows, their length) a host batch makes the step compute: padded texts,
    packed rows of queries and of candidates, or one pack of both (counted on the query side)."""
    if "pack_input_ids" in b:
        r, l = b["pack_input_ids"].shape
        return r, l, 0, l
    q = b["query_pack_input_ids" if "query_pack_input_ids" in b else "query_input_ids"].shape
    d = b["doc_pack_input_ids" if "doc_pack_input_ids" in b else "doc_input_ids"].shape
    return q[0], q[1], d[0], d[1]
