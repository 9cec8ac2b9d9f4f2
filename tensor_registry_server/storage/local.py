"""Local-directory backend (the embedded default).

Objects are files under ``root``; a write goes to ``root/.tmp/<uuid>`` and is renamed into place
only when complete (rename is atomic on one file system), so readers never see partial files.

Uploads: request chunks are gathered, without copying them, into batches of a few MiB; each batch
goes to two lanes of worker threads, one hashing and one writing (hashlib and os.write release
the GIL), while the event loop receives the next batches. SHA-256 is the slowest step (about
1.2 GB/s on one core of the dev box), so the hash lane takes its next batch the moment it is done
with one, without waiting for the event loop. At most MAX_BATCHES_IN_FLIGHT batches are held,
whatever the file size.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import stat
import threading
import uuid
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import BinaryIO

from tensor_registry_server.storage.base import (
    ChecksumMismatch,
    ObjectInfo,
    ObjectNotFound,
    ObjectTooLarge,
    Sink,
    Storage,
    StorageError,
    StoredObject,
)
from tensor_registry_server.storage.object_keys import check_relative_path

READ_CHUNK = 1024 * 1024
# Measured (bench/serving/upload.py --batch-sweep, 1 MiB request chunks): 4-32 MiB batches all run
# at SHA-256 speed, 1 MiB ones pay a lane hop per chunk; 4 MiB keeps the memory per upload small.
WRITE_BATCH = 4 * 1024 * 1024
# Batches received but not yet both hashed and written: the bound on one upload's buffers.
MAX_BATCHES_IN_FLIGHT = 4
# Start writeback every this many bytes, so that the fsync before publishing is short.
SYNC_EVERY = 64 * 1024 * 1024
TEMP_DIR = ".tmp"
# Stored bytes are served only through signed URLs: nobody else on the host reads them.
PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700


class LocalStorage(Storage):
    name = "local"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.tmp_dir = root / TEMP_DIR
        self.tmp_dir.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)

    def path_for(self, key: str) -> Path:
        problem = check_relative_path(key.rstrip("/")) if key else "empty key"
        if problem:
            raise ObjectNotFound(f"invalid key {key!r}: {problem}")
        return self.root / key

    def local_path(self, key: str) -> Path:
        return self.path_for(key)

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
        writer = _BatchWriter(await asyncio.to_thread(_create, tmp))
        size = 0
        batch: list[bytes] = []
        batched = 0
        try:
            async for chunk in chunks:
                size += len(chunk)
                if max_size is not None and size > max_size:
                    raise ObjectTooLarge(f"more than {max_size} bytes")
                # Chunks are kept, not copied, until the threads are done with them: only a
                # mutable buffer (which its producer may refill) is copied.
                batch.append(chunk if isinstance(chunk, bytes) else bytes(chunk))
                batched += len(chunk)
                if batched >= WRITE_BATCH:
                    await writer.submit(batch)
                    batch, batched = [], 0
            if batch:
                await writer.submit(batch)
            digest = await writer.finish()
            if expected_sha256 is not None and expected_sha256.lower() != digest:
                raise ChecksumMismatch(expected_sha256.lower(), digest)
            await asyncio.to_thread(_publish, tmp, final)
        except BaseException:
            # Cancellation (the client went away) lands here too: never leave the temp file.
            await _shielded(writer.abort())
            tmp.unlink(missing_ok=True)
            raise
        return StoredObject(key=key, size=size, sha256=digest)

    async def stat(self, key: str) -> ObjectInfo:
        path = self.path_for(key)
        try:
            st = await asyncio.to_thread(os.stat, path)
        except FileNotFoundError as exc:
            raise ObjectNotFound(key) from exc
        if not _is_regular(st.st_mode):
            raise ObjectNotFound(key)
        return _info(key, st)

    async def read(
        self, key: str, *, offset: int = 0, length: int | None = None
    ) -> AsyncIterator[bytes]:
        path = self.path_for(key)
        try:
            fd = await asyncio.to_thread(os.open, path, os.O_RDONLY)
        except (FileNotFoundError, IsADirectoryError) as exc:
            raise ObjectNotFound(key) from exc
        try:
            position = offset
            remaining = length
            while remaining is None or remaining > 0:
                want = READ_CHUNK if remaining is None else min(READ_CHUNK, remaining)
                chunk = await asyncio.to_thread(os.pread, fd, want, position)
                if not chunk:
                    break
                position += len(chunk)
                if remaining is not None:
                    remaining -= len(chunk)
                yield chunk
        finally:
            os.close(fd)

    async def delete(self, key: str) -> None:
        await asyncio.to_thread(_unlink_and_prune, self.root, self.path_for(key))

    async def delete_prefix(self, prefix: str) -> int:
        target = self.path_for(prefix)
        return await asyncio.to_thread(_remove_tree, self.root, target)

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

    async def purge_temp(self, older_than: datetime) -> int:
        return await asyncio.to_thread(_purge_dir, self.tmp_dir, older_than.timestamp())

    def open_sink(self, key: str) -> LocalSink:
        return LocalSink(self._temp_path(), self.path_for(key), key)

    def open_source(self, key: str) -> BinaryIO:
        try:
            return open(self.path_for(key), "rb")
        except (FileNotFoundError, IsADirectoryError) as exc:
            raise ObjectNotFound(key) from exc


# Worker threads for upload batches: an upload's hash lane and write lane run on two of them.
_EXECUTOR = ThreadPoolExecutor(max_workers=8, thread_name_prefix="local-storage")


class _Lane:
    """Runs calls one after another, in submission order, on the shared pool.

    The next call starts in the same thread as soon as the previous one ends: the hash lane never
    idles waiting for the event loop to wake up and hand it the next batch.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: deque[tuple[Future[None], Callable[[], None]]] = deque()
        self._draining = False

    def run(self, call: Callable[[], None]) -> Future[None]:
        future: Future[None] = Future()
        with self._lock:
            self._queue.append((future, call))
            if self._draining:
                return future
            self._draining = True
        try:
            _EXECUTOR.submit(self._drain)
        except BaseException:
            with self._lock:
                self._queue.pop()
                self._draining = False
            raise
        return future

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._draining = False
                    return
                future, call = self._queue.popleft()
            if not future.set_running_or_notify_cancel():
                continue  # cancelled by an abort before it started
            try:
                call()
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(None)


class _BatchWriter:
    """Hashes and writes batches in two lanes while the caller gathers the next batches.

    Durability: the file is fsynced before it is published (a 201 promises bytes that survive a
    crash). To keep that final fsync short, writeback is started every SYNC_EVERY bytes by an
    fdatasync in the background, overlapping the disk with the network.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._hash = hashlib.sha256()
        self._hashing = _Lane()
        self._writing = _Lane()
        # Per batch in flight: its hash, its write, its size.
        self._inflight: deque[tuple[Future[None], Future[None], int]] = deque()
        self._syncing: Future[None] | None = None
        self._unsynced = 0

    async def submit(self, batch: list[bytes]) -> None:
        while len(self._inflight) >= MAX_BATCHES_IN_FLIGHT:
            await self._retire_oldest()
        # Nobody mutates the batch from here on: the caller starts a new list, and the chunks
        # are immutable bytes.
        hashed = self._hashing.run(partial(_hash_all, self._hash.update, batch))
        written = self._writing.run(partial(_write_chunks, self._fd, batch))
        self._inflight.append((hashed, written, sum(len(chunk) for chunk in batch)))

    async def _retire_oldest(self) -> None:
        hashed, written, size = self._inflight[0]
        await asyncio.wrap_future(hashed)
        await asyncio.wrap_future(written)
        self._inflight.popleft()
        self._unsynced += size
        if self._unsynced >= SYNC_EVERY and (self._syncing is None or self._syncing.done()):
            if self._syncing is not None:
                self._syncing.result()
            self._syncing = _EXECUTOR.submit(os.fdatasync, self._fd)
            self._unsynced = 0

    async def finish(self) -> str:
        while self._inflight:
            await self._retire_oldest()
        if self._syncing is not None:
            await asyncio.wrap_future(self._syncing)
            self._syncing = None
        fd, self._fd = self._fd, -1
        await asyncio.to_thread(_sync_and_close, fd)
        return self._hash.hexdigest()

    async def abort(self) -> None:
        # The threads may still hold the fd (the awaiting task was cancelled, the threads were
        # not): drop the batches they have not started, wait for the rest, then close it.
        pending: list[Future[None]] = [f for h, w, _ in self._inflight for f in (h, w)]
        if self._syncing is not None:
            pending.append(self._syncing)
        for future in pending:
            future.cancel()
        if pending:
            await asyncio.to_thread(wait_futures, pending)
        self._inflight.clear()
        self._syncing = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _hash_all(update: Callable[[bytes], None], batch: list[bytes]) -> None:
    for chunk in batch:
        update(chunk)


def _write_chunks(fd: int, batch: list[bytes]) -> None:
    for chunk in batch:
        _write_all(fd, chunk)


def _sync_and_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def _shielded(step: Awaitable[None]) -> None:
    task = asyncio.ensure_future(step)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise


class LocalSink(Sink):
    def __init__(self, tmp: Path, final: Path, key: str) -> None:
        self._tmp = tmp
        self._final = final
        self._key = key
        self._fh: BinaryIO | None = open(  # noqa: SIM115 - closed in commit/abort
            tmp, "w+b", opener=lambda path, flags: os.open(path, flags, PRIVATE_FILE_MODE)
        )

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


def _create(path: Path) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    return os.open(path, flags, PRIVATE_FILE_MODE)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _publish(tmp: Path, final: Path) -> None:
    final.parent.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    os.replace(tmp, final)


def _is_regular(mode: int) -> bool:
    return stat.S_ISREG(mode)


def _info(key: str, st: os.stat_result) -> ObjectInfo:
    return ObjectInfo(
        key=key,
        size=st.st_size,
        etag=f"{st.st_mtime_ns:x}-{st.st_size:x}",
        modified=datetime.fromtimestamp(st.st_mtime, UTC),
    )


def _unlink_and_prune(root: Path, path: Path) -> None:
    path.unlink(missing_ok=True)
    _prune_empty_parents(root, path.parent)


def _prune_empty_parents(root: Path, folder: Path) -> None:
    """Remove now-empty folders up to (not including) the root; stop at the first non-empty."""
    while folder != root and root in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


def _remove_tree(root: Path, target: Path) -> int:
    if target.is_file():
        _unlink_and_prune(root, target)
        return 1
    if not target.exists():
        return 0
    count = sum(1 for p in target.rglob("*") if p.is_file())
    shutil.rmtree(target, ignore_errors=True)
    _prune_empty_parents(root, target.parent)
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
        if rel.startswith(f"{TEMP_DIR}/"):
            continue
        try:
            infos.append(_info(rel, path.stat()))
        except FileNotFoundError:
            continue  # deleted while listing
    return infos


def _purge_dir(folder: Path, cutoff: float) -> int:
    removed = 0
    if not folder.is_dir():
        return 0
    for entry in folder.iterdir():
        try:
            if entry.is_file() and entry.stat().st_mtime < cutoff:
                entry.unlink()
                removed += 1
        except FileNotFoundError:
            continue
    return removed
