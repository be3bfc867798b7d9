"""``jaxembed data validate`` and ``jaxembed data prepare``.

``add_parsers(subparsers)`` adds the ``data`` command to the main parser; each sub-command sets ``func`` (returns
the exit status; a UserError is printed on one line by the main CLI, exit status 2).

- ``data validate FILE... [--format NAME] [--text-field F] [--label-field F] [--score-threshold X]``: checks every
  record, prints every problem (one per line: ``file:line: field 'x': what (fix: how)``) and a summary per file.
  Exit status 0 when every record is valid, 1 when some are not, 2 for a usage error (missing file, bad option).
- ``data prepare --config PATH[:VARIANT] --out DIR [--on-error stop|skip]``: writes the dataset store
  (``jaxembed.data.store.write_store``). ``--config`` is a Python file whose ``get_config()`` (or
  ``get_config(VARIANT)``) returns a ConfigDict with a ``data`` field (or a data config itself), or ``shared``: every
  file of the shared training data (``jaxembed.data.config.shared_train_config``).
- ``data clustering --input FILE --out FILE [--instruction TEXT] [--num-negatives K]``: clustering triplets from a
  classification file (``jaxembed.data.clustering``).
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

from jaxembed.errors import InputError, UserError, in_file, with_file

VALIDATE_FORMATS = ("auto", "triplets", "scored_pairs", "labelled_pairs", "classification", "st")


def add_parsers(subparsers) -> None:
    """Add ``data validate`` and ``data prepare`` to an argparse sub-parsers object."""
    p = subparsers.add_parser("data", help="validate training files; prepare the dataset store",
                              description="Validate training files and prepare the random-access dataset store.")
    sub = p.add_subparsers(dest="data_command", required=True, metavar="{validate,prepare,clustering}")

    v = sub.add_parser("validate", help="check every record of JSON Lines files (exit 0 only if all are valid)",
                       description="Check every record: valid UTF-8 and JSON, required fields, types, empty texts. "
                                   "Prints every problem with file, line, field and fix.")
    v.add_argument("files", nargs="+", metavar="FILE",
                   help="JSON Lines, Parquet (.parquet), CSV / TSV (.csv / .tsv) files or datasets.save_to_disk "
                        "folders")
    v.add_argument("--format", default="auto", choices=VALIDATE_FORMATS,
                   help="record format (default: from the first record's keys)")
    v.add_argument("--text-field", default=None, help="classification: field holding the text (default: text)")
    v.add_argument("--label-field", default=None, help="classification / labelled pairs: the label field "
                                                       "(default: label)")
    v.add_argument("--score-threshold", type=float, default=None,
                   help="scored pairs: count the pairs below this score as left out")
    v.add_argument("--extra-field", action="append", default=[], metavar="KEY[,KEY...]",
                   help="record keys that are not fields of the format but expected (read and ignored; the data "
                        "config's extra_fields); any other unknown key is reported")
    v.add_argument("-q", "--quiet", action="store_true", help="print the summary only, not each problem")
    v.set_defaults(func=cmd_validate)

    pp = sub.add_parser("prepare", help="validate every record of a data config and write the dataset store",
                        description="Read every dataset of a data config, check every record, apply the on_error "
                                    "policy and write the random-access store (ArrayRecord) with a report.")
    pp.add_argument("--config", required=True, metavar="PATH[:VARIANT]|shared",
                    help="a Python file whose get_config([VARIANT]) returns a ConfigDict with a 'data' field, or "
                         "'shared' for all the shared training data")
    pp.add_argument("--out", required=True, metavar="DIR", help="store folder (an existing store is replaced)")
    pp.add_argument("--on-error", default=None, choices=["stop", "skip"],
                    help="override the config: stop at the first bad record, or skip and count bad records")
    pp.add_argument("-q", "--quiet", action="store_true", help="print only the totals")
    pp.set_defaults(func=cmd_prepare)

    from jaxembed.data.clustering import add_parser as add_clustering

    add_clustering(sub)  # data clustering: clustering triplets from a classification file (MoTE's clustering expert)


# ----------------------------------------------------------------------------------------------------- validate

def validate_file(path: str, fmt: str = "auto", text_field: str | None = None, label_field: str | None = None,
                  score_threshold: float | None = None, extra_fields=()):
    """(Tally, ReadInfo, whole-file error or None) of one file, every record read with the 'skip' policy."""
    from jaxembed.data.formats import DEFAULT_FIELDS, ReadInfo, ReadOptions, Tally, apply_policy, read_files

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


def cmd_validate(args) -> int:
    from jaxembed.data.sources import is_saved_dataset

    for f in args.files:  # usage errors first: every file must exist
        if not Path(f).is_file() and not is_saved_dataset(f):
            raise UserError(f"{f}: " + ("is a folder, not a file (nor a datasets.save_to_disk folder)"
                                        if Path(f).is_dir() else "no such file") + " (fix: check the path)")
    extra = [k.strip() for item in args.extra_field for k in item.split(",") if k.strip()]
    bad_records = bad_files = total = 0
    out = sys.stdout
    for f in args.files:
        tally, info, err = validate_file(f, args.format, args.text_field, args.label_field, args.score_threshold,
                                         extra)
        if not args.quiet:
            for s in tally.iter_skipped():
                if s.invalid:
                    print(s, file=out)
            if err is not None:
                print(err, file=out)
        total += tally.read
        bad_records += tally.invalid
        bad_files += err is not None or tally.invalid > 0
        what = f"{info.format}" + (f", task type {info.task_type}" if info.task_type else "")
        line = f"{f}: {tally.read} records ({what}): {tally.read - tally.invalid} valid, {tally.invalid} invalid"
        if tally.filtered:
            line += f" ({tally.filtered} valid but left out: " + "; ".join(
                f"{r}: {n}" for r, n in tally.reasons(invalid=False).items()) + ")"
        if err is not None:
            line += " -- cannot read the file: " + str(err)
        elif tally.invalid:
            line += " [" + "; ".join(f"{r}: {n}" for r, n in tally.reasons(invalid=True).items()) + "]"
        if tally.identical:
            line += f"; {tally.identical} identical to an earlier record"
        print(line, file=out)
    if bad_files:
        print(f"{bad_records} invalid records in {bad_files} of {len(args.files)} files ({total} records read)",
              file=out)
        return 1
    print(f"all {total} records valid in {len(args.files)} files", file=out)
    return 0


# ------------------------------------------------------------------------------------------------------ prepare

def load_config_file(spec: str):
    """``get_config()`` / ``get_config(variant)`` of a Python config file given as ``PATH[:VARIANT]``."""
    from jaxembed.config import override_error  # one line for a value of the wrong type (a dict to datasets)

    path, variant = spec, None
    if not Path(spec).exists() and ":" in spec:
        path, variant = spec.rsplit(":", 1)
    p = Path(path)
    if not p.is_file():
        what = "is a folder, not a config file" if p.is_dir() else f"no such file {path}"
        raise UserError(f"--config {spec}: {what} (fix: give a Python config file, PATH:VARIANT, or 'shared')")
    try:
        mod_spec = importlib.util.spec_from_file_location(f"_jaxembed_config_{p.stem}", p)
        mod = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(mod)
    except UserError as e:
        raise UserError(with_file(e, p)) from None
    except Exception as e:  # noqa: BLE001 -- a broken config file is the user's to fix
        raise UserError(override_error(e, p) or f"{in_file(e, p)}: cannot load the config file "
                        f"({type(e).__name__}: {e})") from None
    if not hasattr(mod, "get_config"):
        raise UserError(f"{path}: no get_config() function (fix: define get_config(arg=None) returning a "
                        "ConfigDict)")
    try:
        return mod.get_config(variant) if variant is not None else mod.get_config()
    except UserError as e:  # e.g. dataset_config(tempreature=...): name the config file and line
        raise UserError(with_file(e, p)) from None
    except Exception as e:  # noqa: BLE001
        raise UserError(override_error(e, p) or f"{in_file(e, p)}: get_config({variant!r}) failed "
                        f"({type(e).__name__}: {e})") from None


def load_data_config(spec: str):
    """(data config, where) for ``--config``: 'shared', or a config file's ``data`` field (or the data config
    itself when the file returns one)."""
    from jaxembed.data.config import shared_train_config

    if spec == "shared":
        from jaxembed import paths

        d = paths.shared_data_dir()
        if not (d / "train").is_dir():
            raise UserError(f"--config shared: {d / 'train'} does not exist (fix: set JAXEMBED_DATA to the shared "
                            "data folder)")
        return shared_train_config(d), "shared: data"
    cfg = load_config_file(spec)
    keys = set(cfg.keys()) if hasattr(cfg, "keys") else set()
    if "data" in keys:
        from jaxembed.config import data_section

        return data_section(cfg), f"{spec}: data"  # a run config: its data section without the run's 'store' key
    if "datasets" in keys:
        return cfg, f"{spec}: data"
    raise UserError(f"{spec}: get_config() returned no 'data' field (fix: add config.data = a data config, see "
                    "jaxembed.data.config.default_data_config)")


def cmd_prepare(args) -> int:
    from jaxembed.data.config import validate_data_config
    from jaxembed.data.store import write_store

    from jaxembed.data.store import check_out_dir

    t0 = time.time()
    check_out_dir(args.out)  # before any work
    cfg, where = load_data_config(args.config)
    if args.on_error:
        cfg.on_error = args.on_error
    validate_data_config(cfg, where=where)
    report = write_store(cfg, args.out, where=where, progress=False if args.quiet else None)
    if not args.quiet:
        print(report.summary())
    print(f"wrote {args.out}: {len(report.datasets)} datasets, {report.written} examples of {report.read} records "
          f"({report.invalid} invalid skipped, {report.filtered} left out by a rule) in {time.time() - t0:.1f}s; "
          f"every skipped record is listed in {Path(args.out) / 'report.txt'}")
    return 0
