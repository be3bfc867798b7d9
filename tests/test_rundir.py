"""The run directory's layout (jaxembed/runs/rundir.py): declared once, its names spelled nowhere else in the
package (read from the source with ``ast``), and docs/architecture.md's table of it the same as ``LAYOUT``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from jaxembed.runs.rundir import LAYOUT, NAMES, RunDir, rundir

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jaxembed"
HOME = "jaxembed/runs/rundir.py"

#: a path joined with one of the names that is no run directory's file: (module, the left operand, name). A model
#: folder's config.json (Hugging Face's), and the curriculum scorer's own output folder.
NOT_RUN_FILES = {
    ("jaxembed/export/__init__.py", "out", "config.json"),
    ("jaxembed/export/__init__.py", "out / '1_Pooling'", "config.json"),
    ("jaxembed/export/__init__.py", "sub", "config.json"),
    ("jaxembed/export/__init__.py", "folder", "config.json"),
    ("jaxembed/hub.py", "folder", "config.json"),
    ("jaxembed/loading.py", "sub", "config.json"),
    ("jaxembed/loading.py", "tdir", "config.json"),
    ("jaxembed/loading.py", "st.transformer_dir", "config.json"),
    ("jaxembed/lora.py", "st.transformer_dir", "config.json"),
    ("jaxembed/pretrain/retromae.py", "st.transformer_dir", "config.json"),
    ("jaxembed/train/run.py", "st.transformer_dir", "config.json"),
    ("jaxembed/train/run.py", "prev.export", "config.json"),  # a previous stage's export
    ("jaxembed/train/run.py", "out", "config.json"),  # the model folder exported into init_from/
    ("jaxembed/losses/parts/gist.py", "p", "config.json"),
    ("jaxembed/config/lengths.py", "p", "config.json"),
    ("jaxembed/evaluate/prompts.py", "p", "config.json"),
    ("jaxembed/curriculum/score.py", "Path(out)", "store"),
}
#: names no other string of the package may equal (the generic ones, config.json, store, export, ..., are words
#: of the config and the CLI too: for those only a path join counts)
DISTINCT = {n for n in NAMES.values() if "." in n[1:] and n != "config.json"} | {"checkpoints_unreadable",
                                                                                   "jax_cache"}


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def run_file_literals(package: Path = PACKAGE) -> list[str]:
    """Every place outside the RunDir module that spells a run directory's file name: a path joined with one
    (``x / "summary.json"``), or a string that is one of the distinct names."""
    names = {n for n in NAMES.values() if n != "."}
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).as_posix()
        if rel == HOME:
            continue
        text = path.read_text()
        if not any(f'"{n}"' in text or f"'{n}'" in text for n in names):  # most modules: no quoted name
            continue
        tree = ast.parse(text, rel)
        docs = _docstrings(tree) | {id(n.slice) for n in ast.walk(tree) if isinstance(n, ast.Subscript)
                                    and ast.unparse(n.value).endswith("NAMES")}  # NAMES["jax_cache"]: by attribute
        for node in ast.walk(tree):
            if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant)
                    and node.right.value in names
                    and (rel, ast.unparse(node.left), node.right.value) not in NOT_RUN_FILES):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
            elif isinstance(node, ast.Constant) and node.value in DISTINCT and id(node) not in docs:
                found.append(f"{rel}:{node.lineno}: {node.value!r}")
    return found


def test_no_run_file_name_outside_rundir():
    """A run directory's file is named by RunDir (``rd.summary_json``), never by a literal elsewhere."""
    found = run_file_literals()
    assert not found, ("run directory names spelled outside " + HOME + " (use jaxembed.runs.rundir.RunDir):\n"
                       + "\n".join(found))


def test_every_entry_is_an_attribute_under_the_root(tmp_path):
    rd = RunDir(tmp_path)
    assert len(NAMES) == len(LAYOUT) and len(set(NAMES.values())) == len(LAYOUT)
    for e in LAYOUT:
        p = getattr(rd, e.attr)
        assert p == (tmp_path if e.name == "./" else tmp_path / e.name.rstrip("/"))
        assert e.name in getattr(RunDir, e.attr).__doc__ and e.written and e.read
    assert rundir(rd) is rd and rundir(str(tmp_path)) == rd and str(rd) == str(tmp_path)
    assert rd.export_dir(None) == rd.export and rd.export_dir("~/x") == Path("~/x").expanduser()


def test_architecture_doc_lists_the_layout():
    """docs/architecture.md's "The run directory" table: one row per LAYOUT entry, in its order, each with its
    name and its RunDir attribute."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## The run directory", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    got = [tuple(re.findall(r"`([^`]+)`", r)[:2]) for r in rows]
    assert got == [(e.name, e.attr) for e in LAYOUT]
