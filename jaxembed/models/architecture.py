"""What jaxembed knows about one architecture, declared once in its folder: ``jaxembed/models/<arch>/spec.py``
defines ``ARCH = Architecture(...)``, its package exports it, and ``jaxembed.models`` collects every folder's
(``ARCHITECTURES``: Hugging Face ``model_type`` -> ``Architecture``). The loader and the export (weight mapping),
the MFU metric (``jaxembed.flops``), LoRA's default target (``jaxembed.lora``), the tiny test models
(``jaxembed.models.tiny``) and the packer's row-length choice (``jaxembed.data.pack_shapes``) read it; none of them
names an architecture of its own.

Adding a backbone: a folder ``jaxembed/models/<arch>/`` with its model, its mapping table and a ``spec.py``
declaring every field below (``jaxembed.models.register`` adds a folder from outside the package;
docs/architecture.md walks through an example).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from pathlib import Path
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class TinySize:
    """The size of a tiny random model (``jaxembed.models.tiny``): hidden width (feed-forward 2x), layers, heads,
    the position table, the vocabulary and the sliding window of the architectures that have one."""

    hidden_size: int
    num_layers: int
    num_heads: int
    max_positions: int
    vocab_size: int
    window: int


@dataclasses.dataclass(frozen=True)
class TinyTokenizer:
    """The tokenizer of an architecture's tiny models (``jaxembed.models.tiny``) when all-MiniLM-L6-v2's WordPiece
    does not fit it: source: what it is (in the tiny folder's settings and model card); write(folder, max_length)
    -> folder: writes its files there, offline and the same on every machine; vocab: its vocabulary size, when
    not MiniLM's (ids below the tiny model's 30,522 embedding rows)."""

    source: str
    write: Callable[[str | os.PathLike, int], Path]
    vocab: int | None = None


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One architecture folder.

    model_types: the Hugging Face ``model_type`` values it loads; config / model: ``<Name>Config`` (``from_hf``,
    ``to_hf``, ``num_layers``, ``hidden_size``) and ``<Name>Model`` (the call of ``jaxembed.models``' docstring);
    rules / prefixes / ignore / adapt: the weight mapping (``jaxembed.models.mapping``: the table of a config,
    the prefixes stripped from checkpoint keys, the regexes of keys that are not encoder weights, config overrides
    read off the checkpoint's keys); matrix_params / attention_width: the FLOP formula (``jaxembed.flops``: the
    weights of all layers' matrices, and heads x head dimension of the attention products); lora_target: the
    default ``model.lora.target`` (a regex searched in the linear layers' paths); tiny: tiny model name -> its
    Hugging Face ``config.json`` fields for a ``TinySize``; packing_cost: a token's attention cost per slot of its
    packed row, relative to its matrix products (``Packing.attention_cost``); uses_token_types: the model reads
    token type ids; hf_extra_linear: Hugging Face linear modules that our model does not have (kept out of PEFT's
    target names); tiny_tokenizer: the tokenizer of its tiny models (None: all-MiniLM-L6-v2's); package: the
    folder's package, filled in by ``jaxembed.models`` when it collects them (or ``register``s one)."""

    model_types: tuple[str, ...]
    config: type
    model: type
    rules: Callable[[Any], list]
    prefixes: tuple[str, ...]
    ignore: tuple[str, ...]
    adapt: Callable[[Any, Any], dict]
    matrix_params: Callable[[Any], int]
    attention_width: Callable[[Any], int]
    lora_target: str
    tiny: dict[str, Callable[[TinySize], dict]]
    packing_cost: Callable[[Any], float]
    uses_token_types: bool = False
    hf_extra_linear: tuple[str, ...] = ()
    tiny_tokenizer: TinyTokenizer | None = None
    package: str = ""

    def module(self):
        """The folder's package (its config, model and mapping table by their names)."""
        return importlib.import_module(self.package)


def layer_attention_cost(config) -> float:
    """1 / (6 H): a token's attention (4 L H FLOPs per layer for a row of L slots) over a BERT-shaped layer's
    ~24 H^2 FLOPs of matrix products, H = ``config.hidden_size``."""
    return 1.0 / (6 * config.hidden_size)
