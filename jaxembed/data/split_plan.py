"""Which datasets the processes of a pod read in parts, where the parts are cut, and how a part reads its records
numbered as one process numbers them (``jaxembed.data.store_split`` writes and merges the parts).

How a dataset is cut (``split_mode``; ``split_format`` says why one is read whole):

- ``lines``: JSON Lines files as they are (not compressed): byte ranges cut at line starts, over the files in order;
  a part counts the lines before it;
- ``csv``: CSV or TSV files as they are: byte ranges cut at line starts; every part reads its files' header, and
  reads the rows that begin in its bytes (the last may end after them: a quoted field may hold a line end). It
  reports where its rows began and where its reading stopped; when a part's last row ends after the next part's
  start (the cut fell inside a quoted field), the merge reads the dataset again whole;
- ``rows``: Parquet files: ranges of row groups (from the files' footers), over the files in order, rows numbered
  as in each whole file;
- ``hf``: a ``datasets.save_to_disk`` folder (``format='hf'`` or its path): ranges of rows of the memory-mapped
  Dataset, numbered from 1 as in the whole dataset;
- ``files``: any other dataset of several files (compressed files, mixed kinds): whole files, each part a run of
  them, as many parts as files at most.

A single compressed file, a hub name or a folder of data files read by ``datasets.load_dataset`` (which decides the
files, their split and their column types), TFDS, and classification records whose labels are first collected from
the whole dataset are read whole by one process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

from jaxembed.data import config as dc
from jaxembed.data import jsonl, readers, sources
from jaxembed.data.readers import FORMAT_TABLE, Skip, detect_format, read_options


@dataclass(frozen=True)
class Part:
    """Part ``index`` of ``count`` of dataset ``dataset``, read as ``mode`` says (see the module docstring):
    ``segments`` (file index, start, end): bytes (``lines``, ``csv``), row groups (``rows``), rows (``hf``), or the
    whole file (``files``: 0, its size); ``size``: the bytes of input it stands for."""

    dataset: int
    index: int
    count: int
    record_format: str = ""
    segments: tuple = ()
    mode: str = "lines"
    size: int = 0

    @property
    def name(self) -> str:
        return f"part {self.index + 1} of {self.count}"


# ------------------------------------------------------------------------------------------------ what is split

def _path_bytes(p: str) -> int:
    if os.path.isdir(p):
        return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(p) for f in fs)
    return os.path.getsize(p)


def split_mode(ds) -> tuple[str | None, str]:
    """(how dataset ``ds`` is cut, "") or (None, why it is read whole); reads file heads and footers only."""
    paths = [str(p) for p in dc.dataset_paths(ds)]
    fmt = ds.get("format", "auto")
    if fmt == "tfds":
        return None, "a TFDS source"
    if fmt == "hf":
        if len(paths) == 1 and sources.is_saved_dataset(paths[0]):
            return "hf", ""
        return None, ("a Hugging Face hub name or data-file folder (datasets.load_dataset decides its files, split "
                      "and column types)")
    kinds = [sources.source_kind(p) for p in paths]
    if "folder" in kinds:
        return None, "a folder that is not a datasets.save_to_disk folder"
    plain = all(k == "hf_disk" or (jsonl.is_plain_file(p) and os.path.getsize(p) > 0) for p, k in zip(paths, kinds))
    if plain and set(kinds) == {"jsonl"}:
        return "lines", ""
    if plain and len(set(kinds)) == 1 and kinds[0] in ("csv", "tsv"):
        return ("csv", "") if all(_first_row(p, kinds[0]) for p in paths) else (None, "a file without rows")
    if kinds == ["parquet"] * len(paths):
        return ("rows", "") if all(sources.parquet_rows(p) for p in paths) else (None, "a file without rows")
    if kinds == ["hf_disk"]:
        return "hf", ""
    if len(paths) > 1:
        return "files", ""
    if not jsonl.is_plain_file(paths[0]):
        return None, "one compressed, empty or unreadable file (a compressed stream is read from its start)"
    return None, "an empty or unreadable file"


def _first_row(path: str, kind: str) -> bool:
    for _ in readers.file_rows(path, kind, readers.DEFAULT_FIELDS):
        return True
    return False


def split_format(ds) -> tuple[str | None, str]:
    """(record format, "") of a dataset that can be read in parts, else (None, why it is read whole). Reads the
    files up to their first record at most; never raises for the data (a whole read reports it)."""
    mode, why = split_mode(ds)
    if mode is None:
        return None, why
    opts = read_options(ds)
    fmt = opts.format if opts.format != "auto" else _first_format(ds, opts.fields)
    spec = FORMAT_TABLE.get(fmt)
    if spec is None:
        return None, "no record format told by the first record"
    if spec.label_descriptions and not opts.label_descriptions:
        return None, "classification labels are collected from the whole dataset first (no label_descriptions)"
    if opts.format == "auto" and ((opts.keep_scores and not spec.scored) or (
            spec.threshold_required and opts.need_threshold and opts.score_threshold is None
            and not opts.keep_scores)):
        return None, "the first record is an error for this dataset config"
    return fmt, ""


def _first_format(ds, fields: dict) -> str | None:
    """The record format ``read_records`` detects: from the dataset's first object (triplets without one)."""
    whole = Part(0, 0, 1, mode=split_mode(ds)[0] or "files")
    for _, _, _, obj in part_records(ds, replace_segments(ds, whole), None):
        if isinstance(obj, dict):
            return detect_format(obj, fields)
    return "triplets"


# ------------------------------------------------------------------------------------------------ cutting

def replace_segments(ds, part: Part) -> Part:
    """``part`` standing for the whole dataset (one segment per file)."""
    paths = [str(p) for p in dc.dataset_paths(ds)]
    if part.mode == "hf":
        return _cut_rows(ds, part.dataset, 1, part.record_format)[0]
    if part.mode == "rows":
        return _cut_groups(paths, part.dataset, 1, part.record_format)[0]
    segs = tuple((f, 0, _path_bytes(p)) for f, p in enumerate(paths))
    return Part(part.dataset, 0, 1, part.record_format, segs, part.mode, sum(s[2] for s in segs))


def parts(ds, i: int, n: int, fmt: str) -> list[Part]:
    """Dataset ``i`` cut into ``n`` parts (fewer for whole files: one per file at most) of about equal input
    bytes (a part may be empty)."""
    mode = split_mode(ds)[0]
    paths = [str(p) for p in dc.dataset_paths(ds)]
    if mode == "rows":
        return _cut_groups(paths, i, n, fmt)
    if mode == "hf":
        return _cut_rows(ds, i, n, fmt)
    sizes = [_path_bytes(p) for p in paths]
    if mode == "files":
        return _cut_units(i, n if n <= len(paths) else len(paths), fmt, mode,
                          [((f, 0, s), s) for f, s in enumerate(sizes)])
    return _cut_bytes(paths, sizes, i, n, fmt, mode)


def _cut_bytes(paths, sizes, i: int, n: int, fmt: str, mode: str) -> list[Part]:
    """Byte ranges of the files in order, each cut at the line start at or after its target."""
    offsets = [sum(sizes[:f]) for f in range(len(paths))]
    total = sum(sizes)
    cuts = [0]
    for r in range(1, n):
        target = r * total // n
        f = max(k for k in range(len(paths)) if offsets[k] <= target)
        cut = offsets[f] + jsonl.next_line_start(paths[f], target - offsets[f])
        cuts.append(max(cut, cuts[-1]))
    cuts.append(total)
    out = []
    for r in range(n):
        segs = []
        for f, (off, size) in enumerate(zip(offsets, sizes)):
            lo, hi = max(cuts[r], off), min(cuts[r + 1], off + size)
            if lo < hi:
                segs.append((f, lo - off, hi - off))
        out.append(Part(i, r, n, fmt, tuple(segs), mode, cuts[r + 1] - cuts[r]))
    return out


def _cut_units(i: int, n: int, fmt: str, mode: str, units: list[tuple[tuple, int]]) -> list[Part]:
    """``units`` (segment, bytes), in order, dealt into ``n`` runs of about equal bytes; adjacent segments of one
    file in a run are joined."""
    total, acc, out = sum(b for _, b in units), 0, [[] for _ in range(n)]
    for seg, b in units:
        r = min(n - 1, acc * n // max(total, 1))
        out[r].append((seg, b))
        acc += b
    parts = []
    for r, run in enumerate(out):
        segs: list[tuple] = []
        for seg in (s for s, _ in run):
            if segs and segs[-1][0] == seg[0] and segs[-1][2] == seg[1]:
                segs[-1] = (seg[0], segs[-1][1], seg[2])
            else:
                segs.append(seg)
        parts.append(Part(i, r, n, fmt, tuple(segs), mode, sum(b for _, b in run)))
    return parts


def _cut_groups(paths, i: int, n: int, fmt: str) -> list[Part]:
    """Runs of the Parquet files' row groups, in order, by their compressed bytes."""
    pq = sources._pyarrow_parquet(paths[0])
    units = []
    for f, p in enumerate(paths):
        meta = pq.ParquetFile(p).metadata
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            size = sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
            units.append(((f, g, g + 1), max(1, size)))
    return _cut_units(i, n, fmt, "rows", units)


def _cut_rows(ds, i: int, n: int, fmt: str) -> list[Part]:
    """Ranges of rows of a save_to_disk Dataset, of about equal counts."""
    path = str(dc.dataset_paths(ds)[0])
    rows = len(sources.load_hf(path, ds.get("split", "train")))
    size = _path_bytes(path)
    cuts = [r * rows // n for r in range(n + 1)]
    return [Part(i, r, n, fmt, ((0, cuts[r], cuts[r + 1]),) if cuts[r] < cuts[r + 1] else (), "hf",
                 size * (cuts[r + 1] - cuts[r]) // max(rows, 1)) for r in range(n)]


# ------------------------------------------------------------------------------------------------ reading a part

def part_records(ds, part: Part, bounds: list | None) -> Iterator[tuple[str, int, str, dict | Skip]]:
    """(path, line / row, default-id suffix, object or Skip) of a part, as ``readers.read_files`` /
    ``readers.read_hf`` yield them for the whole dataset; ``bounds`` (``csv``): gets each segment's [file, start,
    end, {first row's start, stop}] (``jaxembed.data.sources.iter_csv``)."""
    paths = [str(p) for p in dc.dataset_paths(ds)]
    multi = len(paths) > 1
    fields = read_options(ds).fields
    for f, start, end in part.segments:
        p = paths[f]
        if part.mode == "hf":
            yield from _hf_rows(ds, p, start, end, multi, f)
            continue
        for line, obj in _segment_rows(p, part.mode, f, start, end, fields, ds, bounds):
            yield p, line, (f"{f}:{line}" if multi else str(line)), obj


def _segment_rows(p: str, mode: str, f: int, start: int, end: int, fields: dict, ds, bounds
                  ) -> Iterator[tuple[int, dict | Skip]]:
    if mode == "lines":
        for line, text in jsonl.iter_text_lines(p, start, end, jsonl.count_lines(p, start) + 1):
            yield line, (Skip(p, line, text.field, text.reason, text.fix) if isinstance(text, jsonl.BadLine)
                         else readers.object_or_skip(p, line, text))
        return
    if mode == "files":
        rows = readers.file_rows(p, sources.source_kind(p), fields, ds.get("split", "train"))
    elif mode == "rows":
        rows = sources.iter_parquet(p, (start, end))
    else:
        b: dict = {}
        kind = sources.source_kind(p)
        rows = sources.iter_csv(p, "\t" if kind == "tsv" else ",", (fields["score"], fields["label"]),
                                (start, end, count_csv_lines(p, start) + 1), b)
        if bounds is not None:
            bounds.append([f, start, end, b])
    i = 0
    for i, obj in rows:
        yield i, (Skip(p, i, obj.field, obj.reason, obj.fix) if isinstance(obj, jsonl.BadLine) else obj)
    if mode == "files" and i == 0:
        raise readers._empty(p)


def _hf_rows(ds, p: str, start: int, end: int, multi: bool, f: int):
    data = sources.load_hf(p, ds.get("split", "train")).select(range(start, end))
    where = p  # named as readers.read_hf / readers.file_rows name it
    if ds.get("format", "auto") == "hf":
        where = f"{p}{'/' + ds['subset'] if ds.get('subset') else ''}[{ds.get('split', 'train')}]"
    for i, row in sources.iter_hf(data):
        line = start + i
        yield where, line, (f"{f}:{line}" if multi else str(line)), row


def count_csv_lines(path: str, end: int) -> int:
    """The lines that end in the first ``end`` bytes of an uncompressed file as the csv module counts them: at
    ``\\n``, ``\\r\\n`` and a lone ``\\r``."""
    n, left, prev = 0, end, b""
    with open(path, "rb") as f:
        while left > 0:
            chunk = f.read(min(left, 8 << 20))
            if not chunk:
                break
            n += chunk.count(b"\n") + chunk.count(b"\r") - chunk.count(b"\r\n")
            if prev == b"\r" and chunk[:1] == b"\n":
                n -= 1
            prev = chunk[-1:]
            left -= len(chunk)
    return n
