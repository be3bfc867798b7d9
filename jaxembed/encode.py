"""Batched inference: texts -> float32 embeddings in input order.

Packed (the default; ``jaxembed.packing``; docs/design.md, Architecture): the texts are packed best-fit-decreasing
into rows of L tokens (L: the length bucket of the longest text, or of ``ROW_TEXTS`` average texts when that is
more), several texts per row, so almost no compute goes to padding. A forward pass takes R rows (R: enough rows for
about ``batch_size`` texts, a power of two times the device count; the last pass a smaller power of two) and a
static number of text slots, so XLA compiles once per (R, L, slots). With several devices, each device gets
R / devices rows and pools its own texts (``jax.shard_map``; each device's rows are self-contained).

Padded (``packing=False``): texts are sorted by token length and cut into batches of ``batch_size`` rows padded
to a few static length buckets, so XLA compiles once per bucket; each batch is split over the devices.

Both give the same embeddings (tests/test_packing_encode.py: <= 1e-5 on all-MiniLM-L6-v2). ``last_stats`` says
how many token slots the last ``encode`` computed and how many held real tokens.
"""

from __future__ import annotations

import sys
from typing import Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from tqdm.auto import tqdm

from jaxembed import packing as packlib
from jaxembed.errors import UserError
from jaxembed.models.embedding import EmbeddingModel
from jaxembed.tokenizer import Tokenizer, bucket_for, length_buckets

#: a packed row holds about this many average texts (longer rows: fewer gaps, more attention work per token)
ROW_TEXTS = 4
#: the arrays of a pack that the model reads (jaxembed.models.embedding.EmbeddingModel.encode_packed)
_PACK_KEYS = ("input_ids", "segment_ids", "positions", "token_text", "text_row", "text_start", "text_len",
              "text_prompt")


def _pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


class Encoder:
    """Encodes texts with an :class:`EmbeddingModel` and its tokenizer.

    prompts: named instructions (``config_sentence_transformers.json``); default_prompt_name: used when
    neither ``prompt`` nor ``prompt_name`` is given; packing: pack several texts per row (the default) or pad
    one text per row, when ``encode`` is not told."""

    def __init__(self, model: EmbeddingModel, tokenizer: Tokenizer, prompts: dict[str, str] | None = None,
                 default_prompt_name: str | None = None, packing: bool = True):
        self.model = model
        self.tokenizer = tokenizer
        self.prompts = dict(prompts or {})
        self.default_prompt_name = default_prompt_name
        self.packing = bool(packing)
        self.last_stats: dict = {}
        self._packed_fns: dict = {}
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
        """From ``jaxembed.loading.load(...)``."""
        return cls(loaded.model, loaded.tokenizer, loaded.st.prompts, loaded.st.default_prompt_name)

    def _forward(self, state, input_ids, attention_mask, prompt_lengths, experts, dim):
        model = nnx.merge(self._graphdef, state)
        return model(input_ids, attention_mask, prompt_lengths, dim=dim, experts=experts)

    def _packed_fn(self, dim: int | None):
        """jit(state, pack, experts) -> [texts, D]; with several devices a shard_map over their rows."""
        if dim not in self._packed_fns:
            def fwd(state, batch, experts):
                return nnx.merge(self._graphdef, state).encode_packed(batch, dim=dim, experts=experts)

            if self._mesh is not None:
                fwd = jax.shard_map(fwd, mesh=self._mesh, in_specs=(P(), P("data"), P()), out_specs=P("data"),
                                    check_vma=False)
            self._packed_fns[dim] = jax.jit(fwd)
        return self._packed_fns[dim]

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
               side: str | None = None, packing: bool | None = None, row_length: int | None = None) -> np.ndarray:
        """texts: N strings -> [N, D] float32 (D = dim when Matryoshka-truncated), in input order.

        batch_size: texts per forward pass (packed: on average); packing: pack several texts per row (None: the
        encoder's default, True) or pad one text per row (module docstring); row_length: the packed row length
        (default: the length bucket of the longest text, or of ``ROW_TEXTS`` average texts if more).

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
        ex = None if eidx is None else np.int32(eidx)  # one expert for the call (MoTE's fast path)
        out = np.zeros((n, out_dim), np.float32)
        show = sys.stderr.isatty() if progress is None else progress
        packing = self.packing if packing is None else packing
        with tqdm(total=n, desc="encode", unit="text", disable=not show) as bar:
            if packing:
                self._encode_packed(ids, lengths, plen, ex, dim, batch_size, max_length, row_length, out, bar)
            else:
                self._encode_padded(ids, lengths, plen, ex, dim, batch_size, max_length, out, bar)
        return out

    def _encode_padded(self, ids, lengths, plen, ex, dim, batch_size, max_length, out, bar) -> None:
        n = len(ids)
        order = np.argsort(-lengths, kind="stable")
        buckets = length_buckets(max_length)
        ndev = 1 if self._mesh is None else self._mesh.size
        rows = -(-batch_size // ndev) * ndev  # a multiple of the device count
        slots, shapes = 0, set()
        for start in range(0, n, rows):
            idx = order[start:start + rows]
            length = bucket_for(int(lengths[idx].max()), buckets)
            input_ids, mask = self.tokenizer.pad([ids[i] for i in idx], length, rows)
            pl = np.full((rows,), plen, np.int32)
            args = (input_ids, mask, pl)
            if self._mesh is not None:
                args = jax.device_put(args, NamedSharding(self._mesh, P("data")))
            emb = self._fn(self._state, *args, ex, dim=dim)
            out[idx] = np.asarray(emb)[: len(idx)]
            bar.update(len(idx))
            slots += rows * length
            shapes.add((rows, length))
        self.last_stats = dict(packing=False, texts=n, real_tokens=int(lengths.sum()), slots=slots,
                               real_fraction=int(lengths.sum()) / max(slots, 1), shapes=sorted(shapes))

    def _encode_packed(self, ids, lengths, plen, ex, dim, batch_size, max_length, row_length, out, bar) -> None:
        """Pack all texts best-fit-decreasing into rows of L, then run them R rows at a time (module docstring)."""
        n = len(ids)
        if row_length is None:
            target = max(int(lengths.max()), int(np.ceil(ROW_TEXTS * lengths.mean())), 16)
            row_length = bucket_for(target, length_buckets(max(max_length, _pow2(target))))
        L = int(row_length)
        if L < int(lengths.max()):
            raise UserError(f"row_length={L} is shorter than the longest text ({int(lengths.max())} tokens) (fix: "
                            "leave row_length unset, or raise it)")
        text_row, text_start, nrows = packlib.assign(lengths, L)
        nrows = max(nrows, 1)
        ndev = 1 if self._mesh is None else self._mesh.size
        per_dev = lambda r: _pow2(-(-r // ndev))  # rows per device for r rows
        want = max(1, -(-batch_size * int(max(lengths.mean(), 1)) // L))  # rows for ~batch_size texts
        R = ndev * per_dev(min(want, nrows))
        # texts by row; the text slots of a device's pack: a power of two over the busiest device of any pass
        by_row = np.argsort(text_row, kind="stable")
        row_first = np.searchsorted(text_row[by_row], np.arange(nrows + 1))
        groups = []
        for g0 in range(0, nrows, R):
            rl = per_dev(min(R, nrows - g0))
            devs = [(g0 + d * rl, min(g0 + (d + 1) * rl, nrows)) for d in range(ndev)]
            groups.append((rl, [by_row[row_first[min(a, nrows)]:row_first[min(b, nrows)]] for a, b in devs], devs))
        cap = max(8, _pow2(max(len(t) for _, texts, _ in groups for t in texts)))
        fn = self._packed_fn(dim)
        slots, shapes, pending = 0, set(), None

        def collect(p):
            emb, idx = p
            emb = np.asarray(emb)
            for d, t in enumerate(idx):
                out[t] = emb[d * cap:d * cap + len(t)]
                bar.update(len(t))

        for rl, texts, devs in groups:
            packs = [packlib.build([ids[i] for i in t], text_row[t] - a, text_start[t], rl, L,
                                   prompt_lengths=plen, num_texts=cap, pad_id=self.tokenizer.pad_id)
                     for t, (a, _) in zip(texts, devs)]
            stacked = packlib.stack(packs) if ndev > 1 else packs[0]  # device d: rows [d*rl, (d+1)*rl)
            batch = {k: stacked[k] for k in _PACK_KEYS}
            if self._mesh is not None:
                batch = jax.device_put(batch, NamedSharding(self._mesh, P("data")))
            emb = fn(self._state, batch, ex)  # asynchronous: the next pack is built while this one runs
            if pending is not None:
                collect(pending)
            pending = (emb, texts)
            slots += ndev * rl * L
            shapes.add((ndev * rl, L, ndev * cap))
        collect(pending)
        real = int(np.minimum(lengths, L).sum())
        self.last_stats = dict(packing=True, texts=n, real_tokens=real, slots=slots, real_fraction=real / slots,
                               shapes=sorted(shapes), row_length=L)

    def similarity(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Cosine similarity matrix [N, M] between two embedding sets."""
        a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
        b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
        return a @ b.T


def load_encoder(name_or_path: str, **kwargs) -> Encoder:
    """Load a model folder / hub id (see ``jaxembed.loading.load``) and wrap it in an Encoder."""
    from jaxembed import loading

    return Encoder.from_loaded(loading.load(name_or_path, **kwargs))
