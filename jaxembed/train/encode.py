"""The trainer's encoder: a batch's queries and candidates -> embeddings [B, D] and [B*K, D] in the plan's order,
from padded or packed rows (jaxembed.data.pipeline; docs/design.md, Architecture), with or without the gradient cache.

Padded: ``EmbeddingModel.__call__`` on the [B, L] rows (``gradcache.encode_chunked`` for the cache).

Packed: a pack per side holds S shards (one per device along the mesh's batch axes) of R rows of L slots, the
indices of shard s local to it (``jaxembed.packing.stack``). The backbone runs on all S*R rows as one batch under
jit (its parameters sharded as configured, FSDP included, the rows split over the devices); what reads the local
indices runs per shard with ``jax.shard_map`` (``per_shard``): MoTE's per-text expert -> per-token expert, and the
pooling (``pooling.pool_packed``). So every gather stays on its device (the rows of shard s are device s's) and
no activation crosses devices (tests/multidevice/test_packed_train.py reads the compiled program). The Dense head
and the normalisation run on the pooled [S*N, H] (``EmbeddingModel.head_forward``). Text t of shard s is text
s*N + t of the batch: the queries in the plan's row order, the candidates row-major over K.

With the gradient cache, each shard's rows are split into n strided sub-batches (rows k, k + n, ... of every
shard: sub-batch k holds R/n rows of every device, so no sub-batch lives on one device), encoded one at a time
under ``gradcache.pool_packed_chunked``; a text belongs to the sub-batch of its row.

Dropout (jaxembed.models.dropout): one key per step for both sides, and every text of the step a global id, its
index in the plan's batch (query i: i; candidate j, row-major over K: B + j), so each text's masks depend on the
step, its id and its positions only: a padded row, a packed row on any device, any sub-batch of the gradient cache
(each draws from the same key) give it the same masks.

Equal to the padded path (float32, dropout on and off): tests/test_packed_train.py (the loss and every gradient
of the train step, with the gradient cache, MoTE mixed-expert batches) and the 8-device tests.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, PartitionSpec as P

from jaxembed import pooling
from jaxembed.train import gradcache
from jaxembed.data.pipeline import sub_batches
from jaxembed.models import dropout
from jaxembed.parallel import BATCH_AXES

PACK_ROW_KEYS = ("input_ids", "segment_ids", "positions", "token_text")
PACK_TEXT_KEYS = ("text_row", "text_start", "text_len", "text_prompt")


def batch_axes(mesh: Mesh | None) -> tuple[str, ...]:
    """The mesh axes a batch's rows are split over (as ``parallel.host_local_to_global``)."""
    if mesh is None:
        return ()
    return BATCH_AXES if set(BATCH_AXES) <= set(mesh.axis_names) else tuple(mesh.axis_names)


def row_shards(mesh: Mesh | None) -> int:
    """Row shards of a batch on ``mesh``: the devices along its batch axes (1 without a mesh)."""
    if mesh is None:
        return 1
    n = 1
    for a in batch_axes(mesh):
        n *= mesh.shape[a]
    return n


def per_shard(fn: Callable, mesh: Mesh | None, shards: int = 1) -> Callable:
    """``fn`` on each shard's block of its arguments (every argument's leading axis split over the batch axes),
    results concatenated along the leading axis: ``jax.shard_map`` over the mesh's batch axes; without a mesh,
    ``shards`` equal blocks under ``jax.vmap`` (one device holding several shards, e.g. in tests)."""
    if mesh is not None:
        spec = P(batch_axes(mesh))
        return jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
    if shards == 1:
        return fn

    def blocks(*args):
        out = jax.vmap(fn)(*(a.reshape((shards, -1) + a.shape[1:]) for a in args))
        return out.reshape((-1,) + out.shape[2:])

    return blocks


def is_packed(batch: dict) -> bool:
    return "pack_input_ids" in batch or "query_pack_input_ids" in batch


def pack_of(batch: dict, name: str) -> tuple[dict, dict]:
    """(row arrays [S*R, L], text arrays [S*N]) of the pack ``name`` ('pack', or 'query_pack' / 'doc_pack')."""
    rows = {k: batch[f"{name}_{k}"] for k in PACK_ROW_KEYS}
    texts = {k: batch[f"{name}_{k}"] for k in PACK_TEXT_KEYS}
    return rows, texts


def join_shards(q: jax.Array, d: jax.Array, shards: int) -> jax.Array:
    """Per-text values of the queries [B, ...] and the candidates [B*K, ...] in a combined pack's text order: per
    shard, its queries then its candidates -> [B*(1+K), ...] (a reshape along the sharded axis: no
    communication)."""
    q = q.reshape((shards, -1) + q.shape[1:])
    d = d.reshape((shards, -1) + d.shape[1:])
    j = jnp.concatenate([q, d], axis=1)
    return j.reshape((-1,) + j.shape[2:])


def split_shards(x: jax.Array, shards: int, queries: int) -> tuple[jax.Array, jax.Array]:
    """The inverse of ``join_shards``: [B*(1+K), ...] -> (queries [B, ...], candidates [B*K, ...])."""
    x = x.reshape((shards, -1) + x.shape[1:])
    q = queries // shards
    return x[:, :q].reshape((queries,) + x.shape[2:]), x[:, q:].reshape((-1,) + x.shape[2:])


def token_experts(token_text: jax.Array, text_experts: jax.Array, mesh: Mesh | None) -> jax.Array:
    """MoTE: the expert of each slot [S*R, L] from the expert of each text [S*N] (local indices; -1 on padding)."""
    def local(tt, ex):
        return jnp.where(tt >= 0, ex[jnp.maximum(tt, 0)], -1)

    return per_shard(local, mesh)(token_text, text_experts.astype(jnp.int32))


def token_ids(token_text: jax.Array, text_ids: jax.Array, mesh: Mesh | None) -> jax.Array:
    """The global id of each slot's text [S*R, L] from the global id of each text [S*N] (``token_text``: local
    indices; -1 on padding)."""
    def local(tt, ids):
        return jnp.where(tt >= 0, ids[jnp.maximum(tt, 0)], -1)

    return per_shard(local, mesh)(token_text, text_ids.astype(jnp.int32))


def pool_rows(model, rows: dict, texts: dict, *, mesh: Mesh | None, experts=None, deterministic: bool = True,
              rngs: nnx.Rngs | None = None, text_ids: jax.Array | None = None) -> jax.Array:
    """Backbone on packed rows [S*R, L], pooled per text per shard -> [S*N, H] float32 (before the Dense head).
    experts: None, one expert for the call (a scalar), or one per slot [S*R, L] (``token_experts``); text_ids: the
    global text id of each slot [S*R, L] (``token_ids``) that the dropout masks follow (needed with dropout)."""
    with dropout.tokens(text_ids, rows["positions"]) if text_ids is not None else contextlib.nullcontext():
        hidden = model.backbone(rows["input_ids"], None, None, deterministic=deterministic, rngs=rngs,
                                experts=experts, segment_ids=rows["segment_ids"], positions=rows["positions"])
    mode = model.head.pooling
    keep_prompt = model.head.include_prompt

    def local(h, token_text, positions, text_row, text_start, text_len, text_prompt):
        return pooling.pool_packed(mode, h, token_text, positions, text_row, text_start, text_len,
                                   None if keep_prompt else text_prompt)

    return per_shard(local, mesh)(hidden, rows["token_text"], rows["positions"], texts["text_row"],
                                  texts["text_start"], texts["text_len"], texts["text_prompt"])


def head_forward(model, pooled: jax.Array) -> jax.Array:
    """Pooled [N, H] -> the model's Dense layers and normalisation -> [N, D] (``EmbeddingModel``'s head)."""
    return model._head(pooled, None)


def encode_pack(merge: Callable[[Any], Any], params, rows: dict, texts: dict, *, mesh: Mesh | None,
                key: jax.Array | None = None, experts=None, sub_tokens: int = 0,
                text_ids: jax.Array | None = None) -> jax.Array:
    """Embeddings [S*N, D] of one side's packed texts; merge(params) -> the EmbeddingModel; key: dropout (None:
    deterministic); experts: None, one for the call (a scalar) or one per text [S*N]; sub_tokens: the gradient
    cache's token slots per shard and sub-batch (0: at once); text_ids: the global id of each text [S*N] for the
    dropout masks (default: its index in the pack)."""
    S = row_shards(mesh)
    total, L = rows["input_ids"].shape
    n = sub_batches(total // S, L, sub_tokens)
    if experts is not None and jnp.ndim(experts) == 1:  # per text -> per slot: a row array, split like the rows
        rows = {**rows, "experts": token_experts(rows["token_text"], experts, mesh)}
        experts = None
    if key is not None:  # per slot, split like the rows
        ids = jnp.arange(texts["text_row"].shape[0], dtype=jnp.int32) if text_ids is None else text_ids
        rows = {**rows, "text_ids": token_ids(rows["token_text"], ids, mesh)}

    def pool_fn(p, sub_rows, text_row, _sub_key):
        # every sub-batch draws from the step's key: the text ids make its masks its texts' own
        sub = dict(sub_rows)
        ex = sub.pop("experts", experts)
        tid = sub.pop("text_ids", None)
        rngs = None if key is None else nnx.Rngs(dropout=key)
        return pool_rows(merge(p), sub, {**texts, "text_row": text_row}, mesh=mesh, experts=ex,
                         deterministic=key is None, rngs=rngs, text_ids=tid)

    if n == 1:
        pooled = pool_fn(params, rows, texts["text_row"], None)
    else:
        pooled = gradcache.pool_packed_chunked(pool_fn, params, rows, texts["text_row"], n)
    return head_forward(merge(params), pooled)


def embed_batch(merge: Callable[[Any], Any], params, batch: dict, *, K: int, mesh: Mesh | None = None,
                keys: tuple = (None, None), experts: tuple = (None, None), one_expert: bool = False,
                chunk: int | None = None, sub_tokens: tuple[int, int] = (0, 0)) -> tuple[jax.Array, jax.Array]:
    """(queries [B, D], candidates [B*K, D]) of a padded or packed batch (module docstring).

    merge(params) -> EmbeddingModel; keys: dropout keys of the queries and the candidates (None: no dropout; the
    train step passes one key for both sides, so that a combined pack, which takes the queries' key, draws what
    two packs or padded rows draw: the texts' ids tell the sides apart); experts: MoTE expert per query [B] and
    per candidate [B*K] (None: dense); one_expert: every row has the same expert (MoTE's fast path: the first one
    is used for the call); chunk: padded gradient cache, queries per sub-batch (candidates: chunk * K);
    sub_tokens: packed gradient cache, token slots per shard and sub-batch of each pack
    (jaxembed.data.pipeline.Packing.sub_tokens). A combined pack (``pack_*``) is one encode call with the queries'
    keys; the queries' and the candidates' experts must then agree wherever they are routed (jaxembed.train
    combines only then)."""
    if one_expert:
        experts = tuple(None if e is None else e[0] for e in experts)
    B = batch["query_prompt_length"].shape[0]
    ids = (jnp.arange(B, dtype=jnp.int32), B + jnp.arange(B * K, dtype=jnp.int32))  # global text ids (dropout)
    if "pack_input_ids" in batch:  # one pack of queries and candidates (their experts agree, or none)
        S = row_shards(mesh)
        ex = experts[0]
        if ex is not None and jnp.ndim(ex) == 1:
            ex = join_shards(experts[0], experts[1], S)
        rows, texts = pack_of(batch, "pack")
        out = encode_pack(merge, params, rows, texts, mesh=mesh, key=keys[0], experts=ex, sub_tokens=sub_tokens[0],
                          text_ids=join_shards(ids[0], ids[1], S))
        return split_shards(out, S, B)
    if is_packed(batch):
        out = []
        for i, name in enumerate(("query_pack", "doc_pack")):
            rows, texts = pack_of(batch, name)
            out.append(encode_pack(merge, params, rows, texts, mesh=mesh, key=keys[i], experts=experts[i],
                                   sub_tokens=sub_tokens[i], text_ids=ids[i]))
        return out[0], out[1]

    def encode(k, p, x, _sub_key):
        # every sub-batch of the gradient cache draws from the side's key: the text ids make its masks its own
        model = merge(p)
        rngs = None if k is None else nnx.Rngs(dropout=k)
        return model(x["ids"], x["mask"], x["prompt"], deterministic=k is None, rngs=rngs, experts=x.get("experts"),
                     text_ids=x["text_ids"])

    out = []
    for i, (side, c) in enumerate((("query", chunk), ("doc", None if chunk is None else chunk * K))):
        x = {"ids": batch[f"{side}_input_ids"], "mask": batch[f"{side}_attention_mask"],
             "prompt": batch[f"{side}_prompt_length"], "text_ids": ids[i]}
        e = experts[i]
        enc = functools.partial(encode, keys[i])
        if e is not None and jnp.ndim(e) == 0:  # one expert for the call: not split into sub-batches
            enc = functools.partial(lambda ex, k, p, x_, sk: encode(k, p, {**x_, "experts": ex}, sk), e, keys[i])
        elif e is not None:
            x["experts"] = e
        out.append(gradcache.encode_chunked(enc, params, x, c))
    return out[0], out[1]
