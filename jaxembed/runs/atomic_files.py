"""Files written whole: a reader sees the old file or the new one, never a part, on any file system that renames
atomically (local disks, NFS, Lustre), whichever process of a pod writes.

- ``unique_tmp(path)``: a temporary name beside ``path``, unique across hosts, processes and threads
  (``.{name}.tmp-{host}-{pid}-{random}``): two writers never share a temporary file, even when two containers
  give their processes the same pid.
- ``write_text`` / ``write_bytes`` / ``write_json`` / ``write_with``: write the temporary file, flush it to disk,
  ``os.replace`` it onto ``path``.
- ``atomic_dir(path)``: a folder written as a whole (an export, a dataset store): built under a temporary name,
  swapped into place; it replaces only a folder it wrote itself, unchanged since (its ``MANIFEST``;
  ``replace_refusal`` says why not).
- ``writing(what, path)`` / ``write_failed(what, path, error)``: the one-line UserError for a write that failed
  (disk full, no permission).

Which process writes a file, and how the others wait for it: jaxembed.pod.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

from jaxembed.errors import UserError



# ------------------------------------------------------------------------------------------------ writing

def unique_tmp(path: str | os.PathLike, suffix: str = "") -> Path:
    """A temporary name in ``path``'s folder: ``.{name}.tmp-{host}-{pid}-{random}{suffix}``."""
    p = Path(path)
    host = socket.gethostname().split(".")[0][:32] or "host"
    return p.with_name(f".{p.name}.tmp-{host}-{os.getpid()}-{uuid.uuid4().hex[:12]}{suffix}")


def write_with(path: str | os.PathLike, writer: Callable[[Path], Any], suffix: str = "") -> Path:
    """``writer(tmp)`` writes a temporary file, which then replaces ``path`` atomically (removed on failure).
    ``suffix``: an ending the writer needs (np.savez appends .npz to names without it)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = unique_tmp(p, suffix)
    try:
        writer(tmp)
        _fsync(tmp)
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return p


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return write_with(path, lambda t: t.write_bytes(data))


def write_text(path: str | os.PathLike, text: str) -> Path:
    return write_with(path, lambda t: t.write_text(text, encoding="utf-8"))


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    return write_text(path, json.dumps(obj, indent=2) + "\n")


def _fsync(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


#: The file that ``atomic_dir`` writes into each folder it completes: every file and folder it wrote, with each
#: file's size (and SHA-256 up to ``_HASHED_BYTES``). A folder is replaced only when it is such a folder, unchanged.
MANIFEST = "jaxembed_export.json"
_HASHED_BYTES = 32 << 20  # larger files (the weights) are compared by size: hashing them at every export costs


def _walk(folder: Path) -> tuple[dict[str, int], list[str]]:
    """({relative file path: size}, [relative folder paths]) of everything under ``folder`` (links not followed)."""
    files, dirs = {}, []
    for root, dnames, fnames in os.walk(folder, followlinks=False):
        r = Path(root)
        for d in dnames:
            dirs.append((r / d).relative_to(folder).as_posix())
        for f in fnames:
            p = r / f
            files[p.relative_to(folder).as_posix()] = p.lstat().st_size
    return files, sorted(dirs)


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(folder: Path, **info: Any) -> None:
    """Record every file and folder under ``folder`` in its ``MANIFEST`` (``info``: extra fields)."""
    files, dirs = _walk(folder)
    files.pop(MANIFEST, None)
    entries = {name: ({"size": size, "sha256": _sha256(folder / name)} if size <= _HASHED_BYTES else {"size": size})
               for name, size in sorted(files.items())}
    body = {"written_by": "jaxembed", **info, "files": entries, "folders": dirs}
    (folder / MANIFEST).write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")


#: what a folder of each kind that ``atomic_dir`` writes is called, and the files that mark one written without a
#: ``MANIFEST`` (by someone else, or by an older jaxembed)
KINDS = {"model": ("model folder", ("config.json", "modules.json")),
         "store": ("dataset store", ("manifest.json",))}


def replace_refusal(path: str | os.PathLike, kind: str = "model") -> str | None:
    """Why the existing ``path`` must not be replaced by a folder that ``atomic_dir`` writes, or None: it is absent,
    an empty folder, or a folder ``atomic_dir`` wrote whose files are all as it wrote them (its ``MANIFEST``).
    Anything else may hold a person's work: a file, a link, a folder of other files, a jaxembed folder with files
    added, removed or changed since. ``kind``: what the folder holds (``KINDS``), for the messages."""
    noun, markers = KINDS[kind]
    out = Path(path)
    if out.is_symlink():
        return "is a symbolic link"
    if not out.exists():
        return None
    if not out.is_dir():
        return "is a file"
    if not any(out.iterdir()):
        return None
    try:
        manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
        listed, folders = dict(manifest["files"]), set(manifest["folders"])
        wrote = manifest.get("kind", "model")  # exports written before kinds were recorded are models
    except FileNotFoundError:
        if any((out / m).exists() for m in markers):
            names = sorted(p.name for p in out.iterdir())
            shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            return f"holds files jaxembed did not write ({shown}; no {MANIFEST}: not a {noun} jaxembed wrote whole)"
        return f"exists and is not a {noun}"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"its {MANIFEST} is damaged, so what jaxembed wrote there is unknown"
    if wrote != kind:
        return f"exists and is not a {noun} (jaxembed wrote a {KINDS.get(wrote, (wrote,))[0]} there)"
    files, dirs = _walk(out)
    files.pop(MANIFEST, None)
    added = sorted(set(files) - set(listed)) + sorted(set(dirs) - folders)
    removed = sorted(set(listed) - set(files))
    changed = []
    for name in sorted(set(files) & set(listed)):
        want = listed[name] if isinstance(listed[name], dict) else {}
        if files[name] != want.get("size") or ("sha256" in want and _sha256(out / name) != want["sha256"]):
            changed.append(name)
    for what, names in (("files jaxembed did not write", added), ("files changed since jaxembed wrote them", changed),
                        ("files removed since jaxembed wrote them", removed)):
        if names:
            shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            return f"holds {what} ({shown})"
    return None


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, kind: str = "model", **info: Any) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``path``; on success its ``MANIFEST`` is written (``info``: extra
    fields) and it replaces ``path`` (an older folder there is moved aside first and then removed); on an error it
    is removed and ``path`` is left as it was.

    Only what ``replace_refusal`` allows is replaced (nothing, an empty folder, an unchanged earlier folder of
    ``atomic_dir``); anything else is a UserError, before the work and again right before the swap. ``kind``: what
    the folder holds (``KINDS``)."""
    out = Path(path)

    def check():
        why = replace_refusal(out, kind)
        if why is not None:
            raise UserError(f"{out}: {why}; it is not replaced and left as it is (fix: a new or empty output "
                            "folder, or move those files elsewhere first)")

    check()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = unique_tmp(out)
    tmp.mkdir()
    try:
        yield tmp
        write_manifest(tmp, kind=kind, **info)
        check()
        old = None
        if out.exists():
            old = unique_tmp(out, ".old")
            os.rename(out, old)
        os.rename(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_failed(what: str, path: str | os.PathLike, error: BaseException, fix: str = "") -> UserError:
    """The one-line error for a failed write: ``{path}: {what} failed: {reason} (fix: ...)``."""
    reason = describe_os_error(error)
    full = errno.ENOSPC in _errnos(error) or errno.EFBIG in _errnos(error) or errno.EDQUOT in _errnos(error)
    hint = "free space on that disk (or raise the quota / file-size limit)" if full else \
        "check that the folder is writable"
    return UserError(f"{path}: {what} failed: {reason} (fix: {hint}; then {fix or 'run the same command again'})")


@contextlib.contextmanager
def writing(what: str, path: str | os.PathLike, fix: str = "") -> Iterator[None]:
    """Turn a failed write inside (an OSError, or a library error that wraps one: disk full, file too large,
    no permission) into ``write_failed``'s one-line UserError. Other errors pass through."""
    try:
        yield
    except UserError:
        raise
    except Exception as e:
        if isinstance(e, OSError) or _errnos(e):
            raise write_failed(what, path, e, fix) from None
        raise


def _errnos(e: BaseException) -> set[int]:
    out, seen = set(), 0
    while e is not None and seen < 8:
        if isinstance(e, OSError) and e.errno is not None:
            out.add(e.errno)
        text = str(e)
        for code, words in ((errno.ENOSPC, "No space left"), (errno.EFBIG, "File too large"),
                            (errno.EDQUOT, "quota exceeded"), (errno.EACCES, "Permission denied"),
                            (errno.EROFS, "Read-only file system")):
            if words.lower() in text.lower():
                out.add(code)
        e = e.__cause__ or e.__context__
        seen += 1
    return out


def describe_os_error(e: BaseException) -> str:
    """One line for an error from a writer (OSError, or a library's wrapper around one)."""
    if isinstance(e, OSError) and e.strerror:
        return f"[Errno {e.errno}] {e.strerror}"
    codes = _errnos(e)
    for code in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EACCES, errno.EROFS):
        if code in codes:
            return f"[Errno {code}] {os.strerror(code)}"
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}" if text else type(e).__name__
