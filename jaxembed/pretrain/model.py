"""The RetroMAE model (Xiao et al. 2022, Sec. 3.2) over a BERT-family encoder: PEG's pre-training
(docs/design.md, RetroMAE pre-training).

- Encoder: our ``BertModel`` on the lightly masked text X_enc; the sentence embedding is the [CLS] hidden state,
  h_X = Enc(X_enc)[:, 0]. Encoder MLM loss at X_enc's masked positions (Sec. 3.2, "encoding").
- Decoder: the heavily masked copy X_dec goes through the encoder's embedding layer (word + position + type,
  LayerNorm; shared, as in the reference code), and its first token ([CLS]) is replaced by h_X:
  H_dec = [h_X, e(x_1) + p_1, ..., e(x_N) + p_N] (Eq. 3). One (``decoder_layers``) BERT layer with full
  self-attention over H_dec, then a decoder MLM loss at X_dec's masked positions (Eq. 4). The decoder can only
  recover what X_dec lost through h_X, which forces the encoder to put the text's meaning into [CLS].
- LM heads: BERT's ``cls.predictions`` (dense -> activation -> LayerNorm -> output projection tied to the word
  embeddings + bias), RoBERTa's ``lm_head`` alike. The encoder head is loaded from the checkpoint when it has
  one; the decoder head starts as a copy of it.

Loss (Eq. 5): L = w_enc * L_enc + w_dec * L_dec (weights 1 and 1 in the paper).

Packed encoder rows (``pack``; jaxembed.pretrain.data): both corruptions are drawn on the padded rows as always; the
encoder's input X_enc is then read into the packed layout (each slot takes its text's token at its position), the
encoder runs on the packed rows (segments, per-text positions) and its states are read back into the padded layout
[B, L, H] (zeros on padding). Everything after the encoder is unchanged, so the loss equals the padded one (tests:
<= 1e-5) while the encoder computes no padding. Each device reads only its own rows (``jax.shard_map``).
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxembed.errors import UserError
from jaxembed.models.bert import ARCH as BERT_ARCH
from jaxembed.models.bert.model import BertConfig, BertLayer, BertModel
from jaxembed.models.layers import activation, dense, layer_norm, run_layers, to_dtype
from jaxembed.pretrain import masking

log = logging.getLogger(__name__)

BERT_FAMILY = BERT_ARCH.model_types


class MLMHead(nnx.Module):
    """BERT ``cls.predictions`` / RoBERTa ``lm_head``: logits = LN(act(h W + b)) E^T + bias, E the (tied) word
    embedding table [V, H]."""

    def __init__(self, c: BertConfig, rngs: nnx.Rngs):
        self.act_name = c.hidden_act
        self.dense = dense(c.hidden_size, c.hidden_size, ("embed", None), bias=True, opts=c, rngs=rngs)
        self.layer_norm = layer_norm(c.hidden_size, c.layer_norm_eps, opts=c, rngs=rngs)
        self.bias = nnx.Param(jnp.zeros((c.vocab_size,), to_dtype(c.param_dtype)))

    def __call__(self, h: jax.Array, embedding: jax.Array) -> jax.Array:
        """h: [..., H], embedding: [V, H] -> logits [..., V] float32."""
        x = self.layer_norm(activation(self.act_name)(self.dense(h)))
        logits = jnp.einsum("...h,vh->...v", x.astype(jnp.float32), embedding.astype(jnp.float32))
        return logits + self.bias[...].astype(jnp.float32)


class RetroMAE(nnx.Module):
    """encoder (BertModel) + encoder_head, decoder (BERT layers) + decoder_head."""

    def __init__(self, encoder: BertModel, decoder_layers: int = 1, *, rngs: nnx.Rngs):
        c = encoder.config
        if c.model_type not in BERT_FAMILY:
            raise UserError(f"RetroMAE needs a BERT-family encoder ({', '.join(BERT_FAMILY)}), got "
                            f"model_type={c.model_type!r}")
        self.encoder = encoder
        self.encoder_head = MLMHead(c, rngs)
        self.decoder = nnx.List([BertLayer(c, rngs) for _ in range(decoder_layers)])
        self.decoder_head = MLMHead(c, rngs)

    @property
    def config(self) -> BertConfig:
        return self.encoder.config

    @property
    def word_embeddings(self) -> jax.Array:
        return self.encoder.embeddings.word_embeddings.embedding[...]

    def encode(self, input_ids, attention_mask, *, deterministic=True, rngs=None) -> jax.Array:
        """[B, L] -> encoder hidden states [B, L, H]."""
        return self.encoder(input_ids, attention_mask, deterministic=deterministic, rngs=rngs)

    def decode(self, sentence, input_ids, attention_mask, *, deterministic=True, rngs=None) -> jax.Array:
        """sentence: [B, H] (h_X); input_ids, attention_mask: [B, L] (X_dec) -> decoder hidden states [B, L, H],
        with the sentence embedding in place of the first token (Eq. 3)."""
        x = self.encoder.embeddings(input_ids, None, deterministic=deterministic, rngs=rngs)
        x = jnp.concatenate([sentence[:, None, :].astype(x.dtype), x[:, 1:]], axis=1)
        return run_layers(self.decoder, x, self.config.remat, attention_mask, deterministic=deterministic, rngs=rngs)


def build_retromae(config: BertConfig, decoder_layers: int = 1, seed: int = 0,
                   encoder: BertModel | None = None) -> RetroMAE:
    """A RetroMAE model: ``encoder`` (e.g. pretrained, with this config) or a random one, new heads and decoder."""
    from jaxembed.models import init_model

    return RetroMAE(encoder if encoder is not None else init_model(config, seed), decoder_layers,
                    rngs=nnx.Rngs(seed + 1))


def encode_packed(model: RetroMAE, input_ids: jax.Array, pack: dict, *, mesh=None, shards: int = 1,
                  deterministic: bool = True, rngs=None) -> jax.Array:
    """The encoder's states [B, L, H] of the padded rows ``input_ids`` [B, L], computed on their packed layout
    (``pack``: jaxembed.pretrain.data.encoder_pack, shard s = rows [s*R, (s+1)*R) and texts [s*B/S, (s+1)*B/S)
    with local indices: S = the mesh's devices, or ``shards`` without a mesh); padding positions get zeros."""
    from jaxembed.train.encode import per_shard

    length = input_ids.shape[1]

    def to_rows(ids, token_text, positions):  # one shard: padded rows -> packed slots
        return jnp.where(token_text >= 0, ids[jnp.maximum(token_text, 0), jnp.minimum(positions, length - 1)], 0)

    ids = per_shard(to_rows, mesh, shards)(input_ids, pack["pack_token_text"], pack["pack_positions"])
    h = model.encoder(ids, None, None, deterministic=deterministic, rngs=rngs, segment_ids=pack["pack_segment_ids"],
                      positions=pack["pack_positions"])

    def to_padded(hp, text_row, text_start, text_len):  # one shard: packed states -> padded rows
        col = jnp.arange(length)[None, :]
        x = hp[text_row[:, None], jnp.minimum(text_start[:, None] + col, hp.shape[1] - 1)]
        return jnp.where((col < text_len[:, None])[..., None], x, jnp.zeros((), x.dtype))

    return per_shard(to_padded, mesh, shards)(h, pack["pack_text_row"], pack["pack_text_start"], pack["pack_text_len"])


def retromae_loss(model: RetroMAE, input_ids: jax.Array, attention_mask: jax.Array, key: jax.Array, *,
                  special_ids: tuple[int, ...], mask_id: int, encoder_ratio: float = 0.3,
                  decoder_ratio: float = 0.5, encoder_weight: float = 1.0, decoder_weight: float = 1.0,
                  p_mask: float = 0.8, p_random: float = 0.1, dropout: bool = True, pack: dict | None = None,
                  mesh=None, shards: int = 1) -> tuple[jax.Array, dict]:
    """input_ids, attention_mask: [B, L] (clean text) -> (loss, metrics). Both corruptions, the dropout and
    nothing else are drawn from ``key``. pack: the encoder's packed rows of the same texts (module docstring;
    None: the encoder runs on the padded rows); mesh: the devices the rows are split over (None: one device holding
    ``shards`` shards)."""
    k_enc, k_dec, k_sel_e, k_sel_d, k_drop = jax.random.split(key, 5)
    special = jnp.asarray(special_ids, input_ids.dtype)
    vocab = model.config.vocab_size
    can = masking.maskable(input_ids, attention_mask, special)
    enc_sel = masking.choose(k_sel_e, can, encoder_ratio)
    dec_sel = masking.choose(k_sel_d, can, decoder_ratio)
    kw = dict(mask_id=mask_id, vocab_size=vocab, special_ids=special, p_mask=p_mask, p_random=p_random)
    enc_ids, enc_labels = masking.corrupt(k_enc, input_ids, enc_sel, **kw)
    dec_ids, dec_labels = masking.corrupt(k_dec, input_ids, dec_sel, **kw)
    rngs = nnx.Rngs(dropout=k_drop) if dropout else None
    det = not dropout
    emb = model.word_embeddings
    length = input_ids.shape[1]

    if pack is None:
        h = model.encode(enc_ids, attention_mask, deterministic=det, rngs=rngs)       # [B, L, H]
    else:
        h = encode_packed(model, enc_ids, pack, mesh=mesh, shards=shards, deterministic=det, rngs=rngs)
    hs, lab, valid = masking.gather_selected(h, enc_labels, masking.max_selected(length, encoder_ratio))
    enc_loss, enc_acc, enc_n = masking.mlm_loss(model.encoder_head(hs, emb), lab, valid)

    sentence = h[:, 0]                                                                 # [B, H]: [CLS]
    d = model.decode(sentence, dec_ids, attention_mask, deterministic=det, rngs=rngs)  # [B, L, H]
    ds, lab, valid = masking.gather_selected(d, dec_labels, masking.max_selected(length, decoder_ratio))
    dec_loss, dec_acc, dec_n = masking.mlm_loss(model.decoder_head(ds, emb), lab, valid)

    loss = encoder_weight * enc_loss + decoder_weight * dec_loss
    return loss, {"enc_loss": enc_loss, "dec_loss": dec_loss, "enc_acc": enc_acc, "dec_acc": dec_acc,
                  "enc_masked": enc_n, "dec_masked": dec_n}


# ---------------------------------------------------------------------------------------- head weights

_HEAD_KEYS = (  # (dense, LayerNorm, bias candidates) of BERT-style and RoBERTa-style MLM heads
    ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
     ("cls.predictions.bias", "cls.predictions.decoder.bias")),
    ("lm_head.dense", "lm_head.layer_norm", ("lm_head.bias", "lm_head.decoder.bias")),
)


def _ln_key(tensors: dict, prefix: str, name: str) -> str | None:
    for k in ((f"{prefix}.weight", f"{prefix}.gamma") if name == "weight" else (f"{prefix}.bias", f"{prefix}.beta")):
        if k in tensors:
            return k
    return None


def load_mlm_head(head: MLMHead, tensors: dict, source: str = "checkpoint") -> str | None:
    """Copy a checkpoint's MLM-head weights (PyTorch layout) into ``head``; returns the key prefix used, or None
    when the checkpoint has no MLM head (the head keeps its initialisation)."""
    for dense_p, ln_p, bias_keys in _HEAD_KEYS:
        if f"{dense_p}.weight" not in tensors:
            continue
        w, b = tensors[f"{dense_p}.weight"], tensors.get(f"{dense_p}.bias")
        g, beta = _ln_key(tensors, ln_p, "weight"), _ln_key(tensors, ln_p, "bias")
        bias = next((tensors[k] for k in bias_keys if k in tensors), None)
        if b is None or g is None or beta is None or bias is None:
            raise UserError(f"{source}: incomplete MLM head under {dense_p.split('.')[0]}. (dense bias, LayerNorm "
                            "or output bias missing); fix: use a complete checkpoint")
        want = {"dense": head.dense.kernel.shape, "bias": head.bias.shape}
        if np.shape(w)[::-1] != want["dense"] or np.shape(bias) != want["bias"]:
            raise UserError(f"{source}: MLM head shapes {np.shape(w)} / {np.shape(bias)} do not fit the model "
                            f"(hidden {want['dense'][0]}, vocab {want['bias'][0]})")
        pdt = head.dense.kernel[...].dtype
        head.dense.kernel.value = jnp.asarray(np.asarray(w, np.float32).T, pdt)
        head.dense.bias.value = jnp.asarray(np.asarray(b, np.float32), pdt)
        head.layer_norm.scale.value = jnp.asarray(np.asarray(tensors[g], np.float32), pdt)
        head.layer_norm.bias.value = jnp.asarray(np.asarray(tensors[beta], np.float32), pdt)
        head.bias.value = jnp.asarray(np.asarray(bias, np.float32), pdt)
        return dense_p.split(".")[0]
    return None


def copy_head(src: MLMHead, dst: MLMHead) -> None:
    """dst's weights := src's (the decoder head starts from the encoder head)."""
    _, state = nnx.split(src)
    nnx.update(dst, jax.tree.map(lambda x: jnp.array(x, copy=True), state))
