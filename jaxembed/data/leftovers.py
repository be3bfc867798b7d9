"""The temporary folders a killed ``jaxembed data prepare`` or ``jaxembed export`` leaves beside its output, and
their removal.

``atomic_dir`` here builds a store (``write_store``) or an export in ``.{name}.tmp-{host}-{pid}-{random}`` beside
the output folder (``jaxembed.runs.atomic_files.unique_tmp``) and renames it into place; an older folder is first moved
to such a name ending in ``.old``, then removed. A writer killed before it is done (kill -9, out of memory, a lost
machine) leaves its folder behind. ``remove_dead(out)``, called when a store or an export is written, removes the
ones whose writer is certainly gone:

- the host in the name is this host: a folder of another host (another process of a pod, on a shared file
  system) is never touched, whatever its pid;
- no process of this pid runs here (a zombie, killed but not yet waited for, counts as gone);
- no process holds the folder's lock: every writer holds a shared ``flock`` on its folder while it writes
  (``hold``), which guards a live writer whose pid this process cannot see (another container that shares the
  host's name but not its process ids).

Other names (older ones without a host, any other file) are left alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Iterator

from jaxembed.runs import atomic_files

try:
    import fcntl
except ImportError:  # not POSIX: no locks; the host and pid decide
    fcntl = None

log = logging.getLogger(__name__)

#: what follows ``.{name}.tmp-{host}-`` in a temporary name: pid, random hex, and ``.old`` for a replaced store
_REST = re.compile(r"^(\d+)-[0-9a-f]+(\.old)?$")


def hold(folder: Path) -> int | None:
    """A shared lock on ``folder`` for as long as this process writes it (``release`` it, or it ends with the
    process); None where the file system has no locks."""
    if fcntl is None:
        return None
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def release(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def _this_host_prefix(out: Path) -> str:
    """``.{name}.tmp-{host}-`` of this host: a fresh temporary name of ``out`` without its pid and random part."""
    name = atomic_files.unique_tmp(out).name
    return name[: name.rindex("-", 0, name.rindex("-"))] + "-"


def _running(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (in doubt: True)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process (EPERM), or no way to tell
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in (b"Z", b"X")  # a zombie or a dead process has ended


def _locked(folder: Path) -> bool:
    """Whether a process holds ``folder``'s lock (``hold``); False where that cannot be told."""
    if fcntl is None:
        return False
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing drops the lock this call took
    return False


def remove_dead(out: Path, who: str = "data prepare") -> list[str]:
    """Remove the temporary folders of ``out`` left by writers of this host that are gone (see the module
    docstring); one log line names them (``who``: the command that writes ``out``). Returns their names."""
    out = Path(out)
    if not out.parent.is_dir():
        return []
    prefix = _this_host_prefix(out)
    removed = []
    for entry in sorted(out.parent.iterdir()):
        if not entry.name.startswith(prefix):
            continue
        m = _REST.match(entry.name[len(prefix):])
        if m is None or entry.is_symlink() or not entry.is_dir():
            continue
        if _running(int(m.group(1))) or _locked(entry):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        if not entry.exists():
            removed.append(entry.name)
    if removed:
        log.warning("%s: removed %d temporary folder%s left by %s processes of this host that are no "
                    "longer running: %s", os.path.abspath(out.parent), len(removed), "s" if len(removed) != 1 else "",
                    who, ", ".join(removed))
    return removed


@contextlib.contextmanager
def atomic_dir(out: str | os.PathLike, who: str = "export", **kw: Any) -> Iterator[Path]:
    """``jaxembed.runs.atomic_files.atomic_dir(out, **kw)`` (a folder written whole), under this module's rule: its
    temporary folder is locked while written (``hold``), and the ones that killed writers left beside ``out`` are
    removed (``remove_dead``) once the write is allowed."""
    with atomic_files.atomic_dir(out, **kw) as tmp:
        lock = hold(tmp)
        try:
            remove_dead(Path(out), who)
            yield tmp
        finally:
            release(lock)
