"""The layout of the repository: no import cycles, modules that fit in one head, no pointer outside the repository.

The import graph is read from the source (``ast``, nothing is imported): every ``import jaxembed...`` /
``from jaxembed... import ...`` / relative import, at module level or inside a function, resolved to the jaxembed
module it names (``from jaxembed.models import mapping`` -> ``jaxembed.models.mapping``). Importing
``a.b.c`` also runs the ``__init__`` of ``a.b``, so an import of a submodule is an edge to its packages too (except
the importer's own packages, which are being imported already). Imports under ``if TYPE_CHECKING:`` never run and
are left out.

- Module-level imports must form no cycle (a cycle there fails at import time, depending on which module is
  imported first).
- Function-level imports must not close a cycle either: a deferred import that points back up the layers (the model
  layer importing ``jaxembed.mote``, the prompts importing the runner) is a cycle all the same, only hidden until
  the function runs.
- A file under jaxembed/ over ``MAX_LINES`` lines states why at the top of its docstring (a paragraph
  ``Size: ... because ...``), or is in ``NOT_YET_SPLIT`` with the reason it is not split yet.
- No function under jaxembed/train/ is over ``MAX_FUNCTION_LINES`` lines (from its ``def``, or its first decorator,
  to its last line, nested functions included), so a trainer reads top to bottom as named steps;
  ``LONG_FUNCTIONS_LEFT`` lists the ones not split yet, each with its length.
- benchmarks/ (scripts that import each other by bare name, with their folder and benchmarks/ on sys.path): no
  import cycle, module level and in functions alike, and no module over ``BENCH_MAX_LINES`` lines.
- At most ``MAX_FLAT_MODULES`` modules lie flat in jaxembed/ (``__init__.py`` included): the others are grouped
  in packages by what they do (``config/``, ``export/``, ``runs/``, ``evaluate/``, ``teacher/``, ...).
- No module imports a private name (``_name``) of another module of this repository: a name another module needs
  is an interface with a public name (``UNDERSCORE_IMPORTS_LEFT`` is empty).
- Nothing under jaxembed/, tests/, configs/, docs/, benchmarks/, launch/ or in README.md points outside the
  repository (``OUTSIDE``): not at the design brief or the papers (docs/design.md holds the design and cites the
  papers), not at a sibling folder other than the shared data folder, not at one machine's absolute paths
  (benchmark records keep theirs). Every pointer into docs/design.md names one of its headings.
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jaxembed"
MAX_LINES = 500
#: files over MAX_LINES that are not split yet, and why: the only exceptions. Remove an entry when its file is split.
NOT_YET_SPLIT: dict[str, str] = {}
MAX_FUNCTION_LINES = 60
FUNCTION_LENGTH_DIRS = ("jaxembed/train",)
#: functions over MAX_FUNCTION_LINES in FUNCTION_LENGTH_DIRS not split yet: "path::name" -> its length in lines.
LONG_FUNCTIONS_LEFT: dict[str, int] = {}
MAX_FLAT_MODULES = 20


@lru_cache(maxsize=None)
def parse(path: Path) -> ast.Module:
    """The syntax tree of a file, read once per test process (several checks walk the same files)."""
    return ast.parse(path.read_text(), str(path))


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    return {module_name(p, package): p for p in sorted(package.rglob("*.py"))}


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(tree: ast.AST):
    """(import node, at module level?) for every import outside ``if TYPE_CHECKING:`` blocks."""
    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, not in_function
            yield from walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                     ast.Lambda)))
    yield from walk(tree, False)


def _targets(name: str, is_package: bool, node, modules) -> set[str]:
    """The jaxembed modules an import statement in module ``name`` runs."""
    if isinstance(node, ast.Import):
        named = [a.name for a in node.names]
    else:
        if node.level:
            base = name.split(".") if is_package else name.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        named = [f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names]
    own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1 + is_package)}
    out = set()
    for target in named:
        if target.split(".")[0] != PACKAGE.name:
            continue
        while target and target not in modules:  # `from jaxembed.x import some_name`: the module jaxembed.x
            target = target.rpartition(".")[0]
        parts = target.split(".")
        for i in range(2, len(parts) + 1):  # a.b.c runs a.b's __init__ (the root package's is a docstring)
            mod = ".".join(parts[:i])
            if mod not in own and mod != name:
                out.add(mod)
    return out


def import_graph(package: Path = PACKAGE) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module-level edges, function-level edges): module -> the jaxembed modules it imports."""
    modules = package_modules(package)
    top: dict[str, set[str]] = {m: set() for m in modules}
    deferred: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        tree = parse(path)
        for node, module_level in _imports(tree):
            (top if module_level else deferred)[name] |= _targets(name, path.name == "__init__.py", node, modules)
    return top, deferred


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in edges:
                    continue
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _describe(component: list[str], edges: dict[str, set[str]], deferred: dict[str, set[str]]) -> str:
    inside = set(component)
    arrows = [f"{a} -> {b}{' (in a function)' if b not in edges.get(a, ()) else ''}"
              for a in component for b in sorted((edges.get(a, set()) | deferred.get(a, set())) & inside)]
    return "cycle among " + ", ".join(component) + ":\n    " + "\n    ".join(arrows)


def stated_size_reason(path: Path) -> bool:
    """Whether the module docstring holds a paragraph ``Size: ... because ...``."""
    doc = ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""
    return any(re.match(r"Size:.*\bbecause\b", p.strip(), re.S) for p in re.split(r"\n\s*\n", doc))


def oversized(package: Path = PACKAGE) -> list[str]:
    """Files over MAX_LINES lines without a stated reason and not in NOT_YET_SPLIT: 'path: N lines'."""
    out = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        n = len(path.read_text().splitlines())
        if n > MAX_LINES and rel not in NOT_YET_SPLIT and not stated_size_reason(path):
            out.append(f"{rel}: {n} lines")
    return out


def function_lengths(path: Path, root: Path = ROOT) -> dict[str, int]:
    """'path::name' (nested: 'path::outer.inner') -> lines from its def (or first decorator) to its last line."""
    rel = path.relative_to(root).as_posix()
    out = {}

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                out[f"{rel}::{prefix}{child.name}"] = child.end_lineno - first + 1
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(parse(path), "")
    return out


def long_functions(root: Path = ROOT, dirs=FUNCTION_LENGTH_DIRS, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """Every function over ``limit`` lines in the files under ``dirs``: 'path::name' -> its length."""
    found = {}
    for d in dirs:
        for path in sorted((root / d).rglob("*.py")):
            found.update({k: n for k, n in function_lengths(path, root).items() if n > limit})
    return found


# ----------------------------------------------------------------------------------------------------- tests


def test_graph_reads_imports(tmp_path):
    """The graph builder on a small package: relative, absolute, submodule and function-level imports."""
    pkg = tmp_path / "jaxembed"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""root."""\n')
    (pkg / "sub" / "__init__.py").write_text("from jaxembed.sub import b\n")
    (pkg / "a.py").write_text("from jaxembed.sub import b\n\ndef f():\n    from . import c\n")
    (pkg / "sub" / "b.py").write_text("import json\nfrom ..c import X\nfrom typing import TYPE_CHECKING\n"
                                      "if TYPE_CHECKING:\n    from jaxembed import a\n")
    (pkg / "c.py").write_text("def g():\n    import jaxembed.a\n")
    top, deferred = import_graph(pkg)
    assert top == {"jaxembed": set(), "jaxembed.a": {"jaxembed.sub", "jaxembed.sub.b"}, "jaxembed.c": set(),
                   "jaxembed.sub": {"jaxembed.sub.b"}, "jaxembed.sub.b": {"jaxembed.c"}}
    assert deferred["jaxembed.a"] == {"jaxembed.c"} and deferred["jaxembed.c"] == {"jaxembed.a"}
    assert cycles(top) == []
    merged = {m: top[m] | deferred[m] for m in top}
    assert cycles(merged) == [["jaxembed.a", "jaxembed.c", "jaxembed.sub", "jaxembed.sub.b"]]


def test_no_module_level_import_cycle():
    top, deferred = import_graph()
    found = cycles(top)
    assert not found, "\n".join(_describe(c, top, {}) for c in found)


def test_no_import_cycle_through_function_level_imports():
    """A deferred import does not make a cycle acceptable: order the modules one way (move the shared part down,
    or let the lower layer take what it needs as an argument / through an interface)."""
    top, deferred = import_graph()
    merged = {m: top[m] | deferred[m] for m in top}
    found = cycles(merged)
    assert not found, "\n".join(_describe(c, top, deferred) for c in found)


def test_modules_fit_in_one_head():
    found = oversized()
    assert not found, (f"files over {MAX_LINES} lines with no stated reason (split them by responsibility, or "
                       "open the module docstring with a paragraph 'Size: ... because ...'):\n  " + "\n  ".join(found))


def flat_modules(package: Path = PACKAGE) -> list[str]:
    """The modules that lie directly in ``package`` (not in a sub-package)."""
    return sorted(p.name for p in package.glob("*.py"))


def test_few_modules_lie_flat_in_the_package():
    found = flat_modules()
    assert len(found) <= MAX_FLAT_MODULES, (
        f"{len(found)} modules flat in jaxembed/, over {MAX_FLAT_MODULES}: move the new one into the package of "
        "what it does (config/, export/, runs/, evaluate/, ...):\n  " + "\n  ".join(found))


def test_not_yet_split_entries_are_current():
    """An entry of NOT_YET_SPLIT goes when its file is split (or states its reason itself). (A loop, not a
    parametrisation: an empty allow-list must pass, not skip.)"""
    for rel in sorted(NOT_YET_SPLIT):
        path = ROOT / rel
        assert path.exists(), f"{rel} is gone: remove it from NOT_YET_SPLIT in tests/test_layout.py"
        n = len(path.read_text().splitlines())
        assert n > MAX_LINES and not stated_size_reason(path), (
            f"{rel} ({n} lines) no longer needs its NOT_YET_SPLIT entry: remove it from tests/test_layout.py")


def test_long_functions_are_found(tmp_path):
    """The length check on a small file: a decorated function counts from its decorator, a method and a nested
    function by their dotted names."""
    (tmp_path / "pkg").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(5))
    inner = body.replace("    ", "        ")
    (tmp_path / "pkg" / "m.py").write_text(f"@dec\ndef f():\n{body}\n    def g():\n{inner}\n\n\n"
                                           "class C:\n    def h(self):\n        pass\n")
    lengths = function_lengths(tmp_path / "pkg" / "m.py", tmp_path)
    assert lengths == {"pkg/m.py::f": 13, "pkg/m.py::f.g": 6, "pkg/m.py::C.h": 2}
    assert long_functions(tmp_path, ("pkg",), limit=6) == {"pkg/m.py::f": 13}


def test_trainer_functions_fit_on_one_screen():
    """No function in jaxembed/train/ over MAX_FUNCTION_LINES lines, but those LONG_FUNCTIONS_LEFT names with their
    current length (an entry goes, or its length follows, when the function changes)."""
    found = long_functions()
    new = {k: n for k, n in found.items() if k not in LONG_FUNCTIONS_LEFT}
    assert not new, (f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps):\n  "
                     + "\n  ".join(f"{k}: {n} lines" for k, n in sorted(new.items())))
    stale = {k: (n, found.get(k)) for k, n in LONG_FUNCTIONS_LEFT.items() if found.get(k) != n}
    assert not stale, ("LONG_FUNCTIONS_LEFT entries that are not current (listed length, length now; None: split "
                       "or gone):\n  " + "\n  ".join(f"{k}: {v}" for k, v in sorted(stale.items())))


def test_evaluation_modules_import_one_way():
    """prompts -> tasks -> runner -> report, each only downwards (no prompts / runner / tasks cycle)."""
    top, deferred = import_graph()
    order = ["jaxembed.evaluate.prompts", "jaxembed.evaluate.tasks", "jaxembed.evaluate.runner",
             "jaxembed.evaluate.report"]
    for i, low in enumerate(order):
        for high in order[i + 1:]:
            assert high not in top.get(low, set()) | deferred.get(low, set()), f"{low} imports {high}"


# ---------------------------------------------------------------------------- pointers outside the repository

#: what the pointer checks read: every text file under these folders, and these files
SCANNED = ("jaxembed", "tests", "configs", "docs", "benchmarks", "launch", "README.md")
#: benchmark records keep the absolute paths of the machine they ran on (commands, model folders): they record a
#: run, they do not point a reader anywhere, so the absolute-path rule leaves them alone
RECORDS = "benchmarks/results/"
#: a pointer out of the repository (name -> pattern, fix). The shared data folder beside the repository (the demo's
#: and the tests' data, or $JAXEMBED_DATA) is the one outside folder the code and the docs may name. The patterns
#: are spelled so that this file does not match them.
OUTSIDE = {
    "the design brief": (re.compile(r"\bDESIGN\.md\b"),
                         "point into docs/design.md (the file, a comma and one of its headings, or a link)"),
    "a papers folder": (re.compile(r"(?<![\w./-])papers[/]|shared[/]papers"),
                        "cite the paper (authors, year, arXiv id or venue), as docs/design.md's references do"),
    "a shared folder other than its data": (re.compile(r"\.\./shared(?![/]data\b)"),
                                            "only the shared data folder may be named"),
    "an absolute path of one machine": (re.compile(r"(?<![\w./-])[/]work[/]"),
                                        "a path relative to the repository, or a placeholder such as DIR"),
}
#: a pointer into docs/design.md: the file, a comma and a heading; or a link to one of its anchors
_DESIGN_POINTER = re.compile(r"docs/design\.md, ([^\n);]*)|design\.md#([\w-]+)")


def scanned_files(root: Path = ROOT) -> list[tuple[str, str]]:
    """(path relative to root, text) of every UTF-8 file of SCANNED (caches and binary files left out)."""
    out = []
    for name in SCANNED:
        top = root / name
        for path in sorted([top] if top.is_file() else top.rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            try:
                out.append((path.relative_to(root).as_posix(), path.read_text(encoding="utf-8")))
            except UnicodeDecodeError:
                continue
    return out


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def outside_pointers(files: list[tuple[str, str]]) -> list[str]:
    """'path:line: what ('match'; fix: ...)' for every pointer out of the repository."""
    bad = []
    for rel, text in files:
        for what, (pattern, fix) in OUTSIDE.items():
            if what == "an absolute path of one machine" and rel.startswith(RECORDS):
                continue
            bad += [f"{rel}:{_line(text, m.start())}: {what} ({m.group(0)!r}; fix: {fix})"
                    for m in pattern.finditer(text)]
    return bad


def design_headings(root: Path = ROOT) -> list[str]:
    """The headings of docs/design.md below its title."""
    text = (root / "docs" / "design.md").read_text(encoding="utf-8")
    return [m.group(1) for m in re.finditer(r"^#{2,6}\s+(.+?)\s*$", text, re.M)]


def _anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def broken_design_pointers(files: list[tuple[str, str]], headings: list[str]) -> list[str]:
    """'path:line: pointer' for every pointer into docs/design.md that names no heading of it."""
    anchors = {_anchor(h) for h in headings}
    bad = []
    for rel, text in files:
        for m in _DESIGN_POINTER.finditer(text):
            named, anchor = m.group(1), m.group(2)
            if (named is not None and not any(named.startswith(h) for h in headings)) or (
                    anchor is not None and anchor not in anchors):
                bad.append(f"{rel}:{_line(text, m.start())}: {m.group(0)!r}")
    return bad


def test_nothing_points_outside_the_repository():
    """A clone has no design brief and no papers beside it: the code, tests, configs, docs, benchmarks and launch
    scripts point into docs/design.md (which cites the papers), never at files outside the repository other than
    the shared data folder."""
    bad = outside_pointers(scanned_files())
    assert not bad, "pointers outside the repository:\n  " + "\n  ".join(bad)


def test_pointers_into_the_design_name_a_heading():
    """Each pointer into docs/design.md names one of its headings, so a renamed section shows here."""
    bad = broken_design_pointers(scanned_files(), design_headings())
    assert not bad, ("pointers into docs/design.md that name none of its headings (" + ", ".join(design_headings())
                     + "):\n  " + "\n  ".join(bad))


def test_the_pointer_checks_catch_pointers():
    """Both checks on planted text (the outside names are put together here, so that this file matches none)."""
    brief, papers, shared, machine = "DESIGN" + ".md", "papers" + "/", "../" + "shared", "/wo" + "rk/"
    files = [
        ("jaxembed/a.py", f"# the loss ({brief} 2.1)\n"),
        ("configs/b.py", f'"""PEG ({shared}/{papers}peg.md)."""\n'),
        ("docs/c.md", f"see ({papers}mote.md) and\n`{shared}` beside it\n"),
        ("tests/d.py", f"x = '{machine}main/runs'\n"),
        ("benchmarks/results/e.json", f'{{"command": "python x.py --out {machine}runs"}}\n'),
        ("docs/f.md", f"`{shared}/data/train`, huggingface.co/{papers}2311.11691, docs/design.md\n"),
    ]
    bad = outside_pointers(files)
    assert sorted({b.split(": ", 1)[0] for b in bad}) == ["configs/b.py:1", "docs/c.md:1", "docs/c.md:2",
                                                         "jaxembed/a.py:1", "tests/d.py:1"], bad
    design = "docs/design" + ".md"
    pointers = [("jaxembed/g.py", f"# ({design}, PEG; Eq. 4)\n# ({design}, Matryoshka)\n"),
                ("configs/README.md", f"[x](../{design}#data-cube) [y](../{design}#curriculum)\n")]
    assert broken_design_pointers(pointers, ["PEG", "Data-CUBE"]) == [
        f"jaxembed/g.py:2: '{design}, Matryoshka'", f"configs/README.md:1: '{design[5:]}#curriculum'"]


# ---------------------------------------------------------------------------------------------- benchmarks/

#: benchmarks/: scripts, not a package. A script runs with its own folder on sys.path, and puts benchmarks/ there
#: too (the shared _record.py and _harness/): a bare ``import x`` names the importer's folder's x.py first, then
#: benchmarks/x.py (or the package benchmarks/x/).
BENCH = ROOT / "benchmarks"
BENCH_MAX_LINES = 600
#: benchmark scripts over BENCH_MAX_LINES that are not split yet, and why. Remove an entry when its file is split.
BENCH_NOT_YET_SPLIT: dict[str, str] = {}


def bench_modules(root: Path = BENCH) -> dict[str, Path]:
    """Every module under benchmarks/: its name relative to benchmarks/ (``gpu.bench``, ``_harness.st``,
    ``_harness`` for a package's __init__) -> file."""
    return {module_name(p, root / "_"): p for p in sorted(root.rglob("*.py"))}


def _bench_targets(name: str, is_package: bool, node, modules) -> set[str]:
    """The benchmark modules one import statement of module ``name`` runs (a package's __init__ included)."""
    folder = name.split(".") if is_package else name.split(".")[:-1]
    if isinstance(node, ast.Import):
        named, bases = [a.name for a in node.names], [folder, []]
    elif node.level:
        base = folder[:len(folder) - (node.level - 1)]
        named, bases = [".".join(base + ([node.module] if node.module else []))], [[]]
        named = [f"{named[0]}.{a.name}".lstrip(".") for a in node.names] + named
    else:
        named, bases = [f"{node.module}.{a.name}" for a in node.names] + [node.module], [folder, []]
    out = set()
    for target in named:
        for base in bases:
            parts = base + target.split(".")
            if ".".join(base + parts[len(base):len(base) + 1]) not in modules:
                continue  # not a benchmark module from this base: the standard library, a package, or the next base
            for i in range(len(base) + 1, len(parts) + 1):
                mod = ".".join(parts[:i])
                if mod in modules and mod != name and not name.startswith(mod + "."):
                    out.add(mod)
            break
    return out


def bench_import_graph(root: Path = BENCH) -> dict[str, set[str]]:
    """benchmarks/ module -> the benchmark modules it imports (module level and in functions together: every
    benchmark is one script, and a deferred import that closes a cycle is a cycle all the same)."""
    modules = bench_modules(root)
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node, _ in _imports(parse(path)):
            edges[name] |= _bench_targets(name, path.name == "__init__.py", node, modules)
    return edges


def test_bench_graph_reads_script_imports(tmp_path):
    """The benchmark graph on planted scripts: a bare import resolves in the importer's folder first, then
    benchmarks/; a package's relative import; the standard library and jaxembed are left out."""
    (tmp_path / "gpu").mkdir()
    (tmp_path / "_h").mkdir()
    (tmp_path / "_rec.py").write_text("import json\n")
    (tmp_path / "_h" / "__init__.py").write_text("")
    (tmp_path / "_h" / "st.py").write_text("from . import util\nimport os\n")
    (tmp_path / "_h" / "util.py").write_text("")
    (tmp_path / "gpu" / "bench.py").write_text("import sys\nfrom figures import X\n\ndef f():\n    import record\n")
    (tmp_path / "gpu" / "figures.py").write_text("from jaxembed import config\n")
    (tmp_path / "gpu" / "record.py").write_text("import _rec\nfrom _h.st import y\nimport bench\n")
    g = bench_import_graph(tmp_path)
    assert g == {"_rec": set(), "_h": set(), "_h.st": {"_h.util"}, "_h.util": set(),
                 "gpu.bench": {"gpu.figures", "gpu.record"}, "gpu.figures": set(),
                 "gpu.record": {"_rec", "_h", "_h.st", "gpu.bench"}}
    assert cycles(g) == [["gpu.bench", "gpu.record"]]


def test_benchmarks_have_no_import_cycle():
    g = bench_import_graph()
    found = cycles(g)
    assert not found, "\n".join(_describe(c, g, {}) for c in found)


def test_benchmark_modules_fit_in_one_head():
    """A benchmark script over BENCH_MAX_LINES is split by role (its arms, its timing, its records), or listed in
    BENCH_NOT_YET_SPLIT with the reason; an entry goes when its file is split."""
    found = []
    for path in sorted(BENCH.rglob("*.py")):
        rel, n = path.relative_to(ROOT).as_posix(), len(path.read_text().splitlines())
        if n > BENCH_MAX_LINES and rel not in BENCH_NOT_YET_SPLIT:
            found.append(f"{rel}: {n} lines")
    assert not found, f"benchmark modules over {BENCH_MAX_LINES} lines:\n  " + "\n  ".join(found)
    for rel in sorted(BENCH_NOT_YET_SPLIT):
        path = ROOT / rel
        assert path.exists() and len(path.read_text().splitlines()) > BENCH_MAX_LINES, (
            f"{rel} no longer needs its BENCH_NOT_YET_SPLIT entry: remove it from tests/test_layout.py")


# ------------------------------------------------------------------------------------ private names stay home

#: ``from module import _name`` of a project module (jaxembed's or a benchmark's) not yet given a public name, as
#: 'importing file:name': empty, and kept empty. A private name is its module's own business; a name another module
#: needs is an interface and gets a public name. Private names of other packages (huggingface_hub, jaxlib) are not
#: counted: this repository cannot rename them.
UNDERSCORE_IMPORTS_LEFT: frozenset[str] = frozenset()


def _project_module(rel: str, node: ast.ImportFrom, bench: dict[str, Path]) -> bool:
    """Whether ``node`` (in the file ``rel``) imports from a module of this repository."""
    if node.level or (node.module or "").split(".")[0] == PACKAGE.name:
        return True
    if not rel.startswith(BENCH.name + "/"):
        return False
    folder = Path(rel).parent.relative_to(BENCH.name).parts
    first = (node.module or "").split(".")[0]
    return any(".".join(base + (first,)) in bench for base in (folder, ()))


def underscore_imports(root: Path = ROOT) -> set[str]:
    """'file:name' for every ``from <a module of this repository> import _name`` under jaxembed/ and benchmarks/
    (module level, in functions, under TYPE_CHECKING alike; dunder names left out)."""
    bench = bench_modules(root / BENCH.name)
    out = set()
    for top in (root / PACKAGE.name, root / BENCH.name):
        for path in sorted(top.rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for node in ast.walk(parse(path)):
                if isinstance(node, ast.ImportFrom) and _project_module(rel, node, bench):
                    out |= {f"{rel}:{a.name}" for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")}
    return out


def test_underscore_imports_are_found(tmp_path):
    """Planted files: absolute, relative and function-level imports of private names of project modules are
    found (a benchmark's bare import too), the standard library's, other packages' and dunder names are not."""
    (tmp_path / "jaxembed" / "sub").mkdir(parents=True)
    (tmp_path / "benchmarks" / "gpu").mkdir(parents=True)
    (tmp_path / "jaxembed" / "a.py").write_text("from jaxembed.sub.b import _x, y\nfrom os import _exit\n"
                                                "from huggingface_hub.utils import _http\nfrom . import __version__\n")
    (tmp_path / "jaxembed" / "sub" / "b.py").write_text("def f():\n    from .c import _Table\n")
    (tmp_path / "benchmarks" / "gpu" / "harness.py").write_text("")
    (tmp_path / "benchmarks" / "gpu" / "run.py").write_text("from harness import _keys\nfrom json import _default\n"
                                                            "from jaxembed.data import _fetch\n")
    assert underscore_imports(tmp_path) == {"jaxembed/a.py:_x", "jaxembed/sub/b.py:_Table",
                                            "benchmarks/gpu/run.py:_keys", "benchmarks/gpu/run.py:_fetch"}


def test_no_new_underscore_import():
    """Code imports no private name from another module of this repository: give the name a public one where it is
    a real interface (and import that), or keep the use inside its module; UNDERSCORE_IMPORTS_LEFT lists the ones
    not done yet, and an entry goes with its import."""
    found = underscore_imports()
    new, gone = sorted(found - UNDERSCORE_IMPORTS_LEFT), sorted(UNDERSCORE_IMPORTS_LEFT - found)
    assert not new, ("private names imported from another module (give them a public name):\n  " + "\n  ".join(new))
    assert not gone, ("no longer imported: remove from UNDERSCORE_IMPORTS_LEFT in tests/test_layout.py:\n  "
                      + "\n  ".join(gone))
