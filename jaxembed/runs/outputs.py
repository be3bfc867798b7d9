"""Output paths checked before any work: a command that would fail to write its result after minutes of reading,
encoding or training fails at once instead, with one line naming the path and the fix.

``check_output(path, kind, flag)`` refuses, as a UserError:
- a path under a file (``--out data.jsonl/store``: 'data.jsonl' is a file, not a folder);
- a file output that is an existing folder, a folder output that is an existing file;
- a path whose nearest existing folder cannot be written (permissions, read-only file system), probed by creating
  and removing a uniquely named empty file there (``os.access`` is not enough: root passes it on read-only mounts);
- an existing file output that cannot be overwritten.

``check_cli_outputs(args)`` applies it to every output flag of the parsed ``jaxembed`` command line
(``OUTPUTS``), so commands whose modules do not check their own outputs still fail before any work.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

from jaxembed.errors import UserError

FILE, FOLDER = "file", "folder"


def _nearest_existing(p: Path) -> tuple[Path, Path | None]:
    """(the nearest ancestor of the absolute path ``p`` that exists, or ``p`` itself; the first component of ``p``
    that is an existing file with more components below it, or None)."""
    cur = Path(p.parts[0])
    for part in p.parts[1:]:
        nxt = cur / part
        try:
            exists = nxt.exists()
        except OSError:
            exists = False
        if not exists:
            return cur, None
        if nxt != p and not nxt.is_dir():
            return cur, nxt
        cur = nxt
    return cur, None


def check_output(path, kind: str = FILE, flag: str = "--out", suffix: str | tuple[str, ...] | None = None) -> Path:
    """Check that ``path`` can be written as a ``kind`` ('file' or 'folder'); -> ``path`` as a Path.

    suffix: a file output must end with it (e.g. '.npy')."""
    if kind not in (FILE, FOLDER):
        raise ValueError(f"kind must be {FILE!r} or {FOLDER!r}, got {kind!r}")
    if path is None or str(path) == "":
        raise UserError(f"{flag}: empty path (fix: give a {kind} path)")
    p = Path(os.path.expanduser(str(path)))
    if suffix is not None:
        sfx = (suffix,) if isinstance(suffix, str) else tuple(suffix)
        if not str(p).endswith(sfx):
            raise UserError(f"{flag} {path}: must end in {' or '.join(sfx)} (fix: e.g. {p.name}{sfx[0]})")
    ap = Path(os.path.abspath(p))
    base, blocker = _nearest_existing(ap)
    if blocker is not None:
        raise UserError(f"{flag} {path}: {blocker} is a file, not a folder (fix: choose a path outside it, e.g. "
                        f"{blocker.parent / (blocker.stem + '_out')}/{ap.name})")
    if base == ap:  # the output itself exists
        if kind == FILE and ap.is_dir():
            raise UserError(f"{flag} {path}: is a folder (fix: give a file path, e.g. {p / ('out' + _sfx(suffix))})")
        if kind == FOLDER and not ap.is_dir():
            raise UserError(f"{flag} {path}: is a file (fix: give a folder path, or remove the file)")
        if kind == FILE:
            if not os.access(ap, os.W_OK):
                raise UserError(f"{flag} {path}: the file exists and cannot be overwritten (fix: check its "
                                "permissions or choose another path)")
            base = ap.parent
    _probe(base, flag, path)
    return p


def _sfx(suffix) -> str:
    if suffix is None:
        return ""
    return suffix if isinstance(suffix, str) else suffix[0]


def _probe(folder: Path, flag: str, path) -> None:
    """Create and remove an empty file in ``folder``; a UserError when that fails."""
    try:
        fd, name = tempfile.mkstemp(prefix=".jaxembed-write-check-", dir=folder)
    except OSError as e:
        why = e.strerror or type(e).__name__
        raise UserError(f"{flag} {path}: cannot write in {folder} ({why}) (fix: choose a writable location, or "
                        "fix the folder's permissions)") from None
    os.close(fd)
    try:
        os.unlink(name)
    except OSError:
        pass


# ------------------------------------------------------------------------------------------ the command line

def _eval_out(args):
    if getattr(args, "list", False) or args.out is None:
        return []
    return [("out", FOLDER if getattr(args, "mteb", None) is not None else FILE, None)]


def _mine_report(args):
    return [("report", FILE, None)] if getattr(args, "report", None) else []


#: (command, sub-command or None) -> output flags: a list of (attribute, kind, suffix), or a function of the
#: parsed arguments giving that list. Attributes that are None (optional flags not given) are skipped.
OUTPUTS: dict[tuple[str, str | None], list | Callable] = {
    ("encode", None): [("out", FILE, ".npy")],
    ("export", None): [("out", FOLDER, None)],
    ("train", None): [("workdir", FOLDER, None)],
    ("demo", None): [("workdir", FOLDER, None)],
    ("data", "prepare"): [("out", FOLDER, None)],
    ("plan", "build"): [("out", FILE, ".npz")],
    ("plan", "show"): [("png", FILE, None)],
    ("eval", None): _eval_out,
    ("score", None): [("out", FOLDER, None)],
    ("curriculum", None): [("out", FOLDER, None)],
    ("mine", None): lambda a: [("out", FILE, None)] + _mine_report(a),
    ("judge", None): [("out", FILE, None)],
    ("synth", "personas"): [("out", FOLDER, None)],
    ("pretrain", "retromae"): [("workdir", FOLDER, None)],
}


def outputs_of(args) -> list[tuple[str, str, str, str | None]]:
    """(flag, path, kind, suffix) of every output named on a parsed ``jaxembed`` command line."""
    cmd = getattr(args, "command", None)
    sub = None
    for attr in ("data_command", "plan_command", "synth_command", "pretrain_command"):
        sub = sub or getattr(args, attr, None)
    spec = OUTPUTS.get((cmd, sub))
    if spec is None:
        return []
    items = spec(args) if callable(spec) else spec
    out = []
    for attr, kind, suffix in items:
        v = getattr(args, attr, None)
        if v is not None:
            out.append(("--" + attr.replace("_", "-"), str(v), kind, suffix))
    return out


def check_cli_outputs(args) -> None:
    """Check every output path of a parsed ``jaxembed`` command line (see ``OUTPUTS``) before the command runs."""
    for flag, path, kind, suffix in outputs_of(args):
        check_output(path, kind, flag, suffix)
