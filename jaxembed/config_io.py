"""Run config files and what is written of them: ``load_config_file`` (``path/file.py[:arg]`` -> its
``get_config(arg)``), ``apply_overrides`` (``--config.a.b=VALUE``), one-line errors for ml-collections' type errors
(``override_error``), and the resolved config of a run directory (``to_json``, ``write_resolved``). The defaults
and the checks are ``jaxembed.config``, which re-exports these names."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import os
import re
from pathlib import Path
from typing import Any

import ml_collections as mc

from jaxembed.errors import UserError, in_file, with_file


def load_config_file(spec: str) -> mc.ConfigDict:
    """``path/to/file.py[:arg]`` -> get_config(arg)."""
    path, _, arg = spec.partition(":")
    p = Path(path)
    if not p.exists():
        raise UserError(f"--config {path}: no such file (fix: e.g. --config configs/demo.py:tiny)")
    spec_ = importlib.util.spec_from_file_location(f"jaxembed_config_{p.stem}", p)
    module = importlib.util.module_from_spec(spec_)
    try:
        spec_.loader.exec_module(module)
    except UserError as e:
        raise UserError(with_file(e, p, "--config ")) from None
    except Exception as e:
        raise UserError(override_error(e, p, "--config ") or f"--config {in_file(e, p)}: the file failed to run "
                        f"({type(e).__name__}: {e})") from None
    if not hasattr(module, "get_config"):
        raise UserError(f"--config {path}: defines no get_config(arg=None)")
    try:
        params = inspect.signature(module.get_config).parameters
    except (TypeError, ValueError):
        params = {"arg": None}
    takes_arg = bool(params)
    if arg and not takes_arg:
        raise UserError(f"--config {spec}: get_config() takes no argument, so the variant {arg!r} cannot be passed "
                        f"(fix: define get_config(arg=None) in {path}, or drop ':{arg}')")
    try:
        cfg = module.get_config(arg or None) if takes_arg else module.get_config()  # ml_collections' get_config()
    except UserError as e:  # e.g. dataset_config(tempreature=...): name the config file and line
        raise UserError(with_file(e, p, "--config ")) from None
    except Exception as e:
        raise UserError(override_error(e, p, "--config ") or f"--config {in_file(e, p)}: get_config({arg!r}) failed "
                        f"({type(e).__name__}: {e})") from None
    return cfg


_OVERRIDE = re.compile(r"Could not override field '([^']+)'.*is of original type <class '([\w.]+)'> and cannot be "
                       r"casted to type <class '([\w.]+)'>", re.S)



def override_error(e: Exception, path: str | os.PathLike, prefix: str = "") -> str | None:
    """One line, led by ``prefix`` + ``path:line``, for ml-collections' multi-line TypeError on assigning a value of
    another type to a config field (e.g. a dict to ``data.datasets``, a list); None for any other error."""
    m = _OVERRIDE.search(str(e)) if isinstance(e, TypeError) else None
    if m is None:
        return None
    field, given, kind = m.group(1), m.group(2).rsplit(".", 1)[-1], m.group(3).rsplit(".", 1)[-1]
    if field == "datasets" and given == "ConfigDict":
        return (f"{prefix}{in_file(e, path)}: datasets is a list of dataset configs, a dict cannot be assigned to "
                "it (fix: c.data.datasets = datasets_from_dict({'name': 'path' or dict(path=..., ...), ...}), with "
                "from jaxembed.data.config import datasets_from_dict)")
    given = "dict" if given == "ConfigDict" else given
    return f"{prefix}{in_file(e, path)}: field '{field}' is a {kind}, a {given} cannot be assigned to it"


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
        return text


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
        except (TypeError, ValueError) as e:
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


def write_resolved(c: mc.ConfigDict, workdir: str | os.PathLike) -> None:
    """config.json (machine-readable) and config.txt (ml-collections' readable form) in the run directory."""
    from jaxembed import runfiles

    wd = Path(workdir)
    runfiles.write_text(wd / "config.json", to_json(c) + "\n")  # atomic: a reader never sees half a file
    runfiles.write_text(wd / "config.txt", str(c))
