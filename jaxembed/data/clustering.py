"""Clustering training data from a labelled classification file (MoTE's clustering expert; docs/design.md, MoTE).

The shared training data has no clustering set, so a MoTE model's clustering expert never trains: it stays the
up-cycled dense feed-forward block. MTEB-era embedders build clustering training pairs from labelled texts (BGE's
``symmetric_clustering`` data, E5-mistral's clustering tasks, nomic-embed's): the query is a text with a clustering
instruction, the positive another text of the same label, the negatives texts of other labels.

- ``clustering_triplets(texts, labels)``: those triplets, seeded (pure).
- ``write_clustering_file(src, out)``: reads a classification file (``text``, ``label``; every record checked by
  the classification reader, bad ones named by file and line) and writes a triplets file whose records carry the
  BGE fields ``prompt`` (the instruction) and ``type`` = ``clustering``: a data config that gives it no
  ``task_type`` / ``query_instruction`` takes both from the file, so MoTE routes it to the clustering expert
  and TA-CL (``jaxembed.mote.ta_cl``) gives it heterogeneous batches and temperature 0.06. The file keeps each
  query's ``label``. ``jaxembed data clustering`` is this function.
- ``clustering_file(src)``: the same, written once into ``$JAXEMBED_CACHE/clustering`` (default
  ``~/.cache/jaxembed``) under a name that hashes the source's bytes and the settings, atomically (several hosts
  loading one config at once write the same bytes).
- ``shared_clustering_datasets(data_dir)``: dataset configs of clustering sets built from the shared ``train/``
  classification files (TREC question types, SST-5 sentiment levels; never ``eval/``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from jaxembed.errors import UserError

#: bump when the records written for the same input and settings change (part of the cache key)
VERSION = 1
#: the reasons a query is left out (counted in the report, never silently)
NO_POSITIVE = "no other text with its label"
#: the shared train/ classification sets used as clustering data: name -> (file, instruction, extra record keys)
SHARED = {
    "trec": ("trec_cls.jsonl", "Identify the type of answer the given question asks for.", ("fine_label",)),
    "sst5": ("sst5_cls.jsonl", "Identify the sentiment level of the given movie review.", ()),
}


def clustering_triplets(texts: Sequence[str], labels: Sequence[str], *, num_negatives: int = 4,
                        seed: int = 0) -> tuple[list[dict], dict[str, int]]:
    """Clustering triplets from labelled texts. -> (records, skipped {reason: count}).

    Record for text i with label l: ``{"query": texts[i], "pos": [p], "neg": [n_1..n_k], "label": l}`` where p is a
    uniform draw among the distinct texts of label l other than texts[i], and the negatives go through the other
    labels in a random order (cycled when k exceeds their number), one uniform draw of a distinct text from each,
    never the query's or the positive's text nor a repeat. k = ``num_negatives``, fewer only when the other labels
    have fewer distinct texts. A query whose label has no other distinct text is left out (``NO_POSITIVE``).
    Seeded: the same inputs give the same records."""
    texts, labels = [str(t) for t in texts], [str(x) for x in labels]
    if len(texts) != len(labels):
        raise UserError(f"clustering_triplets: {len(texts)} texts but {len(labels)} labels")
    if num_negatives < 0:
        raise UserError(f"--num-negatives must be >= 0, got {num_negatives}")
    names = sorted(set(labels))
    if len(names) < 2 and num_negatives > 0:
        raise UserError(f"clustering data needs texts of at least 2 labels for negatives, got {names} (fix: a "
                        "classification file with several labels, or --num-negatives 0)")
    by_label: dict[str, list[str]] = {x: [] for x in names}  # distinct texts, first appearance first
    where: dict[str, dict[str, int]] = {x: {} for x in names}
    for t, x in zip(texts, labels):
        if t not in where[x]:
            where[x][t] = len(by_label[x])
            by_label[x].append(t)
    rng = np.random.default_rng([int(seed), 0x5EED])
    records, skipped = [], {}
    for t, x in zip(texts, labels):
        own = by_label[x]
        if len(own) < 2:
            skipped[NO_POSITIVE] = skipped.get(NO_POSITIVE, 0) + 1
            continue
        r = int(rng.integers(len(own) - 1))
        pos = own[r + (r >= where[x][t])]  # uniform over the label's other texts
        others = [names[k] for k in rng.permutation(len(names)) if names[k] != x]
        taken, neg = {t, pos}, []
        left = {y: len(by_label[y]) - sum(1 for z in (t, pos) if z in where[y]) for y in others}
        while len(neg) < num_negatives and any(v > 0 for v in left.values()):
            for y in others:
                if len(neg) == num_negatives or left[y] <= 0:
                    continue
                pool, cand = by_label[y], None
                for _ in range(32):  # rejection: the texts taken are few against the pool
                    c = pool[int(rng.integers(len(pool)))]
                    if c not in taken:
                        cand = c
                        break
                if cand is None:  # a small pool (or texts that other labels share): draw among the free ones
                    free = [c for c in pool if c not in taken]
                    if not free:
                        left[y] = 0
                        continue
                    cand = free[int(rng.integers(len(free)))]
                taken.add(cand)
                neg.append(cand)
                left[y] -= 1
        records.append({"query": t, "pos": [pos], "neg": neg, "label": x})
    return records, skipped


def read_labelled(src, *, text_field: str | None = None, label_field: str | None = None,
                  extra_fields: Sequence[str] = (), on_error: str = "stop") -> tuple[list[str], list[str], dict]:
    """(texts, labels, tally dict) of a classification file, every record checked by the classification reader
    (``jaxembed.data.readers``); on_error 'skip' counts bad records instead of stopping at the first."""
    from jaxembed.data.readers import DEFAULT_FIELDS, ReadOptions, Tally, apply_policy, read_files

    fields = dict(DEFAULT_FIELDS, text=text_field or "text", label=label_field or "label")
    opts = ReadOptions(name=Path(src).stem, format="classification", fields=fields, use_type=False,
                       use_prompt=False, extra_fields=frozenset(extra_fields))
    tally = Tally(Path(src).stem, keep_ids=False, memory_limit=10_000)
    texts, labels = [], []
    for ex in apply_policy(read_files(str(src), opts), on_error, tally):
        texts.append(ex["query"])
        labels.append(ex["label"])
    return texts, labels, tally.summary_dict()


def write_clustering_file(src, out, *, instruction: str, num_negatives: int = 4, seed: int = 0,
                          text_field: str | None = None, label_field: str | None = None,
                          extra_fields: Sequence[str] = (), on_error: str = "stop") -> dict:
    """Read the classification file ``src``, write the clustering triplets file ``out`` (JSON Lines, atomic) and
    ``out`` with suffix .report.json. -> the report: read / written / left out (with reasons), labels, settings."""
    from jaxembed.runs import atomic_files

    if not instruction.strip():
        raise UserError("--instruction: a clustering instruction is needed (e.g. 'Identify the topic or theme of "
                        "the given text.')")
    texts, labels, tally = read_labelled(src, text_field=text_field, label_field=label_field,
                                         extra_fields=extra_fields, on_error=on_error)
    if not texts:
        raise UserError(f"{src}: no valid classification records (fix: a file of text, label records)")
    records, skipped = clustering_triplets(texts, labels, num_negatives=num_negatives, seed=seed)
    lines = [json.dumps(dict(r, prompt=instruction, type="clustering"), ensure_ascii=False) for r in records]
    out = Path(out)
    atomic_files.write_text(out, "\n".join(lines) + ("\n" if lines else ""))
    counts = {x: labels.count(x) for x in sorted(set(labels))}
    report = {"source": str(src), "output": str(out), "records_read": tally, "examples": len(texts),
              "written": len(records), "left_out": skipped, "labels": counts, "instruction": instruction,
              "num_negatives": num_negatives, "seed": seed, "version": VERSION}
    atomic_files.write_json(out.with_suffix(".report.json"), report)
    return report


def cache_dir() -> Path:
    """``$JAXEMBED_CACHE/clustering`` or ``~/.cache/jaxembed/clustering``."""
    return Path(os.environ.get("JAXEMBED_CACHE") or "~/.cache/jaxembed").expanduser() / "clustering"


def clustering_file(src, *, instruction: str, num_negatives: int = 4, seed: int = 0,
                    extra_fields: Sequence[str] = (), folder=None) -> Path:
    """The clustering triplets of ``src`` (``write_clustering_file``), made once under ``folder`` (default
    ``cache_dir()``) and named by a hash of src's bytes and the settings. -> the file's path."""
    src = Path(src)
    if not src.is_file():
        raise UserError(f"{src}: no such classification file (fix: check the path; the shared data is described "
                        "in ../shared/data/README.md)")
    h = hashlib.sha256(src.read_bytes())
    h.update(json.dumps([VERSION, instruction, num_negatives, seed, sorted(extra_fields)]).encode())
    path = Path(folder or cache_dir()) / f"{src.stem}-clustering-{h.hexdigest()[:16]}.jsonl"
    if not path.is_file():
        write_clustering_file(src, path, instruction=instruction, num_negatives=num_negatives, seed=seed,
                              extra_fields=extra_fields)
    return path


def shared_clustering_datasets(data_dir, names: Sequence[str] = ("trec", "sst5"), *, num_negatives: int = 4,
                               seed: int = 0) -> list:
    """Dataset configs (``jaxembed.data.config.dataset_config``) of clustering sets built from the shared
    ``<data_dir>/train`` classification files (``SHARED``): ``<name>_clustering``, task type clustering, its
    instruction and task type from the file (BGE ``prompt`` / ``type``)."""
    from jaxembed.data.config import dataset_config

    unknown = [n for n in names if n not in SHARED]
    if unknown:
        raise UserError(f"shared_clustering_datasets: unknown sets {unknown} (known: {', '.join(SHARED)})")
    out = []
    for n in names:
        file, instruction, extra = SHARED[n]
        path = clustering_file(Path(data_dir) / "train" / file, instruction=instruction,
                               num_negatives=num_negatives, seed=seed, extra_fields=extra)
        out.append(dataset_config(name=f"{n}_clustering", path=str(path), format="triplets",
                                  task=f"{n}_clustering", task_type="clustering", num_negatives=num_negatives))
    return out


# ------------------------------------------------------------------------------------------------------ command


def add_parser(sub) -> None:
    """``jaxembed data clustering`` on an argparse sub-parsers object (the ``data`` command's)."""
    c = sub.add_parser("clustering", help="clustering training triplets from a labelled classification file",
                       description="Turn a classification file (text, label) into clustering triplets: query = the "
                                   "text (with the clustering instruction), positive = another text of its label, "
                                   "negatives = texts of other labels (seeded). Writes JSON Lines in the triplets "
                                   "format with BGE prompt / type = clustering, and OUT.report.json.")
    c.add_argument("--input", required=True, metavar="FILE", help="classification file (JSON Lines, Parquet, CSV)")
    c.add_argument("--out", required=True, metavar="FILE", help="the triplets file to write")
    c.add_argument("--instruction", default="Identify the topic or theme of the given text.",
                   help="clustering instruction (the BGE prompt; the data config makes it 'Instruct: ... Query: ')")
    c.add_argument("--num-negatives", type=int, default=4, help="texts of other labels per query (default 4)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--text-field", default=None, help="field holding the text (default: text)")
    c.add_argument("--label-field", default=None, help="field holding the label (default: label)")
    c.add_argument("--extra-field", action="append", default=[], metavar="KEY[,KEY...]",
                   help="record keys to read and ignore (e.g. fine_label); any other unknown key is an error")
    c.add_argument("--on-error", default="stop", choices=["stop", "skip"],
                   help="stop at the first bad record (default) or skip and count bad records")
    c.set_defaults(func=cmd_clustering)


def cmd_clustering(args: argparse.Namespace) -> int:
    extra = [k for a in args.extra_field for k in a.split(",") if k]
    r = write_clustering_file(args.input, args.out, instruction=args.instruction, num_negatives=args.num_negatives,
                              seed=args.seed, text_field=args.text_field, label_field=args.label_field,
                              extra_fields=extra, on_error=args.on_error)
    left = ", ".join(f"{k}: {v}" for k, v in r["left_out"].items()) or "none"
    print(f"{args.input}: {r['examples']} texts of {len(r['labels'])} labels -> {r['written']} clustering triplets "
          f"in {args.out} (left out: {left}); report {Path(args.out).with_suffix('.report.json')}")
    return 0
