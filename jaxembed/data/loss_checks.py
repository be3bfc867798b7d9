"""Each dataset's loss against its data, before any work (``check_dataset_losses``): called by the config check
(``jaxembed.config.validate``, reading the first record of local files) and by the trainer on the prepared store
(``jaxembed.train.loss``, its pair / teacher score counts).

It reads records (``jaxembed.data.readers``), so it sits above ``jaxembed.data.config``, which only knows the
config's fields.
"""

from __future__ import annotations

import json
from pathlib import Path

from jaxembed.data import readers, sources
from jaxembed.data.config import (CONTRASTIVE_LOSSES, SCORED_LOSSES, SOURCE_FORMATS, config_get, dataset_paths,
                                  effective_record_format)
from jaxembed.data.formats import FORMAT_TABLE
from jaxembed.errors import UserError
from jaxembed.losses.table import quoted


def check_dataset_losses(run_config, store_dir=None) -> None:
    """Each dataset's loss (its ``loss``, else the run's ``loss.type``) against its data, before any work: a scored-pair
    loss (CoSENT / AnglE) needs scored pairs, all of them (no ``score_threshold``); distillation (``loss.distill``)
    needs teacher scores (``pos_scores`` / ``neg_scores``) on every dataset trained by a contrastive loss (the first
    record of its first file is read; a store's counts); distillation and a GIST guide need a contrastive dataset.
    Datasets of one run may name different losses: each batch row follows its dataset's (docs/losses.md).
    store_dir: check this store's datasets (default: ``data.store`` when set, else the config's datasets)."""
    loss_cfg = run_config.loss
    run_loss, distill = loss_cfg.type, loss_cfg.get("distill", "none")
    entries = []  # (where, name, effective loss, record format, score_threshold, dataset config or None, counts)
    store_dir = store_dir or run_config.data.get("store")
    if store_dir:
        mf = Path(store_dir) / "manifest.json"
        try:
            manifest = json.loads(mf.read_text(encoding="utf-8"))
            cfgs = {d.get("name"): d for d in (manifest.get("config") or {}).get("datasets", [])}
            for i, d in enumerate(manifest.get("datasets", [])):
                entries.append((f"{mf}: datasets[{i}]", d.get("name"), d.get("loss") or run_loss,
                                d.get("record_format"), (cfgs.get(d.get("name")) or {}).get("score_threshold"), None,
                                d.get("counts") or {}))
        except (OSError, ValueError, AttributeError):
            return  # an unreadable manifest is reported by the store checks
    else:
        for i, d in enumerate(run_config.data.datasets):
            entries.append((f"config.data.datasets[{i}]", config_get(d, "name"), config_get(d, "loss") or run_loss,
                            effective_record_format(d), config_get(d, "score_threshold"), d, None))
    contrastive = [e for e in entries if e[2] in CONTRASTIVE_LOSSES]
    for w, name, loss, rec, thr, ds, counts in entries:
        if loss in SCORED_LOSSES:
            if rec not in ("auto", None) and not _format_has(rec, "scored"):
                raise UserError(f"{w}.loss: dataset {name!r} trains with {loss!r}, which learns from scored pairs "
                                f"(sentence1, sentence2, score), but its records are {rec} (fix: loss='infonce' on "
                                "the dataset, or give it scored pairs)")
            if thr is not None:
                raise UserError(f"{w}.score_threshold: dataset {name!r} trains with {loss!r}, which learns from every "
                                f"pair and its score; score_threshold={thr!r} would drop the low-scored pairs (fix: "
                                "remove score_threshold from the dataset" + (" and prepare the store again)"
                                                                             if counts is not None else ")"))
            first = _first_record(ds) if ds is not None else None
            if first is not None:
                _check_scored_record(first, w, name, loss, rec, ds)
            if counts is not None and counts.get("scores", 0) < counts.get("written", 0):
                raise UserError(f"{w}: dataset {name!r} trains with {loss!r} but the store holds "
                                f"{counts.get('scores', 0)} pair scores for {counts.get('written', 0)} examples (fix: "
                                "prepare the store again with this jaxembed, the dataset's loss set)")
        elif distill != "none":
            fix = (f"score it with the teacher: jaxembed teacher-score --model TEACHER --input FILE --out "
                   f"FILE.scored.jsonl and train on that file; or give {name!r} loss={quoted(SCORED_LOSSES)} if it is "
                   "scored pairs; or --config.loss.distill=none")
            if rec not in ("auto", None) and not _format_has(rec, "teacher_scores"):
                raise UserError(f"{w}: loss.distill={distill!r} distils teacher scores (pos_scores / neg_scores of "
                                f"triplets) but dataset {name!r} is {rec} (fix: {fix})")
            if counts is not None and not counts.get("teacher_scores"):
                raise UserError(f"{w}: loss.distill={distill!r} needs teacher scores (pos_scores / neg_scores) but "
                                f"dataset {name!r} has none in the store (fix: {fix}, then prepare the store again)")
            if ds is not None:
                first = _first_record(ds)
                if first is not None and first[1].get("pos_scores") is None:
                    raise UserError(f"{first[0]}: loss.distill={distill!r} needs teacher scores (pos_scores / "
                                    f"neg_scores) but dataset {name!r} has none (fix: {fix})")
    if not contrastive:
        for key, on in (("distill", distill != "none"), ("gist_guide", bool(loss_cfg.get("gist_guide")))):
            if on:
                raise UserError(f"config.loss.{key} = {loss_cfg[key]!r}: no dataset trains a contrastive loss "
                                f"({' / '.join(CONTRASTIVE_LOSSES)}), which {key} acts on (fix: --config.loss.{key}="
                                f"{'none' if key == 'distill' else chr(39) * 2})")


def _check_scored_record(first: tuple[str, dict], w: str, name, loss: str, rec: str, ds) -> None:
    """The first record of a dataset trained by a scored-pair loss is a scored pair (or an st pair with a score /
    label column)."""
    where, obj = first
    fields = readers.read_options(ds).fields
    fmt = readers.detect_format(obj, fields) if rec == "auto" else rec
    spec = FORMAT_TABLE.get(fmt) if fmt is not None else None
    if spec is None or spec.pair_score is None or not spec.pair_score(obj, fields):
        without = " without a score column" if spec is not None and spec.scored else ""
        raise UserError(f"{where}: dataset {name!r} trains with {loss!r}, which learns from scored pairs (sentence1, "
                        f"sentence2, score), but its records are {fmt or 'of an unknown format'}{without} ({w}) "
                        "(fix: loss='infonce' on the dataset, or give it scored pairs)")


def _format_has(rec: str, prop: str) -> bool:
    """Whether record format ``rec`` (as a config or a store's manifest names it) has property ``prop`` of its
    ``RecordFormat``; an unknown name has none."""
    spec = FORMAT_TABLE.get(rec)
    return spec is not None and bool(getattr(spec, prop))


def _first_record(ds) -> tuple[str, dict] | None:
    """(``file:line``, the first JSON object) of a dataset's first file, when it is a local file (JSON Lines,
    Parquet, CSV / TSV, a save_to_disk folder); None otherwise (hub and TFDS datasets are checked in the store)."""
    if config_get(ds, "format", "auto") in SOURCE_FORMATS:
        return None
    paths = dataset_paths(ds)
    try:
        kind = sources.source_kind(paths[0])
        if kind == "folder":
            return None
        for line, obj in readers.file_rows(paths[0], kind, readers.DEFAULT_FIELDS, config_get(ds, "split", "train")):
            if isinstance(obj, dict):
                return f"{paths[0]}:{line}", obj
            break
    except (UserError, OSError):
        return None  # the data checks name what is wrong with the file
    return None
