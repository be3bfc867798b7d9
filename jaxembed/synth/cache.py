"""The on-disk answer cache of the LLM jobs (``ResponseCache``, keyed by ``cache_key``): what makes a killed job,
run again, send no request for the answers it already has, and lets several jobs share one cache file."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Sequence

log = logging.getLogger(__name__)


class ResponseCache:
    """Answers on disk: an append-only JSON Lines file, one ``{"key": ..., "response": {...}}`` per line.

    Only the byte offset and length of each key's line are kept in memory. Several processes may share one file
    (two jobs on one cache directory): each record is appended by one ``write`` of the whole line under an
    exclusive lock on the file (``fcntl.flock``), so no line is ever interleaved or half-visible to a writer; a
    key missing in memory is looked up again in the lines other processes appended since, so an answer one
    process got is a cache hit for the other (and a key answered twice keeps its first answer). A line torn by a
    killed process (no final newline) is cut off under the lock, before the next record, and counted in
    ``torn``; an unreadable line in the middle (an old file) is skipped and counted."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._offsets: dict[str, tuple[int, int]] = {}
        self._scanned = 0  # bytes of complete lines read so far
        self.torn = 0
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        with self._lock, self._exclusive():
            self._scan(cut_torn=True)

    @contextlib.contextmanager
    def _exclusive(self):
        """The file lock (between processes; ``_lock`` is the one between this process's threads)."""
        import fcntl

        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _scan(self, cut_torn: bool = False) -> None:
        """Index the complete lines appended since the last scan. ``cut_torn`` (under the file lock): a last line
        without its newline can only be a killed writer's; cut it off."""
        size = os.fstat(self._fd).st_size
        if size < self._scanned:  # cut by another process (a torn line we had not indexed anyway)
            self._scanned = size
        data = os.pread(self._fd, size - self._scanned, self._scanned) if size > self._scanned else b""
        pos = 0
        while pos < len(data):
            nl = data.find(b"\n", pos)
            if nl < 0:
                if cut_torn:
                    self.torn += 1
                    log.warning("%s: cut off a torn record at byte %d (a killed run); the rest is kept", self.path,
                                self._scanned + pos)
                    os.ftruncate(self._fd, self._scanned + pos)
                break
            raw = data[pos:nl + 1]
            try:
                key = json.loads(raw)["key"]
                self._offsets.setdefault(key, (self._scanned + pos, len(raw)))
            except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
                self.torn += 1
                log.warning("%s: skipped an unreadable record at byte %d", self.path, self._scanned + pos)
            pos = nl + 1
        self._scanned += pos

    def _read(self, key: str) -> dict:
        off, n = self._offsets[key]
        return json.loads(os.pread(self._fd, n, off))["response"]

    def __len__(self) -> int:
        return len(self._offsets)

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def get(self, key: str) -> dict | None:
        with self._lock:
            if key not in self._offsets:
                self._scan()  # what other processes appended since
            return self._read(key) if key in self._offsets else None

    def put(self, key: str, response: dict, meta: dict | None = None) -> dict:
        """Append the answer unless the key has one (from this process or another); returns the stored one."""
        line = (json.dumps({"key": key, **(meta or {}), "response": response}, ensure_ascii=False) + "\n").encode()
        with self._lock, self._exclusive():
            self._scan(cut_torn=True)
            if key in self._offsets:
                return self._read(key)
            off = os.fstat(self._fd).st_size
            view = memoryview(line)
            while view:  # one write() in practice; a partial write is continued, still under the lock
                view = view[os.write(self._fd, view):]
            self._offsets[key] = (off, len(line))
            self._scanned = off + len(line)
        return response

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1



def cache_key(model: str, messages: Sequence[dict], params: dict, salt: str = "") -> str:
    """sha256 of the canonical JSON of (model, messages, sampling parameters, salt)."""
    blob = json.dumps({"model": model, "messages": list(messages), "params": params, "salt": salt},
                      sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()

