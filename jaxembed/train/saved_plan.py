"""A run's saved plan (``<workdir>/plan.npz`` + ``plan.json``) against its config: the inputs the config's plan is
a pure function of (``plan_inputs``, recorded in plan.json when the plan is built), a saved plan that records
other inputs compared with the config's plan built beside it, and the plan of a run that is only read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from jaxembed.runs import atomic_files
from jaxembed import config as cfglib
from jaxembed.errors import UserError
from jaxembed.runs.rundir import RunDir


def plan_inputs_of(config, store) -> dict:
    """``jaxembed.data.plan.plan_inputs`` of the run config's plan on ``store``."""
    from jaxembed.data.plan import plan_inputs

    return plan_inputs(store, config.plan, cfglib.data_section(config))


def saved_inputs(path: Path) -> dict:
    """The inputs recorded in a saved plan's plan.json ({} when none are: a plan saved by an older jaxembed)."""
    try:
        side = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return (side.get("inputs") or {}) if isinstance(side, dict) else {}


def check_saved(path: Path, build: Callable[[Path], Any]) -> None:
    """A saved plan that records other (or no) inputs: the config's plan, built (``build(tmp)``: in blocks, into
    a temporary file beside it), must equal it; the temporary file is removed either way."""
    from jaxembed.data.plan import Plan

    tmp = atomic_files.unique_tmp(path, ".npz")
    try:
        built = build(tmp).fingerprint()
    finally:
        for p in (tmp, tmp.with_suffix(".json")):
            p.unlink(missing_ok=True)
    if Plan.load(path).fingerprint() != built:
        raise UserError(f"{path}: the saved plan differs from the one the config builds (the data or the "
                        "plan config changed); fix: use a new --workdir")


def read_only_plan(config, store, rd: RunDir, build: Callable[[], Any]):
    """The plan of a run read but not written (an export): its saved plan when it records the config's inputs,
    else ``build()`` (the config's plan, in memory)."""
    from jaxembed.data.plan import Plan

    path = rd.plan
    if path.exists() and saved_inputs(path).get("fingerprint") == plan_inputs_of(config, store)["fingerprint"]:
        return Plan.load(path)
    return build()
