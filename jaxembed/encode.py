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

Streaming (``encode_chunks``, ``encode_file``: ``jaxembed encode``): the texts are read, encoded and written
``STREAM_CHUNK`` at a time, each chunk packed on its own, so memory stays flat in the input's length and progress
starts with the first chunk; the embeddings equal one ``encode`` of all texts (<= 1e-5).
"""

from __future__ import annotations

import json
import sys
import tempfile
from typing import Callable, Iterable, Iterator, Sequence

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
        how = self._settings(prompt, prompt_name, batch_size, max_length, dim, task, expert, side, packing,
                             row_length, empty=not len(texts))
        with self._bar(len(texts), progress) as bar:
            return self._encode_part(texts, how, bar)

    def encode_chunks(self, chunks: Iterable[Sequence[str]], *, total: int | None = None,
                      progress: bool | None = None, **kw) -> Iterator[np.ndarray]:
        """Streaming ``encode``: one [n_i, D] array per chunk of texts, in order, with one progress bar over all of
        them (``total``: the number of texts, when known). Only one chunk's texts, tokens and embeddings are held
        at a time, so memory does not grow with the input; the chunks are read from ``chunks`` one by one, as they
        are encoded. Takes ``encode``'s keyword arguments; each chunk is packed on its own (in rows no shorter, and
        passes no smaller, than the chunks before: they reuse compiled shapes), so the embeddings equal ``encode``'s
        of all texts at once (to float rounding, <= 1e-5); ``last_stats`` is the last chunk's."""
        how = dict(self._settings(**kw), sticky={})
        with self._bar(total, progress) as bar:
            for texts in chunks:
                if isinstance(texts, str):
                    raise TypeError("encode_chunks() takes lists of texts, not single strings")
                yield self._encode_part(texts, how, bar)

    def _settings(self, prompt=None, prompt_name=None, batch_size=32, max_length=None, dim=None, task=None,
                  expert=None, side=None, packing=None, row_length=None, empty=False) -> dict:
        """encode's arguments, checked and resolved once for all of a call's texts."""
        eidx = self.expert_index(task, expert, side)
        if not empty and dim is not None and not 0 < dim <= self.model.dim:
            raise UserError(f"--dim must be between 1 and the model's dimension {self.model.dim}, got {dim}")
        p = self.resolve_prompt(prompt, prompt_name)
        return dict(prompt=p, plen=self.tokenizer.prompt_length(p), dim=dim, out_dim=dim or self.model.dim,
                    ex=None if eidx is None else np.int32(eidx),  # one expert for the call (MoTE's fast path)
                    batch_size=batch_size, max_length=max_length or self.tokenizer.max_length,
                    packing=self.packing if packing is None else packing, row_length=row_length)

    @staticmethod
    def _bar(total: int | None, progress: bool | None):
        show = sys.stderr.isatty() if progress is None else progress
        return tqdm(total=total, desc="encode", unit="text", disable=not show)

    def _encode_part(self, texts: Sequence[str], how: dict, bar) -> np.ndarray:
        """Texts -> [N, D] with the resolved settings ``how``, advancing ``bar``."""
        n = len(texts)
        if n == 0:
            return np.zeros((0, how["out_dim"]), np.float32)
        ids = self.tokenizer.tokenize([how["prompt"] + t for t in texts], how["max_length"])
        lengths = np.array([len(x) for x in ids])
        out = np.zeros((n, how["out_dim"]), np.float32)
        ex, dim, bs, ml = how["ex"], how["dim"], how["batch_size"], how["max_length"]
        if how["packing"]:
            self._encode_packed(ids, lengths, how["plen"], ex, dim, bs, ml, how["row_length"], out, bar,
                                how.get("sticky"))
        else:
            self._encode_padded(ids, lengths, how["plen"], ex, dim, bs, ml, out, bar)
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

    def _encode_packed(self, ids, lengths, plen, ex, dim, batch_size, max_length, row_length, out, bar,
                       sticky: dict | None = None) -> None:
        """Pack all texts best-fit-decreasing into rows of L, then run them R rows at a time (module docstring).
        sticky (streaming): L, R and the text slots of the chunks before, which a chunk raises but never lowers, so
        that the chunks of a stream reuse a few compiled shapes instead of compiling their own."""
        sticky = {} if sticky is None else sticky
        n = len(ids)
        if row_length is None:
            target = max(int(lengths.max()), int(np.ceil(ROW_TEXTS * lengths.mean())), 16)
            row_length = bucket_for(target, length_buckets(max(max_length, _pow2(target))))
            row_length = sticky["L"] = max(row_length, sticky.get("L", 0))
        L = int(row_length)
        if L < int(lengths.max()):
            raise UserError(f"row_length={L} is shorter than the longest text ({int(lengths.max())} tokens) (fix: "
                            "leave row_length unset, or raise it)")
        text_row, text_start, nrows = packlib.assign(lengths, L)
        nrows = max(nrows, 1)
        ndev = 1 if self._mesh is None else self._mesh.size
        per_dev = lambda r: _pow2(-(-r // ndev))  # rows per device for r rows
        want = max(1, -(-batch_size * int(max(lengths.mean(), 1)) // L))  # rows for ~batch_size texts
        R = sticky["R"] = max(ndev * per_dev(min(want, nrows)), sticky.get("R", 0))
        # texts by row; the text slots of a device's pack: a power of two over the busiest device of any pass
        by_row = np.argsort(text_row, kind="stable")
        row_first = np.searchsorted(text_row[by_row], np.arange(nrows + 1))
        groups = []
        for g0 in range(0, nrows, R):
            rl = per_dev(min(R, nrows - g0))
            devs = [(g0 + d * rl, min(g0 + (d + 1) * rl, nrows)) for d in range(ndev)]
            groups.append((rl, [by_row[row_first[min(a, nrows)]:row_first[min(b, nrows)]] for a, b in devs], devs))
        busiest = max(len(t) for _, texts, _ in groups for t in texts)
        cap = sticky["cap"] = max(8, _pow2(busiest), sticky.get("cap", 0))
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


#: texts per chunk of a streamed encode (``encode_file``): one chunk's texts, tokens and embeddings are held at a time
STREAM_CHUNK = 8192


def checked_texts(path: str, field: str = "text", fmt: str | None = None) -> tuple[int, Callable[[], Iterator[str]]]:
    """Check every text of ``path`` (JSON Lines or plain text, ``-``: standard input; ``jaxembed.data.jsonl.
    iter_texts``: a bad line is a UserError naming it) in one pass that holds one text at a time. -> (the number
    of texts, a function that reads them again, one at a time). Standard input, which can be read only once, is
    copied while it is checked to an anonymous temporary file (one JSON string a line), read back from there."""
    from jaxembed.data.jsonl import iter_texts

    if path != "-":
        return sum(1 for _ in iter_texts(path, field, fmt)), lambda: iter_texts(path, field, fmt)
    spool = tempfile.TemporaryFile("w+", encoding="utf-8")  # removed when closed or at exit
    n = 0
    for n, text in enumerate(iter_texts(path, field, fmt), 1):
        spool.write(json.dumps(text, ensure_ascii=False) + "\n")

    def again() -> Iterator[str]:
        spool.seek(0)
        return (json.loads(line) for line in spool)

    return n, again


def encode_file(encoder: Encoder, texts: Iterable[str], out, *, total: int | None = None, chunk: int = STREAM_CHUNK,
                **kw) -> tuple[int, int]:
    """Encode ``texts`` (e.g. ``checked_texts``'s reader) into the .npy file ``out``, ``chunk`` texts at a time:
    the texts are read as they are encoded and each chunk's embeddings appended to the file, so memory stays flat
    in the input's length. The file is written under a temporary name that replaces ``out`` when complete (an
    interrupted or failed encode leaves the earlier ``out``, or none). total: the number of texts, for the
    progress bar; kw: ``Encoder.encode``'s options. -> the matrix's shape (N, D)."""
    from jaxembed.runs import atomic_files

    width = kw.get("dim") or encoder.model.dim
    shape = []

    def write(tmp) -> None:
        with open(tmp, "wb") as f:
            n = write_npy_rows(f, encoder.encode_chunks(batched(texts, chunk), total=total, **kw), width)
        if n == 0:
            raise UserError("no texts to encode (fix: pass a file with at least one text)")
        shape.extend((n, width))

    atomic_files.write_with(out, write, suffix=".npy")
    return tuple(shape)


def batched(items: Iterable, size: int) -> Iterator[list]:
    """Lists of ``size`` consecutive items (the last one shorter), each taken from ``items`` when it is asked for."""
    part = []
    for x in items:
        part.append(x)
        if len(part) == size:
            yield part
            part = []
    if part:
        yield part


def write_npy_rows(f, parts: Iterable[np.ndarray], width: int) -> int:
    """Write a float32 [N, width] .npy file to the binary file ``f`` from row blocks that arrive one at a time
    (N unknown until the last): the header is written for 0 rows, the rows appended, then the header rewritten
    in place with N (numpy's header leaves room for the first dimension to grow). -> N."""
    from numpy.lib import format as npy

    header = {"descr": npy.dtype_to_descr(np.dtype("<f4")), "fortran_order": False}
    npy.write_array_header_1_0(f, {**header, "shape": (0, width)})
    start, n = f.tell(), 0
    for part in parts:
        part = np.ascontiguousarray(part, dtype="<f4")
        if part.ndim != 2 or part.shape[1] != width:
            raise ValueError(f"write_npy_rows: a block of shape {part.shape}, expected (rows, {width})")
        f.write(part.tobytes())
        n += part.shape[0]
    f.seek(0)
    npy.write_array_header_1_0(f, {**header, "shape": (n, width)})
    if f.tell() != start:
        raise RuntimeError(f"write_npy_rows: the header for {n} rows does not fit the room left for it")
    return n
