"""Redis backend: hot copies that tensorizer reads natively with ``redis://host:port/<key>``.

Layout (tensorizer's own reader, docs/tensorizer-vllm-facts.md §4.4): an object ``K`` (the
registry key under the configured prefix) is stored as strings ``K:<offset>`` of ``chunk_mb``
each that tile ``[0, size)``; tensorizer lists ``K:*`` and sorts by the number after the last
``:``. Registry keys never contain ``:``, so no other object's keys match ``K:*``. Beside the
chunks, a hash ``K`` holds ``size``, ``sha256``, ``chunk`` and ``modified`` (tensorizer ignores
it; ``stat`` and ``list`` read it).

Writes go to ``<prefix>tmp/redis/<epoch>-<uuid>:<offset>`` (with a one-day TTL as a backstop)
and are renamed under ``K`` in one MULTI/EXEC transaction, so readers see all of an object or
none of it.

Limits: tensorizer connects to db 0 without AUTH or TLS, so ``tensorizer_uri`` is offered only
when the configured URL is db 0 without a password; otherwise serving nodes read through the
registry's signed blob URL. vLLM refuses ``redis://`` for vllm-format loads (facts §1.5).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import re
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator
from datetime import UTC, datetime
from typing import Any, BinaryIO
from urllib.parse import urlparse

from tensor_registry_server.settings import RedisStorageSettings
from tensor_registry_server.storage.base import (
    ChecksumMismatch,
    ObjectInfo,
    ObjectNotFound,
    ObjectTooLarge,
    SeekableSource,
    Sink,
    Storage,
    StorageError,
    StoredObject,
    seek_position,
)
from tensor_registry_server.storage.object_keys import check_relative_path

TEMP_TTL_SECONDS = 24 * 3600
TEMP_PREFIX = "tmp/redis/"
_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


def _glob_escape(text: str) -> str:
    return _GLOB_SPECIAL.sub(r"\\\1", text)


def _chunk_offsets(size: int, chunk: int) -> range:
    return range(0, size, chunk)


class RedisStorage(Storage):
    name = "redis"

    def __init__(self, settings: RedisStorageSettings) -> None:
        self.settings = settings
        if not settings.url:
            # No default address (storage.redis.url): never write into whatever Redis answers.
            raise ValueError("storage.redis.url is not set: the redis backend is not configured")
        self.url: str = settings.url
        self.prefix = settings.prefix
        self.chunk = max(1, settings.chunk_mb) * 1024 * 1024
        self._client: Any = None
        self._sync_client: Any = None

    # -- keys / clients --------------------------------------------------------------------
    def redis_key(self, key: str) -> str:
        problem = check_relative_path(key.rstrip("/")) if key else "empty key"
        if problem:
            raise ObjectNotFound(f"invalid key {key!r}: {problem}")
        return f"{self.prefix}{key}"

    def client(self) -> Any:
        if self._client is None:
            import redis.asyncio

            self._client = redis.asyncio.Redis.from_url(self.url)
        return self._client

    def sync_client(self) -> Any:
        if self._sync_client is None:
            import redis

            self._sync_client = redis.Redis.from_url(self.url)
        return self._sync_client

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
        sync_client, self._sync_client = self._sync_client, None
        if sync_client is not None:
            sync_client.close()

    def _temp_base(self) -> str:
        return f"{self.prefix}{TEMP_PREFIX}{int(time.time())}-{uuid.uuid4().hex}"

    def tensorizer_uri(self, key: str) -> str | None:
        parsed = urlparse(self.url)
        db = (parsed.path or "/0").strip("/") or "0"
        if parsed.scheme != "redis" or db != "0" or parsed.password:
            return None
        return (
            f"redis://{parsed.hostname or '127.0.0.1'}:{parsed.port or 6379}/{self.redis_key(key)}"
        )

    # -- async API -------------------------------------------------------------------------
    async def put_stream(
        self,
        key: str,
        chunks: AsyncIterable[bytes],
        *,
        max_size: int | None = None,
        expected_sha256: str | None = None,
    ) -> StoredObject:
        client = self.client()
        final = self.redis_key(key)
        temp = self._temp_base()
        digest = hashlib.sha256()
        size = 0
        buffer = bytearray()
        pending: asyncio.Task[Any] | None = None
        written: list[int] = []

        async def flush(data: bytes, offset: int) -> None:
            await asyncio.to_thread(digest.update, data)
            await client.set(f"{temp}:{offset}", data, ex=TEMP_TTL_SECONDS)

        try:
            async for chunk in chunks:
                size += len(chunk)
                if max_size is not None and size > max_size:
                    raise ObjectTooLarge(f"more than {max_size} bytes")
                buffer += chunk
                while len(buffer) >= self.chunk:
                    if pending is not None:
                        await pending
                    offset = len(written) * self.chunk
                    written.append(offset)
                    data, buffer = bytes(buffer[: self.chunk]), buffer[self.chunk :]
                    pending = asyncio.ensure_future(flush(data, offset))
            if pending is not None:
                await pending
                pending = None
            if buffer:
                offset = len(written) * self.chunk
                written.append(offset)
                await flush(bytes(buffer), offset)
            sha256 = digest.hexdigest()
            if expected_sha256 is not None and expected_sha256.lower() != sha256:
                raise ChecksumMismatch(expected_sha256.lower(), sha256)
            await self._publish(client, temp, final, written, size=size, sha256=sha256)
        except BaseException:
            if pending is not None:
                await asyncio.gather(pending, return_exceptions=True)
            await _shielded(self._drop_temp(client, temp, written))
            raise
        return StoredObject(key=key, size=size, sha256=sha256)

    async def _publish(
        self, client: Any, temp: str, final: str, offsets: list[int], *, size: int, sha256: str
    ) -> None:
        old = await self._chunk_keys(client, final)
        async with client.pipeline(transaction=True) as pipe:
            if old:
                pipe.delete(*old)
            for offset in offsets:
                pipe.rename(f"{temp}:{offset}", f"{final}:{offset}")
                pipe.persist(f"{final}:{offset}")
            pipe.delete(final)
            pipe.hset(
                final,
                mapping={
                    "size": size,
                    "sha256": sha256,
                    "chunk": self.chunk,
                    "modified": time.time(),
                },
            )
            await pipe.execute()

    async def _drop_temp(self, client: Any, temp: str, offsets: list[int]) -> None:
        if offsets:
            await client.delete(*(f"{temp}:{o}" for o in offsets))

    async def _chunk_keys(self, client: Any, redis_key: str) -> list[bytes]:
        return [k async for k in client.scan_iter(match=f"{_glob_escape(redis_key)}:*", count=1000)]

    async def _meta(self, client: Any, key: str) -> dict[str, str]:
        raw = await client.hgetall(self.redis_key(key))
        if not raw:
            raise ObjectNotFound(key)
        return {k.decode(): v.decode() for k, v in raw.items()}

    async def stat(self, key: str) -> ObjectInfo:
        meta = await self._meta(self.client(), key)
        return _info(key, meta)

    async def read(
        self, key: str, *, offset: int = 0, length: int | None = None
    ) -> AsyncIterator[bytes]:
        client = self.client()
        meta = await self._meta(client, key)
        size, chunk = int(meta["size"]), int(meta["chunk"])
        end = size if length is None else min(size, offset + length)
        base = self.redis_key(key)
        position = offset
        while position < end:
            start = position - position % chunk
            piece = await client.getrange(
                f"{base}:{start}", position - start, min(end, start + chunk) - start - 1
            )
            if not piece:
                raise StorageError(f"redis object {key} is missing its chunk at {start}")
            position += len(piece)
            yield bytes(piece)

    async def delete(self, key: str) -> None:
        client = self.client()
        final = self.redis_key(key)
        keys = [final.encode(), *await self._chunk_keys(client, final)]
        await client.delete(*keys)

    async def delete_prefix(self, prefix: str) -> int:
        client = self.client()
        pattern = f"{_glob_escape(self.redis_key(prefix))}*"
        objects = 0
        batch: list[bytes] = []
        async for name in client.scan_iter(match=pattern, count=1000):
            if b":" not in name[len(self.prefix.encode()) :]:
                objects += 1
            batch.append(name)
            if len(batch) >= 500:
                await client.delete(*batch)
                batch = []
        if batch:
            await client.delete(*batch)
        return objects

    async def list(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        client = self.client()
        pattern = f"{_glob_escape(self.prefix + prefix)}*"
        names = sorted([n async for n in client.scan_iter(match=pattern, count=1000, _type="hash")])
        for name in names:
            key = name.decode()[len(self.prefix) :]
            if ":" in key or key.startswith(TEMP_PREFIX):
                continue
            raw = await client.hgetall(name)
            if raw:
                yield _info(key, {k.decode(): v.decode() for k, v in raw.items()})

    async def check(self) -> None:
        client = self.client()
        probe = f"{self.prefix}{TEMP_PREFIX}probe-{uuid.uuid4().hex}"
        try:
            await client.set(probe, b"ok", ex=60)
            await client.delete(probe)
        except Exception as exc:
            raise StorageError(
                f"redis storage at {_safe_url(self.url)} is unusable: {exc}"
            ) from exc

    async def purge_temp(self, older_than: datetime) -> int:
        client = self.client()
        cutoff = older_than.timestamp()
        pattern = f"{_glob_escape(self.prefix + TEMP_PREFIX)}*"
        stale: list[bytes] = []
        async for name in client.scan_iter(match=pattern, count=1000):
            stamp = name.decode()[len(self.prefix + TEMP_PREFIX) :].split("-", 1)[0]
            if stamp.isdigit() and int(stamp) < cutoff:
                stale.append(name)
        if stale:
            await client.delete(*stale)
        return len(stale)

    # -- sync API (workers) ----------------------------------------------------------------
    def open_sink(self, key: str) -> RedisSink:
        return RedisSink(self, key)

    def open_source(self, key: str) -> BinaryIO:
        return io.BufferedReader(RedisRawSource(self, key), buffer_size=4 * 1024 * 1024)


def _info(key: str, meta: dict[str, str]) -> ObjectInfo:
    return ObjectInfo(
        key=key,
        size=int(meta["size"]),
        etag=meta.get("sha256"),
        modified=datetime.fromtimestamp(float(meta.get("modified", "0")), UTC),
    )


def _safe_url(url: str) -> str:
    parsed = urlparse(url)
    return f"{parsed.scheme}://{parsed.hostname}:{parsed.port or 6379}{parsed.path}"


async def _shielded(step: Any) -> None:
    task = asyncio.ensure_future(step)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise


class RedisSink(Sink):
    """Random-access writes with SETRANGE into temp chunks; no local buffer at all.

    Redis zero-fills a SETRANGE past the end of a string, so tensorizer's gaps and back-writes
    cost nothing. ``commit`` pads short chunks to tile ``[0, size)``, hashes the chunks in
    order (one GET each) and renames them under the key in one transaction.
    """

    def __init__(self, storage: RedisStorage, key: str) -> None:
        self._storage = storage
        self._client = storage.sync_client()
        self._key = key
        self._final = storage.redis_key(key)
        self._temp = storage._temp_base()
        self._chunk = storage.chunk
        self._position = 0
        self._size = 0
        self._touched: set[int] = set()
        self._done = False

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._done:
            raise ValueError("sink is closed")
        view = memoryview(data).cast("B")
        total = len(view)
        position = self._position
        pipe = self._client.pipeline(transaction=False)
        while view:
            start = position - position % self._chunk
            take = min(len(view), start + self._chunk - position)
            name = f"{self._temp}:{start}"
            pipe.setrange(name, position - start, bytes(view[:take]))
            if start not in self._touched:
                pipe.expire(name, TEMP_TTL_SECONDS)
                self._touched.add(start)
            position += take
            view = view[take:]
        pipe.execute()
        self._position = position
        self._size = max(self._size, position)
        return total

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._position = seek_position(offset, whence, current=self._position, size=self._size)
        return self._position

    def tell(self) -> int:
        return self._position

    def readable(self) -> bool:
        return True  # tensorizer wants "wb+"-like objects; it never reads a serializer's target

    def fileno(self) -> int:
        raise io.UnsupportedOperation("RedisSink has no file descriptor")

    def commit(self) -> StoredObject:
        if self._done:
            raise ValueError("sink is closed")
        offsets = list(_chunk_offsets(self._size, self._chunk))
        try:
            digest = hashlib.sha256()
            for start in offsets:
                name = f"{self._temp}:{start}"
                expected = min(self._chunk, self._size - start)
                if self._client.strlen(name) < expected:
                    # Never written up to its end (a gap): zero-fill so the chunks tile the file.
                    self._client.setrange(name, expected - 1, b"\x00")
                    self._client.expire(name, TEMP_TTL_SECONDS)
                digest.update(self._client.get(name))
            sha256 = digest.hexdigest()
            old = list(self._client.scan_iter(match=f"{_glob_escape(self._final)}:*", count=1000))
            pipe = self._client.pipeline(transaction=True)
            if old:
                pipe.delete(*old)
            for start in offsets:
                pipe.rename(f"{self._temp}:{start}", f"{self._final}:{start}")
                pipe.persist(f"{self._final}:{start}")
            pipe.delete(self._final)
            pipe.hset(
                self._final,
                mapping={
                    "size": self._size,
                    "sha256": sha256,
                    "chunk": self._chunk,
                    "modified": time.time(),
                },
            )
            pipe.execute()
        except BaseException:
            self.abort()
            raise
        self._done = True
        return StoredObject(key=self._key, size=self._size, sha256=sha256)

    def abort(self) -> None:
        self._done = True
        if self._touched:
            self._client.delete(*(f"{self._temp}:{start}" for start in self._touched))
            self._touched.clear()


class RedisRawSource(SeekableSource):
    """Read-only, seekable view of one object (GETRANGE per read)."""

    def __init__(self, storage: RedisStorage, key: str) -> None:
        super().__init__()
        self._client = storage.sync_client()
        self._base = storage.redis_key(key)
        raw = self._client.hgetall(self._base)
        if not raw:
            raise ObjectNotFound(key)
        meta = {k.decode(): v.decode() for k, v in raw.items()}
        self.size = int(meta["size"])
        self._chunk = int(meta["chunk"])
        self._position = 0

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._position >= self.size or not len(view):
            return 0
        start = self._position - self._position % self._chunk
        end = min(self.size, start + self._chunk, self._position + len(view))
        piece = self._client.getrange(
            f"{self._base}:{start}", self._position - start, end - start - 1
        )
        view[: len(piece)] = piece
        self._position += len(piece)
        return len(piece)
