"""Reading JSON Lines and plain-text files record by record, with errors that name file, line and field."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Iterator

from jaxembed.errors import InputError


def _open(path: str):
    if path == "-":
        return sys.stdin
    p = Path(path)
    if not p.exists():
        raise InputError(path, None, "no such file", "check the path")
    if p.is_dir():
        raise InputError(path, None, "is a folder, not a file", "pass a .jsonl or .txt file")
    return open(p, encoding="utf-8", errors="strict", newline="")


def iter_lines(path: str) -> Iterator[tuple[int, str]]:
    """(line number from 1, line without its newline). A final empty line is not a record."""
    f = _open(path)
    try:
        for i, line in enumerate(f, 1):
            yield i, line.rstrip("\r\n")
    except UnicodeDecodeError as e:
        raise InputError(path, None, f"is not valid UTF-8 ({e.reason} at byte {e.start})",
                         "re-encode the file as UTF-8") from None
    finally:
        if f is not sys.stdin:
            f.close()


def iter_jsonl(path: str) -> Iterator[tuple[int, dict]]:
    """(line number, JSON object) for each line; malformed or non-object lines raise InputError."""
    for i, line in iter_lines(path):
        if not line.strip():
            raise InputError(path, i, "empty line", "remove blank lines: each line must be one JSON object")
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(path, i, f"invalid JSON ({e.msg} at column {e.colno})",
                             "each line must be one complete JSON object") from None
        if not isinstance(obj, dict):
            raise InputError(path, i, f"expected a JSON object, got {type(obj).__name__}",
                             'write one object per line, e.g. {"text": "..."}')
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
    if not v.strip():
        raise InputError(path, line, "empty text", "remove the record or give it text", field=field)
    return v


def read_texts(path: str, field: str = "text", fmt: str | None = None) -> list[str]:
    """Texts from a JSON Lines file (``field`` of each object) or a plain-text file (one text per line).

    fmt: 'jsonl' or 'text'; by default from the suffix (.jsonl / .json -> jsonl, else text)."""
    fmt = fmt or ("jsonl" if str(path).endswith((".jsonl", ".json")) else "text")
    if fmt == "jsonl":
        return [text_field(path, i, obj, field) for i, obj in iter_jsonl(path)]
    if fmt != "text":
        raise InputError(path, None, f"unknown input format {fmt!r}", "use 'jsonl' or 'text'")
    out = []
    for i, line in iter_lines(path):
        if not line.strip():
            raise InputError(path, i, "empty line", "each line is one text: remove blank lines")
        out.append(line)
    return out
