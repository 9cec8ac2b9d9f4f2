"""The S3 backend's synchronous side, for workers (boto3, threads): ``S3Sink`` writes a
tensorizer file as a multipart upload without a local copy, ``S3RawSource`` reads one object
with ranged GETs. ``S3Storage.open_sink``/``open_source`` (tensor_registry_server.storage.s3) hand
them out.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO

from tensor_registry_server.storage.base import (
    ObjectNotFound,
    SeekableSource,
    Sink,
    StorageError,
    StoredObject,
    seek_position,
)
from tensor_registry_server.storage.s3 import MIN_PART, MiB, _is_missing, part_size_for


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
