"""Export to a folder that ``transformers.AutoModel`` and ``sentence_transformers.SentenceTransformer`` both load.

Layout (the sentence-transformers v3 format, which v3 through v6 read):
config.json, model.safetensors (PyTorch layout), tokenizer files, modules.json, sentence_bert_config.json,
1_Pooling/config.json, [k_Dense/...], n_Normalize/, config_sentence_transformers.json (prompts keyed by task name,
task type, ``query`` / ``document`` as mteb looks them up), README.md.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from jaxembed import __version__, models
from jaxembed.models.embedding import DENSE_ACTIVATIONS, EmbeddingModel
from jaxembed.tokenizer import Tokenizer

log = logging.getLogger(__name__)

_DTYPE_NAMES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
                "int32": "I32"}
_POOLING_KEYS = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
                 "max": "pooling_mode_max_tokens", "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens",
                 "lasttoken": "pooling_mode_lasttoken"}


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
    """Write a .safetensors file (any numpy dtype incl. ml_dtypes bfloat16), atomically."""
    header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    arrays = []
    for k in sorted(tensors):
        a = np.ascontiguousarray(tensors[k])
        name = _DTYPE_NAMES.get(str(a.dtype))
        if name is None:
            raise ValueError(f"cannot write tensor {k} of dtype {a.dtype} to safetensors")
        header[k] = {"dtype": name, "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        arrays.append(a)
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as f:
        f.write(len(hb).to_bytes(8, "little"))
        f.write(hb)
        for a in arrays:
            f.write(a.tobytes())
    os.replace(tmp, path)


def _dump(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def export(model: EmbeddingModel, tokenizer: Tokenizer, out_dir: str | os.PathLike, *,
           hf_config: dict | None = None, prompts: dict[str, str] | None = None,
           default_prompt_name: str | None = None, similarity_fn_name: str = "cosine",
           model_card: str | None = None) -> Path:
    """Write ``model`` + ``tokenizer`` as a Hugging Face / sentence-transformers folder and return its path.

    hf_config: the original config.json (kept for fields we do not model, e.g. ``_name_or_path``), overlaid
    with our architecture fields."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = model.config
    if getattr(config, "causal", True) is False:
        log.warning("exporting a bidirectional %s: PyTorch transformers will run it with causal attention, so its "
                    "embeddings there differ from jaxembed's", config.model_type)
    cfg = {k: v for k, v in (hf_config or {}).items() if k not in ("architectures", "auto_map")}
    cfg.update(config.to_hf())
    cfg["dtype"] = config.param_dtype
    cfg.setdefault("transformers_version", _transformers_version())
    _dump(out / "config.json", cfg)
    tensors = models.export_weights(model.backbone)
    write_safetensors(out / "model.safetensors", tensors)

    hf_tok = tokenizer.hf
    hf_tok.model_max_length = tokenizer.max_length
    tokenizer.save(out)

    head = model.head
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
    _dump(out / "sentence_bert_config.json", {"max_seq_length": tokenizer.max_length,
                                              "do_lower_case": bool(tokenizer.lowercase)})
    pool_cfg = {"word_embedding_dimension": config.hidden_size}
    pool_cfg.update({key: head.pooling == mode for mode, key in _POOLING_KEYS.items()})
    pool_cfg["pooling_mode_weightedmean_tokens"] = False
    pool_cfg["include_prompt"] = head.include_prompt
    _dump(out / "1_Pooling" / "config.json", pool_cfg)
    modules.append({"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"})
    torch_act = {v: k for k, v in DENSE_ACTIVATIONS.items()}
    for spec, layer in zip(head.dense, model.dense):
        i = len(modules)
        sub = out / f"{i}_Dense"
        _dump(sub / "config.json", {"in_features": spec.in_features, "out_features": spec.out_features,
                                    "bias": spec.bias, "activation_function": torch_act[spec.activation]})
        w = {"linear.weight": np.asarray(layer.linear.kernel[...]).T}
        if spec.bias:
            w["linear.bias"] = np.asarray(layer.linear.bias[...])
        write_safetensors(sub / "model.safetensors", w)
        modules.append({"idx": i, "name": str(i), "path": f"{i}_Dense", "type": "sentence_transformers.models.Dense"})
    if head.normalize:
        i = len(modules)
        (out / f"{i}_Normalize").mkdir(exist_ok=True)
        modules.append({"idx": i, "name": str(i), "path": f"{i}_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    _dump(out / "modules.json", modules)
    _dump(out / "config_sentence_transformers.json", {
        "__version__": {"jaxembed": __version__},
        "model_type": "SentenceTransformer",
        "prompts": dict(prompts or {}),
        "default_prompt_name": default_prompt_name,
        "similarity_fn_name": similarity_fn_name,
    })
    (out / "README.md").write_text(model_card or _card(config, head, prompts), encoding="utf-8")
    return out


def export_loaded(loaded, out_dir: str | os.PathLike) -> Path:
    """Export what ``jaxembed.hf.load`` returned (keeps its prompts and original config fields)."""
    return export(loaded.model, loaded.tokenizer, out_dir, hf_config=loaded.hf_config, prompts=loaded.st.prompts,
                  default_prompt_name=loaded.st.default_prompt_name, similarity_fn_name=loaded.st.similarity_fn_name)


def _transformers_version() -> str:
    try:
        import transformers

        return transformers.__version__
    except ImportError:
        return "unknown"


def _card(config, head, prompts) -> str:
    lines = [
        "---", "library_name: sentence-transformers", "tags:", "- sentence-transformers", "- feature-extraction",
        "- jaxembed", "---", "", "# Text-embedding model trained with jaxembed", "",
        f"Architecture: `{config.model_type}`, {config.num_layers} layers, hidden size {config.hidden_size}; "
        f"pooling `{head.pooling}`{'' if head.include_prompt else ' (instruction tokens excluded)'}"
        f"{', L2-normalised' if head.normalize else ''}.", "",
        "```python", "from sentence_transformers import SentenceTransformer",
        "model = SentenceTransformer('PATH')", "emb = model.encode(['a sentence'])", "```", "",
    ]
    if prompts:
        lines += ["Prompts (instructions):", ""] + [f"- `{k}`: `{v}`" for k, v in sorted(prompts.items())] + [""]
    return "\n".join(lines)
