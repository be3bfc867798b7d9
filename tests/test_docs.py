"""The commands of README.md and docs/*.md run as written, their relative links resolve, and the files and Python
objects they name exist (docs/install.md).

Every fenced ```bash block is split into commands (``bash -n`` decides where a command ends, so continuation lines,
quotes, here-documents and loops stay whole; a block that is not valid bash fails here). Two trailing comments
mark the exceptions:

- ``# doc-test: skip (why)``: not run (too slow for CI, a GPU, the network, a cluster). It must still parse: each
  simple command of it (pipes, ``&&``, loops and ``$(...)`` taken apart) is checked statically. ``jaxembed ...``
  goes through the real parser (``jaxembed.cli.build_parser``: subcommand, flags, choices, ``--config.KEY`` only
  where the CLI takes it), and every command with a ``--config NAME:VARIANT`` (a recipe) or ``--config
  FILE:VARIANT`` (when the file is in the repository) loads it and applies the ``--config.KEY=VALUE`` / ``--set``
  overrides to it (unknown keys fail); ``python SCRIPT`` exists and defines every ``--flag`` used (its
  ``add_argument`` calls); ``python -c`` compiles; ``make TARGET`` is a Makefile target; ``pip install -e '.[x]'``
  names extras of pyproject.toml; a path (``launch/x.sh``, ``sbatch launch/x.sh``) exists; any other program is
  one of ``KNOWN_PROGRAMS``.
- ``# doc-test: exit N``: run, and must exit with status N.

Every other command runs, page by page and in order (one bash process per page, so a page's variables and files
carry from one command to the next), in a scratch folder laid out like the repository: copies of ``configs/`` and
``launch/``, ``benchmarks/`` linked, and ``../shared/data`` beside it. Each must exit 0 (or its N) within
``COMMAND_LIMIT_S`` (stretched by the load average on a busy machine); they are meant to take a few seconds each.
``docs/data.md``'s blocks are run by tests/test_docs_data.py, which also checks their output; here they are only
parsed.
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
#: pages whose commands another test runs (with checks of their output); here they are parsed only
RUN_ELSEWHERE = {"docs/data.md": "tests/test_docs_data.py"}
SKIP = re.compile(r"#\s*doc-test:\s*skip\b")
EXIT = re.compile(r"#\s*doc-test:\s*exit\s+(\d+)")
ANY_MARK = re.compile(r"#\s*doc-test:")
COMMAND_LIMIT_S = 30.0  # per command that runs, on an idle machine (they are written to take a few seconds)


def command_limit_s() -> float:
    """COMMAND_LIMIT_S, stretched by the machine's load (a shared 2-core machine under load 8 runs 4x slower)."""
    return COMMAND_LIMIT_S * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
#: programs the docs may name besides jaxembed / python / make / pip and files of the repository
KNOWN_PROGRAMS = {
    "cat", "mkdir", "ls", "echo", "printf", "head", "tail", "cp", "rm", "mv", "test", "true", "wc", "grep", "jq",
    "source", ".", "export", "cd", "nice", "time", "env", "xargs", "tee", "iconv", "git", "pytest",
    "sbatch", "srun", "scancel", "squeue", "gcloud", "vllm", "wandb", "hf", "huggingface-cli", "tensorboard",
    "nvidia-smi",
}
SHELL_WORDS = {"do", "done", "then", "else", "elif", "fi", "!", "{", "}"}


@dataclass
class Command:
    page: str      # path relative to ROOT
    line: int      # first line in the page (1-based)
    text: str      # the command as written (here-document bodies included)
    header: str    # the command without its here-document bodies
    skip: bool
    exit: int

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


# --------------------------------------------------------------------------------------------- extraction


def bash_blocks(text: str) -> list[tuple[int, list[str]]]:
    """The fenced ```bash blocks of a markdown text: (line number of the first code line, its lines), with the
    fence's indentation removed."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^(\s*)```bash\s*$", lines[i])
        if not m:
            i += 1
            continue
        indent, body, start = len(m.group(1)), [], i + 2
        i += 1
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        blocks.append((start, body))
        i += 1
    return blocks


_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_]\w*)\1")


def _bash_state(src: str) -> str:
    """'complete', 'incomplete' or the syntax error of ``src`` (bash -n)."""
    if src.rstrip("\n").endswith("\\"):
        return "incomplete"
    out = subprocess.run(["bash", "-n"], input=src + "\n", capture_output=True, text=True)
    err = out.stderr
    if any(m in err for m in ("unexpected end of file", "delimited by end-of-file", "unexpected EOF")):
        return "incomplete"
    return "complete" if out.returncode == 0 else err.strip()


def split_commands(page: str, start: int, lines: list[str]) -> list[Command]:
    """A block's commands (blank lines and comment lines between commands are dropped)."""
    cmds, buf, header, first, pending = [], [], [], 0, []
    for k, ln in enumerate(lines):
        if not buf and (not ln.strip() or ln.lstrip().startswith("#")):
            continue
        if not buf:
            first = start + k
        buf.append(ln)
        if pending:  # inside a here-document body
            if ln.strip() == pending[0]:
                pending.pop(0)
        else:
            header.append(ln)
            pending += [m.group(2) for m in _HEREDOC.finditer(ln)]
        if pending:
            continue
        state = _bash_state("\n".join(buf))
        if state == "incomplete":
            continue
        assert state == "complete", f"{page}:{first}: not valid bash: {state}\n" + "\n".join(buf)
        head = "\n".join(header)
        mark = EXIT.search(head)
        assert not ANY_MARK.search(head) or SKIP.search(head) or mark, \
            f"{page}:{first}: unknown doc-test mark (use '# doc-test: skip (why)' or '# doc-test: exit N')"
        cmds.append(Command(page, first, "\n".join(buf), head, bool(SKIP.search(head)),
                            int(mark.group(1)) if mark else 0))
        buf, header, pending = [], [], []
    assert not buf, f"{page}:{first}: the block ends inside a command:\n" + "\n".join(buf)
    return cmds


def page_commands(path: Path) -> list[Command]:
    rel = path.relative_to(ROOT).as_posix()
    out = []
    for start, lines in bash_blocks(path.read_text(encoding="utf-8")):
        out += split_commands(rel, start, lines)
    return out


@lru_cache(maxsize=None)
def all_commands() -> tuple[Command, ...]:
    return tuple(c for p in PAGES for c in page_commands(p))


# ----------------------------------------------------------------------------------------- static checks


def _shell_text(header: str) -> str:
    """The header with comments removed, line continuations joined and unquoted newlines made ';'."""
    out, q, i = [], None, 0
    while i < len(header):
        ch = header[i]
        if q == "'":
            q = None if ch == "'" else q
        elif q == '"':
            if ch == "\\" and i + 1 < len(header):
                out.append(ch + header[i + 1])
                i += 2
                continue
            q = None if ch == '"' else q
        elif ch == "\\" and header[i + 1:i + 2] == "\n":
            out.append(" ")
            i += 2
            continue
        elif ch in "'\"":
            q = ch
        elif ch == "#" and (not out or out[-1][-1:] in (" ", "\t", "\n", ";")):
            while i < len(header) and header[i] != "\n":
                i += 1
            continue
        elif ch == "\n":
            out.append(" ; ")
            i += 1
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def simple_commands(header: str) -> list[list[str]]:
    """The simple commands of a command line: split at ; && || | & ( ), redirections and assignments dropped."""
    lex = shlex.shlex(_shell_text(header), posix=True, punctuation_chars=";&|()<>")
    lex.whitespace_split = True
    lex.commenters = ""
    toks = list(lex)
    cmds, cur, i = [], [], 0
    while i < len(toks):
        t = toks[i]
        if t and set(t) <= set(";&|()"):
            cmds.append(cur)
            cur = []
        elif t and set(t) <= set("<>&"):
            if cur and cur[-1].isdigit():
                cur.pop()  # 2>&1: the descriptor
            i += 1  # the redirection's target
        else:
            cur.append(t)
        i += 1
    cmds.append(cur)
    out = []
    for c in cmds:
        while c and (c[0] in SHELL_WORDS or re.match(r"^[A-Za-z_]\w*=", c[0])):
            c = c[1:]
        while c and c[-1] in SHELL_WORDS:
            c = c[:-1]
        if c and c[0] in ("for", "while", "until", "case", "if", "select"):
            c = []  # a loop header: its words are values, not a command
        if c and c[0] in ("nice", "time"):
            c = c[3:] if c[0] == "nice" and c[1:2] == ["-n"] else c[1:]
        if c:
            out.append(c)
    return out


def _parse_jaxembed(args: list[str]):
    """Parse like jaxembed.cli.main: (namespace, --config.KEY=VALUE overrides); AssertionError with argparse's
    message when it refuses."""
    from jaxembed import cli

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            ns, unknown = cli.build_parser().parse_known_args(args)
    except SystemExit as e:
        raise AssertionError(f"jaxembed {' '.join(args)}: {err.getvalue().strip() or e}") from None
    overrides = [u for u in unknown if u.startswith("--config.")]
    rest = [u for u in unknown if not u.startswith("--config.")]
    assert not rest, f"jaxembed {' '.join(args)}: unrecognized arguments: {' '.join(rest)}"
    assert not overrides or ns.command in ("train", "demo", "sweep", "pretrain"), \
        f"jaxembed {ns.command} takes no --config.KEY=VALUE"
    return ns, [o[len("--config."):] for o in overrides]


def check_jaxembed(args: list[str]) -> None:
    from jaxembed import config as cfglib
    from jaxembed.config.io import split_config_spec

    ns, overrides = _parse_jaxembed(args)
    overrides += list(getattr(ns, "set", None) or []) if ns.command in ("sweep", "pretrain") else []
    spec = getattr(ns, "config", None)
    if ns.command == "demo":
        spec = "demo" + (":tiny" if ns.tiny else "")
    if not isinstance(spec, str) or "$" in spec or spec == "shared":
        return  # no config, a variable, or `data prepare --config shared`
    path = split_config_spec(spec)[0]
    if not (ROOT / path).is_file() and not re.fullmatch(r"[A-Za-z_]\w*", path):
        return  # a config the page writes first: its keys are checked when it runs (a bare name: a recipe)
    if ns.command == "plan":
        overrides = []  # plan build --set: keys of the plan config, not of the run config
    cwd = os.getcwd()
    try:
        os.chdir(ROOT)
        cfg = cfglib.load_config_file(spec)
        cfglib.apply_overrides(cfg, [o for o in overrides if "$" not in o])
    finally:
        os.chdir(cwd)


@lru_cache(maxsize=None)
def script_flags(path: Path) -> frozenset[str]:
    """The option strings of every add_argument call in a Python script and in the modules beside it that it
    imports (benchmarks share a harness)."""
    flags, todo, seen = set(), [path], set()
    while todo:
        p = todo.pop()
        if p in seen or not p.is_file():
            continue
        seen.add(p)
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                flags |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            todo += [path.parent / (n.replace(".", "/") + ".py") for n in names]
            todo += [path.parent / n.replace(".", "/") / "__init__.py" for n in names]
    return frozenset(f for f in flags if f.startswith("-"))


def check_python(args: list[str]) -> None:
    if not args or args[0] == "-":
        return  # code from a here-document: it runs where the command is not skipped
    if args[0] == "-c":
        compile(args[1], "<python -c>", "exec")
        return
    if args[0] == "-m":
        import importlib.util

        assert importlib.util.find_spec(args[1]) is not None, f"python -m {args[1]}: no such module"
        return
    script = ROOT / args[0]
    assert script.is_file(), f"python {args[0]}: no such file in the repository"
    known = script_flags(script)
    for a in args[1:]:
        if a == "--":
            break
        if a.startswith("--") and "$" not in a:
            assert a.split("=", 1)[0] in known, f"python {args[0]}: no flag {a.split('=', 1)[0]} (it has: " \
                                                 f"{', '.join(sorted(known))})"


def check_simple(c: list[str]) -> None:
    prog, args = c[0], c[1:]
    if prog == "jaxembed":
        check_jaxembed(args)
    elif prog in ("python", "python3"):
        check_python(args)
    elif prog == "make":
        targets = set(re.findall(r"^([\w.-]+):", (ROOT / "Makefile").read_text(), re.M))
        for t in (a for a in args if not a.startswith("-") and "=" not in a):
            assert t in targets, f"make {t}: no such target (targets: {', '.join(sorted(targets))})"
    elif prog == "pip":
        text = (ROOT / "pyproject.toml").read_text()
        extras = set(re.findall(r"^([\w-]+)\s*=\s*\[", text.split("[project.optional-dependencies]")[1]
                                .split("\n[")[0], re.M))
        for a in args:
            m = re.fullmatch(r"\.\[([\w,-]+)\]", a)
            for e in (m.group(1).split(",") if m else []):
                assert e in extras, f"pip install '.[{e}]': no such extra (extras: {', '.join(sorted(extras))})"
    elif prog == "sbatch":
        script = next(a for a in args if not a.startswith("-"))
        assert (ROOT / script).is_file(), f"sbatch {script}: no such file in the repository"
    elif "/" in prog:
        assert (ROOT / prog).is_file(), f"{prog}: no such file in the repository"
    else:
        assert prog in KNOWN_PROGRAMS, f"{prog}: not a program the docs are known to use (a typo? else add it " \
                                       "to KNOWN_PROGRAMS in tests/test_docs.py)"


def check_parses(cmd: Command) -> None:
    for c in simple_commands(cmd.header):
        try:
            check_simple(c)
        except AssertionError as e:
            raise AssertionError(f"{cmd.where}: {e}\n  {cmd.header}") from None
        except Exception as e:  # a config that fails to load, a bad override
            raise AssertionError(f"{cmd.where}: {type(e).__name__}: {e}\n  {cmd.header}") from None


# ------------------------------------------------------------------------------------------------- tests


def test_commands_are_found_and_marked():
    """The extraction sees the blocks (a broken fence or splitter would silently test nothing)."""
    cmds = all_commands()
    pages = {c.page for c in cmds}
    assert "README.md" in pages and len(pages) >= 8, pages
    assert any(c.skip for c in cmds) and any(not c.skip for c in cmds)
    readme = [c for c in cmds if c.page == "README.md"]
    assert any(c.text.startswith("make demo") for c in readme) and any(c.text.startswith("make test") for c in readme)


def test_skipped_commands_parse():
    for cmd in all_commands():
        if cmd.skip or cmd.page in RUN_ELSEWHERE:
            check_parses(cmd)


def test_the_parse_check_catches_mistakes():
    """The static check refuses what a reader would trip on (so a pass means something)."""
    bad = ["jaxembed trian --config configs/demo.py --workdir w",           # a typo in the subcommand
           "jaxembed encode --model m --input x --out y --no-padding",        # an unknown flag
           "jaxembed eval --split test",                                        # a value outside the choices
           "jaxembed train --config configs/demo.py --workdir w --config.optim.learning_rate=1e-4",  # unknown key
           "jaxembed train --config configs/demo.py:huge --workdir w",          # an unknown variant
           "jaxembed train --config demoo:tiny --workdir w",                    # an unknown recipe
           "jaxembed train --config kalm:tiny,stage3 --workdir w",              # a recipe's unknown variant
           "jaxembed score --config pegg:tiny --out s",                         # (every command's --config)
           "jaxembed pretrain retromae --config retromae:tiny --workdir w --set train.stepz=3",  # its --set keys
           "jaxembed encode --model m --input x --out y --config.model.dtype=bfloat16",  # no overrides there
           "python benchmarks/train_throughput.py --modles minilm:16",           # a flag the script lacks
           "make tests", "pip install -e '.[gpus]'", "jaxmbed --help", "launch/slurm.sh configs/demo.py r"]
    for text in bad:
        with pytest.raises(AssertionError):
            check_parses(Command("x.md", 1, text, text, True, 0))
    good = ("for d in a b; do\n  jaxembed mine --model $M --store s --dataset $d --out r/$d.jsonl 2>&1 | tail -n 2\n"
            "done")
    check_parses(Command("x.md", 1, good, good, True, 0))


def _scratch(tmp_path: Path, shared_data: Path) -> Path:
    work = tmp_path / "repo"
    work.mkdir(parents=True)
    for d in ("configs", "launch"):
        shutil.copytree(ROOT / d, work / d, symlinks=True)
    (work / "benchmarks").symlink_to(ROOT / "benchmarks")
    if (ROOT / ".venv").is_dir():  # `source .venv/bin/activate` as in the docs (make creates it)
        (work / ".venv").symlink_to(ROOT / ".venv")
    (tmp_path / "shared").symlink_to(shared_data.parent)
    return work


def _script(cmds: list[Command]) -> str:
    lines = ["exec 2>&1", "set -o pipefail"]
    for i, c in enumerate(cmds):
        lines += [f"echo \"@@doc-test {i} start $EPOCHREALTIME\"", c.text,
                  f"__rc=$?; echo \"@@doc-test {i} end $EPOCHREALTIME $__rc\"",
                  f"[ \"$__rc\" = {c.exit} ] || exit 97"]
    return "\n".join(lines) + "\n"


def test_commands_run_as_written(shared_data, tmp_path, capsys):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               HF_HUB_OFFLINE="1", MPLBACKEND="Agg", TOKENIZERS_PARALLELISM="false")
    ran, skipped, elsewhere, t0, report = 0, 0, 0, time.time(), []
    for page in PAGES:
        rel = page.relative_to(ROOT).as_posix()
        cmds = [c for c in all_commands() if c.page == rel]
        if rel in RUN_ELSEWHERE:
            elsewhere += len(cmds)
            continue
        run = [c for c in cmds if not c.skip]
        skipped += len(cmds) - len(run)
        if not run:
            continue
        work = _scratch(tmp_path / rel.replace("/", "_"), shared_data)
        out = subprocess.run(["bash", "-c", _script(run)], cwd=work, env=env, capture_output=True, text=True,
                             timeout=600)
        log, times = out.stdout, {}
        for m in re.finditer(r"^@@doc-test (\d+) (start|end) ([\d.]+)(?: (\d+))?$", log, re.M):
            times.setdefault(int(m.group(1)), {})[m.group(2)] = (float(m.group(3)), m.group(4))
        done = [i for i, t in times.items() if "end" in t]
        failed = next((i for i in sorted(times) if "end" not in times[i] or
                       int(times[i]["end"][1]) != run[i].exit), None)
        if failed is not None or out.returncode != 0:
            i = failed if failed is not None else max(done, default=0)
            section = log.split(f"@@doc-test {i} start")[-1]
            rc = times.get(i, {}).get("end", (0, "?"))[1]
            pytest.fail(f"{run[i].where}: exit status {rc} (expected {run[i].exit}):\n{run[i].text}\n--- output "
                        f"(last 4000 characters):\n{section[-4000:]}")
        for i in done:
            took = times[i]["end"][0] - times[i]["start"][0]
            report.append((took, run[i].where))
            limit = command_limit_s()
            assert took < limit, f"{run[i].where}: took {took:.1f} s (limit {limit:.0f} s at this load): mark it " \
                                 f"'# doc-test: skip (why)' or make it cheaper:\n{run[i].text}"
        ran += len(run)
    with capsys.disabled():
        slow = ", ".join(f"{w} {t:.1f}s" for t, w in sorted(report, reverse=True)[:5])
        print(f"\ndoc commands: {ran} run, {skipped} marked skip (parsed only), {elsewhere} run by "
              f"{', '.join(RUN_ELSEWHERE.values())}; {time.time() - t0:.1f} s (load {os.getloadavg()[0]:.1f}); "
              f"slowest: {slow}")
    assert ran >= 10


# ------------------------------------------------------------------------------------------------- links


def _strip_fences(text: str) -> str:
    return re.sub(r"^\s*```.*?^\s*```[^\n]*$", "", text, flags=re.S | re.M)


def _strip_code(text: str) -> str:
    return re.sub(r"`[^`\n]*`", "", _strip_fences(text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    h = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", h).replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", _strip_fences(path.read_text(encoding="utf-8")), re.M):
        s = slug(m.group(1))
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return frozenset(out)


def links(path: Path) -> list[str]:
    return re.findall(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", _strip_code(path.read_text(encoding="utf-8")))


#: files that other work beside the docs writes and that the docs link already; a link to
#: one of them may dangle until it lands (then it is checked like any other). Drop an entry once its file exists.
PENDING_FILES = {
    "docs/testing.md": "mutation testing, written with the mutation work",
    "benchmarks/gpu/README.md": "the GPU benchmarks, written with benchmarks/gpu/",
}


def test_relative_links_resolve():
    bad = []
    for page in PAGES:
        for target in links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # http(s):, mailto:
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            pending = dest.is_relative_to(ROOT) and dest.relative_to(ROOT).as_posix() in PENDING_FILES
            if not dest.exists() and not pending:
                bad.append(f"{page.relative_to(ROOT)}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{page.relative_to(ROOT)}: {target}: no heading with that anchor in {dest.name}")
    assert not bad, "\n".join(bad)


def test_the_link_check_catches_broken_links(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# A `b` c\n## Same\n## Same\n[x](p.md#a-b-c) [y](#same-1) [z](#nope) [w](missing.md)\n"
                    "```\n[not a link](nowhere.md)\n```\n")
    assert anchors(page) == {"a-b-c", "same", "same-1"}
    assert links(page) == ["p.md#a-b-c", "#same-1", "#nope", "missing.md"]


# ------------------------------------------------------------------------------------------ named files

_REPO_PATH = re.compile(r"`((?:jaxembed|tests|benchmarks|configs|launch|docs)/[^`\s]*)`")


def named_paths(path: Path) -> list[str]:
    """The repository paths a page names in inline code (`jaxembed/mote.py`, `tests/test_pod.py::test_x`,
    `configs/kalm.py:tiny`, `jaxembed/models/*/params.py`, `jaxembed/models/<arch>/model.py`)."""
    out = []
    for m in _REPO_PATH.finditer(_strip_fences(path.read_text(encoding="utf-8"))):
        p = m.group(1).split("::")[0]
        p = re.sub(r"(\.py):.*$", r"\1", p)          # a config's variant
        out.append(re.sub(r"<[^>]*>", "*", p).rstrip(".,;:"))
    return out


def _braces(p: str) -> list[str]:
    """Shell brace expansion of one ``{a,b}`` group (recursively): tests/test_{x,y}.py -> both paths."""
    m = re.search(r"\{([^{}]*,[^{}]*)\}", p)
    return [q for alt in m.group(1).split(",") for q in _braces(p[:m.start()] + alt + p[m.end():])] if m else [p]


def test_named_repository_files_exist():
    """Every file of the repository that the README or a docs page names in inline code exists (modules move: the
    page must move with them)."""
    bad = [f"{page.relative_to(ROOT)}: `{p}`" for page in PAGES for p in named_paths(page)
           if not all(list(ROOT.glob(q.rstrip("/"))) for q in _braces(p))]
    assert not bad, "no such file or folder in the repository:\n" + "\n".join(bad)


_DOTTED = re.compile(r"`(jaxembed(?:\.[A-Za-z_]\w*)+)(?:\(\))?`")


def test_named_python_objects_exist():
    """Every ``jaxembed.module.object`` a page names in inline code imports (a renamed function or a moved module
    shows here)."""
    import importlib

    bad = []
    for page in PAGES:
        for name in sorted(set(_DOTTED.findall(_strip_fences(page.read_text(encoding="utf-8"))))):
            parts, obj = name.split("."), None
            for i in range(len(parts), 0, -1):
                try:
                    obj = importlib.import_module(".".join(parts[:i]))
                except ImportError:
                    continue
                try:
                    for attr in parts[i:]:
                        obj = getattr(obj, attr)
                except AttributeError:
                    obj = None
                break
            if obj is None:
                bad.append(f"{page.relative_to(ROOT)}: `{name}`")
    assert not bad, "not importable:\n" + "\n".join(bad)


_CONFIG_KEY = re.compile(r"`((?:model|data|plan|loss|optim|train|eval|export)\.[a-z_][\w.]*?)(?:=[^`]*)?`")
#: words of that shape that are not config keys: sentence-transformers' attribute
NOT_CONFIG_KEYS = {"model.max_seq_length"}


def _config_keys(c, prefix: str = "") -> set[str]:
    import ml_collections as mc

    out = set()
    for k, v in c.items():
        out.add(prefix + k)
        if isinstance(v, mc.ConfigDict):
            out |= _config_keys(v, f"{prefix}{k}.")
    return out


def test_named_config_keys_exist():
    """Every run-config key a page names in inline code (`data.packing`, `plan.curriculum.walk=balanced`) is a key
    of ``default_config()`` (or of RetroMAE's config); file names (`plan.npz`) and the trainer's functions
    (`train.prepare_store`) are not keys."""
    from jaxembed import train
    from jaxembed.config import default_config
    from jaxembed.pretrain.config import default_config as retromae_config

    known = _config_keys(default_config()) | _config_keys(retromae_config())
    bad = []
    for page in PAGES:
        for m in _CONFIG_KEY.finditer(_strip_fences(page.read_text(encoding="utf-8"))):
            key = m.group(1)
            if re.search(r"\.(npz|json|py|safetensors|log|txt)$", key) or key in NOT_CONFIG_KEYS or (
                    key.startswith("train.") and hasattr(train, key.split(".", 1)[1])):
                continue
            if key not in known:
                bad.append(f"{page.relative_to(ROOT)}: `{m.group(0).strip('`')}`")
    assert not bad, "not a config key (renamed?):\n" + "\n".join(bad)
