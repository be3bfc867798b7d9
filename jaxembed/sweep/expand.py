"""Sweep expansion: ``--sweep`` / ``--zip`` / ``get_hyper()`` into runs, each config built and validated, each run
named from its swept values (``plan_sweep`` -> ``Sweep``). Nothing is written here; the rules are in the
``jaxembed.sweep`` docstring."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import inspect
import itertools
import os
import re
from pathlib import Path
from typing import Any

from jaxembed import config as cfglib
from jaxembed.config.io import load_config_module
from jaxembed.errors import UserError

MANIFEST = "sweep.json"
NAME_MAX = 120


def product(mapping: dict[str, list]) -> list[dict]:
    """``{"a": [1, 2], "b": [3, 4]}`` -> the 4 combinations, the last key varying fastest."""
    keys = list(mapping)
    return [dict(zip(keys, vals)) for vals in itertools.product(*(list(mapping[k]) for k in keys))]


def zipped(mapping: dict[str, list], where: str = "zip") -> list[dict]:
    """``{"a": [1, 2], "b": [3, 4]}`` -> ``[{"a": 1, "b": 3}, {"a": 2, "b": 4}]``; the lists must be equally long."""
    lengths = {k: len(list(v)) for k, v in mapping.items()}
    if len(set(lengths.values())) > 1:
        raise UserError(f"{where}: zipped keys need lists of one length, got "
                        f"{', '.join(f'{k}: {n}' for k, n in lengths.items())} (fix: give each key the same number "
                        "of values, or use a product)")
    keys = list(mapping)
    return [dict(zip(keys, vals)) for vals in zip(*(list(mapping[k]) for k in keys))]


def cross(*groups: list[dict]) -> list[dict]:
    """Every combination of one entry per group, merged (the last group varies fastest)."""
    out = [{}]
    for g in groups:
        out = [{**a, **b} for a in out for b in g]
    return out


def split_top(text: str, sep: str | None) -> list[str]:
    """Split on ``sep`` (None: whitespace) outside brackets and quotes."""
    parts, cur, depth, quote = [], [], 0, None
    for ch in text:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = None
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        is_sep = ch.isspace() if sep is None else ch == sep
        if is_sep and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()] if sep is None else [p.strip() for p in parts]


def _clean_key(key: str) -> str:
    key = key.strip()
    for prefix in ("--config.", "config."):
        if key.startswith(prefix):
            key = key[len(prefix):]
    return key


def parse_spec(spec: str, where: str) -> dict[str, list[str]]:
    """``"a.b=1,2 c=x,y"`` -> ``{"a.b": ["1", "2"], "c": ["x", "y"]}`` (value texts, as on a command line)."""
    axes: dict[str, list[str]] = {}
    items = split_top(spec, None)
    if not items:
        raise UserError(f"{where} {spec!r}: empty (fix: e.g. --sweep \"optim.lr=1e-5,2e-5\")")
    for item in items:
        key, eq, vals = item.partition("=")
        key = _clean_key(key)
        if not eq or not key:
            raise UserError(f"{where} {item!r}: expected KEY=V1,V2,... (fix: e.g. optim.lr=1e-5,2e-5)")
        values = []
        for v in split_top(vals, ","):
            if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
                v = v[1:-1]  # a quoted value: the text inside
            if v == "":
                raise UserError(f"{where} {item!r}: an empty value (fix: remove the extra comma)")
            values.append(v)
        if key in axes:
            raise UserError(f"{where} {spec!r}: key {key} appears twice (fix: list all its values once)")
        axes[key] = values
    return axes


class Text(str):
    """A value written as on a command line (parsed like ``--config.KEY=VALUE``), not a Python value."""


def _hyper_groups(obj: Any, where: str) -> list[dict]:
    """The runs a ``get_hyper()`` result describes (see the module docstring)."""
    if isinstance(obj, dict):
        unknown = set(obj) - {"product", "zip"}
        if unknown or not obj:
            raise UserError(f"{where}: a dict must hold 'product' and / or 'zip' (got keys {sorted(obj)}); or "
                            "return a list of override dicts")
        groups = []
        for kind in obj:  # in the dict's order: the last group varies fastest
            if kind in obj:
                m = obj[kind]
                if not isinstance(m, dict) or not all(isinstance(v, (list, tuple)) for v in m.values()):
                    raise UserError(f"{where}: {kind!r} must map keys to lists of values, e.g. "
                                    "{'optim.lr': [1e-5, 2e-5]}")
                groups.append(zipped(m, f"{where} zip") if kind == "zip" else product(m))
        return [{_clean_key(k): v for k, v in run.items()} for run in cross(*groups)]
    if isinstance(obj, (list, tuple)) and all(isinstance(x, dict) for x in obj) and obj:
        return [{_clean_key(k): v for k, v in x.items()} for x in obj]
    raise UserError(f"{where}: must return a non-empty list of override dicts or a {{'product': ..., 'zip': ...}} "
                    f"dict, got {type(obj).__name__}")


def load_hyper(config_spec: str) -> list[dict] | None:
    """Call ``get_hyper(arg)`` of a config file (``file.py[:arg]``, read as ``load_config_file`` reads it); None
    when the file defines none."""
    module, path, arg = load_config_module(config_spec)
    fn = getattr(module, "get_hyper", None)
    if fn is None:
        return None
    where = f"{path}: get_hyper({arg!r})"
    try:
        obj = fn(arg or None) if inspect.signature(fn).parameters else fn()
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"{where} failed ({type(e).__name__}: {e})") from None
    return _hyper_groups(obj, where)


def _lookup(c, key: str, where: str):
    """The value at a dotted key; a UserError naming the key and the keys there when it does not exist."""
    cur, done = c, []
    for part in key.split("."):
        if not hasattr(cur, "keys") or part not in cur:
            known = ", ".join(sorted(cur.keys())) if hasattr(cur, "keys") else f"{'.'.join(done)} has no sub-keys"
            raise UserError(f"{where}: unknown key {key!r} (keys at {'.'.join(done) or 'the top'}: {known}) "
                            "(fix: use one of these keys)")
        cur = cur[part]
        done.append(part)
    return cur


def _as_text(c, key: str, value: Any, where: str) -> str:
    """A Python value -> the ``KEY=TEXT`` text that ``apply_overrides`` parses back to it (checked)."""
    if isinstance(value, Text):
        return str(value)
    old = _lookup(c, key, where)
    text = value if isinstance(old, str) and isinstance(value, str) else repr(value)
    scratch = copy.deepcopy(c)
    try:
        cfglib.apply_overrides(scratch, [f"{key}={text}"])
    except UserError as e:
        raise UserError(f"{where}: {key}={value!r}: {e}") from None
    got = _lookup(scratch, key, where)
    want = tuple(value) if isinstance(value, list) else value
    if got != want and not (isinstance(got, float) and isinstance(want, int) and float(want) == got):
        raise UserError(f"{where}: {key}={value!r} does not survive the command line (it reads back as {got!r}); "
                        "fix: give a value of the key's type")
    return text


def _name_value(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v).lower()
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "-".join(_name_value(x) for x in v) or "none"
    return str(v)


def short_keys(keys: list[str]) -> dict[str, str]:
    """The last component of each key, or more components where two keys would read the same."""
    out = {}
    for k in keys:
        parts = k.split(".")
        for n in range(1, len(parts) + 1):
            short = ".".join(parts[-n:])
            if sum(1 for o in keys if o == short or o.endswith("." + short)) == 1:
                out[k] = short
                break
        else:
            out[k] = k
    return out


def run_names(values: list[dict[str, Any]], keys: list[str]) -> list[str]:
    """Readable, unique, file-system-safe names: ``lr=1e-05,temperature=0.01`` (keys that vary across runs)."""
    varying = [k for k in keys if len({repr(v.get(k)) for v in values}) > 1]
    short = short_keys(varying)
    names, seen = [], {}
    for v in values:
        name = ",".join(f"{short[k]}={_name_value(v[k])}" for k in varying if k in v) or "run"
        name = re.sub(r"[^A-Za-z0-9._+\-=,]", "_", name)
        if len(name) > NAME_MAX:
            name = name[:NAME_MAX - 9] + "-" + hashlib.sha1(name.encode()).hexdigest()[:8]
        base, k = name, 2
        while name in seen:
            name, k = f"{base}-{k}", k + 1
        seen[name] = True
        names.append(name)
    return names


@dataclasses.dataclass
class SweepRun:
    index: int
    name: str
    workdir: Path
    overrides: dict[str, str]          # swept key -> value text
    values: dict[str, Any]             # swept key -> the value in the resolved config
    args: list[str]                    # every override of this run, KEY=TEXT (the fixed ones first)
    config: Any = None

    def train_args(self) -> list[str]:
        return [f"--config.{a}" for a in self.args]


@dataclasses.dataclass
class Sweep:
    config_spec: str
    root: Path
    fixed: list[str]
    keys: list[str]
    runs: list[SweepRun]
    sources: dict

    def manifest(self) -> dict:
        return {"format": "jaxembed-sweep", "version": 1, "config": self.config_spec, "fixed": self.fixed,
                "keys": self.keys, "sources": self.sources,
                "runs": [{"index": r.index, "name": r.name, "dir": r.name, "overrides": r.overrides,
                          "args": r.args} for r in self.runs]}


def plan_sweep(config_spec: str, root: str | os.PathLike, sweeps=(), zips=(), fixed=(), use_hyper: bool = True,
               validate: bool = True) -> Sweep:
    """Expand and check a sweep; nothing is written. Raises UserError naming the run and key at fault."""
    base = cfglib.load_config_file(config_spec)
    fixed = [_clean_key(f) for f in fixed]
    try:
        cfglib.apply_overrides(base, fixed)
    except UserError as e:
        raise UserError(f"sweep --set: {e}") from None
    groups, owner = [], {}

    def claim(keys, where):
        for k in keys:
            _lookup(base, k, f"{where} {k}")
            if k in owner:
                raise UserError(f"sweep: key {k} is swept twice ({owner[k]} and {where}) (fix: sweep it in one "
                                "place only)")
            owner[k] = where
    for s in sweeps:
        axes = parse_spec(s, "--sweep")
        claim(axes, "--sweep")
        groups.append(product({k: [Text(v) for v in vs] for k, vs in axes.items()}))
    for s in zips:
        axes = parse_spec(s, "--zip")
        claim(axes, "--zip")
        groups.append(zipped({k: [Text(v) for v in vs] for k, vs in axes.items()}, f"--zip {s!r}"))
    hyper = load_hyper(config_spec) if use_hyper else None
    if hyper is not None:
        hkeys = list(dict.fromkeys(k for run in hyper for k in run))
        claim(hkeys, "get_hyper()")
        groups.append([{k: Text(_as_text(base, k, v, f"get_hyper() run {i + 1}")) for k, v in run.items()}
                       for i, run in enumerate(hyper)])
    if not groups:
        raise UserError("sweep: nothing to sweep (fix: give --sweep \"KEY=V1,V2\", --zip, or define get_hyper() in "
                        "the config file)")
    combos = cross(*groups)
    keys = list(owner)
    runs, values = [], []
    for i, combo in enumerate(combos):
        label = " ".join(f"{k}={v}" for k, v in combo.items())
        where = f"sweep run {i + 1} of {len(combos)} ({label})"
        c = copy.deepcopy(base)
        try:
            cfglib.apply_overrides(c, [f"{k}={v}" for k, v in combo.items()])
        except UserError as e:
            raise UserError(f"{where}: {e}") from None
        if validate:
            try:
                cfglib.validate(c)
            except UserError as e:
                raise UserError(f"{where}: {e} (fix: change or drop that value of the sweep)") from None
        vals = {k: _lookup(c, k, where) for k in combo}
        for j, prev in enumerate(values):
            if prev == vals:
                raise UserError(f"sweep: runs {j + 1} and {i + 1} have the same values ({label}) (fix: remove the "
                                "duplicate)")
        values.append(vals)
        runs.append((combo, c))
    root = Path(root)
    names = run_names(values, keys)
    out = [SweepRun(i, n, root / n, {k: str(v) for k, v in combo.items()}, vals,
                    fixed + [f"{k}={v}" for k, v in combo.items()], c)
           for i, (n, (combo, c), vals) in enumerate(zip(names, runs, values))]
    sources = {"sweep": list(sweeps), "zip": list(zips), "get_hyper": hyper is not None}
    return Sweep(config_spec, root, fixed, keys, out, sources)

