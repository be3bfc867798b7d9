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
- ``hf_files``: a local folder of Parquet data files given with ``format='hf'`` (the hub's Parquet export, a
  downloaded snapshot): runs of row groups of the files ``datasets.load_dataset`` reads for the split
  (``hf_data_files``), rows numbered from 1 over the files, as the whole dataset;
- ``files``: any other dataset of several files (compressed files, mixed kinds): whole files, each part a run of
  them, as many parts as files at most.

The first part is smaller than the others (``targets``, ``MERGE_SHARE``): its process merges all of them after.

A single compressed file, a hub name, a data-file folder with a dataset card, script or subset, or of other files
than Parquet (``datasets.load_dataset`` decides the files, their split and their rows), TFDS, and classification
records whose labels are first collected from the whole dataset are read whole by one process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

from jaxembed.data import config as dc
from jaxembed.data import jsonl, readers, sources
from jaxembed.data.readers import FORMAT_TABLE, Skip, detect_format, read_options
from jaxembed.errors import UserError


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


#: why a dataset whose files raise an error while being looked at is read whole
_UNREADABLE = "a file that cannot be read in parts (the whole read names what is wrong)"


def split_mode(ds) -> tuple[str | None, str]:
    """(how dataset ``ds`` is cut, "") or (None, why it is read whole); reads file heads and footers only, and
    never raises for the data (the whole read reports it)."""
    try:
        return _split_mode(ds)
    except (UserError, OSError):
        return None, _UNREADABLE


def _split_mode(ds) -> tuple[str | None, str]:
    paths = [str(p) for p in dc.dataset_paths(ds)]
    fmt = ds.get("format", "auto")
    if fmt == "tfds":
        return None, "a TFDS source"
    if fmt == "hf":
        if len(paths) == 1 and sources.is_saved_dataset(paths[0]):
            return "hf", ""
        files, why = hf_data_files(ds)
        return ("hf_files", "") if files else (None, why)
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


#: files of a data-file folder that may make ``datasets.load_dataset`` choose its files otherwise than by their names
_HF_CONFIG_FILES = ("README.md", "dataset_infos.json", "dataset_info.json")


def hf_data_files(ds) -> tuple[list[str] | None, str]:
    """(the Parquet files, in order, that ``datasets.load_dataset`` reads for the split of a local folder of data
    files given with ``format='hf'``, "") or (None, why it is read whole): the files as datasets resolves them
    (``get_data_patterns``), for a folder without a dataset card, script or subset, whose files are all Parquet (the
    rows datasets makes of JSON Lines or CSV files, their types unified over the file, differ from the files')."""
    path = str(dc.dataset_paths(ds)[0])
    whole = "a Hugging Face hub name (datasets.load_dataset decides its files, split and column types)"
    if not os.path.isdir(path):
        return None, whole
    if ds.get("subset") or any(os.path.exists(os.path.join(path, n)) for n in _HF_CONFIG_FILES) or any(
            n.endswith(".py") for n in os.listdir(path)):
        return None, "a data-file folder with a dataset card, a script or a subset (datasets.load_dataset reads it)"
    try:
        from datasets.data_files import DataFilesDict, get_data_patterns

        files = DataFilesDict.from_patterns(get_data_patterns(path), base_path=path).get(ds.get("split", "train"))
    except Exception:  # noqa: BLE001 -- no data files, no such split, no datasets package: the whole read says so
        return None, "a data-file folder whose files datasets cannot resolve for the split"
    files = [str(f) for f in files or ()]
    if not files or not all(f.lower().endswith(sources.PARQUET_SUFFIXES) for f in files):
        return None, ("a data-file folder of other files than Parquet (datasets.load_dataset makes their rows: give "
                      "the files as the dataset's paths, without format='hf', to read them in parts)")
    return files, ""


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
    try:
        fmt = opts.format if opts.format != "auto" else _first_format(ds, mode, opts.fields)
    except (UserError, OSError):  # an empty first file of whole files, ...: the whole read names it
        return None, _UNREADABLE
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


def _first_format(ds, mode: str, fields: dict) -> str | None:
    """The record format ``read_records`` detects: from the dataset's first object (triplets without one), read as
    ``mode`` cuts the dataset."""
    whole = Part(0, 0, 1, mode=mode)
    for _, _, _, obj in part_records(ds, replace_segments(ds, whole), None):
        if isinstance(obj, dict):
            return detect_format(obj, fields)
    return "triplets"


# ------------------------------------------------------------------------------------------------ cutting

def replace_segments(ds, part: Part) -> Part:
    """``part`` standing for the whole dataset (one segment per file)."""
    paths = _files(ds, part.mode)
    if part.mode == "hf":
        return _cut_rows(ds, part.dataset, 1, part.record_format)[0]
    if part.mode in ("rows", "hf_files"):
        return _cut_groups(paths, part.dataset, 1, part.record_format, part.mode)[0]
    segs = tuple((f, 0, _path_bytes(p)) for f, p in enumerate(paths))
    return Part(part.dataset, 0, 1, part.record_format, segs, part.mode, sum(s[2] for s in segs))


def _files(ds, mode: str | None) -> list[str]:
    """The files a dataset's parts index: its paths, or the Parquet files of a data-file folder (``hf_files``)."""
    if mode == "hf_files":
        return hf_data_files(ds)[0] or []
    return [str(p) for p in dc.dataset_paths(ds)]


def parts(ds, i: int, n: int, fmt: str) -> list[Part]:
    """Dataset ``i`` cut into ``n`` parts (fewer for whole files: one per file at most) of about equal input
    bytes (a part may be empty)."""
    mode = split_mode(ds)[0]
    paths = _files(ds, mode)
    if mode in ("rows", "hf_files"):
        return _cut_groups(paths, i, n, fmt, mode)
    if mode == "hf":
        return _cut_rows(ds, i, n, fmt)
    sizes = [_path_bytes(p) for p in paths]
    if mode == "files":
        return _cut_units(i, n if n <= len(paths) else len(paths), fmt, mode,
                          [((f, 0, s), s) for f, s in enumerate(sizes)])
    return _cut_bytes(paths, sizes, i, n, fmt, mode)


#: the merge's CPU time as a share of reading the whole dataset (benchmarks/prepare_pod.py, 4 processes: JSON
#: Lines ~0.2, Parquet ~0.28): the process of the first part merges all of them, so its part is smaller by that
MERGE_SHARE = 0.25


def targets(total: int, n: int) -> list[int]:
    """Where ``n`` parts of ``total`` (bytes, rows) start: the first part ``total * (1 - MERGE_SHARE * (n - 1)) /
    n`` (at least 0), the others equal, so that every process has about the same work with the merge counted."""
    first = max(0.0, total * (1 - MERGE_SHARE * (n - 1)) / n) if n > 1 else total
    rest = (total - first) / max(n - 1, 1)
    return [0] + [int(first + (r - 1) * rest) for r in range(1, n)]


def _merge_cost(total: int, n: int) -> int:
    """What the merge adds to the first part's process (``Part.size``, by which ``store_pod.plan`` deals)."""
    return int(total * MERGE_SHARE) if n > 1 else 0


def _cut_bytes(paths, sizes, i: int, n: int, fmt: str, mode: str) -> list[Part]:
    """Byte ranges of the files in order, each cut at the line start at or after its target (``targets``)."""
    offsets = [sum(sizes[:f]) for f in range(len(paths))]
    total = sum(sizes)
    cuts = [0]
    for target in targets(total, n)[1:]:
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
        out.append(Part(i, r, n, fmt, tuple(segs), mode,
                        cuts[r + 1] - cuts[r] + (_merge_cost(total, n) if r == 0 else 0)))
    return out


def _cut_units(i: int, n: int, fmt: str, mode: str, units: list[tuple[tuple, int]]) -> list[Part]:
    """``units`` (segment, bytes), in order, dealt into ``n`` runs by where each starts (``targets``); adjacent
    segments of one file in a run are joined."""
    total, acc, out = sum(b for _, b in units), 0, [[] for _ in range(n)]
    starts = targets(total, n)
    for seg, b in units:
        r = max(k for k in range(n) if starts[k] <= acc)
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
        parts.append(Part(i, r, n, fmt, tuple(segs), mode,
                          sum(b for _, b in run) + (_merge_cost(total, n) if r == 0 else 0)))
    return parts


def _cut_groups(paths, i: int, n: int, fmt: str, mode: str = "rows") -> list[Part]:
    """Runs of the Parquet files' row groups, in order, by their compressed bytes."""
    sources.require("parquet", paths[0])
    import pyarrow.parquet as pq

    units = []
    for f, p in enumerate(paths):
        meta = pq.ParquetFile(p).metadata
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            size = sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
            units.append(((f, g, g + 1), max(1, size)))
    return _cut_units(i, n, fmt, mode, units)


def _cut_rows(ds, i: int, n: int, fmt: str) -> list[Part]:
    """Ranges of rows of a save_to_disk Dataset, cut at ``targets``."""
    path = str(dc.dataset_paths(ds)[0])
    rows = len(sources.load_hf(path, ds.get("split", "train")))
    size = _path_bytes(path)
    cuts = targets(rows, n) + [rows]
    return [Part(i, r, n, fmt, ((0, cuts[r], cuts[r + 1]),) if cuts[r] < cuts[r + 1] else (), "hf",
                 size * (cuts[r + 1] - cuts[r]) // max(rows, 1) + (_merge_cost(size, n) if r == 0 else 0))
            for r in range(n)]


# ------------------------------------------------------------------------------------------------ reading a part

def part_records(ds, part: Part, bounds: list | None) -> Iterator[tuple[str, int, str, dict | Skip]]:
    """(path, line / row, default-id suffix, object or Skip) of a part, as ``readers.read_files`` /
    ``readers.read_hf`` yield them for the whole dataset; ``bounds`` (``csv``): gets each segment's [file, start,
    end, {first row's start, stop}] (``jaxembed.data.sources.iter_csv``)."""
    paths = _files(ds, part.mode)
    multi = len(paths) > 1
    fields = read_options(ds).fields
    for f, start, end in part.segments:
        p = paths[f]
        if part.mode == "hf":
            yield from _hf_rows(ds, p, start, end, multi, f)
            continue
        if part.mode == "hf_files":
            yield from _hf_file_rows(ds, paths, f, start, end)
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
        raise readers.empty_file(p)


def _hf_where(ds) -> str:
    """A ``format='hf'`` dataset's rows' source, as ``readers.read_hf`` names it."""
    subset = ds.get("subset")
    return f"{dc.dataset_paths(ds)[0]}{'/' + subset if subset else ''}[{ds.get('split', 'train')}]"


def _hf_file_rows(ds, paths: list[str], f: int, start: int, end: int):
    """The rows of row groups ``start`` .. ``end - 1`` of a data-file folder's Parquet file ``f``, numbered over
    the folder's files from 1, as ``datasets.load_dataset`` reads them."""
    before = sum(sources.parquet_rows(p) or 0 for p in paths[:f])
    where = _hf_where(ds)
    for i, row in sources.iter_parquet(paths[f], (start, end)):
        yield where, before + i, str(before + i), {k: sources.plain(v) for k, v in row.items()}  # as iter_hf


def _hf_rows(ds, p: str, start: int, end: int, multi: bool, f: int):
    data = sources.load_hf(p, ds.get("split", "train")).select(range(start, end))
    where = _hf_where(ds) if ds.get("format", "auto") == "hf" else p  # as readers.read_hf / file_rows name it
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
