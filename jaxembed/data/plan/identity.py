"""What a plan is a pure function of, recorded small: the datasets' table as the builders read it (with the size of
each dataset's record file), the plan config, the data config's sampling defaults and a digest of each file the
config names (scores, task order, instance orders). Two processes with equal inputs build equal plans, so a pod
compares these instead of a plan of its own, and a resumed run keeps its saved plan without building it again."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from jaxembed.data.plan.config import as_plain_dict, merged_config
from jaxembed.data.plan.file import VERSION
from jaxembed.data.plan.inputs import dataset_infos

#: the dataset fields a plan reads
_FIELDS = ("name", "task", "size", "batching", "epochs", "weight", "temperature")


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _file_digest(path: str) -> str:
    """sha256 (16 hex) of a file's bytes, read 1 MiB at a time; 'missing' when there is no such file."""
    p = Path(path).expanduser()
    if not p.is_file():
        return "missing"
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def _record_bytes(datasets, k: int):
    """The size in bytes of dataset k's record file in a store (None for a list of dataset infos)."""
    try:
        return Path(datasets.record_path(k)).stat().st_size
    except (AttributeError, OSError):
        return None


def plan_inputs(datasets, config=None, data_config=None) -> dict:
    """The inputs of ``build_plan(datasets, config, data_config=data_config)`` as plain JSON: ``datasets`` (one
    row per dataset: its fields the plan reads, and its record file's bytes) and their ``datasets_digest``,
    ``config`` and ``data`` (digests of the plan config and of the data config's sampling defaults), ``files``
    ({config field: digest}) and ``fingerprint`` (of all of it)."""
    cfg = merged_config(config)
    if data_config is not None:
        dc = as_plain_dict(data_config)
    else:
        dc = getattr(datasets, "manifest", None) or {}
    data = {k: dc.get(k) for k in ("sampling", "sampling_temperature", "seed")}
    rows = [[getattr(i, f, None) for f in _FIELDS] + [_record_bytes(datasets, k)]
            for k, i in enumerate(dataset_infos(datasets))]
    named = {"scores": cfg.get("scores"), "curriculum.task_order": cfg["curriculum"].get("task_order"),
             "curriculum.instance_orders": cfg["curriculum"].get("instance_orders")}
    files = {k: _file_digest(v) for k, v in named.items() if isinstance(v, str) and v}
    out = {"version": VERSION, "datasets_digest": _digest(rows), "config": _digest(cfg), "data": _digest(data),
           "files": files}
    out["fingerprint"] = _digest(out)
    out["datasets"] = rows
    return out


def compact(inputs: dict, limit: int = 1 << 18) -> dict:
    """``inputs`` to send to the other processes of a pod: without the datasets' rows when they are long (many
    datasets), their digest standing in for them."""
    if len(json.dumps(inputs.get("datasets", []))) <= limit:
        return inputs
    return {k: v for k, v in inputs.items() if k != "datasets"}


def inputs_differences(mine: dict, theirs: dict) -> list[str]:
    """What differs between two ``plan_inputs`` records, in words (empty when they are equal)."""
    if mine.get("fingerprint") == theirs.get("fingerprint"):
        return []
    out = []
    if mine.get("datasets_digest") != theirs.get("datasets_digest"):
        if "datasets" in mine and "datasets" in theirs:
            a = {r[0]: r for r in mine["datasets"]}
            b = {r[0]: r for r in theirs["datasets"]}
            if list(a) != list(b):
                out.append(f"datasets {list(b)} vs {list(a)}")
            for name in (n for n in b if n in a and a[n] != b[n]):
                diff = [f"{f} {x} vs {y}" for f, x, y in zip((*_FIELDS, "record bytes"), b[name], a[name]) if x != y]
                out.append(f"dataset '{name}' ({', '.join(diff)})")
        else:
            out.append("the store's datasets (names, tasks, sizes, batching, epochs, weights, temperatures or "
                       "record files)")
    if mine.get("config") != theirs.get("config"):
        out.append("the plan config")
    if mine.get("data") != theirs.get("data"):
        out.append("the data config's sampling, sampling_temperature or seed")
    for k in sorted(set(mine.get("files", {})) | set(theirs.get("files", {}))):
        if mine.get("files", {}).get(k) != theirs.get("files", {}).get(k):
            out.append(f"the file of {k}")
    return out or ["the plan's inputs"]
