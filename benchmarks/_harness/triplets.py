"""The synthetic triplets of benchmarks/scale.py, written with array operations (no Python loop per record).

A record is ``{"query": "<index> <words>", "pos": ["<words>"], "neg": ["<words>"]}``: a query of 4 + Poisson(6)
words, a positive and a negative of 20 + Poisson(50) words each, drawn Zipf-distributed from a 5,000-word
vocabulary of syllable words (several word pieces each, as real text has). Records are drawn 20,000 at a time from
one seeded generator, in the order a loop over the records would draw them, so a size's file is the same whichever
way it is written, and a file of a multiple of 20,000 records is the first lines of any larger one (3M of 10M).

Each chunk is put together as bytes: every record is a run of pieces (its header with the index, its words, each
followed by a space except the last of a field, the separators between the fields and the line's end), and the
chunk's bytes are one gather from a table of those pieces (a block of 1,000 records at a time).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CHUNK = 20_000
#: records put together at once: every array stays well under glibc's mmap threshold (32 MiB), so the heap reuses
#: its pages from block to block (a fresh mapping per array costs its page faults, slow on a virtual machine)
BLOCK = 1_000
VOCAB = 5_000
SYLLABLES = ["ka", "to", "ri", "men", "sul", "pa", "de", "lo", "vin", "gar", "tes", "mo", "ban", "el", "qua", "ny"]
#: what comes after a query's last word, after a positive's, and after a negative's (json.dumps' separators)
AFTER_QUERY, AFTER_POS, LINE_END = b'", "pos": ["', b'"], "neg": ["', b'"]}\n'


def vocabulary(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The vocabulary (1-3 syllables a word) and its Zipf probabilities, the generator's first draws."""
    vocab = np.array(["".join(rng.choice(SYLLABLES, k)) for k in rng.integers(1, 4, VOCAB)])
    zipf = 1.0 / np.arange(1, VOCAB + 1)
    return vocab, zipf / zipf.sum()


class ZipfDraw:
    """``rng.choice(len(p), size, p=p)`` for a fixed p, the same indices from the same generator: numpy draws
    ``rng.random(size)`` and searches them in the normalised cumulative sum (side='right'); here a table of 65,536
    equal slices of [0, 1) gives each draw the first index its slice can hold, and a few vectorised steps move it
    to the searched one (most slices hold one index: no step)."""

    SLICES = 1 << 16

    def __init__(self, p: np.ndarray):
        cdf = p.cumsum()
        self.cdf = cdf / cdf[-1]
        edges = np.arange(self.SLICES + 1, dtype=np.float64) / self.SLICES
        found = self.cdf.searchsorted(edges, side="right")
        self.first = found[:-1].astype(np.int32)
        self.steps = int((found[1:] - found[:-1]).max())

    def __call__(self, rng: np.random.Generator, size: int) -> np.ndarray:
        u = rng.random(size)
        idx = self.first[(u * self.SLICES).astype(np.int64)]
        for _ in range(self.steps):  # the slice's first index up to the first whose cumulative sum exceeds u
            idx += self.cdf[idx] <= u
        return idx


class Pieces:
    """The byte strings a chunk is made of: each word with a space after it (ids 0..V-1) and without (V..2V-1),
    the three separators (2V, 2V+1, 2V+2), then the chunk's record headers (2V+3...)."""

    def __init__(self, vocab: np.ndarray):
        words = [w.encode() for w in vocab]
        fixed = [w + b" " for w in words] + words + [AFTER_QUERY, AFTER_POS, LINE_END]
        self.words = len(words)
        self.buf = b"".join(fixed)
        self.lengths = np.array([len(x) for x in fixed], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)[:-1]])

    def chunk_bytes(self, start: int, qn: np.ndarray, dn: np.ndarray, words: np.ndarray) -> bytes:
        """Records start.. of a chunk: query word counts ``qn``, document word counts ``dn`` [m, 2], and their
        words' vocabulary ids, in order (each record's query, positive, negative)."""
        m, V = len(qn), self.words
        heads = [f'{{"query": "{i} '.encode() for i in range(start, start + m)]
        fields = np.stack([qn, dn[:, 0], dn[:, 1]], axis=1).astype(np.int64)
        ids = words.astype(np.int64)
        ids[np.cumsum(fields.ravel()) - 1] += V  # a field's last word: no space after it
        per_record = fields.sum(1) + 4  # header, words, two separators, line end
        first = np.concatenate([[0], np.cumsum(per_record)[:-1]])
        seq = np.empty(int(per_record.sum()), dtype=np.int64)
        fixed = np.zeros(len(seq), dtype=bool)
        at = [first, first + 1 + fields[:, 0], first + 2 + fields[:, :2].sum(1), first + 3 + fields.sum(1)]
        for pos, piece in zip(at, (None, 2 * V, 2 * V + 1, 2 * V + 2)):
            seq[pos] = 2 * V + 3 + np.arange(m) if piece is None else piece
            fixed[pos] = True
        seq[~fixed] = ids
        head_len = np.array([len(h) for h in heads], dtype=np.int64)
        lengths = np.concatenate([self.lengths, head_len])[seq]
        offsets = np.concatenate([self.offsets, len(self.buf) + np.cumsum(head_len) - head_len])[seq]
        table = np.frombuffer(self.buf + b"".join(heads), dtype=np.uint8)
        ends = np.cumsum(lengths)
        gather = np.repeat(offsets - (ends - lengths), lengths) + np.arange(int(ends[-1]))
        return table[gather].tobytes()


def write_triplets(path: Path, n: int, seed: int = 0) -> dict:
    """n records into ``path`` (JSON Lines); returns the count and the file's size."""
    rng = np.random.default_rng(seed)
    vocab, zipf = vocabulary(rng)
    draw, pieces = ZipfDraw(zipf), Pieces(vocab)
    with open(path, "wb") as f:
        for c0 in range(0, n, CHUNK):
            m = min(CHUNK, n - c0)
            qn = 4 + rng.poisson(6, m)
            dn = 20 + rng.poisson(50, (m, 2))
            words = draw(rng, int(qn.sum() + dn.sum()))
            ends = np.cumsum(qn + dn.sum(1))
            for b0 in range(0, m, BLOCK):
                w0, w1 = ends[b0 - 1] if b0 else 0, ends[min(b0 + BLOCK, m) - 1]
                f.write(pieces.chunk_bytes(c0 + b0, qn[b0:b0 + BLOCK], dn[b0:b0 + BLOCK], words[w0:w1]))
    return {"records": n, "bytes": Path(path).stat().st_size}
