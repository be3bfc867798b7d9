"""``AutoTokenizer.from_pretrained(folder)`` without paying for AutoTokenizer's choice of class in every process.

AutoTokenizer picks the tokenizer class from the folder's config.json (through ``AutoConfig``) and
tokenizer_config.json, then returns ``<class>.from_pretrained(folder)``. Importing it imports transformers' config
classes, which import torch wherever torch is installed: ~2 CPU-s of a ~2.5 CPU-s load, in every ``jaxembed``
process that loads a model. The class it picked for a folder is remembered in a small file under
``$JAXEMBED_CACHE/tokenizer_class`` (default ``~/.cache/jaxembed``), keyed by everything the choice reads: the
folder's path as given, the names and sizes of its files, the bytes of its files other than weights, and the
versions of transformers and tokenizers. A later load of the same folder calls
``<class>.from_pretrained(folder)`` directly: the same call AutoTokenizer ends with, so the same tokenizer. A folder
that changes gets a new key (AutoTokenizer again); a class that is not transformers' own (``trust_remote_code``) is
never remembered. The memory is a cache: a missing, unreadable or unwritable entry only means AutoTokenizer runs.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import logging
import os
from pathlib import Path

from jaxembed.runs import atomic_files

log = logging.getLogger(__name__)

#: files whose bytes do not take part in the choice of class (weights: named and sized only, never read)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".ckpt", ".gguf", ".onnx", ".npz",
                    ".ot")
#: a file larger than this is named and sized only, whatever its name (no tokenizer file comes near it)
READ_LIMIT = 256 << 20


def cache_dir() -> Path:
    """``$JAXEMBED_CACHE/tokenizer_class`` or ``~/.cache/jaxembed/tokenizer_class``."""
    return Path(os.environ.get("JAXEMBED_CACHE") or "~/.cache/jaxembed").expanduser() / "tokenizer_class"


def folder_key(folder: str | os.PathLike) -> str:
    """A hash of what AutoTokenizer's choice of class reads in ``folder`` (see the module docstring)."""
    h = hashlib.sha256()
    for dist in ("transformers", "tokenizers"):
        h.update(f"{dist}={importlib.metadata.version(dist)}\n".encode())
    h.update(f"{folder}\n".encode())  # as given: AutoTokenizer matches some hub ids' patterns against it
    for path in sorted(Path(folder).iterdir()):
        if not path.is_file():
            h.update(f"dir {path.name}\n".encode())
            continue
        size = path.stat().st_size
        h.update(f"file {path.name} {size}\n".encode())
        if size <= READ_LIMIT and not path.name.endswith(_WEIGHT_SUFFIXES):
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def remembered(key: str):
    """The tokenizer class remembered under ``key``, or None (nothing remembered, or an entry that cannot be used)."""
    path = cache_dir() / f"{key}.json"
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
        module, name = entry["module"], entry["class"]
        if not module.startswith("transformers."):
            return None
        return getattr(importlib.import_module(module), name)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, ImportError, AttributeError) as e:
        log.debug("%s: unusable tokenizer class entry (%s); AutoTokenizer chooses", path, e)
        return None


def remember(key: str, cls) -> None:
    """Remember ``cls`` under ``key`` (transformers' own classes only); a failure to write is logged, not raised."""
    if not cls.__module__.startswith("transformers.") or "." in cls.__qualname__:
        return
    try:
        atomic_files.write_json(cache_dir() / f"{key}.json", {"module": cls.__module__, "class": cls.__qualname__})
    except OSError as e:
        log.debug("could not remember the tokenizer class in %s (%s)", cache_dir(), e)


def load_as_auto(folder: str | os.PathLike):
    """What ``transformers.AutoTokenizer.from_pretrained(folder)`` returns, for a local folder."""
    key = folder_key(folder)
    cls = remembered(key)
    if cls is not None:
        return cls.from_pretrained(str(folder))
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(folder))
    remember(key, type(hf))
    return hf
