"""The one rule for a run's max lengths (tokens, the special tokens included), checked with the config:
``check_lengths``; ``length_source``: the local model folder whose position table bounds them."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import ml_collections as mc

from jaxembed.errors import UserError
from jaxembed.runs.rundir import RunDir

log = logging.getLogger("jaxembed.config")


def check_lengths(c: mc.ConfigDict) -> None:
    """One rule for a run's max lengths (tokens, the special tokens included; docs/training.md): model.max_length
    is 0 (the model folder's max_seq_length) or an integer from 2 up to the model's position table, and is the
    max_seq_length the export writes; a dataset's max_query_length / max_doc_length is in the same range, and a
    limit above the run's max length is capped at it (model.max_length caps every dataset's limits), said in one
    log line. The model is read from a local folder only (its JSON files, no weights); a hub id or a previous
    stage not yet exported is checked when it loads (jaxembed.loading.load)."""
    from jaxembed import loading

    ml = c.model.max_length
    source, limit, table = length_source(c), None, ""
    try:
        if source is not None:
            limit, table = loading.position_limit(source)
    except UserError:  # a folder the loader cannot read: the run says so in one line when it loads the model
        source = None
    if ml:
        loading.check_max_length(ml, "config.model.max_length", limit, table)
    limits = []
    if not c.data.store:
        limits = [(f"config.data.datasets[{i}].{k}", d.get(k)) for i, d in enumerate(c.data.datasets)
                  for k in ("max_query_length", "max_doc_length")]
    else:
        mf = Path(c.data.store) / "manifest.json"
        try:
            entries = json.loads(mf.read_text(encoding="utf-8")).get("datasets", [])
            limits = [(f"{mf}: datasets[{i}].{k}", d.get(k)) for i, d in enumerate(entries)
                      for k in ("max_query_length", "max_doc_length")]
        except (OSError, ValueError, AttributeError, TypeError):
            pass  # an unreadable manifest: _check_store_task_types says so
    limits = [(key, v) for key, v in limits if v is not None]
    for key, v in limits:
        loading.check_max_length(v, key, limit, table)
    run = ml
    if not ml and source is not None and limits:
        try:
            run = loading.default_max_length(source)
        except UserError:  # said when the run loads the model
            run = None
    capped = [f"{key} = {v}" for key, v in limits if run is not None and v > run]
    if capped:
        what = "config.model.max_length" if ml else f"config.model.max_length = 0: the max_seq_length of {source}"
        more = f" and {len(capped) - 1} more dataset limit(s)" if len(capped) > 1 else ""
        log.warning("%s%s: capped at the run's max length %d (%s), which caps every dataset's limits and is the "
                    "export's max_seq_length", capped[0], more, run, what)


def length_source(c: mc.ConfigDict) -> Path | None:
    """The local model folder a run's weights come from (model.init_from, else model.name); None for a hub id or
    a previous stage that has no export yet."""
    src = c.model.get("init_from") if "init_from" in c.model else ""
    p = Path(os.path.expanduser(str(src or c.model.name)))
    if src and RunDir(p).has_checkpoints():  # a previous stage's run directory: its export
        p = RunDir(p).export
    return p if (p / "config.json").is_file() or (p / "modules.json").is_file() else None
