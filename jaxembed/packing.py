"""Packing texts into fixed-size rows, so that no compute is spent on padding (docs/design.md, Architecture).
Pure numpy.

Several texts share a row of L token slots, one after another; a segment id per slot says which text of the row
it belongs to and a position per slot restarts at 0 with every text. The models attend only within a segment
(block-diagonal attention), use the per-text positions (absolute position embeddings, RoPE, T5 buckets) and pool
per segment, so every text gets exactly the states it gets alone in a padded row (MosaicBERT / ModernBERT
unpadding; GTE and nomic's contrastors do the same with FlashAttention's variable-length kernels).

The pack: a dict of numpy arrays, for R rows of L slots and N text slots
------------------------------------------------------------------------------------------------------------

Per slot, [R, L]:

- ``input_ids``  int32: token ids; ``pad_id`` on padding.
- ``segment_ids`` int32: 0 = padding; 1, 2, ... = the 1st, 2nd, ... text of the row, numbered in the order of
  their columns.
- ``positions``  int32: the slot's position within its text (0 at each text's first token); 0 on padding.
- ``token_text`` int32: index (0..N-1) of the slot's text in the pack's text list; -1 on padding.
- ``token_type_ids`` int32: only when ``token_types`` are given (BERT segment A / B per token); 0 on padding.

Per text, [N] (input order: text i of the list given to ``build`` / ``pack`` is slot i):

- ``text_row``   int32: the row that holds the text.
- ``text_start`` int32: the column of its first token. Its tokens are ``[text_start, text_start + text_len)``.
- ``text_len``   int32: its number of tokens (after truncation to L).
- ``text_prompt`` int32: its leading instruction tokens, ``min(prompt length, text_len)`` (pooling can exclude
  them, INSTRUCTOR-style).
- ``text_segment`` int32: its segment id within the row (``segment_ids[text_row, text_start]``).
- ``text_valid`` bool: False for the dummy slots ``build(..., num_texts=N_cap)`` adds after the real texts to
  give a static N. A dummy slot has row 0, start 0, length 0, segment 0 and no tokens.
- ``text_truncated`` bool: the text was longer than L and lost its tail (a text is cut to the row length L;
  callers that must not cut tokenize with ``max_length <= L``).

Invariants (tests/test_packing.py checks them): each text's tokens are contiguous and in order; texts of a row
start at column 0 and follow each other without gaps, so padding is only at the end of a row; a text with no
tokens (``text_len == 0``) occupies no slot (row 0, start 0, segment 0), and its pooled vector is what a padded
all-padding row gives (mean: zeros).

Per shard (the training loader)
------------------------------------------------------------------------------------------------------------

``pack(ids, rows=R, row_length=L, num_texts=N_cap)`` packs one shard's texts into exactly R rows or raises
``DoesNotFit`` (with the number of rows best-fit needs). Indices in a pack (``text_row``, ``token_text``) are local
to it: every shard's rows are self-contained. ``stack`` concatenates shards' packs along the leading axis keeping
local indices (for ``jax.shard_map`` over the shards: each device pools its own rows); ``concat`` offsets them
into one global pack instead.

The model side: ``EmbeddingModel.encode_packed(pack, experts=...)`` returns [N, D] in the pack's text order (MoTE:
one expert per text, [N], or one for the call). Lay a step's texts out in the plan's order (e.g. the B queries,
then the B x K candidates row-major) and the embeddings reshape to [B, D] and [B, K, D] as a padded batch gives
them, so the loss never knows the batch was packed.

Assignment: best-fit decreasing (``assign``): texts by decreasing length (ties by input index); each goes to
the fullest row that still has room for it (ties: the lowest row), else opens a new row. Deterministic, and
O(N log N + N log L). Grain's ``FirstFitPackIterDataset`` packs a stream first-fit with the same segment id /
position conventions; here the whole list of a step is known, so the packer sorts it first and uses best fit.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
from typing import Sequence

import numpy as np

from jaxembed.errors import UserError


@dataclasses.dataclass(frozen=True)
class PackingSettings:
    """``data.packing`` (``enabled``): pack several texts per row (no compute on padding); False pads one text per
    row. ``jaxembed.config`` takes the key's default from here and checks it with ``check``; ``from_config`` reads
    a run's data section (a config file that replaced ``config.data`` without the key packs: the default)."""

    enabled: bool = True

    @staticmethod
    def check(data) -> None:
        """A bool; raises UserError (one line)."""
        v = data.get("packing", True)
        if not isinstance(v, bool):
            raise UserError(f"config.data.packing = {v!r} is not valid: True (pack several texts per row) or False "
                            "(pad one per row)")

    @classmethod
    def from_config(cls, data) -> PackingSettings:
        return cls(bool(data.get("packing", cls().enabled)))

TEXT_KEYS = ("text_row", "text_start", "text_len", "text_prompt", "text_segment", "text_valid", "text_truncated")
ROW_KEYS = ("input_ids", "segment_ids", "positions", "token_text")


class DoesNotFit(ValueError):
    """The texts need more rows than allowed; ``needed`` is the number of rows best-fit decreasing uses."""

    def __init__(self, needed: int, rows: int, row_length: int):
        super().__init__(f"the texts need {needed} rows of {row_length} tokens (best-fit decreasing); only {rows} "
                         "are allowed")
        self.needed, self.rows, self.row_length = needed, rows, row_length


def _lengths(token_ids_or_lengths) -> np.ndarray:
    if isinstance(token_ids_or_lengths, np.ndarray) and token_ids_or_lengths.dtype.kind in "iu":
        return token_ids_or_lengths.astype(np.int64)
    return np.array([len(t) for t in token_ids_or_lengths], np.int64)


def assign(lengths: Sequence[int] | np.ndarray, row_length: int, rows: int | None = None
           ) -> tuple[np.ndarray, np.ndarray, int]:
    """Best-fit decreasing: lengths [N] (tokens per text; longer than ``row_length`` counts as ``row_length``)
    -> (text_row [N] int32, text_start [N] int32, rows used). ``rows``: the most rows allowed (``DoesNotFit``
    when best fit needs more); None = as many as needed. A text of length 0 gets row 0, start 0 and uses no slot.
    Rows are numbered in the order they are opened; within a row texts follow each other from column 0."""
    if row_length <= 0:
        raise ValueError(f"row_length must be positive, got {row_length}")
    n = np.minimum(np.asarray(lengths, np.int64), row_length)
    if n.size and n.min() < 0:
        raise ValueError("text lengths must be >= 0")
    text_row = np.zeros(len(n), np.int32)
    text_start = np.zeros(len(n), np.int32)
    fill: list[int] = []  # tokens used per row
    free: dict[int, list[int]] = {}  # free slots -> heap of rows with exactly that many free slots
    caps: list[int] = []  # sorted free-slot counts that have rows
    for i in np.argsort(-n, kind="stable"):
        k = int(n[i])
        if k == 0:
            continue  # occupies nothing: row 0, start 0
        j = bisect.bisect_left(caps, k)
        if j < len(caps):  # the fullest row with room
            c = caps[j]
            r = heapq.heappop(free[c])
            if not free[c]:
                del free[c]
                caps.pop(j)
        else:
            if rows is not None and len(fill) >= rows:
                raise DoesNotFit(rows_needed(n, row_length), rows, row_length)
            r, c = len(fill), row_length
            fill.append(0)
        text_row[i], text_start[i] = r, fill[r]
        fill[r] += k
        left = c - k
        if left:
            if left not in free:
                free[left] = []
                bisect.insort(caps, left)
            heapq.heappush(free[left], r)
    return text_row, text_start, len(fill)


def rows_needed(lengths: Sequence[int] | np.ndarray, row_length: int) -> int:
    """Rows of ``row_length`` that best-fit decreasing needs for texts of these lengths."""
    return assign(lengths, row_length)[2]


def build(token_ids: Sequence[Sequence[int]], text_row: np.ndarray, text_start: np.ndarray, rows: int,
          row_length: int, *, prompt_lengths: int | Sequence[int] | np.ndarray = 0,
          token_types: Sequence[Sequence[int]] | None = None, num_texts: int | None = None,
          pad_id: int = 0) -> dict[str, np.ndarray]:
    """The pack (module docstring) of ``token_ids`` placed at (``text_row``, ``text_start``) (from ``assign``)
    in ``rows`` rows of ``row_length``. prompt_lengths: instruction tokens at the start of each text (one int
    for all, or [N]); token_types: per-token type ids (same lengths as token_ids) or None; num_texts: the text
    slots N_cap >= N (dummies after the real texts), None = N."""
    n = len(token_ids)
    cap = n if num_texts is None else int(num_texts)
    if cap < n:
        raise ValueError(f"num_texts={cap} is fewer than the {n} texts")
    R, L = int(rows), int(row_length)
    input_ids = np.full((R, L), pad_id, np.int32)
    segment_ids = np.zeros((R, L), np.int32)
    positions = np.zeros((R, L), np.int32)
    token_text = np.full((R, L), -1, np.int32)
    types = None if token_types is None else np.zeros((R, L), np.int32)
    lens = np.zeros(cap, np.int32)
    full = _lengths(token_ids)
    lens[:n] = np.minimum(full, L)
    prompts = np.zeros(cap, np.int32)
    prompts[:n] = np.minimum(np.broadcast_to(np.asarray(prompt_lengths, np.int64), (n,)), lens[:n])
    rows_of = np.zeros(cap, np.int32)
    starts = np.zeros(cap, np.int32)
    rows_of[:n], starts[:n] = text_row, text_start
    seg = np.zeros(cap, np.int32)
    # Segment ids: the texts of each row numbered by column.
    real = np.flatnonzero(lens[:n] > 0)
    by_pos = real[np.lexsort((starts[real], rows_of[real]))]
    if by_pos.size:
        r_sorted = rows_of[by_pos]
        first = np.r_[True, r_sorted[1:] != r_sorted[:-1]]
        group_start = np.maximum.accumulate(np.where(first, np.arange(by_pos.size), 0))
        seg[by_pos] = np.arange(by_pos.size) - group_start + 1
    for i in real:
        r, s, k = int(rows_of[i]), int(starts[i]), int(lens[i])
        if r >= R or s + k > L:
            raise ValueError(f"text {i} placed at row {r}, columns {s}..{s + k} is outside {R} x {L} rows")
        input_ids[r, s:s + k] = token_ids[i][:k]
        segment_ids[r, s:s + k] = seg[i]
        positions[r, s:s + k] = np.arange(k, dtype=np.int32)
        token_text[r, s:s + k] = i
        if types is not None:
            types[r, s:s + k] = np.asarray(token_types[i][:k], np.int32)
    if (np.count_nonzero(token_text >= 0) != int(lens.sum())):
        raise ValueError("texts overlap in the rows (text_row / text_start do not come from one assignment)")
    valid = np.zeros(cap, bool)
    valid[:n] = True
    truncated = np.zeros(cap, bool)
    truncated[:n] = full > L
    out = dict(input_ids=input_ids, segment_ids=segment_ids, positions=positions, token_text=token_text,
               text_row=rows_of, text_start=starts, text_len=lens, text_prompt=prompts, text_segment=seg,
               text_valid=valid, text_truncated=truncated)
    if types is not None:
        out["token_type_ids"] = types
    return out


def pack(token_ids: Sequence[Sequence[int]], rows: int | None, row_length: int, *,
         prompt_lengths: int | Sequence[int] | np.ndarray = 0, token_types: Sequence[Sequence[int]] | None = None,
         num_texts: int | None = None, pad_id: int = 0) -> dict[str, np.ndarray]:
    """Pack texts (token-id lists) into ``rows`` rows of ``row_length`` (None: as few as best fit needs) and
    return the pack (module docstring). Raises ``DoesNotFit`` when they need more than ``rows`` rows. A text
    longer than ``row_length`` is truncated to it (``text_truncated``)."""
    text_row, text_start, used = assign(_lengths(token_ids), row_length, rows)
    return build(token_ids, text_row, text_start, max(used, 1) if rows is None else rows, row_length,
                 prompt_lengths=prompt_lengths, token_types=token_types, num_texts=num_texts, pad_id=pad_id)


def stack(packs: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Concatenate packs of the same shapes along the leading axis, indices kept local to each pack: the layout
    of per-shard packs under ``jax.shard_map`` (shard s = rows [s*R, (s+1)*R) and texts [s*N, (s+1)*N))."""
    keys = packs[0].keys()
    return {k: np.concatenate([p[k] for p in packs]) for k in keys}


def concat(packs: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One global pack from several: rows and texts one after another, ``text_row`` and ``token_text`` offset
    (a dummy slot keeps row 0)."""
    out = []
    rows = texts = 0
    for p in packs:
        q = dict(p)
        q["text_row"] = np.where(p["text_valid"], p["text_row"] + rows, 0).astype(np.int32)
        q["token_text"] = np.where(p["token_text"] >= 0, p["token_text"] + texts, -1).astype(np.int32)
        rows += p["input_ids"].shape[0]
        texts += p["text_row"].shape[0]
        out.append(q)
    return stack(out)


def real_fraction(pack: dict[str, np.ndarray]) -> float:
    """Fraction of the pack's slots that hold a real token (the share of compute that is not padding)."""
    return float(np.count_nonzero(pack["segment_ids"])) / max(pack["segment_ids"].size, 1)
