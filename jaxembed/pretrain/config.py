"""The config of a RetroMAE run (``jaxembed pretrain retromae``): every field with its default (``default_config``)
and ``validate``, which checks every value before any work starts. The job is ``jaxembed.pretrain.retromae``,
which re-exports both."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import ml_collections as mc
from ml_collections import config_dict

from jaxembed import config as cfglib
from jaxembed.runs import optim
from jaxembed.choices import POOLING_MODES
from jaxembed.errors import UserError

DEFAULT_FIELDS = ("text", "query", "pos", "neg", "sentence1", "sentence2")
#: the poolings a RetroMAE export may take: every mode but last-token (a decoder's pooling; RetroMAE is BERT's)
EXPORT_POOLINGS = tuple(m for m in POOLING_MODES if m != "lasttoken")


def default_config() -> mc.ConfigDict:
    """Every field of a RetroMAE run with its default. Sections: model, data, retromae, optim, train, export."""
    c = mc.ConfigDict()
    c.model = mc.ConfigDict(dict(
        name="",                # BERT-family folder / hub id: the weights (init='pretrained') and the tokenizer
        init="pretrained",      # 'pretrained': start from name's weights; 'random': a fresh encoder
        overrides=mc.ConfigDict(),  # init='random': config.json fields to change, e.g. num_hidden_layers=2
        dtype="float32", param_dtype="float32", remat=False,
        max_length=128,         # tokens per text (special tokens included)
    ))
    c.data = mc.ConfigDict(dict(
        paths=(),               # .jsonl (fields below) and .txt (one text per line) files
        fields=DEFAULT_FIELDS,  # JSON fields holding text; a list field gives one text per item
        store="",               # or / and a store from `jaxembed data prepare` (queries, positives, negatives)
        max_texts=0,            # keep the first N distinct texts (0 = all)
        dedup=True,             # drop exact duplicate texts (counted)
        min_tokens=4,           # texts with fewer non-special tokens are left out (counted)
        length_buckets="pow2",  # padded lengths: 'pow2' (16/32/64/...), 'fine' (x1.5 steps), 'max' (one shape)
        packing=True,           # the encoder runs on packed rows (no compute on padding); False = padded rows
        bucket_window=64,       # texts sorted by length within windows of this many batches
    ))
    c.retromae = mc.ConfigDict(dict(
        encoder_mask_ratio=0.3,   # RetroMAE: 0.15-0.3 for the encoder
        decoder_mask_ratio=0.5,   # RetroMAE: 0.5-0.7 for the decoder
        decoder_layers=1,
        encoder_loss_weight=1.0, decoder_loss_weight=1.0,
        mask_prob=0.8, random_prob=0.1,  # BERT's 80 / 10 / 10 of the picked tokens
    ))
    c.optim = mc.ConfigDict(dict(
        lr=1e-4, schedule="linear", warmup_steps=-1, warmup_ratio=0.1, end_factor=0.0,
        weight_decay=0.01, b1=0.9, b2=0.999, eps=1e-8, grad_clip=1.0,
    ))
    c.train = mc.ConfigDict(dict(
        seed=0, batch_size=32,  # texts per step, over all local devices
        steps=1000,
        dropout=True,           # the model's dropout while training
        log_every=10, checkpoint_every=200, checkpoint_minutes=0.0, keep_checkpoints=2, async_checkpoints=True,
        compile_cache=True,     # keep compiled programs in WORKDIR/jax_cache: a resumed run does not compile again
        max_nonfinite=5,        # stop after this many non-finite steps in a row
        progress=config_dict.placeholder(bool),
    ))
    c.export = mc.ConfigDict(dict(
        at_end=True, dir="",    # '' = <workdir>/export
        pooling="cls",          # RetroMAE's sentence embedding is [CLS]
        normalize=True,
    ))
    return c


def config_error(key: str, value: Any, allowed: str) -> UserError:
    return UserError(f"config.{key} = {value!r} is not valid: {allowed}")


def _num(c, key, *, low=None, high=None, integer=False, allow_low=True) -> None:
    v = c
    for p in key.split("."):
        v = v[p]
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    ok = ok and (not integer or float(v).is_integer())
    ok = ok and (low is None or (v >= low if allow_low else v > low)) and (high is None or v <= high)
    if not ok:
        rng = f"{'>=' if allow_low else '>'} {low}" if low is not None else ""
        rng += (" and " if rng and high is not None else "") + (f"<= {high}" if high is not None else "")
        raise config_error(key, v, f"{'an integer' if integer else 'a number'} {rng}".strip())


def validate(c: mc.ConfigDict) -> None:
    """Check every value before any work starts; the first problem is a UserError naming the key."""
    for s in ("model", "data", "retromae", "optim", "train", "export"):
        if s not in c:
            raise UserError(f"config.{s} is missing (fix: start from jaxembed.pretrain.retromae.default_config())")
    if not c.model.name:
        raise config_error("model.name", c.model.name, "a BERT-family model folder or hub id (its tokenizer is used "
                                               "even with model.init='random')")
    if c.model.init not in ("pretrained", "random"):
        raise config_error("model.init", c.model.init, "allowed: pretrained, random")
    if c.model.overrides and c.model.init != "random":
        raise config_error("model.overrides", dict(c.model.overrides), "only used with model.init='random'")
    for k in ("dtype", "param_dtype"):
        if c.model[k] not in cfglib.DTYPES:
            raise config_error(f"model.{k}", c.model[k], f"allowed: {', '.join(cfglib.DTYPES)}")
    _num(c, "model.max_length", low=8, integer=True)
    if not c.data.paths and not c.data.store:
        raise config_error("data.paths", c.data.paths, "at least one .jsonl / .txt file, or set data.store")
    for i, p in enumerate(c.data.paths):
        if not isinstance(p, str) or not Path(p).is_file():
            raise config_error(f"data.paths[{i}]", p, "an existing .jsonl or .txt file")
    if c.data.store and not (Path(c.data.store) / "manifest.json").exists():
        raise config_error("data.store", c.data.store, "a folder written by `jaxembed data prepare`")
    if not c.data.fields or not all(isinstance(f, str) and f for f in c.data.fields):
        raise config_error("data.fields", c.data.fields, "a non-empty tuple of JSON field names")
    _num(c, "data.max_texts", low=0, integer=True)
    _num(c, "data.min_tokens", low=0, integer=True)
    _num(c, "data.bucket_window", low=1, integer=True)
    if c.data.length_buckets not in ("pow2", "fine", "max"):
        raise config_error("data.length_buckets", c.data.length_buckets, "allowed: pow2, fine, max")
    for k in ("encoder_mask_ratio", "decoder_mask_ratio"):
        _num(c, f"retromae.{k}", low=0.0, high=1.0, allow_low=False)
    _num(c, "retromae.decoder_layers", low=1, integer=True)
    for k in ("encoder_loss_weight", "decoder_loss_weight", "mask_prob", "random_prob"):
        _num(c, f"retromae.{k}", low=0.0)
    if c.retromae.mask_prob + c.retromae.random_prob > 1:
        raise config_error("retromae.random_prob", c.retromae.random_prob, "mask_prob + random_prob <= 1")
    _num(c, "optim.lr", low=0.0, allow_low=False)
    if c.optim.schedule not in optim.SCHEDULES:
        raise config_error("optim.schedule", c.optim.schedule, f"allowed: {', '.join(optim.SCHEDULES)}")
    _num(c, "optim.warmup_ratio", low=0.0, high=1.0)
    for k in ("weight_decay", "grad_clip", "end_factor"):
        _num(c, f"optim.{k}", low=0.0)
    for k in ("batch_size", "steps", "log_every", "keep_checkpoints"):
        _num(c, f"train.{k}", low=1, integer=True)
    for k in ("checkpoint_every", "max_nonfinite", "seed"):
        _num(c, f"train.{k}", low=0, integer=True)
    _num(c, "train.checkpoint_minutes", low=0.0)
    if not isinstance(c.data.get("packing", True), bool):
        raise config_error("data.packing", c.data.packing,
                           "True (the encoder runs on packed rows) or False (padded rows)")
    if c.export.pooling not in EXPORT_POOLINGS:
        raise config_error("export.pooling", c.export.pooling, f"allowed: {', '.join(EXPORT_POOLINGS)}")
