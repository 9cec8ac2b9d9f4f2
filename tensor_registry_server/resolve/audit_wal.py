"""A local write-ahead file for the write-behind resolve audit (issue 36 §5).

Every resolve row is appended here (one ``write(2)``, a JSON line) before the answer leaves the
process, and dropped once its batch is committed. What this survives:

* ``kill -9`` (or an OOM kill) of the replica: nothing is lost. A finished ``write`` sits in the
  kernel's page cache, which outlives the process; the next start of a replica sharing the
  folder — or a running one, within ``sweep_seconds`` — finds the dead owner's segments (its lock
  file is no longer ``flock``-ed) and writes their rows. Ids are assigned when the row is queued,
  so a row the dead replica had already committed is skipped, never duplicated.
* a crash of the whole host (power loss): at most the rows of one flush interval, because each
  flush rotates the segment and ``fsync``s the closed one before its rows go to the database.

Layout: ``<folder>/<owner>.lock`` (held with ``flock`` for the owner's life) and
``<folder>/<owner>.<seq>.wal`` segments.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

log = logging.getLogger("tensor_registry.resolve.audit")

Row = tuple[Any, ...]
_encode = json.JSONEncoder(separators=(",", ":"), default=str).encode


class AuditWal:
    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.owner = uuid.uuid4().hex
        self._lock_fd = os.open(folder / f"{self.owner}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._seq = 0
        self._fd = self._open(0)
        self._closed: list[Path] = []

    def _path(self, seq: int) -> Path:
        return self.folder / f"{self.owner}.{seq:08d}.wal"

    def _open(self, seq: int) -> int:
        return os.open(self._path(seq), os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)

    def append(self, row: Row) -> None:
        """One write(2) of one line: a process killed after this returns loses nothing."""
        os.write(self._fd, (_encode(row) + "\n").encode())

    def rotate(self) -> int:
        """Start a new segment; returns the closed one's fd (to fsync and close off the loop).

        Called synchronously with taking the queue's snapshot, so the closed segments hold
        exactly the rows of that snapshot or earlier ones."""
        old_fd = self._fd
        self._closed.append(self._path(self._seq))
        self._seq += 1
        self._fd = self._open(self._seq)
        return old_fd

    def committed(self, upto: int) -> None:
        """Every row of the first ``upto`` closed segments is in the database: drop them."""
        done, self._closed = self._closed[:upto], self._closed[upto:]
        for path in done:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    @property
    def closed_segments(self) -> int:
        return len(self._closed)

    def close(self, *, keep: bool) -> None:
        """keep=False: everything was written, remove our files; keep=True leaves them for the
        next replica to replay."""
        os.close(self._fd)
        if not keep:
            self.committed(len(self._closed))
            with contextlib.suppress(FileNotFoundError):
                self._path(self._seq).unlink()
            with contextlib.suppress(FileNotFoundError):
                (self.folder / f"{self.owner}.lock").unlink()
        os.close(self._lock_fd)

    def orphans(self) -> list[tuple[str, int, list[Path]]]:
        """Owners that are gone (their lock is free): (owner, lock fd we now hold, segments).

        The caller replays the segments, then calls ``release_orphan``."""
        found = []
        for lock in sorted(self.folder.glob("*.lock")):
            owner = lock.stem
            if owner == self.owner:
                continue
            try:
                fd = os.open(lock, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)  # alive
                continue
            found.append((owner, fd, sorted(self.folder.glob(f"{owner}.*.wal"))))
        return found

    def release_orphan(self, owner: str, fd: int, segments: list[Path]) -> None:
        for path in segments:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        with contextlib.suppress(FileNotFoundError):
            (self.folder / f"{owner}.lock").unlink()
        os.close(fd)


def read_segment(path: Path) -> list[Row]:
    """The rows of one segment; a torn last line (the process died inside write) is skipped."""
    rows: list[Row] = []
    with path.open("rb") as fh:
        for line in fh:
            try:
                raw = json.loads(line)
                rows.append(
                    (
                        uuid.UUID(raw[0]),
                        datetime.fromisoformat(raw[1]),
                        raw[2],
                        uuid.UUID(raw[3]) if raw[3] else None,
                        *raw[4:],
                    )
                )
            except (ValueError, IndexError, TypeError):
                log.warning("audit wal %s: skipped a torn line", path.name)
    return rows
