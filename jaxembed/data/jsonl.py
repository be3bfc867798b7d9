"""Reading JSON Lines and plain-text files record by record, with errors that name file, line and field.

The line reader is shared by every input path (``jaxembed data validate / prepare``, ``encode``, ``mine``, the
evaluation sets, the LLM data tools, pre-training):

- files are read as bytes and decoded line by line, so a bad byte costs one line, not the file, and the error names
  the line; a UTF-8 byte-order mark at the start is removed; CRLF line ends are accepted (a line ends at ``\\n``);
- gzip, bzip2 and xz files are read transparently (told by their first bytes, whatever the suffix); zstd, zip and
  UTF-16 files are a clear error;
- only regular files are read: a device (``/dev/zero``), a named pipe (FIFO, also ``<(cmd)``) or a socket is an
  error that says what the path is (such an input may never end, and a dataset is read more than once);
- a line longer than ``MAX_LINE_BYTES`` is not read into memory: it is reported (the rest of the file is read);
- a line that ``json.loads`` cannot turn into an object is reported with the reason, including what ``json``
  raises besides ``JSONDecodeError``: nesting too deep (``RecursionError``), an integer of more than 4300 digits
  (``ValueError``); a key that appears twice in one object is an error (JSON readers silently keep the last);
- a text with no content (``is_empty_text``: only whitespace, control, zero-width / format characters or byte-order
  marks, which tokenizers drop) is an "empty text".
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import re
import stat
import sys
import unicodedata
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

from jaxembed.errors import InputError

#: a line longer than this (bytes, after decompression) is reported, not read; a record this big is almost always a
#: file without line breaks (a JSON array or a pretty-printed document), not one record.
MAX_LINE_BYTES = 64 << 20

_MAGIC = ((b"\x1f\x8b", "gzip", gzip.open), (b"BZh", "bzip2", bz2.open), (b"\xfd7zXZ\x00", "xz", lzma.open))
_UNSUPPORTED = ((b"\x28\xb5\x2f\xfd", "zstd-compressed", "decompress it first: zstd -d FILE"),
                (b"PK\x03\x04", "a zip archive", "unzip it and pass the .jsonl file inside"),
                (b"\xff\xfe", "UTF-16 (little-endian byte-order mark), not UTF-8",
                 "re-encode it: iconv -f utf-16 -t utf-8 FILE > FILE.utf8"),
                (b"\xfe\xff", "UTF-16 (big-endian byte-order mark), not UTF-8",
                 "re-encode it: iconv -f utf-16 -t utf-8 FILE > FILE.utf8"))
_DECOMPRESS_ERRORS = (EOFError, OSError, zlib.error, lzma.LZMAError)


@dataclass(frozen=True)
class BadLine:
    """A line that is not a record: why, and how to fix it (``field``: the key at fault, if any)."""

    reason: str
    fix: str
    field: str | None = None


#: what a path that is not a regular file is (by ``stat.S_IFMT``), and the fix
_NOT_REGULAR = {
    stat.S_IFCHR: ("a character device", "pass a data file; a device such as /dev/zero or a terminal may never "
                                         "end"),
    stat.S_IFBLK: ("a block device", "pass a data file"),
    stat.S_IFIFO: ("a named pipe (FIFO)", "write the data to a file first (cmd > data.jsonl): a dataset is read "
                                          "more than once, a pipe only once; gzip, bzip2 and xz files are read as "
                                          "they are"),
    stat.S_IFSOCK: ("a socket", "pass a data file"),
}


def check_input_file(path, what: str = "a .jsonl file") -> Path:
    """``path`` as a Path; an InputError when it is missing, a folder, or not a regular file (a device, a named
    pipe, a socket: an input that may never end)."""
    p = Path(path)
    try:
        st = p.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise InputError(path, None, "no such file", "check the path") from None
    except OSError as e:
        raise InputError(path, None, f"cannot be read ({e.strerror})", "check the path and its permissions") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(path, None, "is a folder, not a file", f"pass {what}")
    if not stat.S_ISREG(st.st_mode):
        kind, fix = _NOT_REGULAR.get(stat.S_IFMT(st.st_mode), ("not a regular file", f"pass {what}"))
        raise InputError(path, None, f"is {kind}, not a regular file", fix)
    return p


def open_binary(path) -> BinaryIO:
    """The file's bytes, decompressed when it is gzip / bzip2 / xz; an InputError for missing files, folders and
    compressions we do not read."""
    p = check_input_file(path)
    try:
        with open(p, "rb") as f:
            head = f.read(6)
    except OSError as e:
        raise InputError(path, None, f"cannot be read ({e.strerror})", "check the file's permissions") from None
    for magic, what, fix in _UNSUPPORTED:
        if head.startswith(magic):
            raise InputError(path, None, f"is {what}", fix)
    for magic, _, opener in _MAGIC:
        if head.startswith(magic):
            return opener(p, "rb")
    return open(p, "rb")


def is_plain_file(path) -> bool:
    """Whether a regular file is read as it is (neither compressed nor UTF-16): a part of it can be read from a
    byte offset."""
    try:
        with open(check_input_file(path), "rb") as f:
            head = f.read(6)
    except (OSError, InputError):
        return False
    return not any(head.startswith(m[0]) for m in _MAGIC + _UNSUPPORTED)


def iter_byte_lines(path, max_line_bytes: int | None = None, keep_ends: bool = False, start: int = 0,
                    end: int | None = None, first_line: int = 1) -> Iterator[tuple[int, bytes | BadLine]]:
    """(line number from 1, line bytes without the line end (``keep_ends``: with it), or a BadLine for a line over
    ``max_line_bytes``, whose bytes are counted and passed over, never held). A final newline does not start
    another record. A truncated or corrupt compressed file is an InputError naming the line where it breaks.

    ``start`` / ``end``: only the lines of these bytes of an uncompressed file, both at line starts (a part of a
    file read by one process of a pod, ``jaxembed.data.store_split``); ``first_line``: the number of the line at
    ``start`` (the lines before it, counted by ``count_lines``)."""
    limit = MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes
    f = open_binary(path)
    i, pos = first_line - 1, start
    if start:
        f.seek(start)
    try:
        while end is None or pos < end:
            try:
                raw = f.readline(limit + 1)
            except _DECOMPRESS_ERRORS as e:
                raise InputError(path, i + 1, f"the compressed file is truncated or corrupt ({e})",
                                 "download or compress the file again") from None
            if not raw:
                break
            i += 1
            pos += len(raw)
            if len(raw) > limit and not raw.endswith(b"\n"):
                n = len(raw)
                while True:  # skip the rest of the line without holding it
                    try:
                        chunk = f.readline(1 << 20)
                    except _DECOMPRESS_ERRORS as e:
                        raise InputError(path, i, f"the compressed file is truncated or corrupt ({e})",
                                         "download or compress the file again") from None
                    n += len(chunk)
                    pos += len(chunk)
                    if not chunk or chunk.endswith(b"\n"):
                        break
                yield i, BadLine(f"line of {n:,} bytes is longer than the limit of {limit:,} bytes",
                                 "one record per line: is the file a JSON array or a pretty-printed document? "
                                 "(or raise jaxembed.data.jsonl.MAX_LINE_BYTES)")
                continue
            if not keep_ends:
                if raw.endswith(b"\n"):
                    raw = raw[:-1]
                if raw.endswith(b"\r"):
                    raw = raw[:-1]
            if i == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            yield i, raw
    finally:
        f.close()


def decode_line(raw: bytes) -> str | BadLine:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return BadLine(f"not valid UTF-8 ({e.reason} at byte {e.start} of the line)",
                       "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)")


def iter_text_lines(path, start: int = 0, end: int | None = None, first_line: int = 1
                    ) -> Iterator[tuple[int, str | BadLine]]:
    """(line number, decoded line, or a BadLine: not UTF-8, too long); ``start`` / ``end`` / ``first_line``: a part
    of the file (``iter_byte_lines``)."""
    for i, raw in iter_byte_lines(path, start=start, end=end, first_line=first_line):
        yield i, raw if isinstance(raw, BadLine) else decode_line(raw)


def count_lines(path, end: int) -> int:
    """The lines that end in the first ``end`` bytes of an uncompressed file (its ``\\n`` bytes): the number of
    the line at byte ``end`` (a line start) is this plus one."""
    n, left = 0, end
    with open(path, "rb") as f:
        while left > 0:
            chunk = f.read(min(left, 8 << 20))
            if not chunk:
                break
            n += chunk.count(b"\n")
            left -= len(chunk)
    return n


def next_line_start(path, offset: int) -> int:
    """The first line start at or after byte ``offset`` of an uncompressed file (its size when there is none)."""
    if offset <= 0:
        return 0
    with open(path, "rb") as f:
        f.seek(offset - 1)
        pos = offset - 1
        while True:
            chunk = f.read(1 << 16)
            if not chunk:
                return pos
            k = chunk.find(b"\n")
            if k >= 0:
                return pos + k + 1
            pos += len(chunk)


#: characters a tokenizer drops besides whitespace: control characters (NUL, ...) and format characters (zero-width
#: space U+200B, joiners U+200C / U+200D, word joiner U+2060, soft hyphen U+00AD, byte-order mark U+FEFF, ...)
_NO_CONTENT_CATEGORIES = ("Cc", "Cf")
EMPTY_TEXT_FIX = "remove the record or give it text"
_NAMES = {"\x00": "NUL", "\ufeff": "BYTE ORDER MARK"}  # names unicodedata lacks or gives otherwise


def is_empty_text(text: str) -> bool:
    """Whether ``text`` has no content once whitespace, control and format (zero-width, byte-order mark)
    characters are dropped, as tokenizers drop them: it would be encoded as the special tokens alone."""
    s = text.strip()
    if not s:
        return True
    if " " < s[0] < "\x7f":  # printable ASCII: content (the common case, decided by one character)
        return False
    return all(c.isspace() or unicodedata.category(c) in _NO_CONTENT_CATEGORIES for c in s)


def empty_text(text: str, what: str = "empty text") -> str | None:
    """The reason ``text`` is refused when it has no content (``is_empty_text``): ``what`` for whitespace only,
    ``what`` with the invisible characters named in parentheses otherwise (the reason is counted without them);
    None for a text with content."""
    if not is_empty_text(text):
        return None
    seen = sorted({c for c in text if not c.isspace()})
    if not seen:
        return what
    names = ", ".join(f"U+{ord(c):04X} {_NAMES.get(c) or unicodedata.name(c, '')}".rstrip()
                      for c in seen[:3]) + (", ..." if len(seen) > 3 else "")
    also = " and whitespace" if any(c.isspace() for c in text) else ""
    return f"{what} (no content: only {names}{also})"


class _DuplicateKey(Exception):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _no_duplicate_keys(pairs: list) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(k)
            seen.add(k)
    return d


#: the end of a key token: an unescaped or escaped quote, blanks, a colon. Every key of the line matches (a match
#: inside a string needs an escaped quote before a colon, which only makes the check below take the slow path).
_KEY_END = re.compile(r'"\s*:')


def _loads(line: str):
    """json.loads that raises _DuplicateKey for a key twice in one object. Fast path: the plain C parser, accepted
    when the line has exactly as many key ends as the parsed top-level object has keys (a duplicate key, or any
    nested object, makes the count differ: then the line is parsed again with a checking hook)."""
    obj = json.loads(line)
    if isinstance(obj, dict) and len(_KEY_END.findall(line)) == len(obj):
        return obj
    return json.loads(line, object_pairs_hook=_no_duplicate_keys)


def parse_object(line: str, line_no: int = 0) -> dict | BadLine:
    """One JSON Lines record as a dict, or a BadLine saying why it is not one (never raises on bad text)."""
    if not line.strip():
        return BadLine("empty line", "remove blank lines: each line must be one JSON object")
    try:
        obj = _loads(line)
    except _DuplicateKey as e:
        return BadLine("appears twice in the record (JSON readers silently keep the last)",
                       "keep one of the two values", field=e.key)
    except json.JSONDecodeError as e:
        if line_no == 1 and line.strip() in ("[", "{"):
            return BadLine(f"invalid JSON ({e.msg} at column {e.colno}): the file looks like one JSON document, "
                           "not JSON Lines", "write one object per line, e.g. jq -c '.[]' FILE.json > FILE.jsonl")
        return BadLine(f"invalid JSON ({e.msg} at column {e.colno})", "each line must be one complete JSON object")
    except RecursionError:
        return BadLine("invalid JSON (nested too deeply to parse: more than ~1000 levels of [ or {)",
                       "each line must be one flat JSON object of texts")
    except ValueError as e:  # e.g. an integer of more than sys.get_int_max_str_digits() digits
        msg = str(e).split(";")[0]
        if "digits" in msg:
            msg = f"an integer of more than {sys.get_int_max_str_digits()} digits"
        return BadLine(f"invalid JSON ({msg})", "write very long numbers as strings, or remove them")
    if not isinstance(obj, dict):
        kind = {"list": "list", "str": "string", "NoneType": "null", "bool": "boolean"}.get(type(obj).__name__,
                                                                                            type(obj).__name__)
        return BadLine(f"expected a JSON object, got {kind}", 'write one object per line, e.g. {"text": "..."}')
    return obj


def _error(path, line: int, bad: BadLine) -> InputError:
    return InputError(path, line, bad.reason, bad.fix, field=bad.field)


def iter_lines(path: str) -> Iterator[tuple[int, str]]:
    """(line number from 1, line without its line end); ``-`` reads standard input. A bad line (not UTF-8, too
    long) raises an InputError naming it."""
    if path == "-":
        limit = MAX_LINE_BYTES
        i = 0
        while True:
            line = sys.stdin.readline(limit + 1)  # at most the limit (in characters) is held
            if not line:
                return
            i += 1
            if len(line) > limit and not line.endswith("\n"):
                raise InputError(path, i, f"line longer than the limit of {limit:,} characters",
                                 "one text per line (or raise jaxembed.data.jsonl.MAX_LINE_BYTES)")
            yield i, line.rstrip("\r\n")
    for i, line in iter_text_lines(path):
        if isinstance(line, BadLine):
            raise _error(path, i, line)
        yield i, line


def iter_jsonl(path: str) -> Iterator[tuple[int, dict]]:
    """(line number, JSON object) for each line; a line that is not one JSON object raises an InputError."""
    for i, line in iter_lines(path):
        obj = parse_object(line, i)
        if isinstance(obj, BadLine):
            raise _error(path, i, obj)
        yield i, obj


def text_field(path: str, line: int, obj: dict, field: str) -> str:
    """obj[field] as a non-empty string, else an InputError naming file, line and field."""
    if field not in obj:
        keys = ", ".join(sorted(obj)) or "none"
        raise InputError(path, line, f"missing (keys present: {keys})", "add the field or choose it with --field",
                         field=field)
    v = obj[field]
    if not isinstance(v, str):
        raise InputError(path, line, f"expected a string, got {type(v).__name__}", "store the text as a string",
                         field=field)
    empty = empty_text(v)
    if empty:
        raise InputError(path, line, empty, EMPTY_TEXT_FIX, field=field)
    return v


def read_texts(path: str, field: str = "text", fmt: str | None = None) -> list[str]:
    """Texts from a JSON Lines file (``field`` of each object) or a plain-text file (one text per line).

    fmt: 'jsonl' or 'text'; by default from the suffix (.jsonl / .json, also + .gz / .bz2 / .xz -> jsonl, else
    text)."""
    return list(iter_texts(path, field, fmt))


def iter_texts(path: str, field: str = "text", fmt: str | None = None) -> Iterator[str]:
    """``read_texts`` one text at a time, read as they are asked for (the file is never held whole)."""
    name = str(path)
    for ext in (".gz", ".bz2", ".xz"):
        name = name[: -len(ext)] if name.endswith(ext) else name
    fmt = fmt or ("jsonl" if name.endswith((".jsonl", ".json")) else "text")
    if path != "-":
        check_input_file(path, "a .jsonl or .txt file")
    if fmt == "jsonl":
        return (text_field(path, i, obj, field) for i, obj in iter_jsonl(path))
    if fmt != "text":
        raise InputError(path, None, f"unknown input format {fmt!r}", "use 'jsonl' or 'text'")
    return _plain_texts(path)


def _plain_texts(path: str) -> Iterator[str]:
    for i, line in iter_lines(path):
        empty = empty_text(line, "empty line")
        if empty:
            raise InputError(path, i, empty, "each line is one text: remove blank lines")
        yield line
