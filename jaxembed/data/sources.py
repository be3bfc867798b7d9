"""Where records come from: JSON Lines, Parquet and CSV / TSV files, Hugging Face ``datasets`` (a
``save_to_disk`` folder, a hub name or a folder of data files, optionally streamed) and TFDS -- each read row by
row, in bounded memory.

Every reader yields ``(line or row number from 1, dict or BadLine)``: a row that cannot be a record (a CSV line
with the wrong number of fields, ...) is a ``BadLine`` that costs one record, never the file. Column order is kept
(``dict`` order = the file's / the schema's column order), which the sentence-transformers row format relies on.

Which reader a path gets (``source_kind``): ``format='hf'`` / ``'tfds'`` name the source; otherwise the path does:
``.parquet`` -> Parquet (pyarrow), ``.csv`` / ``.tsv`` (also ``.gz`` / ``.bz2`` / ``.xz``) -> the csv module, a
folder written by ``datasets.save_to_disk`` -> ``datasets.load_from_disk``, anything else -> JSON Lines.

pyarrow and datasets are optional (``pip install 'jaxembed[hf]'``): asking for a source that needs one without it
is a one-line UserError naming the extra.
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path
from typing import Iterable, Iterator

from jaxembed.data import jsonl
from jaxembed.data.jsonl import BadLine, check_input_file
from jaxembed.errors import InputError, UserError

#: file kinds read by the path's suffix (compression suffixes aside)
PARQUET_SUFFIXES = (".parquet", ".pq")
CSV_SUFFIXES = (".csv",)
TSV_SUFFIXES = (".tsv",)
#: files that mark a ``datasets.save_to_disk`` folder (a Dataset, or a DatasetDict)
SAVED_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
HF_EXTRA = "pip install 'jaxembed[hf]'"
_BATCH = 1024  # rows per Arrow batch: bounded memory whatever the file size


def _bare_suffix(path) -> str:
    name = str(path).lower()
    for ext in (".gz", ".bz2", ".xz"):
        if name.endswith(ext):
            name = name[: -len(ext)]
    return Path(name).suffix


def is_saved_dataset(path) -> bool:
    """Whether ``path`` is a folder written by ``datasets.Dataset(Dict).save_to_disk``."""
    p = Path(path)
    if not p.is_dir():
        return False
    return (p / "dataset_dict.json").is_file() or ((p / "dataset_info.json").is_file() and (p / "state.json").is_file())


def source_kind(path, fmt: str = "auto") -> str:
    """'jsonl' | 'parquet' | 'csv' | 'tsv' | 'hf_disk' (a save_to_disk folder) | 'hf' (datasets.load_dataset: a
    hub name or a folder of data files) | 'tfds'."""
    if fmt == "tfds":
        return "tfds"
    if fmt == "hf":
        return "hf_disk" if is_saved_dataset(path) else "hf"
    if Path(path).is_dir():
        return "hf_disk" if is_saved_dataset(path) else "folder"
    suffix = _bare_suffix(path)
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    if suffix in CSV_SUFFIXES:
        return "csv"
    if suffix in TSV_SUFFIXES:
        return "tsv"
    return "jsonl"


def require(kind: str, path) -> None:
    """A UserError naming the extra when the package that ``kind`` needs is missing (parquet: pyarrow; hf, hf_disk:
    datasets)."""
    if kind == "parquet":
        _pyarrow_parquet(path)
    elif kind in ("hf", "hf_disk"):
        _datasets()


def plain(v):
    """numpy / Arrow / bytes values of a row as JSON-like Python values (bytes that are not UTF-8 stay bytes and
    are reported as a wrong type by the record parser)."""
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            return v
    if hasattr(v, "tolist"):  # numpy scalars and arrays
        return plain(v.tolist())
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    return v


# --------------------------------------------------------------------------------------------------- Parquet

def _pyarrow_parquet(path):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(f"{path}: reading Parquet needs pyarrow: {HF_EXTRA} (or pip install pyarrow)") from None
    return pq


def parquet_rows(path) -> int | None:
    """The number of rows of a Parquet file, from its footer (None when it cannot be read)."""
    pq = _pyarrow_parquet(path)
    try:
        return pq.ParquetFile(str(path)).metadata.num_rows
    except Exception:  # noqa: BLE001 -- reported by iter_parquet
        return None


def iter_parquet(path, row_groups: tuple[int, int] | None = None) -> Iterator[tuple[int, dict]]:
    """(row number from 1, row as a dict in column order) of a Parquet file, one Arrow batch at a time;
    ``row_groups``: only the row groups ``a`` .. ``b - 1`` (a part read by one process of a pod,
    ``jaxembed.data.split_plan``), their rows numbered as in the whole file."""
    pq = _pyarrow_parquet(path)
    check_input_file(path, "a .parquet file")
    try:
        f = pq.ParquetFile(str(path))
    except Exception as e:  # noqa: BLE001 -- a broken or non-Parquet file is the user's to fix
        raise InputError(path, None, f"not a readable Parquet file ({type(e).__name__}: {e})",
                         "check the file (an interrupted download?), or export it again") from None
    i, groups = 0, None
    if row_groups is not None:
        groups = list(range(*row_groups))
        i = sum(f.metadata.row_group(g).num_rows for g in range(row_groups[0]))
    try:
        for batch in f.iter_batches(batch_size=_BATCH, row_groups=groups):
            for row in batch.to_pylist():
                i += 1
                yield i, row
    except OSError as e:
        raise InputError(path, i + 1, f"the Parquet file is truncated or corrupt ({e})",
                         "download or export the file again") from None


# ------------------------------------------------------------------------------------------------------- CSV

_INT = re.compile(r"^[+-]?\d+$")


def _number(s: str):
    """A CSV cell as an int or a finite float when it is one, else the string."""
    t = s.strip()
    if _INT.match(t):
        return int(t)
    try:
        v = float(t)
    except ValueError:
        return s
    return v if math.isfinite(v) else s


class _LongLine(Exception):
    """Raised by ``_CsvLines`` for a line over the limit (the csv reader passes it on and starts afresh after)."""

    def __init__(self, line: int, bad: BadLine):
        super().__init__(bad.reason)
        self.line, self.bad = line, bad


class _CsvLines:
    """The decoded lines of a file, with their line ends, for ``csv.reader``: read by
    ``jaxembed.data.jsonl.iter_byte_lines``, so a line over ``MAX_LINE_BYTES`` is never held (it raises
    ``_LongLine``; the next line follows), a byte-order mark at the start is removed, and gzip / bzip2 / xz files
    are decompressed. A line ends at ``\\n``, ``\\r\\n`` or ``\\r`` (as the csv module reads). ``line``: the number of
    the last line returned or passed over; ``pos``: the byte offset after it in an uncompressed file read from
    ``start`` (None after a line over the limit, whose length is not kept)."""

    def __init__(self, path, start: int = 0, first_line: int = 1):
        self._raw = jsonl.iter_byte_lines(path, keep_ends=True, start=start, first_line=first_line)
        self._pending: list[bytes] = []
        self.line = first_line - 1
        self.pos: int | None = start
        if start == 0 and jsonl.is_plain_file(path):
            with open(path, "rb") as f:
                self.pos = 3 if f.read(3) == b"\xef\xbb\xbf" else 0  # the byte-order mark that is removed

    def __iter__(self):
        return self

    def __next__(self) -> str:
        while not self._pending:  # (a first line that is only a byte-order mark has no line left)
            _, raw = next(self._raw)
            if isinstance(raw, BadLine):
                self.line += 1
                self.pos = None
                raise _LongLine(self.line, raw)
            self._pending = raw.splitlines(keepends=True)[::-1]  # bytes: split at \n, \r\n and \r only
        self.line += 1
        raw = self._pending.pop()
        if self.pos is not None:
            self.pos += len(raw)
        return raw.decode("utf-8")  # a UnicodeDecodeError names self.line (iter_csv)

    def close(self) -> None:
        self._raw.close()


def csv_header(path, delimiter: str = ",") -> tuple[list[str], int]:
    """(the column names of a CSV / TSV file's header, the number of lines it takes); an InputError naming line 1
    when it cannot be one."""
    csv.field_size_limit(jsonl.MAX_LINE_BYTES)
    lines = _CsvLines(path)
    try:
        try:
            header = next(csv.reader(lines, delimiter=delimiter), None)
        except _LongLine as e:
            raise InputError(path, e.line, f"unreadable header ({e.bad.reason})",
                             "the first line must name the columns") from None
        except (csv.Error, UnicodeDecodeError) as e:
            raise InputError(path, 1, f"unreadable header ({e})", "the first line must name the columns") from None
        if header is None:
            raise InputError(path, None, "empty file: no header and no rows",
                             "check the file (an interrupted export?), or remove it from the dataset")
        header = [h.strip() for h in header]
        seen = set()
        for h in header:
            if not h:
                raise InputError(path, 1, "an empty column name in the header", "name every column")
            if h in seen:
                raise InputError(path, 1, f"column {h!r} appears twice in the header", "rename one of them")
            seen.add(h)
        return header, lines.line
    finally:
        lines.close()


def iter_csv(path, delimiter: str = ",", numeric: Iterable[str] = (), part: tuple | None = None,
             bounds: dict | None = None) -> Iterator[tuple[int, dict | BadLine]]:
    """(line number of the row's first line, row dict keyed by the header, or a BadLine) of a CSV / TSV file with
    a header line. Cells are strings; the columns named in ``numeric`` (scores, labels) are read as numbers when
    they are ones. A row with another number of fields than the header, or a line longer than
    ``jaxembed.data.jsonl.MAX_LINE_BYTES`` (never read into memory), is a BadLine. gzip / bzip2 / xz files are
    decompressed (``jaxembed.data.jsonl.open_binary``).

    ``part``: (start byte, end byte, number of the line at start) of an uncompressed file, both at line starts
    after the header: the rows that begin in these bytes (a part read by one process of a pod; the last may end
    after ``end``); ``bounds`` is then given where the first row began (``first``) and where reading stopped
    (``stop``: the end of the last row, None when unknown), for the merge to check that the parts meet."""
    numeric = set(numeric)
    header, header_lines = csv_header(path, delimiter)
    start, end, first_line = (0, None, 1) if part is None else part
    lines = _CsvLines(path, start, first_line)
    reader = csv.reader(lines, delimiter=delimiter)
    try:
        if not start:
            for _ in range(header_lines):
                next(lines)
        if bounds is not None:
            bounds.update(first=lines.pos, stop=lines.pos)
        yield from _csv_rows(path, lines, reader, header, numeric, end, bounds)
    finally:
        lines.close()


def _csv_rows(path, lines: _CsvLines, reader, header: list[str], numeric: set, end: int | None,
              bounds: dict | None) -> Iterator[tuple[int, dict | BadLine]]:
    while end is None or (lines.pos is not None and lines.pos < end):
        start = lines.line + 1
        try:
            row = next(reader)
        except StopIteration:
            break
        except _LongLine as e:  # the row it was part of is this one bad record; reading goes on after it
            yield e.line, e.bad
            continue
        except UnicodeDecodeError as e:
            raise InputError(path, lines.line, f"not valid UTF-8 ({e.reason})",
                             "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
        except csv.Error as e:
            raise InputError(path, start, f"unreadable CSV ({e})", "check the quoting of this row") from None
        finally:
            if bounds is not None:
                bounds["stop"] = lines.pos
        if not row:
            yield start, BadLine("empty line", "remove blank lines: each line is one row")
            continue
        if len(row) != len(header):
            yield start, BadLine(f"{len(row)} fields, the header has {len(header)}",
                                 "quote fields that contain the delimiter, or fix the row")
            continue
        yield start, {h: (_number(v) if h in numeric else v) for h, v in zip(header, row)}


# ------------------------------------------------------------------------------------------ Hugging Face datasets

def _datasets():
    try:
        import datasets
    except ImportError:
        raise UserError(f"format hf needs the Hugging Face datasets package: {HF_EXTRA} (or pip install "
                        "datasets)") from None
    return datasets


def load_hf(source, split: str = "train", subset: str | None = None, streaming: bool = False):
    """A ``datasets.Dataset`` (or ``IterableDataset`` when streaming) from a Dataset / DatasetDict object, a
    ``save_to_disk`` folder, or a name for ``datasets.load_dataset`` (a hub dataset, or a local folder of data
    files, read offline when ``HF_DATASETS_OFFLINE`` / ``HF_HUB_OFFLINE`` is set)."""
    datasets = _datasets()
    ds = source
    if isinstance(source, (str, Path)):
        try:
            if is_saved_dataset(source):
                ds = datasets.load_from_disk(str(source))
                if streaming and isinstance(ds, datasets.Dataset):
                    ds = ds.to_iterable_dataset()
            else:
                from jaxembed import hub  # the hub's timeouts and overall deadline (jaxembed.hub) for the dataset too

                ds = hub.call(f"{source}: loading the Hugging Face dataset", datasets.load_dataset, str(source),
                              subset, split=split, streaming=streaming)
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 -- any loading failure is the user's path / name / network
            msg = " ".join(str(e).split())[:300]
            raise UserError(f"{source}: cannot load the Hugging Face dataset ({type(e).__name__}: {msg}) (fix: "
                            "check the name, subset and split; offline, the dataset must be in the local Hugging "
                            "Face cache)") from None
    if isinstance(ds, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        if split not in ds:
            raise UserError(f"{source}: no split {split!r} (splits: {', '.join(ds)}) (fix: set split in the data "
                            "config)")
        ds = ds[split]
        if streaming and isinstance(ds, datasets.Dataset):
            ds = ds.to_iterable_dataset()
    if not isinstance(ds, (datasets.Dataset, datasets.IterableDataset)):
        raise UserError(f"{source}: expected a datasets.Dataset, got {type(ds).__name__}")
    return ds


def iter_hf(ds) -> Iterator[tuple[int, dict]]:
    """(row number from 1, row dict in column order) of a Dataset or IterableDataset, read in batches."""
    i = 0
    for batch in ds.iter(batch_size=_BATCH):
        cols = list(batch)
        n = len(batch[cols[0]]) if cols else 0
        for r in range(n):
            i += 1
            yield i, {c: plain(batch[c][r]) for c in cols}


def hf_rows(ds) -> int | None:
    """The number of rows of a Dataset (None for a streamed IterableDataset)."""
    try:
        return len(ds)
    except TypeError:
        return None


def open_tfds(name: str, split: str = "train", data_dir: str | None = None):
    """A TFDS random-access data source (``tensorflow_datasets`` is optional)."""
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise UserError(f"format tfds ({name}) needs TensorFlow Datasets: pip install jaxembed[tfds] "
                        "(or pip install tensorflow-datasets)") from None
    try:
        return tfds.data_source(name, split=split, data_dir=data_dir)
    except Exception as e:  # noqa: BLE001
        raise UserError(f"tfds {name}[{split}]: cannot open the data source ({type(e).__name__}: {e})") from None
