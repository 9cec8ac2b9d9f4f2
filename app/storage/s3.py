"""S3-compatible backend (AWS, MinIO, CoreWeave, R2, moto): aioboto3 in the API, boto3 in workers.

Objects live at ``<bucket>/<prefix><key>``. Uploads use multipart above one part, so memory stays
at a few parts whatever the size (16 MiB parts for API uploads, ``multipart_chunk_mb`` for
workers' sinks), and nothing is visible under a key until the upload is
completed; a failed or cancelled upload is aborted (and ``purge_temp`` aborts the ones a crash
left behind).

Workers write tensorizer files through ``S3Sink`` (see there): no local copy of the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import logging
import os
import tempfile
import threading
from collections.abc import AsyncIterable, AsyncIterator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from typing import Any, BinaryIO

from app.settings import S3Settings
from app.storage.base import (
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
from app.storage.object_keys import check_relative_path

log = logging.getLogger("tensor_registry.storage.s3")

MiB = 1024 * 1024
MIN_PART = 5 * MiB  # S3's floor for every part but the last
MAX_PARTS = 10_000
READ_CHUNK = 1 * MiB
MAX_PRESIGN_SECONDS = 7 * 24 * 3600  # SigV4's limit
API_PART_MB = 16


def _client_kwargs(settings: S3Settings, *, pool: int = 32) -> dict[str, Any]:
    from botocore.config import Config

    kwargs: dict[str, Any] = {
        "region_name": settings.region,
        "config": Config(
            s3={"addressing_style": settings.addressing_style},
            signature_version="s3v4",
            max_pool_connections=pool,
            retries={"max_attempts": 5, "mode": "standard"},
        ),
    }
    if settings.endpoint_url:
        kwargs["endpoint_url"] = settings.endpoint_url
    if settings.access_key_id is not None:
        kwargs["aws_access_key_id"] = settings.access_key_id.get_secret_value()
    if settings.secret_access_key is not None:
        kwargs["aws_secret_access_key"] = settings.secret_access_key.get_secret_value()
    return kwargs


def _aio_client_kwargs(settings: S3Settings) -> dict[str, Any]:
    from aiobotocore.config import AioConfig

    kwargs = _client_kwargs(settings)
    sync_config = kwargs.pop("config")
    kwargs["config"] = AioConfig(
        s3=sync_config.s3,
        signature_version="s3v4",
        max_pool_connections=sync_config.max_pool_connections,
        retries=sync_config.retries,
    )
    return kwargs


def _is_missing(exc: Exception) -> bool:
    code = getattr(exc, "response", {}).get("Error", {}).get("Code")
    return code in {"NoSuchKey", "404", "NotFound", "NoSuchUpload"}


def part_size_for(size_hint: int | None, configured_mb: int) -> int:
    """The configured part size, grown so that ``size_hint`` fits in S3's 10,000 parts."""
    size = max(MIN_PART, configured_mb * MiB)
    if size_hint:
        needed = -(-size_hint // (MAX_PARTS - 1))
        size = max(size, -(-needed // MiB) * MiB)
    return size


class S3Storage(Storage):
    name = "s3"

    def __init__(self, settings: S3Settings) -> None:
        self.settings = settings
        self.bucket = settings.bucket
        prefix = settings.prefix.strip("/")
        self.prefix = f"{prefix}/" if prefix else ""
        self._stack: contextlib.AsyncExitStack | None = None
        self._client: Any = None
        self._client_lock = asyncio.Lock()
        self._sync_client: Any = None
        self._sync_lock = threading.Lock()

    # -- keys ------------------------------------------------------------------------------
    def object_key(self, key: str) -> str:
        problem = check_relative_path(key.rstrip("/")) if key else "empty key"
        if problem:
            raise ObjectNotFound(f"invalid key {key!r}: {problem}")
        return f"{self.prefix}{key}"

    def _registry_key(self, object_key: str) -> str:
        return object_key[len(self.prefix) :]

    # -- clients ---------------------------------------------------------------------------
    async def client(self) -> Any:
        if self._client is None:
            async with self._client_lock:
                if self._client is None:
                    import aioboto3

                    stack = contextlib.AsyncExitStack()
                    session = aioboto3.Session()
                    self._client = await stack.enter_async_context(
                        session.client("s3", **_aio_client_kwargs(self.settings))
                    )
                    self._stack = stack
        return self._client

    def sync_client(self) -> Any:
        if self._sync_client is None:
            with self._sync_lock:
                if self._sync_client is None:
                    import boto3

                    self._sync_client = boto3.session.Session().client(
                        "s3", **_client_kwargs(self.settings)
                    )
        return self._sync_client

    async def close(self) -> None:
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    # -- async API -------------------------------------------------------------------------
    async def put_stream(
        self,
        key: str,
        chunks: AsyncIterable[bytes],
        *,
        max_size: int | None = None,
        expected_sha256: str | None = None,
    ) -> StoredObject:
        client = await self.client()
        target = self.object_key(key)
        # API uploads use small parts (memory is about three parts per upload in flight);
        # they grow only when the declared size would need more than 10,000 parts.
        part_size = part_size_for(max_size, min(self.settings.multipart_chunk_mb, API_PART_MB))
        digest = hashlib.sha256()
        size = 0
        buffer = bytearray()
        upload: _AsyncMultipart | None = None
        try:
            async for chunk in chunks:
                size += len(chunk)
                if max_size is not None and size > max_size:
                    raise ObjectTooLarge(f"more than {max_size} bytes")
                buffer += chunk
                if len(buffer) >= part_size:
                    if upload is None:
                        upload = await _AsyncMultipart.start(client, self.bucket, target)
                    part = bytes(memoryview(buffer)[:part_size])
                    del buffer[:part_size]
                    await upload.submit(part, digest)
            if upload is None:
                body = bytes(buffer)
                await asyncio.to_thread(digest.update, body)
                _verify(expected_sha256, digest.hexdigest())
                await client.put_object(Bucket=self.bucket, Key=target, Body=body)
            else:
                if buffer:
                    await upload.submit(bytes(buffer), digest)
                await upload.drain()
                _verify(expected_sha256, digest.hexdigest())
                await upload.complete()
        except BaseException:
            if upload is not None:
                await _shielded(upload.abort())
            raise
        return StoredObject(key=key, size=size, sha256=digest.hexdigest())

    async def stat(self, key: str) -> ObjectInfo:
        client = await self.client()
        try:
            head = await client.head_object(Bucket=self.bucket, Key=self.object_key(key))
        except Exception as exc:
            if _is_missing(exc):
                raise ObjectNotFound(key) from exc
            raise StorageError(f"s3 head {key}: {exc}") from exc
        return ObjectInfo(
            key=key,
            size=int(head["ContentLength"]),
            etag=str(head.get("ETag", "")).strip('"') or None,
            modified=head.get("LastModified"),
        )

    async def read(
        self, key: str, *, offset: int = 0, length: int | None = None
    ) -> AsyncIterator[bytes]:
        if length == 0:
            return
        client = await self.client()
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": self.object_key(key)}
        if offset or length is not None:
            end = "" if length is None else str(offset + length - 1)
            params["Range"] = f"bytes={offset}-{end}"
        try:
            response = await client.get_object(**params)
        except Exception as exc:
            if _is_missing(exc) or "InvalidRange" in str(exc):
                if _is_missing(exc):
                    raise ObjectNotFound(key) from exc
                return
            raise StorageError(f"s3 get {key}: {exc}") from exc
        body = response["Body"]
        try:
            async for chunk in body.iter_chunks(READ_CHUNK):
                yield chunk
        finally:
            body.close()

    async def delete(self, key: str) -> None:
        client = await self.client()
        await client.delete_object(Bucket=self.bucket, Key=self.object_key(key))

    async def delete_prefix(self, prefix: str) -> int:
        client = await self.client()
        removed = 0
        batch: list[dict[str, str]] = []
        async for info in self._list_raw(self.object_key(prefix)):
            batch.append({"Key": info["Key"]})
            if len(batch) == 1000:
                removed += await self._delete_batch(client, batch)
                batch = []
        if batch:
            removed += await self._delete_batch(client, batch)
        return removed

    async def _delete_batch(self, client: Any, batch: list[dict[str, str]]) -> int:
        result = await client.delete_objects(
            Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}
        )
        errors = result.get("Errors") or []
        if errors:
            raise StorageError(f"s3 could not delete {len(errors)} object(s): {errors[0]}")
        return len(batch)

    async def _list_raw(self, object_prefix: str) -> AsyncIterator[dict[str, Any]]:
        client = await self.client()
        paginator = client.get_paginator("list_objects_v2")
        async for page in paginator.paginate(Bucket=self.bucket, Prefix=object_prefix):
            for item in page.get("Contents", []) or []:
                yield item

    async def list(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        object_prefix = f"{self.prefix}{prefix}"
        async for item in self._list_raw(object_prefix):
            yield ObjectInfo(
                key=self._registry_key(item["Key"]),
                size=int(item["Size"]),
                etag=str(item.get("ETag", "")).strip('"') or None,
                modified=item.get("LastModified"),
            )

    async def check(self) -> None:
        client = await self.client()
        try:
            await client.head_bucket(Bucket=self.bucket)
        except Exception as exc:
            raise StorageError(f"s3 bucket {self.bucket} is not reachable: {exc}") from exc

    async def download_url(self, key: str, ttl: int) -> str | None:
        # vLLM applies `uri % rank` to tensor-parallel templates; a presigned URL is full of
        # percent-encoding, so templates go through the registry's own blob URL instead.
        if not self.settings.presign_downloads or "%" in key:
            return None
        client = await self.client()
        url = await client.generate_presigned_url(
            "get_object",
            Params={"Bucket": self.bucket, "Key": self.object_key(key)},
            ExpiresIn=max(1, min(ttl, MAX_PRESIGN_SECONDS)),
        )
        return str(url)

    async def purge_temp(self, older_than: datetime) -> int:
        """Abort multipart uploads under the prefix that were started before ``older_than``."""
        client = await self.client()
        aborted = 0
        paginator = client.get_paginator("list_multipart_uploads")
        async for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix):
            for upload in page.get("Uploads", []) or []:
                if upload["Initiated"] < older_than:
                    with contextlib.suppress(Exception):
                        await client.abort_multipart_upload(
                            Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                        )
                        aborted += 1
        return aborted

    # -- sync API (workers) ----------------------------------------------------------------
    def open_sink(self, key: str, *, part_mb: int | None = None, window_parts: int = 2) -> S3Sink:
        return S3Sink(
            self.sync_client(),
            self.bucket,
            self.object_key(key),
            key,
            part_size=max(MIN_PART, (part_mb or self.settings.multipart_chunk_mb) * MiB),
            window_parts=window_parts,
        )

    def open_source(self, key: str) -> BinaryIO:
        raw = S3RawSource(self.sync_client(), self.bucket, self.object_key(key), key)
        return io.BufferedReader(raw, buffer_size=8 * MiB)


def _verify(expected: str | None, actual: str) -> None:
    if expected is not None and expected.lower() != actual:
        raise ChecksumMismatch(expected.lower(), actual)


async def _shielded(step: Any) -> None:
    task = asyncio.ensure_future(step)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise


class _AsyncMultipart:
    """One multipart upload; the next part is hashed and sent while the caller fills another."""

    def __init__(self, client: Any, bucket: str, key: str, upload_id: str) -> None:
        self.client = client
        self.bucket = bucket
        self.key = key
        self.upload_id = upload_id
        self.parts: list[dict[str, Any]] = []
        self._inflight: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, client: Any, bucket: str, key: str) -> _AsyncMultipart:
        created = await client.create_multipart_upload(Bucket=bucket, Key=key)
        return cls(client, bucket, key, created["UploadId"])

    async def submit(self, part: bytes, digest: Any) -> None:
        await self.drain()
        number = len(self.parts) + 1
        self.parts.append({"PartNumber": number})
        self._inflight = asyncio.ensure_future(self._send(number, part, digest))

    async def _send(self, number: int, part: bytes, digest: Any) -> None:
        # Parts are hashed in order: the previous part's task finished before this one started.
        await asyncio.to_thread(digest.update, part)
        result = await self.client.upload_part(
            Bucket=self.bucket,
            Key=self.key,
            UploadId=self.upload_id,
            PartNumber=number,
            Body=part,
        )
        self.parts[number - 1]["ETag"] = result["ETag"]

    async def drain(self) -> None:
        task, self._inflight = self._inflight, None
        if task is not None:
            await task

    async def complete(self) -> None:
        await self.client.complete_multipart_upload(
            Bucket=self.bucket,
            Key=self.key,
            UploadId=self.upload_id,
            MultipartUpload={"Parts": self.parts},
        )

    async def abort(self) -> None:
        task, self._inflight = self._inflight, None
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        try:
            await self.client.abort_multipart_upload(
                Bucket=self.bucket, Key=self.key, UploadId=self.upload_id
            )
        except Exception:
            log.warning("could not abort multipart upload of %s; left for the sweep", self.key)


class S3Sink(Sink):
    """A seekable file that becomes one S3 object on ``commit()``, with bounded memory.

    Layout: part 1 is the first ``HEAD_PART`` bytes (tensorizer's file header and 256 KiB index,
    rewritten at the very end) and stays in memory until commit: S3 assembles parts by number,
    not by upload order, so part 1 can be sent last. The rest is cut into parts of
    ``part_size``; the last ``window_parts`` parts behind the furthest write stay in memory so
    that nearby back-writes are applied in place, and older parts are uploaded in the background
    (at most two in flight).

    A write that lands in a part already uploaded (tensorizer's non-fd path writes each tensor's
    header, a few dozen bytes, after all data of the ``write_module`` call: arbitrarily far back)
    is spilled to a small local temp file. If there are any at commit, the completed object is
    rebuilt in place with a second multipart upload: unchanged ranges with server-side
    ``UploadPartCopy``, patched ranges re-sent. That rebuild happens inside ``commit()``, before
    the caller records the object anywhere.

    sha256: the final bytes are re-read once after completion (ranged GETs, several in flight)
    and hashed in order. With out-of-order writes no running hash can be right, and reading
    back also proves the object the store holds is the one recorded.
    """

    HEAD_PART = 8 * MiB

    def __init__(
        self,
        client: Any,
        bucket: str,
        object_key: str,
        key: str,
        *,
        part_size: int = 64 * MiB,
        window_parts: int = 2,
        max_inflight: int = 2,
    ) -> None:
        self._client = client
        self._bucket = bucket
        self._object_key = object_key
        self._key = key
        self._part_size = max(MIN_PART, part_size)
        self._window = max(1, window_parts)
        self._upload_id: str | None = None
        self._position = 0
        self._size = 0
        self._head = bytearray()
        self._parts: dict[int, bytearray] = {}  # part index (>= 1) -> bytes held in memory
        self._uploaded_below = 1  # parts with index < this are uploaded (or being uploaded)
        self._etags: dict[int, str] = {}
        self._pool = ThreadPoolExecutor(max_workers=max_inflight, thread_name_prefix="s3-sink")
        self._slots = threading.BoundedSemaphore(max_inflight)
        self._futures: list[Future[None]] = []
        self._spill: BinaryIO | None = None
        self._patches: list[tuple[int, int, int]] = []  # (offset, length, spill offset)
        self._done = False

    # -- geometry ----------------------------------------------------------------------------
    def _part_of(self, offset: int) -> int:
        if offset < self.HEAD_PART:
            return 0
        return 1 + (offset - self.HEAD_PART) // self._part_size

    def _part_start(self, index: int) -> int:
        return 0 if index == 0 else self.HEAD_PART + (index - 1) * self._part_size

    def _part_end(self, index: int) -> int:
        return self.HEAD_PART if index == 0 else self._part_start(index) + self._part_size

    # -- file interface ----------------------------------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._done:
            raise ValueError("sink is closed")
        view = memoryview(data).cast("B")
        total = len(view)
        offset = self._position
        while view:
            index = self._part_of(offset)
            take = min(len(view), self._part_end(index) - offset)
            piece = view[:take]
            if index == 0:
                _put(self._head, offset, piece)
            elif index < self._uploaded_below:
                self._spill_patch(offset, piece)
            else:
                _put(
                    self._parts.setdefault(index, bytearray()),
                    offset - self._part_start(index),
                    piece,
                )
            offset += take
            view = view[take:]
        self._position = offset
        self._size = max(self._size, offset)
        self._evict()
        return total

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._position = seek_position(offset, whence, current=self._position, size=self._size)
        return self._position

    def tell(self) -> int:
        return self._position

    def readable(self) -> bool:
        # tensorizer requires "wb+"-like objects; it never reads from a serializer's target.
        return True

    def fileno(self) -> int:
        raise io.UnsupportedOperation("S3Sink has no file descriptor")

    # -- parts -------------------------------------------------------------------------------
    def _spill_patch(self, offset: int, piece: memoryview) -> None:
        if self._spill is None:
            self._spill = tempfile.TemporaryFile(prefix="tr-s3-sink-")  # noqa: SIM115
        spill_offset = self._spill.seek(0, io.SEEK_END)
        self._spill.write(piece)
        self._patches.append((offset, len(piece), spill_offset))

    def _evict(self) -> None:
        newest = self._part_of(max(self._size - 1, 0))
        while self._uploaded_below <= newest - self._window:
            index = self._uploaded_below
            body = self._parts.pop(index, bytearray())
            body.extend(bytes(self._part_size - len(body)))  # never-written ranges are zeros
            self._uploaded_below += 1
            self._upload_async(index, body)

    def _ensure_upload(self) -> str:
        if self._upload_id is None:
            created = self._client.create_multipart_upload(
                Bucket=self._bucket, Key=self._object_key
            )
            self._upload_id = str(created["UploadId"])
        return self._upload_id

    def _upload_async(self, index: int, body: bytearray) -> None:
        upload_id = self._ensure_upload()
        self._raise_failed()
        self._slots.acquire()

        def send() -> None:
            try:
                result = self._client.upload_part(
                    Bucket=self._bucket,
                    Key=self._object_key,
                    UploadId=upload_id,
                    PartNumber=index + 1,
                    Body=bytes(body),
                )
                self._etags[index] = result["ETag"]
            finally:
                self._slots.release()

        self._futures.append(self._pool.submit(send))

    def _raise_failed(self) -> None:
        for future in self._futures:
            if future.done() and future.exception() is not None:
                raise StorageError(f"s3 part upload failed: {future.exception()}")

    def _wait_uploads(self) -> None:
        for future in self._futures:
            exc = future.exception()
            if exc is not None:
                raise StorageError(f"s3 part upload failed: {exc}") from exc
        self._futures = []

    # -- commit ------------------------------------------------------------------------------
    def commit(self) -> StoredObject:
        if self._done:
            raise ValueError("sink is closed")
        try:
            if self._upload_id is None and not self._patches:
                # Small object: everything is still in memory.
                body = self._assemble_in_memory()
                self._client.put_object(Bucket=self._bucket, Key=self._object_key, Body=body)
            else:
                self._finish_multipart()
                if self._patches:
                    self._rebuild_with_patches()
            digest = self._hash_object()
        except BaseException:
            self.abort()
            raise
        self._close_local()
        return StoredObject(key=self._key, size=self._size, sha256=digest)

    def _assemble_in_memory(self) -> bytes:
        out = bytearray(self._head)
        for index in sorted(self._parts):
            _put(out, self._part_start(index), memoryview(self._parts[index]))
        out.extend(bytes(self._size - len(out)))
        return bytes(out[: self._size])

    def _finish_multipart(self) -> None:
        upload_id = self._ensure_upload()
        last = self._part_of(max(self._size - 1, 0))
        # Parts still in the window, each padded to its full length except the last.
        for index in range(self._uploaded_below, last + 1):
            body = self._parts.pop(index, bytearray())
            length = min(self._part_end(index), self._size) - self._part_start(index)
            body.extend(bytes(length - len(body)))
            self._upload_async(index, body)
        self._uploaded_below = last + 1
        head = bytes(self._head) + bytes(min(self.HEAD_PART, self._size) - len(self._head))
        self._wait_uploads()
        result = self._client.upload_part(
            Bucket=self._bucket, Key=self._object_key, UploadId=upload_id, PartNumber=1, Body=head
        )
        self._etags[0] = result["ETag"]
        self._complete(upload_id, self._etags)
        self._upload_id = None

    def _complete(self, upload_id: str, etags: dict[int, str]) -> None:
        self._client.complete_multipart_upload(
            Bucket=self._bucket,
            Key=self._object_key,
            UploadId=upload_id,
            MultipartUpload={
                "Parts": [{"PartNumber": i + 1, "ETag": etags[i]} for i in sorted(etags)]
            },
        )

    def _rebuild_with_patches(self) -> None:
        """Re-assemble the object in place: copy untouched ranges server-side, resend the rest."""
        assert self._spill is not None
        self._spill.flush()
        step = part_size_for(self._size, 8)
        ranges = [(start, min(start + step, self._size)) for start in range(0, self._size, step)]
        patched = {
            i
            for i, (start, end) in enumerate(ranges)
            for offset, length, _ in self._patches
            if offset < end and offset + length > start
        }
        created = self._client.create_multipart_upload(Bucket=self._bucket, Key=self._object_key)
        upload_id = str(created["UploadId"])
        self._upload_id = upload_id
        source = {"Bucket": self._bucket, "Key": self._object_key}

        def build(i: int) -> tuple[int, str]:
            start, end = ranges[i]
            common = {
                "Bucket": self._bucket,
                "Key": self._object_key,
                "UploadId": upload_id,
                "PartNumber": i + 1,
            }
            if i not in patched:
                result = self._client.upload_part_copy(
                    CopySource=source, CopySourceRange=f"bytes={start}-{end - 1}", **common
                )
                return i, str(result["CopyPartResult"]["ETag"])
            body = bytearray(self._get_range(start, end))
            for offset, length, spill_offset in self._patches:
                lo, hi = max(offset, start), min(offset + length, end)
                if lo < hi:
                    body[lo - start : hi - start] = self._read_spill(
                        spill_offset + lo - offset, hi - lo
                    )
            result = self._client.upload_part(Body=bytes(body), **common)
            return i, str(result["ETag"])

        with ThreadPoolExecutor(max_workers=8, thread_name_prefix="s3-rebuild") as pool:
            etags = dict(pool.map(build, range(len(ranges))))
        self._complete(upload_id, etags)
        self._upload_id = None

    def _read_spill(self, offset: int, length: int) -> bytes:
        assert self._spill is not None
        return os.pread(self._spill.fileno(), length, offset)

    def _get_range(self, start: int, end: int) -> bytes:
        response = self._client.get_object(
            Bucket=self._bucket, Key=self._object_key, Range=f"bytes={start}-{end - 1}"
        )
        return bytes(response["Body"].read())

    def _hash_object(self) -> str:
        digest = hashlib.sha256()
        step = 8 * MiB
        starts = range(0, self._size, step)
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="s3-hash") as pool:
            # In order, with at most a few ranges fetched ahead of the hash.
            def fetch(start: int) -> bytes:
                return self._get_range(start, min(start + step, self._size))

            for chunk in _bounded_map(pool, fetch, starts, 4):
                digest.update(chunk)
        return digest.hexdigest()

    def abort(self) -> None:
        for future in self._futures:
            with contextlib.suppress(Exception):
                future.result()
        self._futures = []
        if self._upload_id is not None:
            with contextlib.suppress(Exception):
                self._client.abort_multipart_upload(
                    Bucket=self._bucket, Key=self._object_key, UploadId=self._upload_id
                )
            self._upload_id = None
        self._close_local()

    def _close_local(self) -> None:
        self._done = True
        self._parts.clear()
        self._head = bytearray()
        self._pool.shutdown(wait=False)
        if self._spill is not None:
            self._spill.close()
            self._spill = None


def _put(buffer: bytearray, offset: int, piece: memoryview) -> None:
    end = offset + len(piece)
    if len(buffer) < end:
        buffer.extend(bytes(end - len(buffer)))
    buffer[offset:end] = piece


def _bounded_map(pool: ThreadPoolExecutor, fn: Any, items: Any, ahead: int) -> Iterator[Any]:
    pending: list[Future[Any]] = []
    for item in items:
        pending.append(pool.submit(fn, item))
        if len(pending) > ahead:
            yield pending.pop(0).result()
    for future in pending:
        yield future.result()


class S3RawSource(SeekableSource):
    """Read-only, seekable view of one object; each ``readinto`` is one ranged GET."""

    def __init__(self, client: Any, bucket: str, object_key: str, key: str) -> None:
        super().__init__()
        self._client = client
        self._bucket = bucket
        self._object_key = object_key
        try:
            head = client.head_object(Bucket=bucket, Key=object_key)
        except Exception as exc:
            if _is_missing(exc):
                raise ObjectNotFound(key) from exc
            raise StorageError(f"s3 head {key}: {exc}") from exc
        self.size = int(head["ContentLength"])
        self._position = 0

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        want = min(len(view), self.size - self._position)
        if want <= 0:
            return 0
        response = self._client.get_object(
            Bucket=self._bucket,
            Key=self._object_key,
            Range=f"bytes={self._position}-{self._position + want - 1}",
        )
        body = response["Body"]
        got = 0
        while got < want:
            chunk = body.read(want - got)
            if not chunk:
                break
            view[got : got + len(chunk)] = chunk
            got += len(chunk)
        self._position += got
        return got
