"""The extension points are declared once (docs/architecture.md, "Adding a backbone, a loss, a record format"):
every entry of each table has all its parts, and no module of jaxembed/ holds a second literal list of a table's
names (a tuple / list / set literal, or the keys of a dict literal, naming two or more of them), which is how the
copies that went out of date started."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "jaxembed"


def _literal_names(node: ast.AST) -> list[str]:
    """The string constants of a tuple / list / set literal, or the string keys of a dict literal."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = node.elts
    elif isinstance(node, ast.Dict):
        items = [k for k in node.keys if k is not None]
    else:
        return []
    return [x.value for x in items if isinstance(x, ast.Constant) and isinstance(x.value, str)]


def literal_copies(names, declared_in: set[str], package: Path = PACKAGE) -> list[str]:
    """``path:line: [names]`` for every literal of a module under ``package`` (but the ``declared_in`` files,
    relative to the package's parent) that names two or more of ``names``."""
    names, out = set(names), []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).as_posix()
        if rel in declared_in:
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            hit = [n for n in _literal_names(node) if n in names]
            if len(set(hit)) >= 2:
                out.append(f"{rel}:{node.lineno}: {hit}")
    return out


def test_literal_copies_finds_tuples_lists_sets_and_dict_keys(tmp_path):
    """The scanner on a small package: each kind of literal with two names is found, one name alone is not, and
    the declaring module is left out."""
    pkg = tmp_path / "jaxembed"
    pkg.mkdir()
    (pkg / "table.py").write_text('NAMES = ("a", "b", "c")\n')
    (pkg / "user.py").write_text('X = ["a", "b"]\nY = {"b": 1, "c": 2}\nZ = {"a", "c"}\nW = x in ("a", "z")\n'
                                 'V = ("q", "b", "c")\n')
    found = literal_copies(("a", "b", "c"), {"jaxembed/table.py"}, pkg)
    assert found == ["jaxembed/user.py:1: ['a', 'b']", "jaxembed/user.py:2: ['b', 'c']",
                     "jaxembed/user.py:3: ['a', 'c']", "jaxembed/user.py:5: ['b', 'c']"]


# --------------------------------------------------------------------------------------------- record formats

def test_every_record_format_has_all_its_parts():
    from jaxembed.data import parsers
    from jaxembed.data.formats import FORMAT_CHOICES, FORMAT_TABLE, format_help

    ranks = [f.detect_rank for f in FORMAT_TABLE.values()]
    assert sorted(ranks) == list(range(len(FORMAT_TABLE))), "detect_rank: each format its own place"
    for name, f in FORMAT_TABLE.items():
        assert f.name == name and f.keys and f.detect and "id" in f.fields, name
        assert callable(f.parse) and f.parse.__module__ == parsers.__name__, name
        assert "{src}" in f.no_task_type and f.no_task_type.format(src="x.jsonl"), name
        assert f"{name} ({f.keys})" in format_help(), name
        assert set(f.fields) <= set(parsers.DEFAULT_FIELDS), name
    assert FORMAT_CHOICES == ("auto", *FORMAT_TABLE)


def test_record_format_names_are_not_copied():
    from jaxembed.data.formats import FORMAT_TABLE

    found = literal_copies(FORMAT_TABLE, {"jaxembed/data/formats.py"})
    assert not found, ("a list of record formats outside jaxembed/data/formats.py (derive it from "
                       "FORMAT_TABLE):\n  " + "\n  ".join(found))


def _choices(parser, *path):
    """The choices of the option ``path[-1]`` of the sub-command ``path[:-1]``."""
    import argparse

    for name in path[:-1]:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return next(a for a in parser._actions if path[-1] in a.option_strings).choices


@pytest.mark.parametrize("command", [("data", "validate", "--format"), ("mine", "--format")])
def test_format_options_offer_every_record_format(command):
    """``data validate --format`` and ``mine --format`` offer the table's formats (mine's missed ``st``)."""
    from jaxembed.cli import build_parser
    from jaxembed.data.formats import FORMAT_CHOICES

    assert tuple(_choices(build_parser(), *command)) == FORMAT_CHOICES


def test_mine_reads_a_file_of_sentence_transformers_rows_given_as_st(tmp_path):
    """``mine --format st``: the input is read as sentence-transformers rows."""
    from jaxembed.mining.job import read_input

    p = tmp_path / "st.jsonl"
    p.write_text('{"anchor": "a", "positive": "p", "negative": "n"}\n{"anchor": "b", "positive": "q"}\n')
    examples, info, _ = read_input(p, format="st")
    assert info.format == "st" and [(e["query"], e["pos"], e["neg"]) for e in examples] == [
        ("a", ["p"], ["n"]), ("b", ["q"], [])]


# ------------------------------------------------------------------------------------------------ architectures

def _arch_cases():
    from jaxembed import models

    return [(folder, name) for folder, arch in models.FOLDERS.items() for name in arch.tiny]


@pytest.mark.parametrize("folder, tiny_name", _arch_cases())
def test_every_architecture_has_all_its_facts(folder, tiny_name):
    """Each folder's ARCH, on each of its tiny models: the model_type loads through it, the mapping table covers
    every parameter, the FLOP formula, the packing cost and the LoRA target apply."""
    import re

    from jaxembed import flops, lora, models
    from jaxembed.models import mapping
    from jaxembed.models.tiny import tiny_hf_config

    arch = models.FOLDERS[folder]
    assert arch.package == folder and arch.module().ARCH.model_types == arch.model_types
    cfg = models.config_from_hf(tiny_hf_config(tiny_name))
    assert cfg.model_type in arch.model_types and isinstance(cfg, arch.config)
    assert models.ARCHITECTURES[cfg.model_type].package == folder
    model = models.abstract_model(cfg)
    assert isinstance(model, arch.model)
    params = set(models.param_shapes(model))
    mapped = {tuple(path) for _, path, _ in mapping.expand(arch.rules(cfg), cfg.num_layers)}
    assert params and params <= mapped, f"parameters without a Hugging Face key: {sorted(params - mapped)[:4]}"
    assert flops.layer_matrix_params(cfg) > 0 and flops.attention_width(cfg) > 0
    assert 0 < arch.packing_cost(cfg) < 1
    assert all(re.compile(p) for p in arch.ignore) and isinstance(arch.adapt(cfg, ()), dict)
    paths = [".".join(map(str, p[:-1])) for p in params if p[-1] == "kernel"]
    assert lora.select(paths, "", cfg.model_type), "the default LoRA target picks no linear layer"


def test_every_model_type_and_tiny_name_is_declared_once():
    from jaxembed import models

    types = [t for arch in models.FOLDERS.values() for t in arch.model_types]
    tiny = [n for arch in models.FOLDERS.values() for n in arch.tiny]
    assert len(types) == len(set(types)) == len(models.ARCHITECTURES) and len(tiny) == len(set(tiny))


def test_architecture_names_are_not_copied():
    """Outside the architecture folders, no module lists model types or tiny model names (the FLOP formula, LoRA
    targets, tiny configs and packing costs are each folder's ARCH)."""
    from jaxembed import models
    from jaxembed.models import tiny

    inside = {p.relative_to(PACKAGE.parent).as_posix() for folder in models.FOLDERS
              for p in (PACKAGE.parent / folder.replace(".", "/")).rglob("*.py")}
    found = literal_copies(set(models.ARCHITECTURES) | set(tiny.ARCHS), inside)
    assert not found, ("a list of architectures outside jaxembed/models/<arch>/ (declare the fact in the folder's "
                       "spec.py, jaxembed.models.architecture):\n  " + "\n  ".join(found))


# ---------------------------------------------------------------------------------- command-line choice lists

def _list_copies(names, declared_in: set[str]) -> list[str]:
    """Tuple / list / set literals (not dicts: a table keyed by the names holds a fact per name) holding all the
    ``names`` but at most one (at least two), outside ``declared_in``."""
    need, out = max(2, len(names) - 1), []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if rel in declared_in:
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(set(_literal_names(node)) & set(names)) >= need:
                out.append(f"{rel}:{node.lineno}: {_literal_names(node)}")
    return out


@pytest.mark.parametrize("name", ["POOLING_MODES", "DTYPES", "ATTENTION_KERNELS"])
def test_choice_lists_are_declared_once(name):
    from jaxembed import choices

    found = _list_copies(getattr(choices, name), {"jaxembed/choices.py"})
    assert not found, f"a copy of jaxembed.choices.{name} (read it from there):\n  " + "\n  ".join(found)


@pytest.mark.parametrize("option, name", [
    (("encode", "--pooling"), "POOLING_MODES"), (("encode", "--dtype"), "DTYPES"),
    (("encode", "--attention"), "ATTENTION_KERNELS"), (("export", "--pooling"), "POOLING_MODES"),
    (("export", "--dtype"), "DTYPES"), (("eval", "--pooling"), "POOLING_MODES"), (("eval", "--dtype"), "DTYPES"),
    (("eval", "--attention"), "ATTENTION_KERNELS"), (("score", "--pooling"), "POOLING_MODES"),
    (("score", "--dtype"), "DTYPES"), (("teacher-score", "--dtype"), "TRAIN_DTYPES")])
def test_command_line_choices_come_from_the_declarations(option, name):
    from jaxembed import choices
    from jaxembed.cli import build_parser

    assert tuple(_choices(build_parser(), *option)) == getattr(choices, name)


def test_implementations_and_config_checks_read_the_choice_lists():
    from jaxembed import choices, config, pooling
    from jaxembed.models import attention, layers, tiny
    from jaxembed.pretrain.config import EXPORT_POOLINGS

    assert pooling.MODES == tiny.POOLINGS == choices.POOLING_MODES
    assert tuple(layers.DTYPES) == choices.DTYPES and config.DTYPES == choices.TRAIN_DTYPES
    assert attention.IMPLEMENTATIONS == choices.ATTENTION_KERNELS
    assert set(EXPORT_POOLINGS) < set(choices.POOLING_MODES)


# ------------------------------------------------------------------------------------------------------- losses

def test_every_loss_has_all_its_parts():
    import dataclasses

    from jaxembed.config import default_config
    from jaxembed.losses import objective, scored
    from jaxembed.losses.table import CONTRASTIVE, HEAD, LOSS_TABLE, PARTS, SCORED

    loss_section = default_config().loss
    for name, x in LOSS_TABLE.items():
        assert x.name == name and x.title and x.data and x.kind in (CONTRASTIVE, SCORED), name
        assert callable(x.hook()), name
        assert all(k in loss_section for k in x.config_keys), f"{name}: config_keys not in the loss section"
    owned = set(HEAD)
    for part in PARTS:  # every key of the section is declared by a part, with the section's default as its own
        assert dataclasses.is_dataclass(part.settings), part.name
        for _, key, default, _ in part.settings.keys():
            assert loss_section[key] == default, f"{part.name}: loss.{key}"
            owned.add(key)
        assert isinstance(part.settings.card_of(dict(loss_section)), str) and part.settings.card_of({}) is not None
    assert owned == set(loss_section.keys())
    assert objective.KINDS == tuple(LOSS_TABLE) and scored.KINDS == objective.SCORED
    assert objective.CONTRASTIVE == tuple(n for n, x in LOSS_TABLE.items() if x.kind == CONTRASTIVE)


def test_loss_names_are_not_copied():
    from jaxembed.losses.table import LOSS_TABLE

    found = literal_copies(LOSS_TABLE, {"jaxembed/losses/table.py"})
    assert not found, ("a list of losses outside jaxembed/losses/table.py (derive it from LOSS_TABLE):\n  "
                       + "\n  ".join(found))


def test_the_loss_table_is_read_without_jax():
    """The data config reads the loss table; the table and its package import no JAX."""
    import subprocess
    import sys

    code = "import sys, jaxembed.data.config, jaxembed.losses.table; assert 'jax' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_scored_losses_are_called_through_their_table_function():
    """scored_loss(kind) is the kind's function of the table (its settings' pairs_loss), with the member mask of
    finite, weighted scores."""
    import dataclasses

    import jax.numpy as jnp
    import numpy as np

    from jaxembed.losses import scored
    from jaxembed.losses.table import LOSS_TABLE, SCORED_LOSSES

    rng = np.random.default_rng(0)
    u, v = jnp.asarray(rng.normal(size=(5, 6))), jnp.asarray(rng.normal(size=(5, 6)))
    s, w = jnp.asarray([0.1, 0.9, np.nan, 0.5, 0.3]), jnp.asarray([1.0, 1.0, 1.0, 0.0, 1.0])
    member = jnp.isfinite(s) & (w > 0)
    for kind in SCORED_LOSSES:
        names = {f.name for f in dataclasses.fields(LOSS_TABLE[kind].settings)}
        fields = {k: x for k, x in (("scale", 20.0), ("cosine_weight", 0.5)) if k in names}
        got = scored.scored_loss(kind, u, v, s, w, **fields)
        want = LOSS_TABLE[kind].settings(**fields).pairs_loss(u, v, s, member)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want))
    with pytest.raises(ValueError, match="is not one of cosent, angle"):
        scored.scored_loss("infonce", u, v, s, w)


def test_the_model_card_takes_each_loss_text_from_the_table():
    from jaxembed.losses.table import card_text

    assert card_text({"type": "peg", "peg_alpha": 0.5, "peg_beta": 0.1}) == ", PEG alpha 0.5 beta 0.1"
    assert card_text({"type": "peg"}) == ", PEG alpha None beta None"  # an older config.json without them
    assert card_text({"type": "infonce"}) == card_text({"type": "cosent"}) == card_text({}) == ""


# ----------------------------------------------------------------------------------------------------- the docs

def test_the_worked_examples_of_the_architecture_page_are_the_code():
    """docs/architecture.md, "Adding a backbone, a loss or a record format": each ```python block that follows
    "... `FILE.py`:" is a piece of that file, as it is."""
    import re

    page = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = page[page.index("## Adding a backbone, a loss or a record format"):]
    examples = re.findall(r"`([\w/]+\.py)`:\n\n```python\n(.*?)```", section, re.S)
    assert len(examples) >= 5
    for path, code in examples:
        assert code in (PACKAGE.parent / path).read_text(encoding="utf-8"), f"the example from {path} is not in it"
