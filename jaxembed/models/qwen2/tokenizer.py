"""The tokenizer of the tiny qwen2 models (``jaxembed.models.tiny``): transformers 5 loads any qwen2 folder's tokenizer
as ``Qwen2Tokenizer`` (config.json's model_type wins over tokenizer_config.json), which would turn MiniLM's WordPiece
into one token per character in sentence-transformers / AutoTokenizer. The tiny qwen2 folder therefore carries a
byte-level BPE tokenizer in Qwen2's layout (Qwen2's pre-tokenization, ``<|endoftext|>`` as EOS and padding, no
special tokens added), trained with the ``tokenizers`` library on all-MiniLM-L6-v2's vocabulary (deterministic,
offline), so that jaxembed and sentence-transformers feed the model the same ids."""

from __future__ import annotations

import json
import os
from pathlib import Path

from jaxembed.models.architecture import TinyTokenizer

QWEN2_BPE_VOCAB = 16384  # the tiny qwen2 tokenizer's vocabulary (ids below the tiny models' 30,522 embedding rows)
QWEN2_EOS = "<|endoftext|>"
# Qwen2's pre-tokenization (transformers' Qwen2Tokenizer)
_QWEN2_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def qwen2_tokenizer(folder: str | os.PathLike, max_length: int = 128) -> Path:
    """Write a Qwen2-layout tokenizer (tokenizer.json + tokenizer_config.json, class Qwen2Tokenizer) to
    ``folder``: byte-level BPE with Qwen2's normalizer (NFC), pre-tokenization regex and decoder, QWEN2_BPE_VOCAB
    tokens trained on all-MiniLM-L6-v2's vocabulary (each word and its capitalised form, bare and after a space,
    weighted by 1 / its frequency rank), id 0 =
    ``<|endoftext|>`` (EOS and padding), no special tokens added to a text, as Qwen2's own. -> folder."""
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers, trainers
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers.models import BPE

    from jaxembed import paths

    words = []
    vocab = (paths.demo_model_dir() / "vocab.txt").read_text(encoding="utf-8").split("\n")
    first = vocab.index("the")  # the words follow the characters, most frequent first: the first 2000 x 8
    for rank, w in enumerate(vocab):
        w = w.strip()
        if w and not (w.startswith("[") and w.endswith("]")):
            w = w[2:] if w.startswith("##") else w
            words += [w, w.capitalize(), " " + w, " " + w.capitalize()] * (8 if rank - first < 2000 else 1)
    tok = RawTokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(words, trainers.BpeTrainer(
        vocab_size=QWEN2_BPE_VOCAB, special_tokens=[QWEN2_EOS], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "eos_token": QWEN2_EOS, "pad_token": QWEN2_EOS, "unk_token": None,
        "bos_token": None, "add_prefix_space": False, "errors": "replace", "model_max_length": max_length,
        "padding_side": "right", "clean_up_tokenization_spaces": False}, indent=1) + "\n", encoding="utf-8")
    return folder


TINY_TOKENIZER = TinyTokenizer("byte-level BPE in Qwen2's layout trained on all-MiniLM-L6-v2's vocabulary",
                               qwen2_tokenizer, vocab=QWEN2_BPE_VOCAB)
