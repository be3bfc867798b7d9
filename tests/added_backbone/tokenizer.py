"""The tokenizer of the tiny_encoder's tiny models: a lower-cased WordPiece over the first 8,000 entries of
all-MiniLM-L6-v2's vocabulary (its special tokens, characters and most frequent words and pieces), written with
the ``tokenizers`` library: offline, the same on every machine."""

from __future__ import annotations

import json
import os
from pathlib import Path

from jaxembed.models.architecture import TinyTokenizer

VOCAB = 8000


def write(folder: str | os.PathLike, max_length: int = 128) -> Path:
    """tokenizer.json, vocab.txt and tokenizer_config.json (class BertTokenizer) in ``folder``. -> folder."""
    from tokenizers import BertWordPieceTokenizer

    from jaxembed import paths

    words = (paths.demo_model_dir() / "vocab.txt").read_text(encoding="utf-8").split("\n")[:VOCAB]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    BertWordPieceTokenizer(str(folder / "vocab.txt"), lowercase=True).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": max_length,
        "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]",
        "mask_token": "[MASK]"}, indent=1) + "\n", encoding="utf-8")
    return folder


TINY_TOKENIZER = TinyTokenizer(f"WordPiece over all-MiniLM-L6-v2's first {VOCAB} tokens", write, vocab=VOCAB)
