"""Run directories of a benchmark's workdir: a finished run (its train.json with the record of what it trained) is
reused while its record matches the wanted one, and stops the benchmark when it does not (it is never deleted); an
interrupted run (no train.json) starts again. A lock file lets jobs started side by side prepare a store once."""

from __future__ import annotations

import json
from pathlib import Path

from .proc import log


def flat(d, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def record_differences(old: dict, new: dict) -> list[str]:
    """Keys where a finished run's record and the wanted one differ; a record is {"config": the resolved config as
    plain JSON, and what else identifies the run (e.g. "st_loss")}. A config key that only the new config has (a
    field added to jaxembed since the run) counts only when it is not at its default: other engineers extend
    default_config() while runs exist, and a new field at its default changes nothing the run did."""
    from jaxembed import config as cfglib

    other = sorted(k for k in (old.keys() | new.keys()) - {"config"} if old.get(k) != new.get(k))
    if other:
        return other
    a, b = flat(old["config"]), flat(new["config"])
    defaults = flat(json.loads(cfglib.to_json(cfglib.default_config())))
    diff = [k for k in a.keys() & b.keys() if a[k] != b[k]]
    diff += [k for k in b.keys() - a.keys() if k not in defaults or defaults[k] != b[k]]
    return sorted(diff)


def finished_run(rundir: Path, want: dict, what: str) -> dict | None:
    """rundir/train.json when it holds a finished run of the record ``want`` (``what`` names the run in the log);
    None when there is none (an interrupted run's directory is removed, to start again); a finished run of another
    record stops the benchmark with the keys that differ."""
    done = rundir / "train.json"
    if done.exists():
        prev = json.loads(done.read_text())
        diff = record_differences(prev["record"], want)
        if not diff:
            log(f"{what}: reusing {rundir}")
            return prev
        raise SystemExit(f"error: {rundir} holds a finished run of another config ({', '.join(diff[:8])} differ); "
                         "fix: use another --workdir, or delete that run directory to retrain it")
    if rundir.exists():
        import shutil

        shutil.rmtree(rundir)  # an interrupted run (no train.json): start it again
    return None


def lock(path: Path):
    """An exclusive lock on the file ``path``, held while the returned file is open (``with lock(p): ...``)."""
    import fcntl

    f = open(path, "w")
    fcntl.flock(f, fcntl.LOCK_EX)
    return f
