"""Batched inference: texts -> float32 embeddings in input order.

Texts are sorted by token length and cut into batches padded to a few static length buckets and a fixed number
of rows, so XLA compiles once per bucket. When several devices are visible, each batch is split over all of
them (data parallel).
"""

from __future__ import annotations

import sys
from typing import Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from tqdm.auto import tqdm

from jaxembed.errors import UserError
from jaxembed.models.embedding import EmbeddingModel
from jaxembed.tokenizer import Tokenizer, bucket_for, length_buckets


class Encoder:
    """Encodes texts with an :class:`EmbeddingModel` and its tokenizer.

    prompts: named instructions (``config_sentence_transformers.json``); default_prompt_name: used when
    neither ``prompt`` nor ``prompt_name`` is given."""

    def __init__(self, model: EmbeddingModel, tokenizer: Tokenizer, prompts: dict[str, str] | None = None,
                 default_prompt_name: str | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.prompts = dict(prompts or {})
        self.default_prompt_name = default_prompt_name
        self._graphdef, self._state = nnx.split(model)
        devices = jax.devices()
        self._mesh = Mesh(np.array(devices), ("data",)) if len(devices) > 1 else None
        if self._mesh is not None:
            self._state = jax.device_put(self._state, NamedSharding(self._mesh, P()))
        self._fn = jax.jit(self._forward, static_argnames=("dim",))

    def set_model(self, model: EmbeddingModel) -> None:
        """Swap in new weights of the same architecture (e.g. during training) without recompiling."""
        graphdef, state = nnx.split(model)
        if graphdef != self._graphdef:
            raise ValueError("set_model: the new model's structure differs from the encoder's")
        self.model = model
        self._state = state if self._mesh is None else jax.device_put(state, NamedSharding(self._mesh, P()))

    @classmethod
    def from_loaded(cls, loaded) -> "Encoder":
        """From ``jaxembed.hf.load(...)``."""
        return cls(loaded.model, loaded.tokenizer, loaded.st.prompts, loaded.st.default_prompt_name)

    def _forward(self, state, input_ids, attention_mask, prompt_lengths, experts, dim):
        model = nnx.merge(self._graphdef, state)
        return model(input_ids, attention_mask, prompt_lengths, dim=dim, experts=experts)

    @property
    def mote(self):
        """The model's ``jaxembed.mote.MoTESpec`` (its task experts), or None for a dense model."""
        return getattr(self.model.config, "mote", None)

    def expert_index(self, task: str | None = None, expert: int | str | None = None,
                     side: str | None = None) -> int | None:
        """The MoTE expert to encode with: ``expert`` (an index or a name), else the expert of ``task`` (an
        expert name, a task type such as ``retrieval`` / ``STS``, or ``query`` / ``document``) on ``side``
        (``query`` / ``document``), else the default expert. None for a dense model."""
        spec = self.mote
        if spec is None:
            if task is not None or expert is not None:
                what = f"task {task!r}" if task is not None else f"expert {expert!r}"
                raise UserError(f"{what}: this is a dense model without task experts (fix: leave out the task, or "
                                "use a MoTE model)")
            return None
        if expert is not None and task is not None:
            raise UserError("give either a task or an expert, not both")
        if expert is None:
            return spec.expert_for(task, side)
        if isinstance(expert, str):
            return spec.index(expert)
        if not 0 <= int(expert) < spec.num_experts:
            raise UserError(f"expert index {expert} is out of range: this model has {spec.num_experts} experts "
                            f"({', '.join(spec.experts)})")
        return int(expert)

    def resolve_prompt(self, prompt: str | None = None, prompt_name: str | None = None) -> str:
        if prompt is not None and prompt_name is not None:
            raise UserError("give either prompt or prompt_name, not both")
        if prompt_name is not None:
            if prompt_name not in self.prompts:
                known = ", ".join(sorted(self.prompts)) or "none"
                raise UserError(f"unknown prompt_name {prompt_name!r}; this model's prompts: {known}")
            return self.prompts[prompt_name]
        if prompt is None and self.default_prompt_name:
            return self.prompts.get(self.default_prompt_name, "")
        return prompt or ""

    def encode(self, texts: Sequence[str], *, prompt: str | None = None, prompt_name: str | None = None,
               batch_size: int = 32, max_length: int | None = None, dim: int | None = None,
               progress: bool | None = None, task: str | None = None, expert: int | str | None = None,
               side: str | None = None) -> np.ndarray:
        """texts: N strings -> [N, D] float32 (D = dim when Matryoshka-truncated), in input order.

        MoTE models: every text goes through the expert of ``task`` (on ``side``) or ``expert``, see
        ``expert_index``; without either, the default expert. Dense models take neither."""
        if isinstance(texts, str):
            raise TypeError("encode() takes a list of texts, not a single string")
        eidx = self.expert_index(task, expert, side)
        n = len(texts)
        out_dim = dim or self.model.dim
        if n == 0:
            return np.zeros((0, out_dim), np.float32)
        if dim is not None and not 0 < dim <= self.model.dim:
            raise UserError(f"--dim must be between 1 and the model's dimension {self.model.dim}, got {dim}")
        p = self.resolve_prompt(prompt, prompt_name)
        max_length = max_length or self.tokenizer.max_length
        ids = self.tokenizer.tokenize([p + t for t in texts], max_length)
        plen = self.tokenizer.prompt_length(p)
        lengths = np.array([len(x) for x in ids])
        order = np.argsort(-lengths, kind="stable")
        buckets = length_buckets(max_length)
        ndev = 1 if self._mesh is None else self._mesh.size
        rows = -(-batch_size // ndev) * ndev  # a multiple of the device count
        out = np.zeros((n, out_dim), np.float32)
        show = sys.stderr.isatty() if progress is None else progress
        with tqdm(total=n, desc="encode", unit="text", disable=not show) as bar:
            for start in range(0, n, rows):
                idx = order[start:start + rows]
                length = bucket_for(int(lengths[idx].max()), buckets)
                input_ids, mask = self.tokenizer.pad([ids[i] for i in idx], length, rows)
                pl = np.full((rows,), plen, np.int32)
                args = (input_ids, mask, pl)
                if self._mesh is not None:
                    args = jax.device_put(args, NamedSharding(self._mesh, P("data")))
                ex = None if eidx is None else np.int32(eidx)  # one expert for the call (MoTE's fast path)
                emb = self._fn(self._state, *args, ex, dim=dim)
                out[idx] = np.asarray(emb)[: len(idx)]
                bar.update(len(idx))
        return out

    def similarity(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Cosine similarity matrix [N, M] between two embedding sets."""
        a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
        b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
        return a @ b.T


def load_encoder(name_or_path: str, **kwargs) -> Encoder:
    """Load a model folder / hub id (see ``jaxembed.hf.load``) and wrap it in an Encoder."""
    from jaxembed import hf

    return Encoder.from_loaded(hf.load(name_or_path, **kwargs))
