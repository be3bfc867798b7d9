"""One run at a time in a run directory: ``WorkdirLock``, a lock that dies with its process."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import sys
import time

from jaxembed.errors import UserError
from jaxembed.runs.atomic_files import describe_os_error
from jaxembed.runs.rundir import NAMES, RunDir, rundir

log = logging.getLogger(__name__)


class WorkdirLock:
    """One run at a time in a run directory: an exclusive ``flock`` on ``<workdir>/run.lock``, held from the first
    write of the run to its end. The kernel releases it when its process ends, however it ends (kill -9
    included), so a stopped run never blocks the next; a second run started while the first holds it is refused
    in one line naming the first (pid, host, start, command: the lock file's content). Released, the file is
    removed, and so is the run directory when the lock created it and nothing else was written.

    A pod takes it on process 0 only (``acquire`` inside ``main_first``): the pod is one run. On a file system
    without ``flock`` (some Lustre / NFS mounts), runs go on unlocked, with a warning."""

    NAME = NAMES["lock"]

    def __init__(self, workdir: str | os.PathLike | RunDir):
        rd = rundir(workdir)
        self.workdir = rd.root
        self.path = rd.lock
        self._fd: int | None = None
        self._made_dir = False

    def acquire(self) -> None:
        if self._fd is not None:
            return
        self._made_dir = not self.workdir.exists()
        self.workdir.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = self._holder(fd)
                os.close(fd)
                self._undo_dir()
                raise UserError(f"{self.workdir}: another run is writing this run directory ({holder}) (fix: wait for "
                                "it to end or stop it, or use another --workdir)") from None
            except OSError as e:
                os.close(fd)
                log.warning("%s: the file system does not lock files (%s); two runs started "
                                                    "on this run directory would not be refused", self.path,
                                                    describe_os_error(e))
                return
            try:  # the holder before may have removed the file between our open and our lock: lock the new one
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        started = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime())
        host = socket.gethostname()
        info = {"pid": os.getpid(), "host": host, "started": started, "command": " ".join(sys.argv) or "python"}
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(info) + "\n").encode())
        self._fd = fd

    @staticmethod
    def _holder(fd: int) -> str:
        try:
            info = json.loads(os.pread(fd, 65536, 0).decode("utf-8", "replace") or "{}")
            cmd = " ".join(str(info.get("command", "")).split())
            cmd = cmd if len(cmd) <= 160 else cmd[:157] + "..."
            return f"pid {info['pid']} on {info['host']}, started {info['started']}: {cmd}"
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return "its lock file holds no details"

    def _undo_dir(self) -> None:
        if self._made_dir:
            with contextlib.suppress(OSError):
                self.workdir.rmdir()  # only when empty

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            with contextlib.suppress(OSError):
                if os.path.samestat(os.fstat(fd), os.stat(self.path)):
                    os.unlink(self.path)
        finally:
            os.close(fd)  # releases the lock
        self._undo_dir()

    def __enter__(self) -> "WorkdirLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
