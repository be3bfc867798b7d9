"""Embeddings for the offline jobs (``jaxembed mine``, ``jaxembed score``): the reference encoder, loaded once per
process (``load_encoder``), and texts encoded with it in cached shards (``encode_texts``: a killed job resumes
without re-encoding finished shards)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Sequence

import numpy as np


def normalize(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (zero rows stay zero). [N, D] -> [N, D] float32."""
    x = np.asarray(x, np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def model_fingerprint(encoder) -> str:
    """A short hash of an Encoder's weights (a few parameter arrays), tokenizer settings and output dimension:
    the cache key that tells one model from another."""
    h = hashlib.sha256()
    try:
        import jax
        from flax import nnx

        leaves = jax.tree.leaves(nnx.state(encoder.model))
        for leaf in leaves[:3] + leaves[-3:]:
            a = np.asarray(leaf)
            h.update(str(a.shape).encode())
            h.update(a.reshape(-1)[:65536].tobytes())
        tok = encoder.tokenizer
        h.update(f"{tok.max_length}|{tok.lowercase}|{tok.padding_side}|{encoder.model.dim}".encode())
    except Exception:  # noqa: BLE001 -- an encoder-like object without flax weights: its class names it
        h.update(type(encoder).__qualname__.encode())
    return h.hexdigest()[:16]


def _shard_key(model_key: str, prompt: str, max_length, texts: Sequence[str]) -> str:
    h = hashlib.sha256()
    h.update(f"{model_key}|{max_length}|{len(prompt)}:{prompt}|{len(texts)}".encode())
    for t in texts:
        h.update(len(t).to_bytes(8, "little"))
        h.update(t.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def encode_texts(encoder, texts: Sequence[str], *, prompt: str = "", max_length: int | None = None,
                 batch_size: int = 64, cache_dir: str | os.PathLike | None = None, name: str = "texts",
                 shard_size: int = 4096, model_key: str | None = None, bar=None,
                 encode_kw: dict | None = None) -> np.ndarray:
    """Encode ``texts`` (each prefixed by ``prompt``, pooled as the training loader does) with an Encoder.
    -> [N, D] float32 in input order.

    With ``cache_dir``, the texts are encoded in shards of ``shard_size``; shard k is saved as
    ``cache_dir/<name>-<k>.npz`` with a key (model fingerprint, prompt, max length, the shard's texts), written
    atomically. A rerun loads every shard whose key matches and encodes only the others, so a killed job
    resumes where it stopped. ``bar``: a tqdm bar to advance by the texts done (encoded or loaded); ``encode_kw``:
    more keyword arguments of ``Encoder.encode`` (e.g. a MoTE model's ``task`` / ``side``)."""
    n = len(texts)
    if n == 0:
        dim = getattr(getattr(encoder, "model", None), "dim", 0)
        return np.zeros((0, dim), np.float32)
    kw = dict(prompt=prompt, max_length=max_length, batch_size=batch_size, progress=False, **(encode_kw or {}))
    if cache_dir is None:
        out = np.asarray(encoder.encode(list(texts), **kw), np.float32)
        if bar is not None:
            bar.update(n)
        return out
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    mk = model_key or model_fingerprint(encoder)
    parts = []
    for k, s in enumerate(range(0, n, shard_size)):
        chunk = list(texts[s:s + shard_size])
        key = _shard_key(mk + json.dumps(encode_kw or {}, sort_keys=True), prompt, max_length, chunk)
        path = cache / f"{name}-{k:05d}.npz"
        emb = None
        if path.exists():
            try:
                with np.load(path, allow_pickle=False) as z:
                    if str(z["key"]) == key and z["emb"].shape[0] == len(chunk):
                        emb = z["emb"]
            except (OSError, ValueError, KeyError):
                emb = None  # a damaged shard (killed mid-write by something else): encode it again
        if emb is None:
            emb = np.asarray(encoder.encode(chunk, **kw), np.float32)
            tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
            np.savez(tmp, emb=emb, key=np.array(key))
            os.replace(tmp, path)
        parts.append(emb)
        if bar is not None:
            bar.update(len(chunk))
    return np.concatenate(parts, 0)


def progress_bar(total: int, desc: str, show: bool | None = None):
    """A tqdm bar with ETA (on a terminal, or when ``show`` says so)."""
    from tqdm.auto import tqdm

    show = sys.stderr.isatty() if show is None else show
    return tqdm(total=total, desc=desc, unit="text", disable=not show, smoothing=0.1)



_LOADED: dict = {}  # (model files, load options) -> (Loaded, Encoder): one compilation per process and model


def load_encoder(name, *, dtype: str | None = None, max_length: int | None = None, pooling: str | None = None,
                 bidirectional: bool = False, no_packing: bool = False, config=None):
    """(Loaded, Encoder) of the reference model ``name``; reused within a process while the model's files are
    unchanged, so that several jobs in one process (or a notebook) compile the encoder once. Options not given
    come from the run ``config``'s model section (when given), else the model's own."""
    from jaxembed import loading
    from jaxembed.encode import Encoder

    kw = {}
    kw["dtype"] = dtype or (config.model.dtype if config is not None else None) or "float32"
    ml = max_length or (config.model.max_length if config is not None else 0) or None
    if ml:
        kw["max_length"] = ml
    pooling = pooling or (config.model.pooling if config is not None else "") or None
    if pooling:
        kw["pooling"] = pooling
    if bidirectional:
        kw["causal"] = False
    elif config is not None and config.model.get("causal") is not None:
        kw["causal"] = config.model.causal
    folder = loading.resolve(name)
    stamp = tuple(sorted((str(f.relative_to(folder)), f.stat().st_size, f.stat().st_mtime_ns)
                         for f in folder.rglob("*") if f.is_file() and f.suffix in (".json", ".safetensors", ".bin")))
    key = (str(folder.resolve()), stamp, tuple(sorted(kw.items())))
    if key not in _LOADED:
        loaded = loading.load(folder, **kw)
        _LOADED.clear()  # keep one model alive at most
        _LOADED[key] = (loaded, Encoder.from_loaded(loaded))
    loaded, enc = _LOADED[key]
    # packed rows (the default) or padded ones: the same embeddings (jaxembed.encode), the padded path for comparison
    enc.packing = not (no_packing or (config is not None and not _config_packing(config)))
    return loaded, enc


def _config_packing(config) -> bool:
    from jaxembed.config import packing_enabled

    return packing_enabled(config) if "data" in config else True


def model_key(loaded, encoder) -> str:
    """The cache key of a loaded reference model: its folder and its weights' fingerprint."""
    return f"{Path(loaded.source).resolve()}|{model_fingerprint(encoder)}"


def limit(value, cap):
    """A dataset's token limit under the tokenizer's ``cap`` (None: no limit)."""
    if cap is None:
        return value or None
    return min(int(value or cap), int(cap))
