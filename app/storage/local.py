"""Local-directory backend (the embedded default).

Objects are files under ``root``; a write goes to ``root/.tmp/<uuid>`` and is renamed into place
only when complete (rename is atomic on one file system), so readers never see partial files.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import uuid
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import BinaryIO

from app.storage.base import (
    HashingCounter,
    ObjectInfo,
    ObjectNotFound,
    Sink,
    Storage,
    StorageError,
    StoredObject,
)
from app.storage.keys import check_relative_path

READ_CHUNK = 1024 * 1024


class LocalStorage(Storage):
    name = "local"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.tmp_dir = root / ".tmp"
        self.tmp_dir.mkdir(parents=True, exist_ok=True)

    def path_for(self, key: str) -> Path:
        problem = check_relative_path(key.rstrip("/")) if key else "empty key"
        if problem:
            raise ObjectNotFound(f"invalid key {key!r}: {problem}")
        return self.root / key

    def _temp_path(self) -> Path:
        return self.tmp_dir / uuid.uuid4().hex

    async def put_stream(
        self,
        key: str,
        chunks: AsyncIterable[bytes],
        *,
        max_size: int | None = None,
        expected_sha256: str | None = None,
    ) -> StoredObject:
        final = self.path_for(key)
        tmp = self._temp_path()
        counter = HashingCounter(max_size)
        fh = await asyncio.to_thread(open, tmp, "wb")
        try:
            async for chunk in chunks:
                counter.update(chunk)
                await asyncio.to_thread(fh.write, chunk)
            await asyncio.to_thread(fh.close)
            counter.verify(expected_sha256)
            await asyncio.to_thread(_publish, tmp, final)
        except BaseException:
            fh.close()
            tmp.unlink(missing_ok=True)
            raise
        return StoredObject(key=key, size=counter.size, sha256=counter.sha256)

    async def stat(self, key: str) -> ObjectInfo:
        path = self.path_for(key)
        try:
            st = await asyncio.to_thread(os.stat, path)
        except FileNotFoundError as exc:
            raise ObjectNotFound(key) from exc
        return ObjectInfo(key=key, size=st.st_size, etag=f"{st.st_mtime_ns:x}-{st.st_size:x}")

    async def read(
        self, key: str, *, offset: int = 0, length: int | None = None
    ) -> AsyncIterator[bytes]:
        path = self.path_for(key)
        try:
            fh = await asyncio.to_thread(open, path, "rb")
        except FileNotFoundError as exc:
            raise ObjectNotFound(key) from exc
        try:
            await asyncio.to_thread(fh.seek, offset)
            remaining = length
            while remaining is None or remaining > 0:
                want = READ_CHUNK if remaining is None else min(READ_CHUNK, remaining)
                chunk = await asyncio.to_thread(fh.read, want)
                if not chunk:
                    break
                if remaining is not None:
                    remaining -= len(chunk)
                yield chunk
        finally:
            fh.close()

    async def delete(self, key: str) -> None:
        await asyncio.to_thread(self.path_for(key).unlink, missing_ok=True)

    async def delete_prefix(self, prefix: str) -> int:
        target = self.path_for(prefix)
        return await asyncio.to_thread(_remove_tree, target)

    async def list(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        base = self.path_for(prefix) if prefix else self.root
        entries = await asyncio.to_thread(_walk, self.root, base)
        for info in entries:
            yield info

    async def check(self) -> None:
        probe = self.tmp_dir / f"probe-{uuid.uuid4().hex}"
        try:
            await asyncio.to_thread(probe.write_bytes, b"ok")
            await asyncio.to_thread(probe.unlink)
        except OSError as exc:
            raise StorageError(f"local storage at {self.root} is not writable: {exc}") from exc

    def open_sink(self, key: str) -> LocalSink:
        return LocalSink(self._temp_path(), self.path_for(key), key)

    def open_source(self, key: str) -> BinaryIO:
        try:
            return open(self.path_for(key), "rb")  # noqa: SIM115 - caller closes
        except FileNotFoundError as exc:
            raise ObjectNotFound(key) from exc


class LocalSink(Sink):
    def __init__(self, tmp: Path, final: Path, key: str) -> None:
        self._tmp = tmp
        self._final = final
        self._key = key
        self._fh: BinaryIO | None = open(tmp, "w+b")  # noqa: SIM115 - closed in commit/abort

    def _file(self) -> BinaryIO:
        if self._fh is None:
            raise ValueError("sink is closed")
        return self._fh

    def write(self, data: bytes | bytearray | memoryview) -> int:
        return self._file().write(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._file().seek(offset, whence)

    def tell(self) -> int:
        return self._file().tell()

    def fileno(self) -> int:
        return self._file().fileno()

    def flush(self) -> None:
        self._file().flush()

    def commit(self) -> StoredObject:
        fh = self._file()
        fh.flush()
        # The serializer patched earlier bytes after writing later ones, so hash the final file
        # (it is in the page cache: this costs a memory pass, not a disk read).
        fh.seek(0)
        digest = hashlib.sha256()
        size = 0
        while chunk := fh.read(8 * READ_CHUNK):
            digest.update(chunk)
            size += len(chunk)
        os.fsync(fh.fileno())
        fh.close()
        self._fh = None
        _publish(self._tmp, self._final)
        return StoredObject(key=self._key, size=size, sha256=digest.hexdigest())

    def abort(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        self._tmp.unlink(missing_ok=True)


def _publish(tmp: Path, final: Path) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, final)


def _remove_tree(target: Path) -> int:
    if target.is_file():
        target.unlink(missing_ok=True)
        return 1
    if not target.exists():
        return 0
    count = sum(1 for p in target.rglob("*") if p.is_file())
    shutil.rmtree(target, ignore_errors=True)
    return count


def _walk(root: Path, base: Path) -> list[ObjectInfo]:
    if base.is_file():
        candidates = [base]
    elif base.is_dir():
        candidates = [p for p in base.rglob("*") if p.is_file()]
    else:
        candidates = []
    infos = []
    for path in sorted(candidates):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(".tmp/"):
            continue
        infos.append(ObjectInfo(key=rel, size=path.stat().st_size))
    return infos
