"""Run config files and what is written of them: ``load_config_file`` (``PATH[:VARIANT]`` or
``RECIPE[:VARIANT]`` -> its ``get_config(VARIANT)``), the recipes that ship with jaxembed (``recipe_names``,
``recipe_spec``, ``recipe_list``), ``apply_overrides`` (``--config.a.b=VALUE``), one-line errors for ml-collections'
type errors (``override_error``), the resolved config of a run directory (``to_json``, ``to_text``,
``write_resolved``), a run's ``config.json`` named by ``--config`` (``json_config_path``, ``read_json_config``: read as
data, never run; ``jaxembed.config.load_config_file`` builds the config from it), and the comparison of a resumed
run's config with its own (``config_differences``, ``changed_config_message``, ``extends_steps``). The defaults and
the checks are ``jaxembed.config``, which re-exports these names.

The one loader of config files (``jaxembed train``, ``data prepare``, ``plan build``, ``score``, ``sweep``,
``pretrain``): ``PATH[:VARIANT]`` is ml_collections' convention. The path is the whole text when such a file exists
(a ':' in a folder name, a Windows drive), else the longest part before a ':' that is a file (``x.py:a:b`` passes
``'a:b'``, as ml_collections does). Only ``.py`` files run: any other file (a data file, a ``.json``) is one line,
never executed. A path that is no ``.py`` file but a bare name (no folder, no suffix: ``demo``,
``kalm:tiny,lora``) names a recipe: ``NAME.py`` of ``jaxembed.paths.recipes_dir()`` (``configs/`` of the
repository, ``jaxembed/recipes/`` of an installed package), so recipes load from any folder (a file ``./demo``,
which cannot run, does not hide the recipe; write ``demo.py`` for a file); an unknown name is an error listing the
recipes. ``get_config(VARIANT)``; without a variant (or an empty one, ``x.py:``)
``get_config()`` when it can be called so (its own default applies), else ``get_config(None)``. Every call runs the
file again (no cache: callers change the ConfigDict they get). The file runs as a module named
``jaxembed_config_<stem>_<hash of its path>``, registered in ``sys.modules`` (dataclasses and pickle look classes up
there); ``sys.path`` is left alone. Every error is one line with the fix: ``--config SPEC: ...`` for the argument
(no such file, a folder, a variant get_config() cannot take), ``PATH:LINE: ...`` for an error in the file; a
UserError a recipe raises (an unknown variant, no shared data) is led by its name (``datacube: ...``).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.machinery
import importlib.util
import inspect
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import ml_collections as mc

from jaxembed import paths
from jaxembed.errors import UserError, in_file, with_file
from jaxembed.runs.rundir import RunDir, rundir

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+://")
#: a recipe's name: a bare Python identifier (a path has a folder or a suffix)
_RECIPE_NAME = re.compile(r"^[A-Za-z_]\w*$")


def split_config_spec(spec: str) -> tuple[str, str | None]:
    """``PATH[:VARIANT]`` -> (path, variant or None); see the module docstring. When no file matches, the path is
    the longest part before a ':' that ends in ``.py``, else the part before the last ':' when what follows is no
    path (``configs/x:tiny``), else the whole text (the caller reports it missing)."""
    cuts = [i for i, ch in enumerate(spec) if ch == ":"]
    if Path(spec).exists() or not cuts:
        return spec, None
    for i in reversed(cuts):
        if Path(spec[:i]).is_file():
            return spec[:i], spec[i + 1:] or None
    for i in reversed(cuts):
        if spec[:i].endswith(".py"):
            return spec[:i], spec[i + 1:] or None
    rest = spec[cuts[-1] + 1:]
    if "/" not in rest and "\\" not in rest:
        return spec[:cuts[-1]], rest or None
    return spec, None


def recipe_names() -> list[str]:
    """The recipes that ship with jaxembed: the stems of the ``*.py`` files of ``paths.recipes_dir()``."""
    return sorted(p.stem for p in paths.recipes_dir().glob("*.py")
                  if _RECIPE_NAME.match(p.stem) and not p.stem.startswith("_"))


def recipe_spec(file: str | os.PathLike) -> str:
    """How ``--config`` names the config file ``file`` from any folder: its recipe name when it is one of the
    shipped recipes, else its absolute path. Recipes use it (``recipe_spec(__file__)``) in the commands their
    messages print, so that those commands work wherever they are run, and name a copied recipe by its path."""
    p = Path(file).resolve()
    if p.parent == paths.recipes_dir().resolve() and p.stem in recipe_names():
        return p.stem
    return str(p)


def recipe_list(name: str | None = None) -> list[dict]:
    """[{name, path, summary, variants, doc}] of the shipped recipes (or of the one named), read from the recipe
    modules themselves: their docstring (summary: its first sentence, up to a ' ('), and their ``VARIANTS``."""
    names = recipe_names()
    if name is not None and name not in names:
        raise UserError(f"recipes {name}: no such recipe (fix: one of {', '.join(names)})")
    out = []
    for n in [name] if name is not None else names:
        module, path, _, _ = _load_module(n)
        doc = inspect.cleandoc(module.__doc__ or "")
        first = doc.split("\n\n", 1)[0].replace("\n", " ")
        summary = first.split(" (", 1)[0] if " (" in first else first.split(". ", 1)[0]
        out.append({"name": n, "path": str(Path(path).resolve()), "summary": summary.rstrip("."), "doc": doc,
                    "variants": [str(v) for v in getattr(module, "VARIANTS", ())]})
    return out


def config_help(what: str = "a config file with get_config(arg)") -> str:
    """The help of a ``--config`` flag: a recipe by name, or a file."""
    return (f"a recipe by name ({', '.join(recipe_names())}; `jaxembed recipes` lists their variants) or {what}; "
            "either with :VARIANTS, e.g. demo:tiny, kalm:tiny,lora or ./my_config.py:tiny")


def portable_spec(spec: str) -> str:
    """``--config SPEC`` as another folder or machine reads it (a SLURM job, a launcher): a recipe stays its name, a
    file becomes its absolute path (the variant kept)."""
    p, variant, recipe = resolve_config_path(spec)
    if recipe is not None:
        return spec
    return str(p.absolute()) + (f":{variant}" if variant is not None else "")


def _unknown_recipe(spec: str, name: str, also: str = "") -> str:
    import difflib

    names = recipe_names()
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    return (f"--config {spec}: no recipe or file named {name!r} (fix: "
            + (f"did you mean {close[0]}? " if close else "")
            + f"recipes: {', '.join(names)} (`jaxembed recipes` lists their variants); a config file is given by its "
            f"path, e.g. ./my_config.py{also})")


def resolve_config_path(spec: str, also: str = "") -> tuple[Path, str | None, str | None]:
    """(path, variant, recipe name or None) of ``--config SPEC`` (see the module docstring): an existing file, else
    a recipe's file when the path is a recipe's name. An unknown bare name (no file or folder of that name) is a
    UserError listing the recipes; any other path comes back as it is (the caller reports it missing)."""
    path, variant = split_config_spec(spec)
    p = Path(path)
    python_file = p.is_file() and p.suffix == ".py"
    if python_file or not _RECIPE_NAME.match(path) or (p.is_file() and path not in recipe_names()):
        return p, variant, None
    if path in recipe_names():  # a recipe's name wins over a file of that name that is no .py file (never run)
        return paths.recipes_dir() / f"{path}.py", variant, path
    if not p.is_dir():
        raise UserError(_unknown_recipe(spec, path, also=also))
    return p, variant, None


def _missing(spec: str, p: Path, variant: str | None, also: str) -> UserError:
    """The error for a ``--config`` path that is no file: a URL, a folder, or no such file (for a recipe's file that
    is not there, e.g. configs/demo.py typed outside the repository, the fix is the recipe's name)."""
    if _URL.match(spec):
        return UserError(f"--config {spec}: is a URL, config files are read from a local path (fix: download it and "
                         f"give its local path{also})")
    what = "is a folder, not a config file" if p.is_dir() else "no such file" + ("" if str(p) == spec else f" {p}")
    fix = "give a Python config file as PATH or PATH:VARIANT, or a recipe by name as NAME or NAME:VARIANT"
    if p.stem in recipe_names() and not p.is_dir():
        fix = (f"the recipe '{p.stem}' ships with jaxembed: --config {p.stem}{':' + variant if variant else ''} "
               f"works from any folder; else {fix}")
    else:
        fix += f" ({', '.join(recipe_names())}; e.g. demo:tiny)"
    return UserError(f"--config {spec}: {what} (fix: {fix}{also})")


def _not_python(spec: str, p: Path, also: str) -> str:
    """The error for a ``--config`` file that is no ``.py`` file: only Python files run as config files."""
    what = "a JSON file (read as data only where a run config is taken)" if p.suffix.lower() == ".json" else (
        f"not a Python file ({p.suffix or 'no suffix'})")
    return (f"--config {spec}: {p} is {what}; a config file is Python and runs as code, so only .py files run "
            "(fix: give a .py file with get_config(), a recipe by name (e.g. demo:tiny), or to resume a run from "
            f"its own config: jaxembed train --config WORKDIR/config.json --workdir WORKDIR{also})")


def json_config_path(spec: str, also: str = "") -> Path | None:
    """The JSON run config ``--config SPEC`` names (a run's ``config.json``, read as data: nothing in it runs), or
    None when SPEC names a Python config file or a recipe."""
    p, variant, recipe = resolve_config_path(spec, also)
    if recipe is not None or p.suffix.lower() != ".json" or not p.is_file():
        return None
    if variant is not None:
        raise UserError(f"--config {spec}: a JSON run config takes no variant (fix: --config {p}, with "
                        "--config.KEY=VALUE overrides)")
    return p


#: the sections every run's config.json holds
RUN_SECTIONS = ("model", "data", "plan", "loss", "optim", "train")


def read_json_config(p: Path) -> dict:
    """The object of a run's ``config.json`` (``--config WORKDIR/config.json``), checked to be a run config."""
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise UserError(f"{p}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno}) (fix: give the config.json a "
                        "run wrote, or a Python config file (.py))") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--config {p}: cannot read it ({type(e).__name__}: {e})") from None
    missing = [k for k in RUN_SECTIONS if not isinstance(d, dict) or not isinstance(d.get(k), dict)]
    if missing:
        raise UserError(f"--config {p}: not a run config: a JSON config is the config.json of a run directory, with "
                        f"the sections {', '.join(RUN_SECTIONS)} (missing: {', '.join(missing)}) (fix: give that "
                        "config.json, or a Python config file (.py) with get_config(), or a recipe by name)")
    return d


def _load_module(spec: str, also: str = ""):
    """(module, path, variant, recipe name or None): ``load_config_module``, and whether a recipe was named."""
    p, variant, recipe = resolve_config_path(spec, also)
    if not p.is_file():
        raise _missing(spec, p, variant, also)
    if p.suffix != ".py":  # a data file, a run's config.json: never run as code
        raise UserError(_not_python(spec, p, also))
    digest = hashlib.sha1(str(p.resolve()).encode()).hexdigest()[:8]
    name = "jaxembed_config_" + re.sub(r"\W", "_", p.stem) + "_" + digest
    loader = importlib.machinery.SourceFileLoader(name, str(p))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    sys.modules[name] = module  # while it runs too: @dataclass looks its module up there
    try:
        try:
            loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
    except UserError as e:
        raise UserError(_located(e, p, recipe)) from None
    except SyntaxError as e:
        where = f"{e.filename or p}:{e.lineno}"
        raise UserError(f"{where}: not valid Python ({e.msg}) (fix: correct that line)") from None
    except Exception as e:  # noqa: BLE001 -- a broken config file is the user's to fix
        raise UserError(override_error(e, p) or f"{in_file(e, p)}: the file failed to run "
                        f"({type(e).__name__}: {e})") from None
    return module, str(p), variant, recipe


def load_config_module(spec: str, also: str = ""):
    """(module, path, variant) of a config file given as ``PATH[:VARIANT]`` or ``RECIPE[:VARIANT]``: the file run
    as a module. ``also`` names what else the flag takes, for the fix of a missing file (e.g. ``", or 'shared'"``)."""
    return _load_module(spec, also)[:3]


def _located(e: UserError, path: Path, recipe: str | None) -> str:
    """The message of a UserError raised while a config file ran: led by the recipe's name (``kalm: ...``) for a
    recipe, else by ``path:line`` (``with_file``), unless it already names the file or the recipe."""
    if recipe is None:
        return with_file(e, path)
    msg = str(e)
    head = msg.split(": ", 1)[0]
    return msg if head.split(":", 1)[0] == recipe or path.name in head else f"{recipe}: {msg}"


def _needs_argument(fn) -> bool:
    """Whether ``fn()`` (no argument) cannot be called but ``fn(x)`` can."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0].default is inspect.Parameter.empty and params[0].kind in (
        inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _takes_argument(fn) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)


def load_config_file(spec: str, also: str = "") -> mc.ConfigDict:
    """``PATH[:VARIANT]`` -> ``get_config(VARIANT)`` of that Python file (see the module docstring)."""
    module, path, variant, recipe = _load_module(spec, also)
    p = Path(path)
    fn = getattr(module, "get_config", None)
    if not callable(fn):
        raise UserError(f"--config {path}: defines no get_config() (fix: define get_config(arg=None) returning a "
                        "ConfigDict)")
    if variant is not None and not _takes_argument(fn):
        raise UserError(f"--config {spec}: get_config() takes no argument, so the variant {variant!r} cannot be "
                        f"passed (fix: define get_config(arg=None) in {path}, or drop ':{variant}')")
    try:
        if variant is not None:
            cfg = fn(variant)
        else:
            cfg = fn(None) if _needs_argument(fn) else fn()
    except UserError as e:  # e.g. dataset_config(tempreature=...): name the config file and line
        raise UserError(_located(e, p, recipe)) from None
    except Exception as e:  # noqa: BLE001
        raise UserError(override_error(e, p) or f"{in_file(e, p)}: get_config({variant!r}) "
                        f"failed ({type(e).__name__}: {e})") from None
    if cfg is None:
        raise UserError(f"--config {path}: get_config() returned None (fix: end get_config with 'return config')")
    return cfg


_OVERRIDE = re.compile(r"Could not override field '([^']+)'.*is of original type <class '([\w.]+)'> and cannot be "
                       r"casted to type <class '([\w.]+)'>", re.S)



def override_error(e: Exception, path: str | os.PathLike) -> str | None:
    """One line, led by ``path:line``, for ml-collections' multi-line TypeError on assigning a value of
    another type to a config field (e.g. a dict to ``data.datasets``, a list); None for any other error."""
    m = _OVERRIDE.search(str(e)) if isinstance(e, TypeError) else None
    if m is None:
        return None
    field, given, kind = m.group(1), m.group(2).rsplit(".", 1)[-1], m.group(3).rsplit(".", 1)[-1]
    if field == "datasets" and given == "ConfigDict":
        return (f"{in_file(e, path)}: datasets is a list of dataset configs, a dict cannot be assigned to "
                "it (fix: c.data.datasets = datasets_from_dict({'name': 'path' or dict(path=..., ...), ...}), with "
                "from jaxembed.data.config import datasets_from_dict)")
    given = "dict" if given == "ConfigDict" else given
    return f"{in_file(e, path)}: field '{field}' is a {kind}, a {given} cannot be assigned to it"


def _parse_value(text: str, old: Any) -> Any:
    if isinstance(old, bool) or old is None:
        low = text.lower()
        if low in ("true", "false"):
            return low == "true"
    if isinstance(old, str):
        return text
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        pass
    if isinstance(old, float):
        try:
            return float(text)  # nan, inf: numbers, which the config's checks then judge
        except ValueError:
            pass
    return text


_TYPE_WORDS = {bool: ("True or False", "True"), int: ("an integer", "100"), float: ("a number", "0.5"),
               str: ("a string", "text"), tuple: ("a tuple", "\"('a', 'b')\""), list: ("a list", "\"['a']\"")}


def _wrong_type(key: str, text: str, value: Any, cur: mc.ConfigDict, last: str) -> str:
    """The one-line error of an override whose value is not of the key's type: the key, its type, an example."""
    try:
        kind = cur.get_type(last)
    except (KeyError, AttributeError, TypeError):
        kind = type(cur[last])
    words, example = _TYPE_WORDS.get(kind, (f"a {getattr(kind, '__name__', kind)}", None))
    old = cur[last]
    if old and kind in (int, float, bool):  # the current value, unless it is 0 (often 'off', a poor example)
        example = repr(old)
    fix = f"e.g. --config.{key}={example}" if example else f"a value of type {getattr(kind, '__name__', kind)}"
    return (f"--config.{key}={text}: config.{key} is {words}, and {text!r} (read as {type(value).__name__}) is not "
            f"(fix: {fix})")


def apply_overrides(c: mc.ConfigDict, overrides: list[str]) -> mc.ConfigDict:
    """Apply ``a.b=VALUE`` overrides (values parsed as Python literals; strings may be bare)."""
    for item in overrides:
        key, eq, text = item.partition("=")
        if not eq:
            raise UserError(f"--config.{item}: expected --config.KEY=VALUE")
        parts = key.split(".")
        cur = c
        for i, part in enumerate(parts[:-1]):
            if part not in cur:
                raise UserError(f"--config.{key}: unknown key {'.'.join(parts[:i + 1])!r}")
            cur = cur[part]
        last = parts[-1]
        if last not in cur:
            import difflib

            known = ", ".join(sorted(cur.keys()))
            close = difflib.get_close_matches(last, list(cur.keys()), n=1, cutoff=0.6)
            hint = f" (did you mean {'.'.join(parts[:-1] + [close[0]])}?)" if close else ""
            raise UserError(f"--config.{key}: unknown key{hint} (keys here: {known})")
        old = cur[last]
        value = _parse_value(text, old)
        try:
            if isinstance(old, tuple) and isinstance(value, list):
                value = tuple(value)
            if isinstance(old, float) and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            cur[last] = value
        except TypeError:
            raise UserError(_wrong_type(key, text, value, cur, last)) from None
        except ValueError as e:
            raise UserError(f"--config.{key}={text}: {e}") from None
    return c


def to_plain(x: Any) -> Any:
    """ConfigDicts (also inside lists) -> plain dicts / lists, for JSON."""
    if isinstance(x, (mc.ConfigDict, dict)):
        return {k: to_plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_plain(v) for v in x]
    return x


def to_json(c: mc.ConfigDict) -> str:
    return json.dumps(to_plain(c), indent=2, sort_keys=True, default=str)


def to_text(c: mc.ConfigDict) -> str:
    """The config as plain ``key: value`` lines, one per value (``optim.lr: 2e-05``, ``data.datasets[0].name:
    "stsb"``; values in JSON, so the file is also plain YAML): what config.txt holds."""
    flat = _flat(to_plain(c), "")
    head = ("# the run's resolved config, one value a line (config.json holds the same as JSON); a key is what "
            "--config.KEY=VALUE overrides\n")
    return head + "".join(f"{k}: {json.dumps(v, default=str)}\n" for k, v in sorted(flat.items()))


def write_resolved(c: mc.ConfigDict, rd: RunDir) -> None:
    """config.json (machine-readable) and config.txt (``to_text``: one ``key: value`` line per value) in the run
    directory."""
    from jaxembed.runs import atomic_files

    atomic_files.write_text(rd.config_json, to_json(c) + "\n")  # atomic: a reader never sees half a file
    atomic_files.write_text(rd.config_txt, to_text(c))


def _flat(x: Any, prefix: str) -> dict[str, Any]:
    """A plain config as {dotted key: value}; a list of dicts (data.datasets) item by item (``datasets[0].name``)."""
    if isinstance(x, dict) and x:
        out: dict[str, Any] = {}
        for k, v in x.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(x, list) and x and all(isinstance(v, dict) for v in x):
        out = {}
        for i, v in enumerate(x):
            out.update(_flat(v, f"{prefix}[{i}]"))
        return out
    return {prefix: x}


_ABSENT = object()


def config_differences(old: dict, new: dict, keys: tuple[str, ...]) -> list[tuple[str, Any, Any]]:
    """(dotted key, old value, new value) of every value under ``keys`` (sections like 'optim', or single keys
    like 'train.seed') that differs between two plain configs (``to_plain``); an absent value is ``_ABSENT``."""
    def pick(d: dict, key: str) -> Any:
        for part in key.split("."):
            d = d.get(part, _ABSENT) if isinstance(d, dict) else _ABSENT
        return d

    out = []
    for key in keys:
        a, b = _flat(pick(old, key), key), _flat(pick(new, key), key)
        out += [(k, a.get(k, _ABSENT), b.get(k, _ABSENT)) for k in sorted(set(a) | set(b))
                if a.get(k, _ABSENT) != b.get(k, _ABSENT)]
    return out


def _shown(v: Any, width: int = 60) -> str:
    text = "(absent)" if v is _ABSENT else json.dumps(v, default=str)
    return text if len(text) <= width else text[:width - 3] + "..."


def describe_differences(diffs: list[tuple[str, Any, Any]], shown: int = 8) -> str:
    """``config_differences`` as one line: 'key old -> new; ...' (at most ``shown`` keys, then how many more)."""
    items = [f"{k} {_shown(a)} -> {_shown(b)}" for k, a, b in diffs[:shown]]
    more = f"; and {len(diffs) - shown} more" if len(diffs) > shown else ""
    return "; ".join(items) + more


def changed_config_message(workdir: str | os.PathLike | RunDir, diffs: list[tuple[str, Any, Any]], shown: int = 8) -> str:
    """The one-line refusal of a resume with another config: each differing key with the run's value and this
    command's, and the commands that work (a new run directory; the run's own config.json, read as data)."""
    rd = rundir(workdir)
    wd = rd.root
    return (f"{wd} holds a run with another config: {describe_differences(diffs, shown)} (the run's value -> this "
            "command's). "
            "Resuming needs the same config; only plan.steps may grow, to train a run on (fix: use a new --workdir, "
            f"or resume the run as it was: jaxembed train --config {rd.config_json} --workdir {wd})")


def extends_steps(diffs: list[tuple[str, Any, Any]]) -> bool:
    """Whether the differences are plan.steps alone, grown: a run trained on to more steps (docs/training.md)."""
    return len(diffs) == 1 and diffs[0][0] == "plan.steps" and all(
        isinstance(v, int) and not isinstance(v, bool) for v in diffs[0][1:]) and diffs[0][2] > diffs[0][1]
