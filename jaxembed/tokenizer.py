"""Tokenization: a thin wrapper over a Hugging Face fast tokenizer (no torch), padding to static length buckets.

Static shapes keep XLA from recompiling: every batch is padded to one of a few bucket lengths (powers of two up
to ``max_length``, plus ``max_length`` itself) and to a fixed number of rows.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from jaxembed.errors import UserError
from jaxembed.tokenizer_class import load_as_auto

log = logging.getLogger(__name__)

#: The sentence every tokenizer is checked on when it is loaded: ``decode(encode(.))`` must give back its letters
#: and digits (case aside; ``check_round_trip``). A folder without its tokenizer files gets from transformers an
#: empty tokenizer that turns every word into [UNK], and a model fed that gives wrong embeddings without an error.
PROBE = "The quick brown fox jumps over the lazy dog, 42 times."
#: What counts as a tokenizer's files: one of these sets must be in the folder.
TOKENIZER_FILES = (("tokenizer.json",), ("vocab.txt",), ("vocab.json", "merges.txt"), ("*.model",))
_HOW_TO_FIX = ("copy the tokenizer files of the model the weights come from into the folder (tokenizer.json, "
               "tokenizer_config.json, special_tokens_map.json, vocab.txt ...), e.g. with transformers.AutoTokenizer"
               ".from_pretrained(BASE).save_pretrained(FOLDER)")


def length_buckets(max_length: int, smallest: int = 16) -> tuple[int, ...]:
    """Padded lengths a batch may take: 16, 24, 32, 48, 64, 96, 128, ... (steps of x1.5 / x1.33, multiples of 8)
    below max_length, then max_length. At most ~1.5x padding waste, about two compilations per doubling."""
    out, b = [], smallest
    while b < max_length:
        out.append(b)
        b = b * 3 // 2 if (b & (b - 1)) == 0 else b * 4 // 3  # 16 -> 24 -> 32 -> 48 -> 64 ...
    out.append(max_length)
    return tuple(out)


def bucket_for(n: int, buckets: Sequence[int]) -> int:
    for b in buckets:
        if n <= b:
            return b
    return buckets[-1]


def _file_model_type(folder: str | os.PathLike) -> str | None:
    """The tokenization model that the folder's tokenizer.json holds ('WordPiece', 'BPE', 'Unigram', 'WordLevel'),
    or None without a readable tokenizer.json."""
    try:
        return json.loads((Path(folder) / "tokenizer.json").read_text(encoding="utf-8"))["model"]["type"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def missing_tokenizer_files(folder: str | os.PathLike) -> str | None:
    """What a folder lacks to hold a tokenizer (None when one of ``TOKENIZER_FILES``'s sets is there)."""
    folder = Path(folder)
    for names in TOKENIZER_FILES:
        if all(any(folder.glob(n)) if "*" in n else (folder / n).is_file() for n in names):
            return None
    return "tokenizer files (tokenizer.json, vocab.txt, vocab.json + merges.txt, or a SentencePiece *.model)"


def _letters(text: str) -> str:
    return re.sub(r"[^0-9a-z]", "", text.lower())


def reads_back(hf, text: str) -> float:
    """The share of ``text``'s letters and digits (case aside) that ``hf`` gives back, in order, from its tokens
    (special tokens such as [UNK] dropped): 1.0 for a tokenizer that round-trips the text, 0.0 for one that makes
    only [UNK]."""
    import difflib

    ids = hf(text, add_special_tokens=False)["input_ids"]
    want, got = _letters(text), _letters(hf.decode(ids, skip_special_tokens=True) if ids else "")
    matcher = difflib.SequenceMatcher(None, want, got, autojunk=False)
    return sum(b.size for b in matcher.get_matching_blocks()) / max(len(want), 1)


def check_round_trip(hf, folder: str | os.PathLike) -> None:
    """UserError unless ``hf`` reads ``PROBE`` back: at least half of its letters and digits (``reads_back``).
    The bar is half, not all: a tokenizer rebuilt around another algorithm (``load_hf_tokenizer``) may lose a
    letter and is still one of the model's; one without the words loses them all."""
    if reads_back(hf, PROBE) >= 0.5:
        return
    ids = hf(PROBE, add_special_tokens=False)["input_ids"]
    shown = " ".join(hf.convert_ids_to_tokens(ids[:12])) + (" ..." if len(ids) > 12 else "") if ids else "no tokens"
    raise UserError(f"{folder}: the tokenizer does not read back the probe sentence {PROBE!r}: it makes {shown} "
                    f"(its files are incomplete or belong to another model; fix: {_HOW_TO_FIX})")


def load_hf_tokenizer(folder: str | os.PathLike):
    """The folder's Hugging Face tokenizer, as ``AutoTokenizer`` (and so sentence-transformers) loads it, unless
    that tokenizer differs from the folder's tokenizer.json: transformers 5 picks the tokenizer class from
    config.json's ``model_type`` for some families (qwen2 -> Qwen2Tokenizer, whatever tokenizer_config.json says)
    and rebuilds the tokenizer around that class's own algorithm, so a WordPiece tokenizer.json beside a qwen2
    config becomes a byte-level BPE with no merges (one token per character, the first letter dropped). When the
    loaded tokenizer's model (BPE, WordPiece, ...) differs from tokenizer.json's, the file is loaded as it is
    (``PreTrainedTokenizerFast``, special tokens from tokenizer_config.json), with a warning: sentence-transformers
    would still feed such a folder's model the rebuilt tokenizer's ids.

    Checked first, for every command that loads a tokenizer: the folder holds tokenizer files
    (``missing_tokenizer_files``) and the tokenizer reads ``PROBE`` back (``check_round_trip``); otherwise one
    UserError naming the folder, what is missing and the fix."""
    missing = missing_tokenizer_files(folder)
    if missing:
        raise UserError(f"{folder}: no {missing}, so every word would become [UNK] (fix: {_HOW_TO_FIX})")
    hf = _auto_tokenizer(folder)
    check_round_trip(hf, folder)
    return hf


def _auto_tokenizer(folder: str | os.PathLike):
    hf = load_as_auto(folder)  # AutoTokenizer's tokenizer; the class it picks is remembered per folder
    want = _file_model_type(folder)
    backend = getattr(hf, "backend_tokenizer", None)
    got = type(backend.model).__name__ if backend is not None else None
    if want is None or got is None or got == want:
        return hf
    from transformers import PreTrainedTokenizerFast

    log.warning("%s: transformers loads this folder's %s tokenizer.json as %s (a %s tokenizer: config.json's "
                "model_type picks the class); jaxembed uses tokenizer.json as it is, but sentence-transformers and "
                "AutoTokenizer will not (fix: give the folder a tokenizer of its model's family)",
                folder, want, type(hf).__name__, got)
    return PreTrainedTokenizerFast.from_pretrained(str(folder))


class Tokenizer:
    """Tokenizes texts (optionally prefixed by an instruction) and builds padded arrays.

    hf: a ``transformers`` fast tokenizer; max_length: truncation length in tokens (special tokens included);
    padding_side: 'right' or 'left' (pooling handles both); lowercase: lower-case texts first
    (sentence-transformers' ``do_lower_case``)."""

    def __init__(self, hf, max_length: int, padding_side: str | None = None, lowercase: bool = False):
        self.hf = hf
        self.lowercase = lowercase
        self.max_length = int(max_length)
        self.padding_side = padding_side or getattr(hf, "padding_side", "right") or "right"
        pad = hf.pad_token_id
        if pad is None:  # decoder tokenizers (Qwen) may lack a pad token: pad with EOS, masked anyway
            pad = hf.eos_token_id if hf.eos_token_id is not None else 0
        self.pad_id = int(pad)
        self._special = set(hf.all_special_ids)

    @classmethod
    def from_folder(cls, folder: str | os.PathLike, max_length: int | None = None,
                    padding_side: str | None = None, lowercase: bool = False) -> "Tokenizer":
        hf = load_hf_tokenizer(folder)
        if max_length is None:
            ml = getattr(hf, "model_max_length", 512)
            max_length = ml if ml and ml < 1_000_000 else 512
        return cls(hf, max_length, padding_side, lowercase)

    def tokenize(self, texts: Sequence[str], max_length: int | None = None) -> list[list[int]]:
        """Token ids of each text with the model's special tokens, truncated to max_length."""
        texts = [t.lower() for t in texts] if self.lowercase else list(texts)
        enc = self.hf(texts, truncation=True, max_length=max_length or self.max_length,
                      add_special_tokens=True, return_attention_mask=False, return_token_type_ids=False)
        return enc["input_ids"]

    def prompt_length(self, prompt: str | None) -> int:
        """Number of leading tokens of ``prompt + text`` that belong to the prompt: the prompt's tokens with the
        model's special tokens, minus one trailing special token (EOS / SEP) if there is one -- exactly as
        sentence-transformers and INSTRUCTOR count it, so that pooling excludes the same tokens."""
        if not prompt:
            return 0
        ids = self.hf(prompt.lower() if self.lowercase else prompt, add_special_tokens=True)["input_ids"]
        return len(ids) - (1 if ids and ids[-1] in self._special else 0)

    def pad(self, ids: Sequence[Sequence[int]], length: int, rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """ids: list of token-id lists -> (input_ids [rows, length] int32, attention_mask [rows, length] int32).
        Extra rows (when rows > len(ids)) are all padding."""
        rows = len(ids) if rows is None else rows
        input_ids = np.full((rows, length), self.pad_id, np.int32)
        mask = np.zeros((rows, length), np.int32)
        for r, seq in enumerate(ids):
            seq = seq[:length]
            if self.padding_side == "left":
                input_ids[r, length - len(seq):] = seq
                mask[r, length - len(seq):] = 1
            else:
                input_ids[r, : len(seq)] = seq
                mask[r, : len(seq)] = 1
        return input_ids, mask

    def save(self, folder: str | os.PathLike) -> None:
        self.hf.save_pretrained(str(folder))
