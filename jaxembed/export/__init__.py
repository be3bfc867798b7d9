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

from jaxembed import __version__, base_model, models
from jaxembed.runs import atomic_files
from jaxembed.data import leftovers
from jaxembed.errors import UserError
from jaxembed.runs.rundir import RunDir
from jaxembed.models.embedding import DENSE_ACTIVATIONS, EmbeddingModel
from jaxembed.tokenizer import Tokenizer

log = logging.getLogger(__name__)

_DTYPE_NAMES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
                "int32": "I32"}
_POOLING_KEYS = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
                 "max": "pooling_mode_max_tokens", "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens",
                 "lasttoken": "pooling_mode_lasttoken"}


def check_target(out: str | os.PathLike, flag: str = "--out", *, workdir: str | os.PathLike | None = None,
                 source: str | os.PathLike | None = None) -> Path:
    """Refuse, before any work, an export folder that would replace what jaxembed did not write: one that is, or
    contains, the run directory ``workdir`` or the model folder ``source`` being exported, or lies inside the run's
    checkpoints; or an existing folder that is not an unchanged earlier export (``atomic_files.replace_refusal``: an
    application folder, a model folder of someone else's, an export with the user's files added). -> the path."""
    out = Path(os.path.expanduser(str(out)))
    real = Path(os.path.realpath(out))
    guarded = []
    if workdir is not None:
        w = RunDir(os.path.realpath(os.path.expanduser(str(workdir))))
        guarded += [("the run directory", w.root, False), ("the run's checkpoints", w.checkpoints, True)]
    if source is not None and Path(os.path.expanduser(str(source))).exists():
        guarded.append(("the model folder being exported", Path(os.path.realpath(os.path.expanduser(str(source)))),
                        False))
    for what, p, no_inside in guarded:
        where = ("is" if real == p else "contains" if real in p.parents else
                 "lies inside" if no_inside and p in real.parents else None)
        if where:
            example = w.export if workdir is not None else real.parent / f"{real.name}_export"
            raise UserError(f"{flag} {out}: {where} {what} ({p}); the export would replace it, so nothing is written "
                            f"(fix: another folder, e.g. {example})")
    why = atomic_files.replace_refusal(out)
    if why is not None:
        raise UserError(f"{flag} {out}: {why}; the export replaces only a folder jaxembed exported before, unchanged "
                        "since, so nothing there is touched (fix: choose a new or empty folder, or move those files "
                        "elsewhere first)")
    return out


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

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(len(hb).to_bytes(8, "little"))
            f.write(hb)
            for a in arrays:
                f.write(a.tobytes())

    atomic_files.write_with(path, write)


def _dump(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def export(model: EmbeddingModel, tokenizer: Tokenizer, out_dir: str | os.PathLike, *,
           hf_config: dict | None = None, prompts: dict[str, str] | None = None,
           default_prompt_name: str | None = None, similarity_fn_name: str = "cosine",
           model_card: str | None = None) -> Path:
    """Write ``model`` + ``tokenizer`` as a Hugging Face / sentence-transformers folder and return its path.

    hf_config: the original config.json (kept for fields we do not model, e.g. ``_name_or_path``), overlaid
    with our architecture fields. A MoTE model is written as the full MoTE export (see ``export_mote``).

    The folder is written as a whole (``jaxembed.data.leftovers.atomic_dir``): under a temporary name, renamed into
    place when complete, so a stop or a full disk during the export leaves no half folder (and an earlier export there
    stays as it was); the temporary folders of killed exports beside it are removed."""
    if getattr(model.config, "mote", None) is not None:
        return export_mote(model, tokenizer, out_dir, hf_config=hf_config, prompts=prompts,
                           default_prompt_name=default_prompt_name, similarity_fn_name=similarity_fn_name,
                           model_card=model_card)
    if model_card is None:
        model_card = _card(model.config, model.head, prompts, max_length=tokenizer.max_length, path=out_dir)
    with leftovers.atomic_dir(out_dir) as tmp:
        _write_dense(model, tokenizer, tmp, hf_config=hf_config, prompts=prompts,
                     default_prompt_name=default_prompt_name, similarity_fn_name=similarity_fn_name,
                     model_card=model_card)
    return Path(out_dir)


def _write_dense(model: EmbeddingModel, tokenizer: Tokenizer, out: Path, *, hf_config: dict | None,
                 prompts: dict[str, str] | None, default_prompt_name: str | None, similarity_fn_name: str,
                 model_card: str | None, weights: bool = True) -> None:
    """The dense export's files, written into the (temporary) folder ``out``; weights=False: all but config.json
    and model.safetensors (a LoRA adapter folder: the weights come from its base model)."""
    config = model.config
    # Gemma 3's use_bidirectional_attention is honoured by transformers (EmbeddingGemma); the others' is_causal: false
    # is not by every attention implementation (sdpa without padding runs causally)
    if getattr(config, "causal", True) is False and not config.to_hf().get("use_bidirectional_attention"):
        log.warning("exporting a bidirectional %s: PyTorch transformers will run it with causal attention, so its "
                    "embeddings there differ from jaxembed's", config.model_type)
    if weights:
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
    (out / "README.md").write_text(model_card or _card(config, head, prompts, max_length=tokenizer.max_length),
                                   encoding="utf-8")


def export_loaded(loaded, out_dir: str | os.PathLike, *, name: str | None = None) -> Path:
    """Export what ``jaxembed.loading.load`` returned (keeps its prompts and original config fields), with the card of a
    conversion (``jaxembed.export.card.plain_card``: the source, no training claims; ``name``: the hub id it will be
    pushed to)."""
    from jaxembed.export import card as model_card

    model = loaded.model
    card = model_card.plain_card(model.config, model.head, loaded.st.prompts, source=str(loaded.source), name=name,
                                 max_length=loaded.tokenizer.max_length, mote_spec=getattr(model.config, "mote", None),
                                 path=out_dir)
    return export(model, loaded.tokenizer, out_dir, hf_config=loaded.hf_config, prompts=loaded.st.prompts,
                  default_prompt_name=loaded.st.default_prompt_name, similarity_fn_name=loaded.st.similarity_fn_name,
                  model_card=card)


def _transformers_version() -> str:
    try:
        import transformers

        return transformers.__version__
    except ImportError:
        return "unknown"


def _card(config, head, prompts, note: str = "", max_length: int | None = None, path=None) -> str:
    """The card of a folder written without a run directory (``jaxembed.export.card.plain_card``), to ``path``."""
    from jaxembed.export import card as model_card

    return model_card.plain_card(config, head, prompts, note=note, max_length=max_length, path=path)


# ------------------------------------------------------------------------------------------------------ MoTE


def export_mote(model: EmbeddingModel, tokenizer: Tokenizer, out_dir: str | os.PathLike, **kw) -> Path:
    """The full MoTE export: one sentence-transformers folder holding every expert.

    - ``config.json`` / ``model.safetensors``: the dense model of the default expert. ``transformers.AutoModel``
      loads it as that expert's model. The shared weights are stored once.
    - ``mote_experts.safetensors``: the feed-forward weights of every expert in the MoTE layers, keyed
      ``experts.<expert>.<Hugging Face key>``; ``mote_config.json``: experts, layers, routing, default.
    - ``jaxembed_mote.py``: the sentence-transformers module ``MoTETransformer``, a Transformer that swaps the
      task's expert weights into the model before each forward pass.
      ``SentenceTransformer(DIR, trust_remote_code=True)`` loads it from the folder, with no network access, and
      ``model.encode(texts, task="classification")`` selects an expert. ``task`` takes an expert name, a task
      type (``retrieval`` needs ``encode_query`` / ``encode_document``) or ``query`` / ``document``. Without a
      task, the default expert is used.

    ``jaxembed.loading.load`` reads the folder back as a MoTE model (optionally for one task's experts only)."""
    from jaxembed import mote

    spec = model.config.mote
    card = kw.pop("model_card", None) or _mote_card(model, spec, out_dir)
    kw = {"hf_config": None, "prompts": None, "default_prompt_name": None, "similarity_fn_name": "cosine", **kw}
    with leftovers.atomic_dir(out_dir) as out:  # written as a whole, like export()
        _write_dense(mote.extract_expert(model, spec.default), tokenizer, out,
                     model_card=card, **kw)
        modules = json.loads((out / "modules.json").read_text(encoding="utf-8"))
        modules[0].update(type=f"{_MOTE_MODULE}.MoTETransformer", kwargs=["task"])
        _dump(out / "modules.json", modules)
        _dump(out / mote.CONFIG_FILE, spec.to_json())
        write_safetensors(out / mote.WEIGHTS_FILE, mote.hf_expert_tensors(model))
        (out / f"{_MOTE_MODULE}.py").write_text(MOTE_ST_MODULE, encoding="utf-8")
    return Path(out_dir)


def export_expert(model: EmbeddingModel, tokenizer: Tokenizer, out_dir: str | os.PathLike, task: str,
                  **kw) -> Path:
    """A per-task export: the plain dense folder (standard Hugging Face / sentence-transformers, no custom code)
    whose feed-forward blocks are the expert of ``task``. A task whose queries and documents use two experts
    (retrieval) needs one export per expert: ``task='search_query'`` and ``task='search_document'``."""
    from jaxembed import mote

    spec = mote.get_spec(model)
    if spec is None:
        raise UserError(f"--task {task}: the model is dense (no task experts); export it without --task")
    name = spec.expert_name(task)
    dense = mote.extract_expert(model, name)
    kw.setdefault("model_card", _card(dense.config, dense.head, kw.get("prompts"), note=f"MoTE expert `{name}` "
                                      "(per-task export of a jaxembed MoTE model: a plain dense model).", path=out_dir))
    return export(dense, tokenizer, out_dir, **kw)


def export_averaged(model: EmbeddingModel, tokenizer: Tokenizer, out_dir: str | os.PathLike, **kw) -> Path:
    """MoTE App. B, expert averaging: the dense folder whose feed-forward blocks are the mean of the experts."""
    from jaxembed import mote

    if mote.get_spec(model) is None:
        raise UserError("--average-experts: the model is dense (no task experts); export it without the flag")
    dense = mote.average_experts(model)
    kw.setdefault("model_card", _card(dense.config, dense.head, kw.get("prompts"), note="Expert-averaged (MoTE "
                                      "Appendix B) dense model of a jaxembed MoTE model.", path=out_dir))
    return export(dense, tokenizer, out_dir, **kw)


def _mote_card(model: EmbeddingModel, spec, path) -> str:
    """The card of a full MoTE export written without a run directory, to ``path``."""
    from jaxembed.export import card as model_card

    return model_card.plain_card(model.config, model.head, None, mote_spec=spec, path=path)


_MOTE_MODULE = "jaxembed_mote"
MOTE_ST_MODULE = '''"""MoTE (mixture of task experts) for sentence-transformers, written by jaxembed.

    model = SentenceTransformer(PATH, trust_remote_code=True)
    model.encode(texts, task="classification")      # an expert, a task type, or "query" / "document"
    model.encode_query(queries); model.encode_document(passages)

model.safetensors holds the dense model with the default expert's feed-forward weights; mote_experts.safetensors
holds every expert's feed-forward weights (keys "experts.<expert>.<parameter name>"); mote_config.json lists the
experts, the MoTE layers and the routing (task type -> query expert, document expert). Before a forward pass the
task's expert weights are copied into the model (the inactive experts stay in CPU memory, MoTE 3.1).
"""

import json
import os
import re

import torch
from safetensors.torch import load_file, save_file

try:
    from sentence_transformers.base.modules import Transformer as _Transformer  # sentence-transformers >= 6
except ImportError:  # sentence-transformers 5
    from sentence_transformers.models import Transformer as _Transformer

_ALIASES = {"multilabelclassification": "classification", "instructionretrieval": "retrieval",
            "instructionreranking": "reranking", "bitextmining": "sts"}


def _norm(name):
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


def _local_dir(model_name_or_path, subfolder, kwargs):
    path = os.path.join(model_name_or_path, subfolder or "")
    if os.path.isdir(path):
        return path
    from sentence_transformers.util import load_dir_path

    return load_dir_path(model_name_or_path=model_name_or_path, subfolder=subfolder or "",
                         token=kwargs.get("token"), cache_folder=kwargs.get("cache_folder"),
                         revision=kwargs.get("revision"), local_files_only=kwargs.get("local_files_only", False))


class MoTETransformer(_Transformer):
    forward_kwargs = set(getattr(_Transformer, "forward_kwargs", set())) | {"task"}

    @classmethod
    def load(cls, model_name_or_path, subfolder="", **kwargs):
        module = super().load(model_name_or_path, subfolder=subfolder, **kwargs)
        module._mote_setup(_local_dir(model_name_or_path, subfolder, kwargs))
        return module

    def _mote_setup(self, folder):
        with open(os.path.join(folder, "mote_config.json"), encoding="utf-8") as f:
            self.mote_config = json.load(f)
        tensors = load_file(os.path.join(folder, self.mote_config["weights"]))
        self._mote_experts = {}
        for name in self.mote_config["experts"]:
            prefix = "experts." + name + "."
            self._mote_experts[name] = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        model = self.auto_model
        self._mote_params = {k: model.get_parameter(k) for k in self._mote_experts[self.mote_config["default"]]}
        self._mote_current = self.mote_config["default"]  # model.safetensors holds the default expert

    def expert_for(self, task):
        """The expert name of a task: an expert, "query" / "document", or a task type (retrieval needs a side)."""
        cfg = self.mote_config
        if task is None:
            return cfg["default"]
        if task in cfg["experts"]:
            return task
        routes = {_norm(t): v for t, v in cfg["routing"].items()}
        key = _norm(task)
        if key in ("query", "document"):
            return routes["retrieval"][0 if key == "query" else 1]
        pair = routes.get(key) or routes.get(_norm(_ALIASES.get(key, "")))
        if pair is None:
            raise ValueError(f"task {task!r}: not an expert ({', '.join(cfg['experts'])}), a routed task type "
                             f"({', '.join(cfg['routing'])}) or query / document")
        if pair[0] != pair[1]:
            raise ValueError(f"task {task!r} encodes queries with {pair[0]!r} and documents with {pair[1]!r}: use "
                             "encode_query / encode_document, or task='query' / 'document'")
        return pair[0]

    def set_expert(self, name):
        if name == self._mote_current:
            return
        with torch.no_grad():
            for k, v in self._mote_experts[name].items():
                self._mote_params[k].copy_(v)
        self._mote_current = name

    def forward(self, features, task=None, **kwargs):
        self.set_expert(self.expert_for(task))
        return super().forward(features, **kwargs)

    def save(self, output_path, *args, **kwargs):
        current = self._mote_current
        self.set_expert(self.mote_config["default"])
        try:
            super().save(output_path, *args, **kwargs)
        finally:
            self.set_expert(current)
        with open(os.path.join(output_path, "mote_config.json"), "w", encoding="utf-8") as f:
            json.dump(self.mote_config, f, indent=2)
        flat = {"experts." + n + "." + k: v.contiguous() for n, w in self._mote_experts.items() for k, v in w.items()}
        save_file(flat, os.path.join(output_path, self.mote_config["weights"]))
        with open(__file__, encoding="utf-8") as src, open(os.path.join(output_path, os.path.basename(__file__)),
                                                            "w", encoding="utf-8") as dst:
            dst.write(src.read())
'''


# ------------------------------------------------------------------------------------------------------ LoRA


def export_lora(model: EmbeddingModel, tokenizer: Tokenizer, out_dir: str | os.PathLike, *, spec, base: str,
                kind: str = "merged", adapter_card: str | None = None, name: str | None = None, **kw) -> Path:
    """The export of a model with LoRA adapters (``jaxembed.lora``), written as a whole like ``export``. One layout
    for every kind: the merged model is the folder ``DIR`` itself, the adapter is always ``DIR/adapter/``.

    - ``merged``: ``DIR`` is the plain folder of ``export`` with every adapted weight W0 + (alpha / r) A B (a MoTE
      model: the full MoTE export).
    - ``adapter``: ``DIR/adapter/`` is the adapter as a PEFT folder on top of ``base`` (the base model's folder or
      hub id): ``adapter_config.json`` + ``adapter_model.safetensors`` and the sentence-transformers files
      (tokenizer, modules.json, pooling ...) but no base weights, so that ``SentenceTransformer(DIR/adapter)``
      loads base + adapter, and ``peft.PeftModel.from_pretrained(AutoModel.from_pretrained(base), DIR/adapter)``
      gives the backbone. ``DIR`` holds nothing else but a README.md saying so (``loadable_folder`` finds it).
    - ``both``: the merged folder ``DIR`` with the adapter folder in ``DIR/adapter/``.

    A MoTE model whose experts share their base weights (up-cycled from a dense model) gets one adapter folder per
    expert, ``DIR/adapter/<expert>/``. ``model_card`` (in ``kw``) is the merged folder's README.md,
    ``adapter_card`` the adapter folder's (default: ``jaxembed.export.card.adapter_card``). ``name``: the hub id
    the adapter will be pushed to (its config then names the base by hub id: ``base_model.adapter_base``)."""
    from jaxembed import lora

    if kind not in lora.EXPORTS:
        raise UserError(f"LoRA export {kind!r} is not one of {', '.join(lora.EXPORTS)}")
    if kind == "merged":
        return export(lora.merged(model), tokenizer, out_dir, **kw)
    if getattr(model.config, "mote", None) is not None and not lora.experts_share_base(model):
        raise UserError("LoRA adapter export of a MoTE model whose experts have different base weights (it started "
                        "from a MoTE export): no dense base model carries them (fix: model.lora.export=merged)")
    with leftovers.atomic_dir(out_dir) as tmp:
        if kind == "both":
            staged = tmp / ".merged"
            export(lora.merged(model), tokenizer, staged, **kw)
            for p in staged.iterdir():
                os.rename(p, tmp / p.name)
            staged.rmdir()
        else:
            where = os.path.join(os.path.abspath(os.path.expanduser(str(out_dir))), ADAPTER_DIR)
            (tmp / "README.md").write_text(
                f"# LoRA adapter export\n\nThis export holds the LoRA adapter only (model.lora.export=adapter): "
                f"`{ADAPTER_DIR}/` is the PEFT adapter with the sentence-transformers files, on top of the base model "
                f"`{base}`, without base weights. It loads with\n\n```python\nfrom sentence_transformers import "
                f"SentenceTransformer\nmodel = SentenceTransformer({where!r})\n```\n", encoding="utf-8")
        kw.pop("model_card", None)
        _write_adapters(model, tokenizer, tmp / ADAPTER_DIR, spec=spec, base=base, card=adapter_card,
                        path=Path(out_dir) / ADAPTER_DIR, config_base=base_model.adapter_base(base, name),
                        **kw)
    return Path(out_dir)


#: the subfolder of a LoRA export that holds the PEFT adapter (``export_lora``)
ADAPTER_DIR = "adapter"


def loadable_folder(folder: str | os.PathLike) -> Path:
    """The folder that is the model of an export: ``folder`` itself, or for a LoRA export that holds only the
    adapter (no model files at its top) its ``adapter/``."""
    folder = Path(folder)
    sub = folder / ADAPTER_DIR
    if not ((folder / "modules.json").is_file() or (folder / "config.json").is_file()) and (
            sub / "modules.json").is_file():
        return sub
    return folder


def _write_adapters(model: EmbeddingModel, tokenizer: Tokenizer, out: Path, *, spec, base: str, card: str | None,
                    path: Path, config_base: str, **kw) -> None:
    mote_spec = getattr(model.config, "mote", None)
    if mote_spec is None:
        return _write_adapter(model, tokenizer, out, spec=spec, base=base, expert=None, card=card, path=path,
                              config_base=config_base, **kw)
    for e, name in enumerate(mote_spec.experts):
        _write_adapter(model, tokenizer, out / name, spec=spec, base=base, expert=e, card=None, path=path / name,
                       config_base=config_base, **kw)
    (out / "README.md").write_text(
        "# LoRA adapters of a jaxembed MoTE model, one per expert\n\nEach folder is the dense base model "
        f"`{base}` plus that expert's adapter (PEFT LoRA, rank {spec.rank}, alpha {spec.alpha}): "
        + ", ".join(f"`{n}/`" for n in mote_spec.experts) + ".\n", encoding="utf-8")


def _write_adapter(model: EmbeddingModel, tokenizer: Tokenizer, out: Path, *, spec, base: str, expert: int | None,
                   card: str | None, path: Path, config_base: str, hf_config: dict | None = None,
                   prompts: dict[str, str] | None = None, default_prompt_name: str | None = None,
                   similarity_fn_name: str = "cosine") -> None:
    """One PEFT adapter folder (see ``export_lora``), written to ``out`` (its final place: ``path``); ``expert``: a
    MoTE expert's index; ``config_base``: the base adapter_config.json names (``base_model.adapter_base``)."""
    from jaxembed import lora
    from jaxembed.export import card as model_card

    out.mkdir(parents=True, exist_ok=True)
    tensors, picked, every = lora.peft_tensors(model, expert)
    config = lora.peft_config(spec, picked, every, config_base)
    if card is None:
        card = model_card.adapter_card(base=base, rank=spec.rank, alpha=spec.alpha, layers=len(picked),
                                       modules=config["target_modules"], path=path,
                                       expert=model.config.mote.experts[expert] if expert is not None else None)
    _write_dense(model, tokenizer, out, hf_config=hf_config, prompts=prompts, default_prompt_name=default_prompt_name,
                 similarity_fn_name=similarity_fn_name, model_card=card, weights=False)
    _dump(out / lora.ADAPTER_CONFIG, config)
    write_safetensors(out / lora.ADAPTER_WEIGHTS, tensors)
