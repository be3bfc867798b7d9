"""``jaxembed data validate`` as functions: every record of a file read with the 'skip' policy (``validate_file``),
and the one-line summary of a file (``summary_line``)."""

from __future__ import annotations

from pathlib import Path

from jaxembed.errors import InputError, UserError


def check_paths(files) -> None:
    """Usage errors first: every path is a regular file or a ``datasets.save_to_disk`` folder (a missing path, a
    device, a named pipe or a socket is named as what it is)."""
    from jaxembed.data.jsonl import check_input_file
    from jaxembed.data.sources import is_saved_dataset

    for f in files:
        if is_saved_dataset(f):
            continue
        if Path(f).is_dir():
            raise UserError(f"{f}: is a folder, not a file (nor a datasets.save_to_disk folder) (fix: check the "
                            "path)")
        check_input_file(f)


def validate_file(path: str, fmt: str = "auto", text_field: str | None = None, label_field: str | None = None,
                  score_threshold: float | None = None, extra_fields=()):
    """(Tally, ReadInfo, whole-file error or None) of one file, every record read with the 'skip' policy."""
    from jaxembed.data.readers import DEFAULT_FIELDS, ReadInfo, ReadOptions, Tally, apply_policy, read_files

    fields = dict(DEFAULT_FIELDS)
    if text_field:
        fields["text"] = text_field
    if label_field:
        fields["label"] = label_field
    opts = ReadOptions(name=Path(path).stem, format=fmt, fields=fields, score_threshold=score_threshold,
                       extra_fields=frozenset(extra_fields))
    tally, info = Tally(Path(path).stem, keep_ids=False, memory_limit=10_000), ReadInfo()
    try:
        for _ in apply_policy(read_files(path, opts, info), "skip", tally):
            pass
    except InputError as e:  # the file as a whole (its format cannot be told)
        return tally, info, e
    return tally, info, None


def summary_line(path, tally, info, err) -> str:
    """``FILE: N records (format): V valid, I invalid`` with the reasons, what was left out and the duplicates."""
    what = f"{info.format}" + (f", task type {info.task_type}" if info.task_type else "")
    line = f"{path}: {tally.read} records ({what}): {tally.read - tally.invalid} valid, {tally.invalid} invalid"
    if tally.filtered:
        line += f" ({tally.filtered} valid but left out: " + "; ".join(
            f"{r}: {n}" for r, n in tally.reasons(invalid=False).items()) + ")"
    if err is not None:
        line += " -- cannot read the file: " + str(err)
    elif tally.invalid:
        line += " [" + "; ".join(f"{r}: {n}" for r, n in tally.reasons(invalid=True).items()) + "]"
    if tally.identical:
        line += f"; {tally.identical} identical to an earlier record"
    return line
