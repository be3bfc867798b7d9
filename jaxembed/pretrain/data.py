"""Raw text for pre-training: read, deduplicate, tokenize once, and cut into length-bucketed batches.

Sources: JSON Lines files (every configured field present in a record is a text; a list field gives one text per
item, e.g. ``pos`` / ``neg`` of triplets), plain-text files (``.txt``: one text per line), or a dataset store from
``jaxembed data prepare`` (every query, positive and negative, without instructions). Nothing is dropped silently:
bad lines, records without a text field, duplicates and too-short texts are counted in the data report.

Batches (``BatchSchedule``) are a pure function of (token lengths, batch size, seed, step): each epoch is a seeded
permutation; windows of ``window`` x batch texts are sorted by length and cut into batches, whose order is then
shuffled. Texts of similar length share a batch, so little padding is wasted, and resuming needs only the step.

Packed encoder rows (``data.packing``, the default; jaxembed.packing): besides the padded rows (the masking and the
decoder read them), a batch holds its texts packed best-fit decreasing, each device's share (shard) on its own,
into R rows of L slots (``encoder_pack``); the encoder runs on those rows (jaxembed.pretrain.model). L is one for
the run (the power of two with the least total cost, as the trainer's loader, jaxembed.data.pipeline) and R comes
from a few shapes per padded length chosen for the whole run (``packed_shapes``, ``pipeline.choose_rows``), so
the step compiles a handful of times; the shapes are a pure function of the lengths and the schedule.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Sequence

import numpy as np
from tqdm.auto import tqdm

from jaxembed.data.readers import Skip, iter_json_objects, iter_raw_lines
from jaxembed.data.jsonl import is_empty_text
from jaxembed.errors import UserError
from jaxembed.tokenizer import Tokenizer, bucket_for, length_buckets


def read_texts(paths: Sequence[str] = (), fields: Sequence[str] = ("text",), store: str = "",
               max_texts: int = 0, dedup: bool = True) -> tuple[list[str], dict]:
    """(texts, report). ``max_texts`` > 0 keeps the first N (after deduplication)."""
    texts: list[str] = []
    seen: set[str] = set()
    rep: dict = {"files": [], "records": 0, "texts_found": 0, "duplicates": 0, "skipped": Counter(),
                 "examples": []}

    def add(t: str) -> bool:
        t = t.strip()
        rep["texts_found"] += 1
        if is_empty_text(t):  # also zero-width characters, NUL, byte-order marks alone: tokenised to nothing
            rep["skipped"]["empty text"] += 1
            return True
        if dedup:
            if t in seen:
                rep["duplicates"] += 1
                return True
            seen.add(t)
        texts.append(t)
        return not (max_texts and len(texts) >= max_texts)

    def skip(where: str, reason: str) -> None:
        rep["skipped"][reason] += 1
        if len(rep["examples"]) < 20:
            rep["examples"].append(f"{where}: {reason}")

    go = True
    for p in paths:
        if not go:
            break
        if not Path(p).is_file():
            raise UserError(f"data.paths: {p} " + ("is a folder, not a file" if Path(p).is_dir() else
                                                    "does not exist") + " (fix: list .jsonl or .txt files)")
        rep["files"].append(str(p))
        if str(p).endswith(".txt"):
            for i, line in iter_raw_lines(p):
                rep["records"] += 1
                if isinstance(line, Skip):
                    skip(f"{p}:{i}", line.reason.split(" (")[0])
                elif not line.strip():
                    skip(f"{p}:{i}", "blank line")
                elif not (go := add(line)):
                    break
            continue
        for i, obj in iter_json_objects(p):
            rep["records"] += 1
            if isinstance(obj, Skip):
                skip(f"{p}:{i}", obj.reason.split(" (")[0])
                continue
            found = False
            for f in fields:
                if f not in obj:
                    continue
                v = obj[f]
                vals = v if isinstance(v, list) else [v]
                for x in vals:
                    if isinstance(x, str):
                        found = True
                        if not (go := add(x)):
                            break
                    else:
                        skip(f"{p}:{i}", f"field '{f}' holds a {type(x).__name__}, not a string")
                if not go:
                    break
            if not found and go:
                skip(f"{p}:{i}", f"no text field ({', '.join(fields)})")
            if not go:
                break
    if store and go:
        from jaxembed.data.store import Store

        st = Store.open(store)
        rep["store"] = str(store)
        for d in st.datasets:
            for start in range(0, d.size, 1024):
                for ex in st.examples(d.name, list(range(start, min(d.size, start + 1024)))):
                    rep["records"] += 1
                    for t in [ex["query"], *ex["pos"], *ex.get("neg", [])]:
                        if not (go := add(t)):
                            break
                    if not go:
                        break
                if not go:
                    break
            if not go:
                break
        st.close()
    rep["skipped"] = dict(rep["skipped"].most_common())
    rep["texts"] = len(texts)
    rep["stopped_at_max_texts"] = bool(max_texts and len(texts) >= max_texts)
    return texts, rep


class Corpus:
    """Token ids of every text, flat: ``ids[offsets[i]:offsets[i + 1]]`` is text i (special tokens included)."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray):
        self.ids, self.offsets = ids, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def get(self, i: int) -> np.ndarray:
        return self.ids[self.offsets[i]:self.offsets[i + 1]]


def tokenize(texts: Sequence[str], tokenizer: Tokenizer, max_length: int, min_tokens: int,
             progress: bool | None = None, chunk: int = 4096) -> tuple[Corpus, dict]:
    """Tokenize (truncating to max_length, special tokens kept); texts with fewer than ``min_tokens`` non-special
    tokens are left out and counted; ``at_max_length`` counts the (probably truncated) texts that fill max_length.
    Returns (corpus, report)."""
    special = np.asarray(sorted(set(tokenizer.hf.all_special_ids)), np.int64)
    pieces, lens = [], []
    short = at_limit = 0
    show = sys.stderr.isatty() if progress is None else progress
    for s in tqdm(range(0, len(texts), chunk), desc="tokenize", unit="chunk", disable=not show):
        for ids in tokenizer.tokenize(texts[s:s + chunk], max_length=max_length):
            arr = np.asarray(ids, np.int32)
            if int((~np.isin(arr, special)).sum()) < min_tokens:
                short += 1
                continue
            at_limit += len(arr) == max_length
            pieces.append(arr)
            lens.append(len(arr))
    offsets = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    ids = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
    lengths = np.asarray(lens)
    rep = {"tokenized": len(texts), "kept": len(lens), "too_short": short, "min_tokens": min_tokens,
           "at_max_length": int(at_limit), "max_length": max_length,
           "tokens": int(lengths.sum()) if len(lens) else 0,
           "length_mean": float(lengths.mean()) if len(lens) else 0.0,
           "length_p50_p90_max": [int(np.percentile(lengths, q)) for q in (50, 90, 100)] if len(lens) else []}
    return Corpus(ids, offsets), rep


def buckets_for(kind: str, max_length: int) -> tuple[int, ...]:
    """Padded lengths: 'pow2' (16, 32, 64, ... and max_length), 'fine' (x1.5 / x1.33 steps) or 'max' (one shape)."""
    if kind == "max":
        return (max_length,)
    if kind == "fine":
        return length_buckets(max_length)
    out, b = [], 16
    while b < max_length:
        out.append(b)
        b *= 2
    return tuple(out) + (max_length,)


class BatchSchedule:
    """Text indices of the batch of every step (see the module docstring). The last ``len % batch_size`` texts of
    each epoch's permutation are left for a later epoch (a different subset every epoch)."""

    def __init__(self, lengths: np.ndarray, batch_size: int, seed: int, window: int = 64):
        self.lengths = np.asarray(lengths)
        self.batch_size, self.seed, self.window = int(batch_size), int(seed), max(1, int(window))
        self.per_epoch = len(self.lengths) // self.batch_size
        if self.per_epoch == 0:
            raise UserError(f"pre-training data: {len(self.lengths)} texts, fewer than one batch of "
                            f"{self.batch_size} (fix: add data or lower train.batch_size)")
        self._epoch, self._batches = -1, None

    def epoch_batches(self, epoch: int) -> np.ndarray:
        """[per_epoch, batch_size] text indices of an epoch."""
        if epoch != self._epoch:
            rng = np.random.default_rng([self.seed, epoch])
            perm = rng.permutation(len(self.lengths))[: self.per_epoch * self.batch_size]
            w = self.window * self.batch_size
            batches = []
            for s in range(0, len(perm), w):
                part = perm[s:s + w]
                part = part[np.argsort(self.lengths[part], kind="stable")]
                batches.append(part.reshape(-1, self.batch_size))
            b = np.concatenate(batches)
            self._batches, self._epoch = b[rng.permutation(len(b))], epoch
        return self._batches

    def indices(self, step: int) -> np.ndarray:
        epoch, i = divmod(int(step), self.per_epoch)
        return self.epoch_batches(epoch)[i]


def make_batch(corpus: Corpus, indices: np.ndarray, tokenizer: Tokenizer, buckets: Sequence[int]) -> dict:
    """{'input_ids', 'attention_mask'}: int32 [B, bucket length] (right padding)."""
    seqs = [corpus.get(int(i)) for i in indices]
    length = bucket_for(max(len(s) for s in seqs), buckets)
    ids, mask = tokenizer.pad([s.tolist() for s in seqs], length)
    return {"input_ids": ids, "attention_mask": mask}


def packed_shapes(schedule: BatchSchedule, steps: int, shards: int, buckets: Sequence[int], *,
                  hidden_size: int = 0) -> tuple[int, np.ndarray]:
    """The encoder packs' row length L and rows per shard R [steps] of every step (module docstring)."""
    from jaxembed import packing as packlib
    from jaxembed.data.pipeline import Packing, choose_rows

    p = Packing(shards=shards, attention_cost=1.0 / (6 * hidden_size) if hidden_size else 0.0)
    lengths = schedule.lengths
    cap = int(lengths.max())
    cands = [L for L in p.row_lengths(cap) if L >= cap]
    rows = np.zeros((len(cands), steps), np.int64)
    padded = np.zeros(steps, np.int64)
    for s in range(steps):
        ln = lengths[schedule.indices(s)]
        padded[s] = bucket_for(int(ln.max()), buckets)
        for i, L in enumerate(cands):
            rows[i, s] = max(packlib.rows_needed(x, L) for x in np.split(ln, shards))
    cost = [rows[i].sum() * L * p.slot_cost(L) for i, L in enumerate(cands)]
    best = int(np.argmin(cost))
    # shapes per padded length (the decoder's): the padded length is the group key of choose_rows
    R = choose_rows({"row_length": padded, "pack_rows": rows[best]}, p)[:, 0]
    return cands[best], R


def encoder_pack(seqs: Sequence[np.ndarray], shards: int, rows: int, row_length: int) -> dict:
    """Each shard's texts (``seqs`` split in ``shards`` equal parts, in order) packed into ``rows`` rows of
    ``row_length`` and stacked (local indices): pack_segment_ids, pack_positions, pack_token_text [shards*rows, L],
    pack_text_row, pack_text_start, pack_text_len [len(seqs)] (int32; jaxembed.packing)."""
    from jaxembed import packing as packlib

    n = len(seqs) // shards
    packs = [packlib.pack([x.tolist() for x in seqs[j * n:(j + 1) * n]], rows, row_length) for j in range(shards)]
    st = packlib.stack(packs)
    keys = ("segment_ids", "positions", "token_text", "text_row", "text_start", "text_len")
    return {f"pack_{k}": st[k].astype(np.int32) for k in keys}
