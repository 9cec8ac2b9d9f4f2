"""S3-compatible backend (AWS, MinIO, CoreWeave, R2, moto): aioboto3 in the API, boto3 in workers.

Objects live at ``<bucket>/<prefix><key>``. Uploads use multipart above one part, so memory stays
at a few parts whatever the size (16 MiB parts for API uploads, ``multipart_chunk_mb`` for
workers' sinks), and nothing is visible under a key until the upload is
completed; a failed or cancelled upload is aborted (and ``purge_temp`` aborts the ones a crash
left behind).

Workers write tensorizer files through ``S3Sink`` (tensor_registry_server.storage.s3_sync): no
local copy of the
model.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import logging
import threading
from collections.abc import AsyncIterable, AsyncIterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, BinaryIO

from tensor_registry_server.settings import S3Settings
from tensor_registry_server.storage.base import (
    ChecksumMismatch,
    ObjectInfo,
    ObjectNotFound,
    ObjectTooLarge,
    Storage,
    StorageError,
    StoredObject,
)
from tensor_registry_server.storage.object_keys import check_relative_path

if TYPE_CHECKING:
    from tensor_registry_server.storage.s3_sync import S3Sink

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
        from tensor_registry_server.storage.s3_sync import (
            S3Sink,  # the sync side imports this module
        )

        return S3Sink(
            self.sync_client(),
            self.bucket,
            self.object_key(key),
            key,
            part_size=max(MIN_PART, (part_mb or self.settings.multipart_chunk_mb) * MiB),
            window_parts=window_parts,
        )

    def open_source(self, key: str) -> BinaryIO:
        from tensor_registry_server.storage.s3_sync import S3RawSource

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
