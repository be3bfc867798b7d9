"""Prompts and MoTE routing for evaluation, resolved the same way for the local evaluators and for mteb; the
model to evaluate (``as_encoder``, ``resolve_model_path``).

Import order of jaxembed.evaluate: ``prompts`` <- ``tasks`` <- ``runner`` (and ``mteb_adapter``); this module
imports neither of the other two.

MoTE routing: a model with task experts (``Encoder.mote``) routes each task by its own config (task type ->
expert; retrieval / reranking queries and documents apart), unless an explicit ``experts`` table is given.

Prompt lookup (mteb's order, ``mteb.models.abs_encoder.get_prompt_name``) in a prompts dict keyed by task name,
task type and prompt type (``query`` / ``document``; None for symmetric tasks):
``{task}-{prompt_type}``, ``{task}``, ``{type}-{prompt_type}``, ``{type}``, ``{prompt_type}``. No match: the
encoder's own default (``default_prompt_name``), else no prompt.

The prompts dict is, from lowest to highest priority: the model's prompts (``config_sentence_transformers.json``),
the task's instructions when ``task_instructions=True`` (formatted with ``instruction_template``; keyed by task
name so they win over the model's type-level prompts), then the caller's ``prompts``.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from jaxembed.errors import UserError
from jaxembed.runs.rundir import NAMES, RunDir

DEFAULT_INSTRUCTION_TEMPLATE = "Instruct: {instruction}\nQuery: "
ASYMMETRIC_MARKERS = ("Retrieval", "Reranking")


def is_asymmetric(task_type: str) -> bool:
    """Queries and documents are encoded differently (mteb passes prompt_type query / document)."""
    return any(m in (task_type or "") for m in ASYMMETRIC_MARKERS)


def lookup_prompt(prompts: Mapping[str, str] | None, task_name: str | None, task_type: str | None,
                  prompt_type: str | None) -> str | None:
    """The key of the prompt to use, in mteb's priority order (see the module docstring); None if none."""
    if not prompts:
        return None
    if task_name and prompt_type and f"{task_name}-{prompt_type}" in prompts:
        return f"{task_name}-{prompt_type}"
    if task_name and task_name in prompts:
        return task_name
    if task_type and prompt_type and f"{task_type}-{prompt_type}" in prompts:
        return f"{task_type}-{prompt_type}"
    if task_type and task_type in prompts:
        return task_type
    if prompt_type and prompt_type in prompts:
        return prompt_type
    return None


def instruction_prompts(task_name: str, task_type: str, instruction, document_instruction: str = "",
                        template: str = DEFAULT_INSTRUCTION_TEMPLATE) -> dict[str, str]:
    """A task's instruction(s) as prompts keyed by task name. ``instruction``: a string (symmetric tasks: every
    text; retrieval / reranking: the queries) or a dict ``{"query": ..., "document": ...}`` (mteb's
    ``TaskMetadata.prompt``)."""
    if "{instruction}" not in template:
        raise UserError(f"instruction template must contain '{{instruction}}', got {template!r}")
    if isinstance(instruction, Mapping):
        query, document = instruction.get("query") or "", instruction.get("document") or ""
    else:
        query, document = instruction or "", document_instruction or ""

    def fmt(s: str) -> str:
        return template.format(instruction=s)

    if not is_asymmetric(task_type):
        return {task_name: fmt(query)} if query else {}
    out = {}
    if query:
        out[f"{task_name}-query"] = fmt(query)
    if document:
        out[f"{task_name}-document"] = fmt(document)
    return out


Router = Mapping[str, "int | str | Sequence | Mapping"] | Callable[..., "int | str | None"]


def make_router(experts: Router | None) -> Callable[[str, str | None], int | str | None]:
    """MoTE routing hook: (task type, prompt type) -> expert (index or name); prompt type is ``query`` /
    ``document`` for retrieval and reranking, None for symmetric tasks.

    A mapping: task type -> an expert for both sides, a pair (query expert, document expert), or
    ``{"query": ..., "document": ...}``; ``"default"`` covers unlisted types. A callable: ``f(task_type)`` or
    ``f(task_type, prompt_type)``. None routes nothing."""
    if experts is None:
        return lambda task_type, prompt_type=None: None
    if callable(experts) and not isinstance(experts, Mapping):
        try:
            n = len([p for p in inspect.signature(experts).parameters.values()
                     if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)])
        except (TypeError, ValueError):
            n = 1
        if n >= 2:
            return experts
        return lambda task_type, prompt_type=None: experts(task_type)
    table = dict(experts)

    def pick(value, prompt_type):
        if isinstance(value, Mapping):
            return value.get(prompt_type or "query", value.get("query"))
        if isinstance(value, (list, tuple)):
            return value[1] if prompt_type == "document" else value[0]
        return value

    def route(task_type: str, prompt_type: str | None = None):
        if task_type in table:
            value = table[task_type]
        elif "default" in table:
            value = table["default"]
        else:
            raise UserError(f"no expert for task type {task_type!r} in the routing table (types: "
                            f"{', '.join(sorted(table))}); add it or a 'default' entry")
        value = pick(value, prompt_type)
        return value if isinstance(value, str) else int(value)

    return route


def model_router(encoder) -> Callable[[str, str | None], str] | None:
    """The routing of a MoTE model's own config (``jaxembed.mote.MoTESpec``: task type -> expert name, queries
    and documents apart), or None when the encoder's model has no task experts."""
    spec = getattr(encoder, "mote", None)
    if spec is None:
        return None
    return lambda task_type, prompt_type=None: spec.expert_name(task_type, prompt_type)


def _accepts(fn, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


_WEIGHTS = ("modules.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
            "pytorch_model.bin.index.json")


def resolve_model_path(path: str | os.PathLike) -> str:
    """A model folder for ``--model``: a training workdir (a folder holding ``export/``, as ``jaxembed train``
    writes it) gives its ``export/``; a model folder (HF / sentence-transformers / jaxembed export) or a hub id is
    returned as is."""
    p = Path(os.path.expanduser(str(path)))
    if not p.is_dir():
        return str(path)
    if any((p / f).exists() for f in _WEIGHTS):
        return str(p)
    run = RunDir(p)
    export = run.export
    if export.is_dir():
        return str(export)
    if run.has_checkpoints():
        raise UserError(f"{p}: a training workdir without export/ yet; export a checkpoint first: "
                        f"jaxembed export --workdir {p} --out {export}")
    if (p / "config.json").exists():
        return str(p)  # let the loader say what is missing
    raise UserError(f"{p}: neither a model folder (no config.json / modules.json / weights) nor a training "
                    "workdir (no export/)")


def model_label(source, slug: bool = False) -> str:
    """The name results give a model (``--model`` as given): a hub id as it is; a folder of the Hugging Face cache
    or the bundled all-MiniLM-L6-v2 its hub id; a jaxembed export its base model, fine-tuned by its run (the folder
    that holds ``export/``); another folder its name. ``slug``: as one ``org/name`` token (mteb's result folders:
    ``jaxembed/<base>-<run>``)."""
    from jaxembed import base_model

    p = Path(os.path.expanduser(str(source)))
    if not p.is_dir():
        return str(source) if "/" in str(source) or not slug else f"jaxembed/{source}"
    p = Path(resolve_model_path(p))
    hub = base_model.hub_id(p)
    if hub:
        return hub
    folder = p.parent.name if p.name in ("model", NAMES["export"]) else p.name
    base = base_model.jaxembed_base(p)
    if base:
        base = base.rsplit("/", 1)[-1]
        return f"jaxembed/{base}-{folder}" if slug else f"{base} fine-tuned ({folder})"
    return f"jaxembed/{folder}" if slug else folder


def as_encoder(model_or_encoder, **load_kwargs):
    """An encoder from: a jaxembed Encoder (or any object with ``encode(texts, prompt=..., batch_size=...)``),
    a ``jaxembed.loading.Loaded``, or a model folder / workdir / hub id (loaded with ``jaxembed.loading.load``)."""
    from jaxembed.encode import Encoder

    if hasattr(model_or_encoder, "encode") and callable(model_or_encoder.encode):
        return model_or_encoder
    if hasattr(model_or_encoder, "model") and hasattr(model_or_encoder, "tokenizer"):
        return Encoder.from_loaded(model_or_encoder)
    if isinstance(model_or_encoder, (str, bytes)) or hasattr(model_or_encoder, "__fspath__"):
        from jaxembed import loading

        return Encoder.from_loaded(loading.load(resolve_model_path(model_or_encoder), **load_kwargs))
    raise UserError(f"cannot evaluate a {type(model_or_encoder).__name__}: pass an Encoder, a loaded model "
                    "(jaxembed.loading.load) or a model folder")


class EvalEncoder:
    """Wraps an encoder for evaluation: texts -> float32 embeddings with the task's prompt and expert.

    Duplicate texts are encoded once. Used by the local evaluators and by the mteb encoder, so that both feed
    the model the same strings."""

    def __init__(self, encoder, *, prompts: Mapping[str, str] | None = None, task_instructions: bool = False,
                 instruction_template: str = DEFAULT_INSTRUCTION_TEMPLATE, experts: Router | None = None,
                 batch_size: int = 64, progress: bool = False):
        if batch_size <= 0:
            raise UserError(f"batch size must be positive, got {batch_size}")
        self.encoder = encoder
        self.model_prompts = dict(getattr(encoder, "prompts", None) or {})
        self.user_prompts = dict(prompts or {})
        self.task_instructions = task_instructions
        self.instruction_template = instruction_template
        # MoTE: an explicit table wins; otherwise a MoTE model routes by its own config (task type -> expert)
        self.route = make_router(experts) if experts is not None else (model_router(encoder) or make_router(None))
        self.batch_size = batch_size
        self.progress = progress
        if experts is not None and not _accepts(encoder.encode, "expert"):
            raise UserError(f"MoTE routing needs an encoder whose encode() takes expert=; "
                            f"{type(encoder).__name__}.encode does not")

    @property
    def renormalize(self) -> bool:
        """Whether a Matryoshka truncation is re-normalised (the model's head normalises)."""
        head = getattr(getattr(self.encoder, "model", None), "head", None)
        return bool(getattr(head, "normalize", True))

    @property
    def dim(self) -> int | None:
        return getattr(getattr(self.encoder, "model", None), "dim", None)

    def prompts_for(self, task_name: str, task_type: str, task_instruction=None,
                    document_instruction: str = "") -> dict[str, str]:
        merged = dict(self.model_prompts)
        if self.task_instructions and task_instruction:
            merged.update(instruction_prompts(task_name, task_type, task_instruction, document_instruction,
                                              self.instruction_template))
        merged.update(self.user_prompts)
        return merged

    def prompt(self, task_name: str, task_type: str, prompt_type: str | None, task_instruction=None,
               document_instruction: str = "") -> str | None:
        """The prompt text for one side of a task; None = the encoder's default."""
        prompts = self.prompts_for(task_name, task_type, task_instruction, document_instruction)
        key = lookup_prompt(prompts, task_name, task_type, prompt_type)
        return prompts[key] if key is not None else None

    def encode(self, texts: Sequence[str], *, prompt: str | None, task_type: str, prompt_type: str | None = None,
               dim: int | None = None) -> np.ndarray:
        """Embeddings of ``texts`` with ``prompt``; a MoTE encoder gets the expert of (task_type, prompt_type)."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim or 0), np.float32)
        uniq: dict[str, int] = {}
        for t in texts:
            uniq.setdefault(t, len(uniq))
        kw = {"prompt": prompt, "batch_size": self.batch_size}
        if _accepts(self.encoder.encode, "progress"):
            kw["progress"] = self.progress
        if dim is not None:
            kw["dim"] = dim
        expert = self.route(task_type, prompt_type)
        if expert is not None:
            kw["expert"] = expert
        emb = np.asarray(self.encoder.encode(list(uniq), **kw), np.float32)
        if len(uniq) == len(texts):
            return emb
        return emb[[uniq[t] for t in texts]]
