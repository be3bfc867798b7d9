"""``jaxembed data validate`` and ``jaxembed data prepare``.

``add_parsers(subparsers)`` adds the ``data`` command to the main parser; each sub-command sets ``func`` (returns
the exit status; a UserError is printed on one line by the main CLI, exit status 2). This module parses arguments;
the work is ``jaxembed.data.validate``, ``jaxembed.config.load_data_config`` and ``jaxembed.data.store``.

- ``data validate FILE... [--format NAME] [--text-field F] [--label-field F] [--score-threshold X]``: checks every
  record, prints every problem (one per line: ``file:line: field 'x': what (fix: how)``) and a summary per file.
  Exit status 0 when every record is valid, 1 when some are not, 2 for a usage error (missing file, bad option).
- ``data prepare --config PATH[:VARIANT] --out DIR [--on-error stop|skip]``: writes the dataset store
  (``jaxembed.data.store.write_store``; started on every process of a pod, they share the datasets, a large one
  in parts: ``jaxembed.data.store_pod``, ``jaxembed.data.store_split``; an explicit pod is joined without importing
  JAX: ``jaxembed.pod.join``). ``--config`` is a Python file whose ``get_config()`` (or ``get_config(VARIANT)``)
  returns a ConfigDict with a ``data`` field (or a data config itself), or ``shared``: every file of the shared
  training data (``jaxembed.data.shared_train.shared_train_config``).
- ``data clustering --input FILE --out FILE [--instruction TEXT] [--num-negatives K]``: clustering triplets from a
  classification file (``jaxembed.data.clustering``).
"""


from __future__ import annotations

import sys
import time
from pathlib import Path

from jaxembed.data.formats import FORMAT_CHOICES, format_help
from jaxembed.data.validate import check_paths, summary_line, validate_file


def add_parsers(subparsers) -> None:
    """Add ``data validate`` and ``data prepare`` to an argparse sub-parsers object."""
    from jaxembed.config.io import config_help

    p = subparsers.add_parser("data", help="validate training files; prepare the dataset store",
                              description="Validate training files and prepare the random-access dataset store.")
    sub = p.add_subparsers(dest="data_command", required=True, metavar="{validate,prepare,clustering}")

    v = sub.add_parser("validate", help="check every record of JSON Lines files (exit 0 only if all are valid)",
                       description="Check every record: valid UTF-8 and JSON, required fields, types, empty texts. "
                                   "Prints every problem with file, line, field and fix.")
    v.add_argument("files", nargs="+", metavar="FILE",
                   help="JSON Lines, Parquet (.parquet), CSV / TSV (.csv / .tsv) files or datasets.save_to_disk "
                        "folders")
    v.add_argument("--format", default="auto", choices=FORMAT_CHOICES,
                   help=f"record format: {format_help()} (default: auto, from the first record's keys)")
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
    pp.add_argument("--config", required=True, metavar="NAME|PATH[:VARIANT]|shared",
                    help=config_help("a Python file whose get_config([VARIANT]) returns a ConfigDict with a 'data' "
                                     "field") + "; or 'shared' for all the shared training data")
    pp.add_argument("--out", required=True, metavar="DIR", help="store folder (an existing store is replaced)")
    pp.add_argument("--on-error", default=None, choices=["stop", "skip"],
                    help="override the config: stop at the first bad record, or skip and count bad records")
    pp.add_argument("-q", "--quiet", action="store_true", help="print only the totals")
    pp.set_defaults(func=cmd_prepare)

    from jaxembed.data.clustering import add_parser as add_clustering

    add_clustering(sub)  # data clustering: clustering triplets from a classification file (MoTE's clustering expert)


# ----------------------------------------------------------------------------------------------------- validate

def cmd_validate(args) -> int:
    check_paths(args.files)  # usage errors first: every file must exist
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
        print(summary_line(f, tally, info, err), file=out)
    if bad_files:
        print(f"{bad_records} invalid records in {bad_files} of {len(args.files)} files ({total} records read)",
              file=out)
        return 1
    print(f"all {total} records valid in {len(args.files)} files", file=out)
    return 0


# ------------------------------------------------------------------------------------------------------ prepare

def cmd_prepare(args) -> int:
    from jaxembed.config import load_data_config
    from jaxembed.data.config import validate_data_config

    from jaxembed import pod
    from jaxembed.data.store import check_out_dir
    from jaxembed.data.store_pod import prepare

    t0 = time.time()
    pod.join()  # started on every process of a pod: they share the datasets (jaxembed.data.store_pod)
    check_out_dir(args.out)  # before any work
    cfg, where = load_data_config(args.config)
    if args.on_error:
        cfg.on_error = args.on_error
    validate_data_config(cfg, where=where)
    report = prepare(cfg, args.out, where=where, progress=False if args.quiet else None)
    if not args.quiet:
        print(report.summary())
    print(f"wrote {args.out}: {len(report.datasets)} datasets, {report.written} examples of {report.read} records "
          f"({report.invalid} invalid skipped, {report.filtered} left out by a rule) in {time.time() - t0:.1f}s; "
          f"every skipped record is listed in {Path(args.out) / 'report.txt'}")
    return 0
