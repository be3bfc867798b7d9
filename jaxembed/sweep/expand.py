"""``jaxembed sweep``: one config, many runs. A sweep expands a config file over hyperparameter values into runs,
each with its own workdir under a root folder, then runs them locally one after another, or writes one SLURM
array script, or a command list for ``launch/tpu_pod.sh``. ``jaxembed sweep report DIR`` tabulates the runs.

    jaxembed sweep --config configs/demo.py:tiny --root runs/sweep \\
        --sweep "optim.lr=1e-5,2e-5 loss.temperature=0.01,0.02"          # 2 x 2 = 4 runs, in sequence
    jaxembed sweep report runs/sweep                                      # table, CSV, markdown, JSON, PNG

Expansion:
- ``--sweep "KEY=V1,V2 KEY2=A,B"``: the cartesian product of its keys (values are Python literals, strings may be
  bare, as for ``--config.KEY=VALUE``; commas inside brackets or quotes do not split, e.g. ``(64,32),(32,16)``).
- ``--zip "KEY=V1,V2 KEY2=A,B"``: its keys vary together (the i-th values form run i); all lists equally long.
- ``get_hyper(arg)`` in the config file (optional, ignored with ``--no-hyper``): a list of override dicts
  ``[{"optim.lr": 1e-5}, ...]``, or ``{"product": {KEY: [values]}, "zip": {KEY: [values]}}``; the helpers
  ``product``, ``zipped`` and ``cross`` below build such lists (``+`` of two lists is their union).
- Groups (each --sweep, each --zip, get_hyper) are crossed with each other. ``--set KEY=VALUE`` (or
  ``--config.KEY=VALUE``) fixes a value for every run.

Every expanded config is built and validated (``jaxembed.config.validate``) before any run starts; a bad key or
value stops the sweep with a message naming the run, the key and the fix. A run's workdir is ``ROOT/NAME`` with a
readable name from its swept values (``lr=1e-05,temperature=0.01``); ``ROOT/sweep.json`` is the manifest.

Local runs (``--mode local``, the default) are ``jaxembed train`` subprocesses (``--in-process`` runs them in this
process, sharing compilations). Each run's output goes to ``NAME/train.log`` and its outcome to
``NAME/status.json``; a failed run is recorded and the sweep goes on. Running the same sweep again skips completed
runs and resumes the others from their checkpoints. SIGTERM / Ctrl-C stop the current run at a checkpoint
(exit 143).
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import datetime
import hashlib
import importlib.util
import inspect
import io
import itertools
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from jaxembed import config as cfglib
from jaxembed import paths
from jaxembed.errors import UserError

MANIFEST = "sweep.json"
STATUS = "status.json"
REPORT = "sweep_report"
SLURM_FILE = "sweep_slurm.sh"
TPU_FILE = "sweep_tpu.txt"
NAME_MAX = 120


# ------------------------------------------------------------------------------------------- expansion


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
    """Call ``get_hyper(arg)`` of a config file (``file.py[:arg]``); None when the file defines none."""
    path, _, arg = config_spec.partition(":")
    p = Path(path)
    spec = importlib.util.spec_from_file_location(f"jaxembed_sweep_{p.stem}", p)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise UserError(f"--config {path}: the file failed to run ({type(e).__name__}: {e})") from None
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


def _short_keys(keys: list[str]) -> dict[str, str]:
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
    short = _short_keys(varying)
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


def _check_existing(sw: Sweep) -> None:
    """Before any run starts: the root's manifest and any existing run directory must match this sweep."""
    old_path = sw.root / MANIFEST
    if old_path.exists():
        try:
            old = json.loads(old_path.read_text())
        except json.JSONDecodeError as e:
            raise UserError(f"{old_path}: not valid JSON ({e}) (fix: delete it, or use a new --root)") from None
        if old.get("config") != sw.config_spec or old.get("fixed") != sw.fixed:
            raise UserError(f"{sw.root} holds a sweep of {old.get('config')} with fixed overrides {old.get('fixed')}"
                            f"; this one is {sw.config_spec} with {sw.fixed} (fix: use a new --root, or the same "
                            "--config and --set / --config.KEY values)")
    existing = [r for r in sw.runs if (r.workdir / "config.json").exists()]
    if existing:
        from jaxembed.train import _check_workdir

        for r in existing:
            _check_workdir(r.config, r.workdir)


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def write_manifest(sw: Sweep, mode: str) -> Path:
    """``ROOT/sweep.json``: this expansion, plus the runs of an earlier expansion into the same root."""
    path = sw.root / MANIFEST
    m = sw.manifest()
    m["mode"] = mode
    m["updated"] = datetime.datetime.now().isoformat(timespec="seconds")
    if path.exists():
        old = json.loads(path.read_text())
        names = {r["name"] for r in m["runs"]}
        extra = [r for r in old.get("runs", []) if r["name"] not in names]
        m["runs"] += extra
        m["keys"] = list(dict.fromkeys(m["keys"] + old.get("keys", [])))
    _write_json(path, m)
    return path


# ------------------------------------------------------------------------------------------- status


def run_status(workdir: Path) -> dict:
    """What a run directory says about its run: completed / preempted / failed / running / incomplete / pending."""
    workdir = Path(workdir)
    summary, status = _read_json(workdir / "summary.json"), _read_json(workdir / STATUS)
    if summary and summary.get("status") == "completed":
        return {**(status or {}), "status": "completed", "step": summary.get("step")}
    if status:
        return status
    if summary:
        return {"status": summary.get("status", "incomplete"), "step": summary.get("step")}
    if (workdir / "metrics.jsonl").exists() or (workdir / "checkpoints").exists():
        return {"status": "incomplete"}
    return {"status": "pending"}


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def write_status(workdir: Path, **fields) -> None:
    fields.setdefault("updated", datetime.datetime.now().isoformat(timespec="seconds"))
    _write_json(Path(workdir) / STATUS, fields)


# ------------------------------------------------------------------------------------------- local runs


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, s):
        for st in self.streams:
            st.write(s)
        return len(s)

    def flush(self):
        for st in self.streams:
            st.flush()


class _StopSignals:
    """While a subprocess run is going: SIGTERM / SIGINT are passed on to it as SIGTERM (it saves a checkpoint and
    exits 143); the sweep then stops."""

    def __init__(self):
        self.proc = None
        self.received = None
        self._old = {}

    def __enter__(self):
        for s in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[s] = signal.signal(s, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum, frame):
        self.received = signum
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)


def train_command(sw: Sweep, run: SweepRun, launcher: str | None = None) -> list[str]:
    """The command that trains one run: ``python -m jaxembed.cli train --config C --workdir W --config.K=V ...``,
    or ``LAUNCHER C W --config.K=V ...`` (e.g. ``--launcher launch/local.sh``)."""
    if launcher:
        return [*shlex.split(launcher), sw.config_spec, str(run.workdir), *run.train_args()]
    return [sys.executable, "-m", "jaxembed.cli", "train", "--config", sw.config_spec, "--workdir",
            str(run.workdir), *run.train_args()]


def _run_subprocess(sw, run, launcher, quiet, stop: _StopSignals, env) -> tuple[int, str]:
    cmd = train_command(sw, run, launcher)
    run.workdir.mkdir(parents=True, exist_ok=True)
    tail: list[str] = []
    with open(run.workdir / "train.log", "a", encoding="utf-8") as log:
        log.write(f"\n=== {datetime.datetime.now().isoformat(timespec='seconds')} {shlex.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                env=env, start_new_session=True)
        stop.proc = proc
        if stop.received is not None:  # a signal that came while the child was starting
            proc.send_signal(signal.SIGTERM)
        try:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                tail = (tail + [line.rstrip("\n")])[-20:]
                if not quiet:
                    sys.stdout.write(f"  [{run.name}] {line}")
                    sys.stdout.flush()
            rc = proc.wait()
        finally:
            stop.proc = None
            if proc.poll() is None:  # an exception here: stop the child cleanly
                proc.send_signal(signal.SIGTERM)
                proc.wait()
    return rc, "\n".join(tail)


def _run_in_process(sw, run, quiet) -> tuple[int, str]:
    import traceback

    from jaxembed.train import train

    run.workdir.mkdir(parents=True, exist_ok=True)
    with open(run.workdir / "train.log", "a", encoding="utf-8") as log:
        log.write(f"\n=== {datetime.datetime.now().isoformat(timespec='seconds')} in process: "
                  f"{shlex.join(train_command(sw, run)[3:])}\n")
        out = log if quiet else _Tee(sys.stdout, log)
        old = sys.stdout
        sys.stdout = out
        try:
            summary = train(copy.deepcopy(run.config), run.workdir)
        except UserError as e:
            print(f"error: {e}", file=log)
            return 2, str(e)
        except Exception as e:  # a crash of one run must not end the sweep
            text = traceback.format_exc()
            log.write(text)
            return 1, f"{type(e).__name__}: {e}\n" + "\n".join(text.splitlines()[-8:])
        finally:
            sys.stdout = old
    return (0 if summary["status"] == "completed" else 143), ""


def run_local(sw: Sweep, *, in_process: bool = False, launcher: str | None = None, quiet: bool = False,
              compile_cache: bool = True) -> int:
    """Run every run of the sweep in turn; returns 0 (all completed), 1 (some failed) or 143 (stopped)."""
    n = len(sw.runs)
    env = dict(os.environ)
    cache = sw.root / ".jax_cache"
    share = compile_cache and not env.get("JAX_COMPILATION_CACHE_DIR")
    if share:
        env["JAX_COMPILATION_CACHE_DIR"] = str(cache)  # runs that compile the same programs share them
    results = {}
    with _StopSignals() as stop:
        for run in sw.runs:
            head = f"sweep [{run.index + 1}/{n}] {run.name}"
            st = run_status(run.workdir)
            if st["status"] == "completed":
                print(f"{head}: already completed (step {st.get('step')}), skipped")
                results[run.name] = "completed"
                continue
            resuming = (run.workdir / "checkpoints").exists()
            print(f"{head}: {'resuming' if resuming else 'starting'} in {run.workdir}", flush=True)
            attempts = int(st.get("attempts", 0)) + 1
            t0 = time.time()
            write_status(run.workdir, status="running", attempts=attempts, pid=os.getpid(),
                         started=datetime.datetime.now().isoformat(timespec="seconds"))
            if in_process:
                if share:  # effective when this process has compiled nothing yet (a `jaxembed sweep` process)
                    import jax

                    jax.config.update("jax_compilation_cache_dir", str(cache))
                    share = False
                rc, err = _run_in_process(sw, run, quiet)
            else:
                rc, err = _run_subprocess(sw, run, launcher, quiet, stop, env)
            if stop.received is not None and rc == 0 and run_status(run.workdir)["status"] != "completed":
                rc = 143
            status = "completed" if rc == 0 else "preempted" if rc == 143 else "failed"
            seconds = round(time.time() - t0, 1)
            write_status(run.workdir, status=status, returncode=rc, attempts=attempts, seconds=seconds,
                         error=err[-4000:] if status == "failed" else "")
            results[run.name] = status
            print(f"{head}: {status} in {seconds:.1f}s" + (f" (exit {rc}; log {run.workdir / 'train.log'})"
                                                         if status == "failed" else ""), flush=True)
            if status == "failed" and err:
                print("  " + "\n  ".join(err.splitlines()[-6:]), flush=True)
            if status == "preempted" or stop.received is not None:
                print(f"sweep: stopped at {run.name} (checkpoint saved); run the same command to resume")
                return 143
    done = sum(1 for s in results.values() if s == "completed")
    failed = [k for k, s in results.items() if s == "failed"]
    print(f"sweep: {done} of {n} runs completed" + (f", {len(failed)} failed: {', '.join(failed)}" if failed else "")
          + f". Report: jaxembed sweep report {sw.root}")
    return 1 if failed else 0


# ------------------------------------------------------------------------------------------- SLURM / TPU


def _sbatch_headers(script: Path) -> list[str]:
    """The ``#SBATCH`` lines of a batch script, less those an array job sets itself."""
    skip = re.compile(r"^#SBATCH\s+(--job-name|-J|--output|-o|--error|-e|--array|-a|--open-mode)\b")
    return [ln.rstrip() for ln in script.read_text().splitlines() if ln.startswith("#SBATCH") and not skip.match(ln)]


def slurm_script(sw: Sweep, launch_script: Path, parallel: int | None = None) -> str:
    """One SLURM array job: task i runs ``launch/slurm_gpu.sh CONFIG ROOT/NAME_i OVERRIDES_i`` (srun on every
    node, requeue on preemption); a task whose run already completed exits at once."""
    root = sw.root.absolute()
    launch_script = launch_script.absolute()
    cfg_path, sep, variant = sw.config_spec.partition(":")
    config = str(Path(cfg_path).absolute()) + sep + variant
    n = len(sw.runs)
    job = re.sub(r"[^A-Za-z0-9_.-]", "_", f"sweep-{root.name}")
    lines = [
        "#!/bin/bash",
        f"# Generated by `jaxembed sweep --mode slurm` on {datetime.datetime.now():%Y-%m-%d %H:%M}: {n} runs of",
        f"# {config}. Submit all runs:  sbatch {root / SLURM_FILE}",
        f"#                some runs:     sbatch --array=0,2 {root / SLURM_FILE}",
        f"# Task i trains run i with {launch_script} (srun on every node, requeue on preemption, resume",
        "# from the last checkpoint). Resources: the #SBATCH lines below, copied from that script; edit them here or",
        "# override them on the sbatch command line. Report: jaxembed sweep report " + str(root),
        f"#SBATCH --job-name={job}",
        f"#SBATCH --array=0-{n - 1}" + (f"%{parallel}" if parallel else ""),
        f"#SBATCH --output={root / 'slurm_logs'}/%A_%a.out",
        "#SBATCH --open-mode=append",
        *_sbatch_headers(launch_script),
        "set -euo pipefail",
        "RUNS=(",
        *[f"  {shlex.quote(r.name)}" for r in sw.runs],
        ")",
        'TASK="${SLURM_ARRAY_TASK_ID:?submit this file with sbatch: it is a SLURM job array}"',
        'case "$TASK" in',
        *[f"  {r.index}) OVERRIDES=({' '.join(shlex.quote(a) for a in r.train_args())}) ;;" for r in sw.runs],
        f'  *) echo "sweep: no run number $TASK (runs 0-{n - 1})" >&2; exit 2 ;;',
        "esac",
        f'WORKDIR={shlex.quote(str(root))}/"${{RUNS[$TASK]}}"',
        "if grep -qs '\"status\": \"completed\"' \"$WORKDIR/summary.json\"; then",
        '  echo "sweep: $WORKDIR already completed"; exit 0',
        "fi",
        f"export JAXEMBED_REPO={shlex.quote(str(launch_script.parent.parent))}",
        (f'exec bash {shlex.quote(str(launch_script))} {shlex.quote(config)} "$WORKDIR" '
         '${OVERRIDES[@]+"${OVERRIDES[@]}"}'),
        "",
    ]
    return "\n".join(lines)


def tpu_commands(sw: Sweep) -> str:
    """One line per run: the arguments of ``launch/tpu_pod.sh train`` (CONFIG WORKDIR --config.K=V ...)."""
    lines = [(f"# jaxembed sweep: {len(sw.runs)} runs of {sw.config_spec}, generated "
              f"{datetime.datetime.now():%Y-%m-%d %H:%M}."),
             "# Run them one after another on every worker of a TPU VM pod (completed runs are skipped):",
             f"#   launch/tpu_pod.sh --name TPU_NAME --zone ZONE run-list {sw.root / TPU_FILE}",
             "# Each line: CONFIG WORKDIR [--config.KEY=VALUE ...], as for `launch/tpu_pod.sh train`."]
    for r in sw.runs:
        lines.append(shlex.join([sw.config_spec, str(r.workdir), *r.train_args()]))
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- report


def _read_metrics(path: Path) -> tuple[dict[str, dict[int, dict]], int]:
    """metrics.jsonl -> {split: {step: record}} (a step logged again after a resume: the last record wins), and
    the number of unreadable lines."""
    out: dict[str, dict[int, dict]] = {}
    bad = 0
    if not path.exists():
        return out, 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            out.setdefault(rec.get("split", "train"), {})[int(rec["step"])] = rec
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            bad += 1
    return out, bad


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: json.dumps(d, sort_keys=True) if isinstance(d, (list, dict)) else d}


def _discover(root: Path) -> tuple[list[dict], list[str]]:
    """Runs of a sweep root (from sweep.json), or of any folder of run directories (keys: what differs)."""
    manifest = _read_json(root / MANIFEST)
    if manifest:
        runs = [{"name": r["name"], "dir": root / r.get("dir", r["name"]), "overrides": r.get("overrides", {})}
                for r in manifest.get("runs", [])]
        return runs, list(manifest.get("keys", []))
    dirs = sorted(p for p in root.iterdir() if p.is_dir() and ((p / "config.json").exists()
                                                               or (p / "metrics.jsonl").exists()))
    if (root / "metrics.jsonl").exists():
        dirs = [root]
    if not dirs:
        raise UserError(f"{root}: no {MANIFEST} and no run directories (config.json / metrics.jsonl) in it (fix: "
                        "give the --root of a sweep, or a folder of jaxembed runs)")
    flat = {d: _flatten(_read_json(d / "config.json") or {}) for d in dirs}
    keys = sorted({k for f in flat.values() for k in f})
    ignore = ("export.dir", "data.store")
    varying = [k for k in keys if k not in ignore and len({repr(f.get(k)) for f in flat.values()}) > 1]
    runs = [{"name": d.name, "dir": d, "overrides": {k: str(flat[d].get(k)) for k in varying}} for d in dirs]
    return runs, varying


def _pick_metric(evals: list[dict[int, dict]], metric: str | None) -> str | None:
    if metric:
        return metric
    keys = sorted({k for e in evals for rec in e.values() for k in rec if k.endswith("/main_score")})
    return keys[0] if keys else None


def collect(root: str | os.PathLike, metric: str | None = None, mode: str | None = None) -> dict:
    """Everything the report shows, as a dict: metric, mode, keys and one row per run (with its curves)."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"{root}: no such folder (fix: the --root of a sweep)")
    runs, keys = _discover(root)
    cfgs = {r["name"]: _read_json(r["dir"] / "config.json") or {} for r in runs}
    metrics = {r["name"]: _read_metrics(r["dir"] / "metrics.jsonl") for r in runs}
    if metric is None:
        configured = {c.get("eval", {}).get("best_metric") for c in cfgs.values()} - {None, ""}
        metric = min(configured) if configured else None
    metric = _pick_metric([m.get("eval", {}) for m, _ in metrics.values()], metric)
    if mode is None:
        modes = {c.get("eval", {}).get("best_mode") for c in cfgs.values()} - {None, ""}
        mode = modes.pop() if len(modes) == 1 else "max"
    rows = []
    for r in runs:
        name, cfg = r["name"], cfgs[r["name"]]
        (m, bad), st = metrics[name], run_status(r["dir"])
        train, evals = m.get("train", {}), m.get("eval", {})
        last = train[max(train)] if train else {}
        plan = _read_json(r["dir"] / "plan.json") or {}
        row = {"run": name, **{k: r["overrides"].get(k, "") for k in keys}, "status": st["status"],
               "step": max(train) if train else None, "steps": plan.get("steps") or cfg.get("plan", {}).get("steps"),
               "loss": last.get("loss"), "accuracy": last.get("accuracy"), "best": None, "best_step": None,
               "final": None, "bad_lines": bad, "dir": str(r["dir"])}
        if st.get("status") == "failed" and st.get("error"):
            row["error"] = st["error"].strip().splitlines()[-1][:300]
        scored = [(s, rec[metric]) for s, rec in sorted(evals.items())
                  if metric and isinstance(rec.get(metric), (int, float)) and math.isfinite(rec[metric])]
        if scored:
            best = (max if mode == "max" else min)(scored, key=lambda x: x[1])  # ties: the earliest step
            row.update(best=best[1], best_step=best[0], final=scored[-1][1])
        row["loss_curve"] = [[s, rec["loss"]] for s, rec in sorted(train.items()) if "loss" in rec]
        row["metric_curve"] = [list(x) for x in scored]
        rows.append(row)
    ranked = [r for r in rows if r["best"] is not None]
    best_run = ((max if mode == "max" else min)(ranked, key=lambda r: r["best"])["run"] if ranked else None)
    return {"root": str(root), "metric": metric, "mode": mode, "keys": keys, "best_run": best_run, "runs": rows}


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _columns(rep: dict) -> list[tuple[str, str]]:
    metric = rep["metric"]
    cols = [("run", "run"), *[(k, _short_keys(rep["keys"]).get(k, k)) for k in rep["keys"]], ("status", "status"),
            ("step", "step"), ("steps", "steps"), ("loss", "loss"), ("accuracy", "accuracy")]
    if metric:
        cols += [("best", f"best {metric}"), ("best_step", "best step"), ("final", f"final {metric}")]
    return cols


def format_report(rep: dict) -> str:
    """The report as a text table (the best run marked with *)."""
    cols = _columns(rep)
    body = [[_fmt(r.get(k)) + (" *" if k == "best" and r["run"] == rep["best_run"] else "") for k, _ in cols]
            for r in rep["runs"]]
    head = [h for _, h in cols]
    widths = [max(len(x) for x in [h] + [b[i] for b in body]) for i, h in enumerate(head)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    lines = [fmt(head), fmt(["-" * w for w in widths]), *[fmt(b) for b in body]]
    if rep["best_run"]:
        best = next(r for r in rep["runs"] if r["run"] == rep["best_run"])
        lines.append(f"best ({rep['mode']} {rep['metric']}): {best['run']}: {_fmt(best['best'])} at step "
                     f"{best['best_step']}")
    elif rep["metric"] is None:
        lines.append("no dev metric in any run (set config.eval.tasks / eval.every); the table shows the final "
                     "training loss")
    for r in rep["runs"]:
        if r.get("error"):
            lines.append(f"{r['run']}: failed: {r['error']}")
        if r.get("bad_lines"):
            lines.append(f"{r['run']}: {r['bad_lines']} unreadable line(s) in metrics.jsonl were skipped")
    return "\n".join(lines)


def _markdown(rep: dict) -> str:
    cols = _columns(rep)
    esc = lambda s: s.replace("|", "\\|")
    out = ["| " + " | ".join(esc(h) for _, h in cols) + " |", "|" + "---|" * len(cols)]
    for r in rep["runs"]:
        cells = [_fmt(r.get(k)) + (" **(best)**" if k == "best" and r["run"] == rep["best_run"] else "")
                 for k, _ in cols]
        out.append("| " + " | ".join(esc(c) for c in cells) + " |")
    return "\n".join(out) + "\n"


def _number(text: str) -> float | None:
    try:
        v = float(text)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def plot_report(rep: dict, path: Path) -> Path | None:
    """Training loss per run, and the best dev metric (else the final loss) against the first swept value (one line
    per combination of the other swept values). None when matplotlib is not installed."""
    if importlib.util.find_spec("matplotlib") is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    for r in rep["runs"]:
        if r["loss_curve"]:
            s, v = zip(*r["loss_curve"])
            ax1.plot(s, v, label=r["run"], marker="." if len(s) < 30 else None)
    ax1.set(title="training loss", xlabel="step", ylabel="loss")
    if any(r["loss_curve"] for r in rep["runs"]):
        ax1.legend(fontsize=7)
    y_key = "best" if rep["metric"] else "loss"
    y_label = f"best {rep['metric']}" if rep["metric"] else "final training loss"
    keys = rep["keys"]
    if keys:
        x_key, others = keys[0], keys[1:]
        xs = [r.get(x_key, "") for r in rep["runs"]]
        numeric = all(_number(x) is not None for x in xs) and len(set(xs)) > 4  # few values: one tick each
        order = sorted(set(xs), key=lambda x: (_number(x) is None, _number(x) or 0.0, x))
        series: dict[str, list] = {}
        for r in rep["runs"]:
            if r.get(y_key) is None:
                continue
            label = ",".join(f"{_short_keys(keys)[k]}={r.get(k, '')}" for k in others) or y_label
            x = _number(r[x_key]) if numeric else order.index(r[x_key])
            series.setdefault(label, []).append((x, r[y_key]))
        for label, pts in series.items():
            pts.sort()
            ax2.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        if numeric and all(_number(x) > 0 for x in xs) and max(map(_number, xs)) / min(map(_number, xs)) >= 10:
            ax2.set_xscale("log")
        if not numeric:
            ax2.set_xticks(range(len(order)), order)
        ax2.set(title=f"{y_label} by {x_key}", xlabel=x_key, ylabel=y_label)
        if series:
            ax2.legend(fontsize=7)
    else:
        ax2.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(rep: dict, prefix: Path, plot: bool = True) -> dict[str, Path | None]:
    """CSV, markdown, JSON and (when matplotlib is importable) PNG next to each other: ``PREFIX.{csv,md,json,png}``."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    cols = _columns(rep)
    out: dict[str, Path | None] = {}
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow([k for k, _ in cols] + ["dir"])
    for r in rep["runs"]:
        w.writerow(["" if r.get(k) is None else r.get(k) for k, _ in cols] + [r["dir"]])
    out["csv"] = prefix.with_suffix(".csv")
    out["csv"].write_text(buf.getvalue())
    out["md"] = prefix.with_suffix(".md")
    out["md"].write_text(_markdown(rep))
    out["json"] = prefix.with_suffix(".json")
    out["json"].write_text(json.dumps(rep, indent=2, allow_nan=True) + "\n")
    out["png"] = plot_report(rep, prefix.with_suffix(".png")) if plot else None
    return out


# ------------------------------------------------------------------------------------------- CLI


def _describe(sw: Sweep) -> str:
    lines = [f"sweep: {len(sw.runs)} runs of {sw.config_spec} into {sw.root}"
             + (f" (fixed: {' '.join(sw.fixed)})" if sw.fixed else "")]
    for r in sw.runs:
        lines.append(f"  {r.index:>3}  {r.name:<40}  {' '.join(f'{k}={v}' for k, v in r.overrides.items())}")
    return "\n".join(lines)


def cmd_sweep(args) -> int:
    if getattr(args, "sweep_action", None) == "report":
        return cmd_report(args)
    if not args.config or not args.root:
        raise UserError("sweep: --config FILE[:VARIANT] and --root DIR are required (e.g. jaxembed sweep --config "
                        "configs/demo.py:tiny --root runs/sweep --sweep \"optim.lr=1e-5,2e-5\"; or jaxembed sweep "
                        "report DIR)")
    fixed = list(args.set or []) + [o[len("--config."):] for o in getattr(args, "overrides", [])]
    sw = plan_sweep(args.config, args.root, args.sweep or (), args.zip or (), fixed, use_hyper=not args.no_hyper,
                    validate=not args.no_validate)
    print(_describe(sw))
    if args.mode == "slurm":
        script = Path(args.slurm_script) if args.slurm_script else paths.REPO_ROOT / "launch" / "slurm_gpu.sh"
        if not script.is_file():
            raise UserError(f"--slurm-script {script}: no such file (fix: give the path of launch/slurm_gpu.sh)")
        text = slurm_script(sw, script, args.array_parallel)
        out = sw.root / SLURM_FILE
        if args.dry_run:
            print(f"--- {out} (dry run: not written)\n{text}")
            return 0
        _check_existing(sw)
        (sw.root / "slurm_logs").mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        out.chmod(0o755)
        write_manifest(sw, "slurm")
        print(f"wrote {out} (one array task per run) and {sw.root / MANIFEST}\nsubmit: sbatch {out}")
        return 0
    if args.mode == "tpu":
        text = tpu_commands(sw)
        out = sw.root / TPU_FILE
        if args.dry_run:
            print(f"--- {out} (dry run: not written)\n{text}")
            return 0
        _check_existing(sw)
        sw.root.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        write_manifest(sw, "tpu")
        note = "" if sw.root.is_absolute() else (" (the workdirs are relative: on the workers they resolve inside "
                                                 "the code folder; give an absolute --root on shared storage)")
        print(f"wrote {out} and {sw.root / MANIFEST}{note}\nrun: launch/tpu_pod.sh --name TPU_NAME --zone ZONE "
              f"run-list {out}")
        return 0
    if args.dry_run:
        for r in sw.runs:
            print(f"  {shlex.join(train_command(sw, r, args.launcher))}")
        print("(dry run: nothing written, nothing run)")
        return 0
    _check_existing(sw)
    write_manifest(sw, "local")
    return run_local(sw, in_process=args.in_process, launcher=args.launcher, quiet=args.quiet,
                     compile_cache=not args.no_compile_cache)


def cmd_report(args) -> int:
    rep = collect(args.dir, metric=args.metric, mode=args.metric_mode)
    print(format_report(rep))
    prefix = Path(args.out) if args.out else Path(args.dir) / REPORT
    out = write_report(rep, prefix, plot=not args.no_plot)
    written = [str(p) for p in out.values() if p]
    print("wrote " + ", ".join(written))
    if not args.no_plot and out["png"] is None:
        print("plot skipped: matplotlib is not installed (pip install matplotlib)")
    return 0


def add_parsers(sub) -> None:
    """Register ``jaxembed sweep`` (run a sweep) and ``jaxembed sweep report DIR``."""
    p = sub.add_parser("sweep", help="expand a config over hyperparameter values into runs and run them (locally "
                                     "in sequence), or write a SLURM array script / TPU command list; "
                                     "`sweep report DIR` tabulates them",
                       description="Expand a config over hyperparameter values into runs, each in its own workdir "
                                   "under --root; run them here in sequence (--mode local), or write one SLURM array "
                                   "script (--mode slurm) or a TPU command list (--mode tpu). `jaxembed sweep report "
                                   "DIR` tabulates the runs.",
                       epilog="Fixed overrides: --set KEY=VALUE or --config.KEY=VALUE. Values parse like "
                              "--config.KEY=VALUE. See jaxembed/sweep.py and the README (Sweeps).")
    p.add_argument("--config", default=None, help="config file with get_config(arg) (and optionally get_hyper(arg))"
                                                  ", e.g. configs/demo.py:tiny")
    p.add_argument("--root", default=None, help="sweep folder: one run directory per run, and sweep.json")
    p.add_argument("--sweep", action="append", metavar="'KEY=V1,V2 KEY2=A,B'",
                   help="cartesian product of these values (repeatable; groups are crossed)")
    p.add_argument("--zip", action="append", metavar="'KEY=V1,V2 KEY2=A,B'",
                   help="these keys vary together: run i takes the i-th value of each (repeatable)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="a fixed override for every run "
                                                                       "(same as --config.KEY=VALUE)")
    p.add_argument("--no-hyper", action="store_true", help="ignore get_hyper() of the config file")
    p.add_argument("--mode", choices=["local", "slurm", "tpu"], default="local",
                   help="local: run in sequence here (default); slurm: write ROOT/sweep_slurm.sh, one array task "
                        "per run; tpu: write ROOT/sweep_tpu.txt for launch/tpu_pod.sh run-list")
    p.add_argument("--dry-run", action="store_true", help="print the runs and commands (or the script), write "
                                                          "nothing, run nothing")
    p.add_argument("--in-process", action="store_true", help="local: train every run in this process (shares "
                                                             "compilations; a crash of one run is still recorded)")
    p.add_argument("--launcher", default=None, metavar="CMD", help="local: train each run with "
                                                                   "`CMD CONFIG WORKDIR --config.K=V ...`, e.g. "
                                                                   "launch/local.sh (default: jaxembed train)")
    p.add_argument("--no-compile-cache", action="store_true", help="local: do not share JAX's persistent "
                                                                   "compilation cache ROOT/.jax_cache between runs")
    p.add_argument("--no-validate", action="store_true", help="skip config.validate() (e.g. writing a TPU command "
                                                              "list on a machine without the data); keys and "
                                                              "value types are still checked")
    p.add_argument("--slurm-script", default=None, help="slurm: the per-run batch script (default "
                                                        "launch/slurm_gpu.sh of this repository)")
    p.add_argument("--array-parallel", type=int, default=None, metavar="N", help="slurm: at most N array tasks "
                                                                                 "at once (--array=0-K%%N)")
    p.add_argument("-q", "--quiet", action="store_true", help="local: do not echo the runs' output (it is in "
                                                              "ROOT/NAME/train.log)")
    p.set_defaults(func=cmd_sweep, sweep_action=None)
    actions = p.add_subparsers(dest="sweep_action", required=False, metavar="{report}")
    r = actions.add_parser("report", help="tabulate a sweep's runs: overrides, status, final and best metrics "
                                          "(text, CSV, markdown, JSON, PNG)")
    r.add_argument("dir", help="the sweep root (with sweep.json), or any folder of run directories")
    r.add_argument("--metric", default=None, help="dev metric for 'best' (default: the runs' eval.best_metric, "
                                                  "else the first */main_score logged)")
    r.add_argument("--metric-mode", choices=["max", "min"], default=None,
                   help="best = max or min (default: the runs' eval.best_mode)")
    r.add_argument("--out", default=None, metavar="PREFIX", help="write PREFIX.csv/.md/.json/.png (default "
                                                                 "DIR/sweep_report)")
    r.add_argument("--no-plot", action="store_true", help="no PNG")
    r.set_defaults(func=cmd_sweep)
