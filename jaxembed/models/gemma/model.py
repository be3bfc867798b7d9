"""Gemma 2 and Gemma 3 text decoders as text-embedding backbones, numerically matching ``transformers``
(``Gemma2Model`` / ``Gemma3TextModel``: last hidden state after the final norm). The block is the shared decoder
(``jaxembed.models.decoder``) with Gemma's choices (Gemma Team 2024, "Gemma 2", section 2; 2025, "Gemma 3",
section 2):

- RMSNorm scales by (1 + w) in float32 (w stored as in the checkpoint, centred on 0);
- token embeddings times sqrt(hidden_size) (rounded to the weights' dtype first, as transformers);
- GeGLU feed-forward (``hidden_activation``, gelu_pytorch_tanh); a norm after the attention output and after the
  MLP output, before each residual, besides the pre-norms (``pre_feedforward_layernorm`` for the MLP);
- attention logits scaled by query_pre_attn_scalar^-1/2, then (Gemma 2) soft-capped: c * tanh(logits / c) with
  c = attn_logit_softcapping (default 50). Gemma 3 replaced soft-capping by the q/k norms (Gemma 3 report,
  section 2): transformers' Gemma3TextModel ignores ``attn_logit_softcapping``, and so does jaxembed (it is kept
  for ``to_hf``);
- ``layer_types``: sliding-window layers (window ``sliding_window``) and global ones; Gemma 2 alternates (even
  layers slide), Gemma 3 has five sliding layers per global one (``sliding_window_pattern`` 6), and its sliding
  layers use their own RoPE base (``rope_local_base_freq`` / ``rope_parameters.sliding_attention``; the global
  layers' RoPE may be linearly scaled); Gemma 3 normalises q and k per head.

``final_logit_softcapping`` acts on the LM head's logits only, which an embedding backbone does not compute: it is
kept for ``to_hf`` and has no effect here.

Bidirectional attention: Gemma 3 as EmbeddingGemma, ``use_bidirectional_attention: true`` (transformers then lets a
sliding layer's token see those at distance <= sliding_window // 2); Gemma 2 with transformers' generic
``is_causal: false`` (distance <= sliding_window). ``causal=False`` writes the same switch back in ``to_hf``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from jaxembed.models.decoder import FULL, SLIDING, DecoderConfig, DecoderModel, hf_kwargs, is_causal
from jaxembed.models.rope import RopeSpec, from_hf as rope_from_hf, from_params

# transformers' defaults where config.json has no such key
_WINDOW = 4096
_ATTN_SOFTCAP = {"gemma2": 50.0, "gemma3_text": None}
_FINAL_SOFTCAP = {"gemma2": 30.0, "gemma3_text": None}
_PATTERN = {"gemma2": 2, "gemma3_text": 6}  # one global layer in every PATTERN (the last of each group)
# Gemma 3's defaults that differ from Gemma 2's (GemmaConfig's own field defaults)
_DEFAULTS = {"gemma2": {}, "gemma3_text": dict(vocab_size=262208, max_position_embeddings=131072)}
_GEMMA3_THETA, _GEMMA3_LOCAL_THETA = 1_000_000.0, 10_000.0


def default_layer_types(model_type: str, num_layers: int, pattern: int | None = None) -> tuple[str, ...]:
    """transformers' default: layer i slides unless (i + 1) is a multiple of the pattern."""
    p = pattern or _PATTERN[model_type]
    return tuple(SLIDING if (i + 1) % p else FULL for i in range(num_layers))


@dataclasses.dataclass(frozen=True, kw_only=True)
class GemmaConfig(DecoderConfig):
    model_type: str = "gemma2"
    vocab_size: int = 256000
    hidden_size: int = 2304
    intermediate_size: int = 9216
    num_hidden_layers: int = 26
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int = 256
    hidden_act: str = "gelu_pytorch_tanh"  # HF: hidden_activation
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = True
    pad_token_id: int | None = 0
    eos_token_id: int | tuple[int, ...] | None = 1
    bos_token_id: int | None = 2
    query_pre_attn_scalar: float = 256
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None  # LM logits only: kept for to_hf, no effect on hidden states
    sliding_window: int | None = _WINDOW
    layer_types: tuple[str, ...] | None = None  # None: default_layer_types
    rope: RopeSpec = RopeSpec()  # Gemma 3: the global layers'
    rope_local: RopeSpec | None = None  # Gemma 3: the sliding layers' (None: base 10000)

    ARCHITECTURES = {"gemma2": "Gemma2Model", "gemma3_text": "Gemma3TextModel"}
    HF_FIELDS = tuple(f for f in DecoderConfig.HF_FIELDS if f != "hidden_act") + (  # hidden_act: hidden_activation
        "attention_bias", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping")

    def __post_init__(self):
        super().__post_init__()
        gemma3 = self.model_type == "gemma3_text"
        object.__setattr__(self, "qk_norm", gemma3)
        if gemma3 and self.rope_local is None:
            object.__setattr__(self, "rope_local", RopeSpec(theta=_GEMMA3_LOCAL_THETA))
        if not gemma3 and self.rope_local is not None:
            raise ValueError("rope_local is Gemma 3's (its sliding layers' RoPE)")
        types = self.layer_types or default_layer_types(self.model_type, self.num_hidden_layers)
        object.__setattr__(self, "layer_types", tuple(types))
        if len(self.layer_types) != self.num_hidden_layers or set(self.layer_types) - {FULL, SLIDING}:
            raise ValueError(f"layer_types={list(self.layer_types)!r}: need {self.num_hidden_layers} entries, each "
                             f"{FULL!r} or {SLIDING!r}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window={self.sliding_window} must be a positive number of tokens (or null)")
        if self.attn_logit_softcapping is not None and self.attn_logit_softcapping <= 0:
            raise ValueError(f"attn_logit_softcapping={self.attn_logit_softcapping} must be positive (or null)")

    # ---- the shared decoder's switches (jaxembed.models.decoder)

    @property
    def sandwich_norms(self) -> bool:
        return True

    @property
    def norm_unit_offset(self) -> bool:
        return True

    @property
    def embed_scale(self) -> float:
        return math.sqrt(self.hidden_size)

    @property
    def attn_scale(self) -> float:
        return self.query_pre_attn_scalar ** -0.5

    @property
    def attn_softcap(self) -> float | None:
        """Gemma 2 only (module docstring)."""
        return self.attn_logit_softcapping if self.model_type == "gemma2" else None

    def layer_window(self, i: int) -> int | None:
        if self.layer_types[i] != SLIDING or self.sliding_window is None:
            return None
        w = self.sliding_window
        if self.causal:
            return w  # t - s < W
        return w // 2 + 1 if self.model_type == "gemma3_text" else w + 1  # |t - s| <= W // 2, resp. <= W

    def layer_rope(self, i: int) -> RopeSpec:
        return self.rope_local if self.rope_local is not None and self.layer_types[i] == SLIDING else self.rope

    # ---- Hugging Face config

    @classmethod
    def from_hf(cls, hf: dict[str, Any], **overrides) -> "GemmaConfig":
        model_type = hf.get("model_type", "gemma2")
        where = f"{model_type} config"
        kw = {**_DEFAULTS.get(model_type, {}), **hf_kwargs(hf, cls.HF_FIELDS)}
        for k, default in (("attn_logit_softcapping", _ATTN_SOFTCAP), ("final_logit_softcapping", _FINAL_SOFTCAP)):
            kw[k] = hf[k] if k in hf else default.get(model_type)
        kw["hidden_act"] = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
        kw["sliding_window"] = hf["sliding_window"] if "sliding_window" in hf else _WINDOW
        n = hf.get("num_hidden_layers", cls.num_hidden_layers)
        kw["layer_types"] = tuple(hf.get("layer_types") or default_layer_types(
            model_type, n, hf.get("sliding_window_pattern") if model_type == "gemma3_text" else None))
        if model_type == "gemma3_text":
            kw["rope"], kw["rope_local"] = _gemma3_ropes(hf, where)
            if not is_causal(hf) and not hf.get("use_bidirectional_attention"):
                raise ValueError(f"{where}: is_causal=false without use_bidirectional_attention is not supported "
                                 "(fix: use_bidirectional_attention=true, EmbeddingGemma's switch)")
            kw["causal"] = not hf.get("use_bidirectional_attention")
        else:
            kw["rope"] = rope_from_hf(hf, where)
            if hf.get("use_bidirectional_attention"):
                raise ValueError(f"{where}: use_bidirectional_attention is not supported for Gemma 2 (transformers' "
                                 "Gemma2Model keeps causal masks with it; fix: is_causal=false)")
            kw["causal"] = is_causal(hf)
        kw.update(overrides)
        return cls(model_type=model_type, **kw)

    def to_hf(self) -> dict[str, Any]:
        d = self.base_hf(self.HF_FIELDS)
        d.update(model_type=self.model_type, architectures=[self.ARCHITECTURES[self.model_type]],
                 hidden_activation=self.hidden_act, sliding_window=self.sliding_window,
                 layer_types=list(self.layer_types))
        if self.model_type == "gemma3_text":
            d["rope_parameters"] = {FULL: self.rope.to_hf(), SLIDING: self.rope_local.to_hf()}
            d["use_bidirectional_attention"] = not self.causal
        else:
            d["rope_parameters"] = self.rope.to_hf()
            if not self.causal:
                d["is_causal"] = False
        return d


def _gemma3_ropes(hf: dict[str, Any], where: str) -> tuple[RopeSpec, RopeSpec]:
    """(global, local) RoPE of a Gemma 3 config: transformers 5's ``rope_parameters`` per layer type, or
    transformers 4's ``rope_theta`` + ``rope_scaling`` (global) and ``rope_local_base_freq`` (local)."""
    params = hf.get("rope_parameters") or {}
    if params and not (FULL in params or SLIDING in params):
        raise ValueError(f"{where}: rope_parameters must be keyed by layer type ({FULL!r}, {SLIDING!r})")
    full = dict(params.get(FULL) or {})
    full.update(hf.get("rope_scaling") or {})  # transformers: rope_scaling applies to the global layers
    glob = from_params(full, theta=hf.get("rope_theta", _GEMMA3_THETA), max_positions=hf.get(
        "max_position_embeddings"), where=f"{where} ({FULL})")
    local = from_params(params.get(SLIDING), theta=hf.get("rope_local_base_freq", _GEMMA3_LOCAL_THETA),
                        max_positions=hf.get("max_position_embeddings"), where=f"{where} ({SLIDING})")
    return glob, local


class GemmaModel(DecoderModel):
    """Gemma 2 / Gemma 3 text backbone (``jaxembed.models.decoder.DecoderModel`` with a ``GemmaConfig``)."""
