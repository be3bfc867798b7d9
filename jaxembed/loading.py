"""Import from a Hugging Face / sentence-transformers folder or hub id.

Reads ``config.json``, weights (``model.safetensors``, sharded safetensors with an index, or -- only when torch is
installed -- ``pytorch_model.bin`` through ``torch.load(weights_only=True)``), tokenizer files, and the
sentence-transformers pipeline (``modules.json``: Transformer, Pooling, Dense, Normalize;
``sentence_bert_config.json``; ``config_sentence_transformers.json`` with prompts). Never unpickles arbitrary
objects and never runs remote code. A damaged weights file (truncated, a bad header, a missing shard, a pickle of
other objects than tensors) is a ModelLoadError: one line naming the file, what is wrong and the fix.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
import re
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxembed import hub, models
from jaxembed.errors import UserError
from jaxembed.models.embedding import DENSE_ACTIVATIONS, DenseSpec, EmbeddingModel, HeadConfig
from jaxembed.models.layers import to_dtype
from jaxembed.tokenizer import Tokenizer, missing_tokenizer_files

log = logging.getLogger(__name__)

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
              "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


class ModelLoadError(UserError):
    """A model folder or id that cannot be loaded; the message names the file and the fix."""


def resolve(name_or_path: str | os.PathLike, revision: str | None = None) -> Path:
    """A local folder, or a hub id downloaded with huggingface_hub (cached; honours HF_HUB_OFFLINE / HF_TOKEN)."""
    p = Path(os.path.expanduser(str(name_or_path)))
    if p.is_dir():
        return p
    if p.exists():
        raise ModelLoadError(f"{p}: is a file; pass the model folder (the one holding config.json)")
    name = str(name_or_path)
    if not _HUB_ID.match(name) or name.startswith((".", "/")):
        raise ModelLoadError(f"{name}: no such folder (and not a Hugging Face hub id like 'org/model')")
    from huggingface_hub import snapshot_download

    try:
        return Path(hub.call(f"{name}: downloading the model", snapshot_download, name, revision=revision,
                             allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*tokenizer*",
                                             "*/*.json", "*/*.safetensors"]))
    except hub.HubDeadline as e:
        raise ModelLoadError(hub.download_unreachable(name, e.detail)) from None
    except Exception as e:  # network, auth, missing repo, offline without the model in the cache
        raise ModelLoadError(hub.download_failure(name, e)) from None


def _read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path}: invalid JSON at line {e.lineno}: {e.msg}") from None


_DAMAGED = "fix: the file is damaged: download or copy it again, or export the model again"
_ST_HEADER_LIMIT = 100_000_000  # the safetensors format's own limit on the header size


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Read a .safetensors file into numpy arrays (memory-mapped, zero-copy; bfloat16 via ml_dtypes).

    The header is checked against the file before any tensor is read: a truncated file, a header that is not
    JSON, a tensor whose bytes lie beyond the end of the file or do not match its shape each give one
    ModelLoadError naming the file."""
    import ml_dtypes

    dtypes = dict(_ST_DTYPES, BF16=ml_dtypes.bfloat16)
    size = path.stat().st_size
    with open(path, "rb") as f:
        first = f.read(8)
        if len(first) < 8:
            raise ModelLoadError(f"{path}: truncated: a safetensors file starts with an 8-byte header length, the "
                                 f"file has {size} bytes ({_DAMAGED})")
        n = int.from_bytes(first, "little")
        if n > _ST_HEADER_LIMIT:
            raise ModelLoadError(f"{path}: not a safetensors file: its first 8 bytes give a header of {n} bytes, "
                                 f"more than the format allows ({_DAMAGED})")
        if 8 + n > size:
            raise ModelLoadError(f"{path}: truncated: its header alone says {8 + n} bytes, the file has {size} "
                                 f"({_DAMAGED})")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ModelLoadError(f"{path}: bad header: not UTF-8 text (byte {e.start} of the header) ({_DAMAGED})"
                             ) from None
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path}: bad header JSON: {e.msg} at byte {e.pos} of the {n}-byte header "
                             f"({_DAMAGED})") from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"{path}: bad header: a JSON {type(header).__name__}, not an object ({_DAMAGED})")
    header.pop("__metadata__", None)
    data = size - 8 - n  # bytes after the header
    spans = {}
    for key, info in header.items():
        ok = isinstance(info, dict) and isinstance(info.get("dtype"), str) and isinstance(info.get("shape"), list)
        offsets = info.get("data_offsets") if ok else None
        ok = ok and isinstance(offsets, list) and len(offsets) == 2 and all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in offsets + info["shape"])
        if not ok or offsets[0] > offsets[1]:
            raise ModelLoadError(f"{path}: bad header: tensor {key!r} needs a dtype, a shape of integers and "
                                 f"data_offsets [start, end], got {json.dumps(info)[:200]} ({_DAMAGED})")
        if info["dtype"] not in dtypes:
            raise ModelLoadError(f"{path}: tensor {key} has unsupported dtype {info['dtype']}")
        spans[key] = offsets
    if spans:
        key, (start, end) = max(spans.items(), key=lambda kv: kv[1][1])
        if end > data:
            raise ModelLoadError(f"{path}: truncated: its header says {8 + n + end} bytes, the file has {size} "
                                 f"(tensor {key!r} at data bytes {start}..{end} lies beyond the end) ({_DAMAGED})")
    for key, (start, end) in spans.items():
        info = header[key]
        need = int(np.prod(info["shape"], dtype=np.int64)) * np.dtype(dtypes[info["dtype"]]).itemsize
        if end - start != need:
            raise ModelLoadError(f"{path}: bad header: tensor {key!r} ({info['dtype']}, shape {info['shape']}) "
                                 f"needs {need} bytes, its data_offsets [{start}, {end}] give {end - start} "
                                 f"({_DAMAGED})")
    if not spans or data == 0:
        return {k: np.zeros(header[k]["shape"], dtypes[header[k]["dtype"]]) for k in spans}
    buf = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    return {key: buf[start:end].view(dtypes[header[key]["dtype"]]).reshape(header[key]["shape"])
            for key, (start, end) in spans.items()}


_TO_SAFETENSORS = ("convert the folder to safetensors, e.g. transformers.AutoModel.from_pretrained(FOLDER)"
                   ".save_pretrained(OUT, safe_serialization=True), or sentence_transformers.SentenceTransformer"
                   "(FOLDER).save(OUT)")


def _read_torch_bin(path: Path) -> dict[str, np.ndarray]:
    """A PyTorch pickle of plain tensors (a state dict), through ``torch.load(weights_only=True)``: anything else
    (a pickled module, other objects, a damaged file) is refused in one line."""
    try:
        import torch
    except ImportError:
        raise ModelLoadError(
            f"{path}: only PyTorch pickle weights were found and torch is not installed. Install torch "
            f"(pip install torch==2.13.0) to read them safely (fix: or {_TO_SAFETENSORS})"
        ) from None
    log.warning("%s: reading PyTorch weights with torch.load(weights_only=True) (no arbitrary unpickling)", path)
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # a pickle of other objects than tensors: refused, never unpickled
        raise ModelLoadError(f"{path}: a PyTorch pickle that torch.load(weights_only=True) refuses "
                             f"({_first_sentence(e)}); jaxembed reads safetensors, and PyTorch pickles only when "
                             f"they hold plain tensors (fix: {_TO_SAFETENSORS})") from None
    except Exception as e:  # a damaged file (torch's zip reader, an EOF in the pickle)
        raise ModelLoadError(f"{path}: unreadable PyTorch pickle ({type(e).__name__}: {_first_sentence(e)}) "
                             f"({_DAMAGED}; or {_TO_SAFETENSORS})") from None
    bad = ("not a dict of tensors but a " + type(sd).__name__ if not isinstance(sd, dict) else next(
        (f"key {k!r} holds a {type(v).__name__}, not a tensor" for k, v in sd.items()
         if not isinstance(k, str) or not isinstance(v, torch.Tensor)), None))
    if bad:
        raise ModelLoadError(f"{path}: {bad}; jaxembed reads safetensors, and PyTorch pickles only when they hold "
                             f"a state dict of plain tensors (fix: {_TO_SAFETENSORS})")
    return {k: v.float().numpy() if v.dtype == torch.bfloat16 else v.numpy() for k, v in sd.items()}


def _first_sentence(e: BaseException) -> str:
    """The part of an exception's message that says what is wrong (torch's run to many lines of advice)."""
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    text = next((x.split("error:", 1)[1].strip() for x in lines if "Unpickler error:" in x), lines[0] if lines else "")
    cut = re.search(r"(?<=[a-z0-9)\]])\. ", text)
    return (text[:cut.start()] if cut else text.rstrip("."))[:300]


def read_weights(folder: Path) -> tuple[dict[str, np.ndarray], str]:
    """All tensors of the model in ``folder`` (single or sharded safetensors, else pytorch_model.bin)."""
    for single, index, reader in (("model.safetensors", "model.safetensors.index.json", read_safetensors),
                                  ("pytorch_model.bin", "pytorch_model.bin.index.json", _read_torch_bin)):
        if (folder / single).exists():
            return reader(folder / single), str(folder / single)
        if (folder / index).exists():
            tensors = {}
            for s in _shards(folder / index):
                tensors.update(reader(folder / s))
            return tensors, str(folder / index)
    raise ModelLoadError(f"{folder}: no weights found (model.safetensors, model.safetensors.index.json or "
                         "pytorch_model.bin)")


def _shards(index: Path) -> list[str]:
    """The shard files an index names (``weight_map``: tensor -> file in the same folder), each checked to exist."""
    doc = _read_json(index)
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(
            isinstance(v, str) for v in weight_map.values()):
        raise ModelLoadError(f"{index}: field 'weight_map': missing or not a mapping tensor name -> shard file "
                             f"({_DAMAGED})")
    shards = sorted(set(weight_map.values()))
    for s in shards:
        if Path(s).is_absolute() or ".." in Path(s).parts:
            raise ModelLoadError(f"{index}: names shard {s!r}, outside the model folder (fix: shards are files in "
                                 "the folder of the index)")
        if not (index.parent / s).is_file():
            raise ModelLoadError(f"{index}: names shard {s}, which is missing from {index.parent} (fix: download "
                                 "or copy every shard the index names, or the whole folder again)")
    return shards


@dataclasses.dataclass
class STInfo:
    """What a sentence-transformers folder says about the pipeline around the transformer."""

    transformer_dir: Path
    head: HeadConfig
    dense_weights: list[dict[str, np.ndarray]]
    max_seq_length: int | None = None
    do_lower_case: bool = False
    prompts: dict[str, str] = dataclasses.field(default_factory=dict)
    default_prompt_name: str | None = None
    similarity_fn_name: str = "cosine"
    is_sentence_transformers: bool = False


_LEGACY_POOLING = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                   "pooling_mode_max_tokens": "max", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
                   "pooling_mode_lasttoken": "lasttoken", "pooling_mode_weightedmean_tokens": "weightedmean"}
_POOLING_NAMES = {"mean_sqrt_len_tokens": "mean_sqrt_len"}


def _pooling_from_config(path: Path) -> tuple[str, bool]:
    cfg = _read_json(path)
    mode = cfg.get("pooling_mode")
    if mode is None:
        active = [v for k, v in _LEGACY_POOLING.items() if cfg.get(k)]
        mode = active[0] if len(active) == 1 else active
    if isinstance(mode, list):
        mode = mode[0] if len(mode) == 1 else mode
    if not isinstance(mode, str):
        raise ModelLoadError(f"{path}: pooling modes {mode} combine several vectors; only a single mode is supported")
    mode = _POOLING_NAMES.get(mode, mode)
    if mode == "weightedmean":
        raise ModelLoadError(f"{path}: pooling mode 'weightedmean' is not supported (supported: mean, cls, "
                             "lasttoken, max, mean_sqrt_len)")
    return mode, bool(cfg.get("include_prompt", True))


def read_sentence_transformers(folder: Path, pooling_default: str = "mean") -> STInfo:
    """Parse modules.json & co. A folder without modules.json is a plain HF model: mean pooling + L2 norm."""
    modules_file = folder / "modules.json"
    info = STInfo(transformer_dir=folder, head=HeadConfig(pooling=pooling_default), dense_weights=[])
    cst = folder / "config_sentence_transformers.json"
    if cst.exists():
        c = _read_json(cst)
        info.prompts = dict(c.get("prompts") or {})
        info.default_prompt_name = c.get("default_prompt_name")
        info.similarity_fn_name = c.get("similarity_fn_name") or "cosine"
    if not modules_file.exists():
        return info
    info.is_sentence_transformers = True
    mode, include_prompt, normalize, dense = pooling_default, True, False, []
    for m in _read_json(modules_file):
        kind = m["type"].rsplit(".", 1)[-1]
        sub = folder / m.get("path", "")
        if kind in ("Transformer", "INSTRUCTOR_Transformer", "MoTETransformer"):  # MoTETransformer: jaxembed's
            # own MoTE module (jaxembed.export); read as data here, never imported
            info.transformer_dir = sub
            sbc = sub / "sentence_bert_config.json"
            if sbc.exists():
                c = _read_json(sbc)
                info.max_seq_length = c.get("max_seq_length")
                info.do_lower_case = bool(c.get("do_lower_case", False))
        elif kind in ("Pooling", "INSTRUCTOR_Pooling"):
            mode, include_prompt = _pooling_from_config(sub / "config.json")
            if kind == "INSTRUCTOR_Pooling":
                include_prompt = False  # INSTRUCTOR excludes instruction tokens from mean pooling
        elif kind == "Dense":
            c = _read_json(sub / "config.json")
            act = c.get("activation_function", "torch.nn.modules.linear.Identity")
            if act not in DENSE_ACTIVATIONS:
                raise ModelLoadError(f"{sub / 'config.json'}: Dense activation {act} is not supported; supported: "
                                     + ", ".join(DENSE_ACTIVATIONS))
            dense.append(DenseSpec(int(c["in_features"]), int(c["out_features"]), bool(c.get("bias", True)),
                                   DENSE_ACTIVATIONS[act]))
            w, _ = read_weights(sub)
            info.dense_weights.append(w)
        elif kind == "Normalize":
            normalize = True
        else:
            raise ModelLoadError(f"{modules_file}: module type {m['type']} is not supported (supported: "
                                 "Transformer, Pooling, Dense, Normalize)")
    info.head = HeadConfig(pooling=mode, include_prompt=include_prompt, dense=tuple(dense), normalize=normalize)
    return info


@dataclasses.dataclass
class Loaded:
    model: EmbeddingModel
    tokenizer: Tokenizer
    hf_config: dict
    st: STInfo
    source: Path


def load(name_or_path: str | os.PathLike, *, dtype: str = "float32", param_dtype: str = "float32",
         remat: bool = False, max_length: int | None = None, pooling: str | None = None,
         normalize: bool | None = None, revision: str | None = None, mote=None, task: str | None = None,
         **arch_overrides) -> Loaded:
    """Load an embedding model (weights, tokenizer, pooling, prompts) from a folder or a hub id.

    arch_overrides: architecture fields such as ``causal=False`` for a Qwen2 backbone.

    MoTE (``jaxembed.mote``): a folder with ``mote_config.json`` (a jaxembed MoTE export) loads as a MoTE model
    with all its experts, or, with ``task``, only the experts that task uses (an expert name, a task type such as
    ``retrieval`` / ``Classification``, or ``query`` / ``document``): the others are never read from disk.
    ``mote``: a ``MoTESpec`` to up-cycle a dense folder into (MoTE 3.1.1)."""
    folder = resolve(name_or_path, revision)
    st = read_sentence_transformers(folder)
    if pooling is not None or normalize is not None:
        st.head = dataclasses.replace(st.head, **{k: v for k, v in (("pooling", pooling), ("normalize", normalize))
                                                  if v is not None})
    tdir = st.transformer_dir
    if not (tdir / "config.json").is_file():
        check_complete(tdir)  # names config.json and whatever else is missing
    for name, value in (("dtype", dtype), ("param_dtype", param_dtype)):
        to_dtype(value)
    hf_config = _read_json(tdir / "config.json")
    try:
        config = models.config_from_hf(hf_config, where=str(tdir / "config.json"), dtype=dtype,
                                       param_dtype=param_dtype, remat=remat, **arch_overrides)
    except (TypeError, ValueError) as e:
        raise ModelLoadError(f"{tdir / 'config.json'}: {e}") from None
    check_complete(tdir)
    limit, table = config_position_limit(config), _position_table(config, tdir / "config.json")
    if max_length:  # asked for: checked before any weight is read
        check_max_length(max_length, "--max-length / model.max_length", limit, table)
    ml = max_length or st.max_seq_length
    tok = Tokenizer.from_folder(tdir, ml, lowercase=st.do_lower_case)  # checked on a probe before any weight
    tensors, wsource = read_weights(tdir)
    backbone, config = models.load_weights(config, tensors, source=wsource)
    del tensors
    backbone = _load_mote(backbone, tdir, mote, task)
    model = EmbeddingModel(backbone, st.head)
    for layer, w in zip(model.dense, st.dense_weights):
        pdt = to_dtype(param_dtype)
        layer.linear.kernel.value = jnp.asarray(np.asarray(w["linear.weight"], np.float32).T, pdt)
        if layer.linear.bias is not None:
            layer.linear.bias.value = jnp.asarray(np.asarray(w["linear.bias"], np.float32), pdt)
    if limit is not None and tok.max_length > limit:  # the folder's own max_seq_length: capped, said once
        log.warning("%s: the folder's max length %d is longer than the position table: %d positions (%s); texts "
                    "are cut at %d tokens", folder, tok.max_length, limit, table, limit)
        tok.max_length = limit
    return Loaded(model, tok, hf_config, st, folder)


_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def check_complete(tdir: Path) -> None:
    """A model folder holds what ``load`` needs before any of it is read: config.json, a weights file and a
    tokenizer's files (the tokenizer is then checked on a probe sentence, ``jaxembed.tokenizer.check_round_trip``).
    Otherwise one ModelLoadError naming everything missing and the fix."""
    missing = [] if (tdir / "config.json").is_file() else ["config.json"]
    if not any((tdir / n).is_file() for n in _WEIGHT_FILES):
        missing.append("weights found (" + ", ".join(_WEIGHT_FILES[:3]) + ")")
    tok = missing_tokenizer_files(tdir)
    if tok:
        missing.append(tok)
    if missing:
        raise ModelLoadError(f"{tdir}: not a complete model folder: no {'; no '.join(missing)} (fix: copy the "
                             "whole model folder again -- weights, config.json and the tokenizer files of the same "
                             "model -- or pass the folder that holds them)")


def _load_mote(backbone, tdir: Path, spec, task: str | None):
    """The backbone with its MoTE experts: read from a MoTE export (all, or those of ``task``), or up-cycled from
    the dense backbone with ``spec``."""
    from jaxembed import mote as motelib

    saved = motelib.read_spec(tdir)
    if saved is None:
        if task is not None:
            raise ModelLoadError(f"{tdir}: a dense model without task experts, so task={task!r} does not apply "
                                 "(fix: leave out the task, or load a jaxembed MoTE export)")
        return backbone if spec is None else motelib.upcycle(backbone, spec)
    if spec is not None and (tuple(spec.experts), tuple(spec.layers)) != (saved.experts, saved.layers):
        raise ModelLoadError(f"{tdir / motelib.CONFIG_FILE}: the folder's experts {saved.experts} in layers "
                             f"{saved.layers} differ from the requested {spec.experts} in layers {spec.layers} "
                             "(fix: make model.mote match the folder, or start from a dense model)")
    if spec is not None:
        saved = dataclasses.replace(saved, routing=spec.routing, default=spec.default)
    keep = saved.experts if task is None else saved.experts_for(task)
    wfile = tdir / motelib.WEIGHTS_FILE
    if not wfile.exists():
        raise ModelLoadError(f"{wfile}: missing; {tdir / motelib.CONFIG_FILE} needs it (fix: re-export the model)")
    return motelib.from_hf_experts(backbone, saved.subset(keep), read_safetensors(wfile), str(wfile))


def config_position_limit(config) -> int | None:
    """Longest input the position table allows (None for relative positions, e.g. T5)."""
    n = getattr(config, "max_position_embeddings", None)
    if n is None:
        return None
    return n - (config.pad_token_id + 1 if getattr(config, "offset_positions", False) else 0)


def _position_table(config, path) -> str:
    """Where the position limit comes from, for messages: ``PATH: max_position_embeddings N[ minus K ...]``."""
    n = getattr(config, "max_position_embeddings", None)
    if n is None:
        return f"{path}: relative positions, no table"
    offset = config.pad_token_id + 1 if getattr(config, "offset_positions", False) else 0
    return f"{path}: max_position_embeddings {n}" + (
        f" minus {offset} (RoBERTa-style positions start after pad_token_id {config.pad_token_id})" if offset else "")


#: The shortest max length: a max length counts the special tokens the tokenizer adds around a text ([CLS] ...
#: [SEP], <s> ... </s>; one EOS for decoders and T5), and two is the most any supported model adds. Below it the
#: tokenizer cannot truncate at all (it returns the whole text, longer than the limit).
MIN_MAX_LENGTH = 2


def check_max_length(value, key: str, limit: int | None, table: str) -> None:
    """The rule for every max length (``model.max_length``, a dataset's ``max_query_length`` / ``max_doc_length``,
    ``--max-length``): an integer from MIN_MAX_LENGTH up to the model's position table ``limit`` (None: no table);
    a UserError naming ``key``, the value, the limit (``table`` says where it comes from) and the fix."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise UserError(f"{key} = {value!r} is not a whole number of tokens (fix: a length in tokens such as 128, "
                        "256 or 512)")
    if value < MIN_MAX_LENGTH:
        raise UserError(f"{key} = {value!r} is too short: a max length counts the special tokens the tokenizer adds "
                        f"around each text ([CLS] ... [SEP], <s> ... </s>), so it is at least {MIN_MAX_LENGTH} "
                        "(fix: a length in tokens such as 128, 256 or 512)")
    if limit is not None and value > limit:
        raise UserError(f"{key} = {value} is longer than the model's position table: {limit} positions ({table}) "
                        f"(fix: {key} at most {limit})")


def position_limit(name_or_path: str | os.PathLike) -> tuple[int | None, str] | None:
    """(position limit, where it comes from) of a local model folder, read from its config.json only (no
    weights, no tokenizer, no download); None for anything that is not a local folder."""
    p = Path(os.path.expanduser(str(name_or_path)))
    if not p.is_dir():
        return None
    st = read_sentence_transformers(p)
    path = st.transformer_dir / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{st.transformer_dir}: no config.json; is this a Hugging Face model folder?")
    try:
        config = models.config_from_hf(_read_json(path), where=str(path))
    except (TypeError, ValueError) as e:
        if isinstance(e, UserError):
            raise
        raise ModelLoadError(f"{path}: {e}") from None
    return config_position_limit(config), _position_table(config, path)


def default_max_length(name_or_path: str | os.PathLike) -> int | None:
    """The max length ``load`` gives a local model folder when none is asked for, from its JSON files (no
    tokenizer, no weights): sentence_bert_config.json's max_seq_length, else tokenizer_config.json's
    model_max_length as ``Tokenizer.from_folder`` takes it (512 when absent or absurdly large), capped at the
    position table; None for anything that is not a local folder."""
    p = Path(os.path.expanduser(str(name_or_path)))
    found = position_limit(p)
    if found is None:
        return None
    st = read_sentence_transformers(p)
    n = st.max_seq_length
    if not n:
        tc = st.transformer_dir / "tokenizer_config.json"
        n = _read_json(tc).get("model_max_length") if tc.is_file() else None
        n = n if isinstance(n, int) and 0 < n < 1_000_000 else 512
    return n if found[0] is None else min(int(n), found[0])
