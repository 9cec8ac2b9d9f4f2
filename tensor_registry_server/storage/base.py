"""The one storage interface. Backends: local directory, S3, Redis (see their modules).

Writes are atomic: an object becomes visible under its key only when it is complete, so a crash
or an aborted upload leaves nothing half-written under a real key (at most an orphan under
``tmp/`` that the sweep removes). sha256 is computed while bytes stream through.
"""

from __future__ import annotations

import io
from abc import ABC, abstractmethod
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO


class StorageError(Exception):
    """A backend failed (unreachable, refused, out of space)."""


class ObjectNotFound(StorageError):
    pass


class ObjectTooLarge(StorageError):
    pass


class ChecksumMismatch(StorageError):
    def __init__(self, expected: str, actual: str) -> None:
        super().__init__(f"sha256 mismatch: expected {expected}, got {actual}")
        self.expected = expected
        self.actual = actual


@dataclass(frozen=True)
class StoredObject:
    key: str
    size: int
    sha256: str


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    etag: str | None = None
    # When the object was last written (the sweep's grace period is measured from it).
    modified: datetime | None = None


class Storage(ABC):
    """Async API for the API process; ``open_sink``/``open_source`` are sync, for workers."""

    name: str

    @abstractmethod
    async def put_stream(
        self,
        key: str,
        chunks: AsyncIterable[bytes],
        *,
        max_size: int | None = None,
        expected_sha256: str | None = None,
    ) -> StoredObject:
        """Store ``chunks`` under ``key`` atomically, hashing on the fly.

        Raises ObjectTooLarge past ``max_size`` and ChecksumMismatch when the bytes do not hash
        to ``expected_sha256``; in both cases nothing is published under ``key``.
        """

    @abstractmethod
    async def stat(self, key: str) -> ObjectInfo:
        """Size and etag of ``key``; raises ObjectNotFound."""

    @abstractmethod
    def read(self, key: str, *, offset: int = 0, length: int | None = None) -> AsyncIterator[bytes]:
        """Stream ``length`` bytes (or to the end) of ``key`` from ``offset``."""

    @abstractmethod
    async def delete(self, key: str) -> None:
        """Remove ``key``; no error when it does not exist."""

    @abstractmethod
    async def delete_prefix(self, prefix: str) -> int:
        """Remove every object under ``prefix``; returns how many."""

    @abstractmethod
    def list(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        """Every object under ``prefix``."""

    @abstractmethod
    async def check(self) -> None:
        """Raise StorageError unless the backend is reachable and writable."""

    async def read_bytes(self, key: str, *, offset: int = 0, length: int | None = None) -> bytes:
        parts = [chunk async for chunk in self.read(key, offset=offset, length=length)]
        return b"".join(parts)

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release clients and pools."""

    async def download_url(self, key: str, ttl: int) -> str | None:
        """A URL that serves ``key`` without the registry (presigned GET), or None.

        None means: use the registry's own signed blob URL (``/api/v1/blobs/...``).
        """
        return None

    def tensorizer_uri(self, key: str) -> str | None:
        """A URI that tensorizer's ``open_stream`` reads natively (``redis://``), or None."""
        return None

    def local_path(self, key: str) -> Path | None:
        """The file holding ``key`` when the backend is a local directory (zero-copy serving)."""
        return None

    async def purge_temp(self, older_than: datetime) -> int:
        """Remove backend-private leftovers of interrupted writes older than ``older_than``.

        Temp files, unfinished multipart uploads, half-written chunk sets: whatever a crash can
        leave that ``list`` does not show. Returns how many were removed.
        """
        return 0

    # Sync side, used by workers (torch and tensorizer are synchronous).
    @abstractmethod
    def open_sink(self, key: str) -> Sink:
        """A seekable, writable binary file object that publishes ``key`` on ``commit()``."""

    @abstractmethod
    def open_source(self, key: str) -> BinaryIO:
        """A readable, seekable binary file object over ``key``."""


class Sink(ABC):
    """Writable, seekable target; nothing is visible under the key before ``commit``."""

    @abstractmethod
    def write(self, data: bytes | bytearray | memoryview) -> int: ...

    @abstractmethod
    def seek(self, offset: int, whence: int = 0) -> int: ...

    @abstractmethod
    def tell(self) -> int: ...

    @abstractmethod
    def commit(self) -> StoredObject:
        """Finish the object and make it visible under its key; returns size and sha256."""

    @abstractmethod
    def abort(self) -> None:
        """Drop everything written; idempotent."""

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def flush(self) -> None:
        return None

    def __enter__(self) -> Sink:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is not None:
            self.abort()


class SeekableSource(io.RawIOBase):
    """Read-only, seekable file object over a remote object of known ``size``.

    Subclasses set ``size`` and ``_position`` and implement ``readinto`` (one ranged read)."""

    size: int
    _position: int

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._position = seek_position(offset, whence, current=self._position, size=self.size)
        return self._position


def seek_position(offset: int, whence: int, *, current: int, size: int) -> int:
    """The absolute position a ``seek(offset, whence)`` lands on; negative ones are refused."""
    if whence == io.SEEK_SET:
        position = offset
    elif whence == io.SEEK_CUR:
        position = current + offset
    elif whence == io.SEEK_END:
        position = size + offset
    else:
        raise ValueError(f"bad whence {whence}")
    if position < 0:
        raise ValueError("negative seek position")
    return position
