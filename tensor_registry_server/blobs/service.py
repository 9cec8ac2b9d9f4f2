"""Signed downloads of stored files: the bytes path of every serving node.

The signature is the auth (no bearer token): it is checked first (403 ``signature_invalid`` /
``signature_expired``), then the file's existence (404 ``blob_not_found``). Nothing is written to
the database or the audit log here: this is the hot path, and issuing the URL was audited.

What tensorizer's HTTP reader needs (docs/tensorizer-vllm-facts.md §4.1): HTTP/1.1, no
redirects, ``Accept-Ranges: bytes`` on the first plain GET, and single ``Range: bytes=a-b``
requests answered with 206 and exactly those bytes. HEAD, suffix and open ranges, ``If-Range``,
416 and multiple ranges (``multipart/byteranges``) are served too.

Local files go out with ``os.sendfile`` when the server offers the ASGI zero-copy extension
(tensor_registry_server.blobs.zerocopy); every other backend, and every other server, streams
``body`` messages.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any, BinaryIO
from urllib.parse import parse_qs, unquote, urlsplit

from prometheus_client import Counter
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from tensor_registry_server.blobs.zerocopy import ZEROCOPY_SEND, ClientGone
from tensor_registry_server.core.errors import AppError, Forbidden, NotFound
from tensor_registry_server.core.tenant_bytes import TENANT_BYTES_HEADERS
from tensor_registry_server.settings import Settings
from tensor_registry_server.storage.base import ObjectNotFound, Storage
from tensor_registry_server.storage.object_keys import check_relative_path
from tensor_registry_server.storage.registry import BACKENDS, StorageRegistry
from tensor_registry_server.storage.signing import blob_scope, verify

BYTES_SERVED = Counter(
    "tensor_registry_blob_bytes_served_total",
    "Bytes of stored files sent through signed blob URLs",
    ["storage"],
)
RESPONSES = Counter(
    "tensor_registry_blob_responses_total",
    "Signed blob responses by storage and status",
    ["storage", "status"],
)

for _storage in BACKENDS:  # at 0 from the start
    BYTES_SERVED.labels(_storage)
    for _status in ("200", "206", "499"):
        RESPONSES.labels(_storage, _status)

SERVABLE_ROOTS = ("versions", "artifacts")
STREAM_CHUNK = 1024 * 1024
# More ranges than this in one request are ignored (a full 200), which is what RFC 9110 allows
# and what keeps overlapping-range amplification out.
MAX_RANGES = 16


class RangeNotSatisfiable(AppError):
    status, code, title = 416, "range_not_satisfiable", "Range not satisfiable"


@dataclass(frozen=True)
class ByteRange:
    start: int
    end: int  # inclusive, as on the wire

    @property
    def length(self) -> int:
        return self.end - self.start + 1


def parse_range(header: str | None, size: int) -> list[ByteRange] | None:
    """The satisfiable ranges of a ``Range`` header, or None to serve the whole file.

    Follows RFC 9110 §14: a header that is not ``bytes=`` with valid specs is ignored (None);
    specs past the end are dropped; if none is left, 416.
    """
    if header is None:
        return None
    unit, _, specs = header.partition("=")
    if unit.strip().lower() != "bytes" or not specs.strip():
        return None
    ranges: list[ByteRange] = []
    parts = [p.strip() for p in specs.split(",")]
    if len(parts) > MAX_RANGES:
        return None
    for part in parts:
        first, dash, last = part.partition("-")
        if not dash or not (first.isdigit() or last.isdigit()):
            return None
        if (first and not first.isdigit()) or (last and not last.isdigit()):
            return None
        if first:
            start = int(first)
            end = int(last) if last else size - 1
            if last and end < start:
                return None
            if start >= size:
                continue
            ranges.append(ByteRange(start, min(end, size - 1)))
        else:
            suffix = int(last)
            if suffix == 0 or size == 0:
                continue
            ranges.append(ByteRange(max(0, size - suffix), size - 1))
    if not ranges:
        raise RangeNotSatisfiable(
            f"The requested range is outside the file ({size} bytes).",
            headers={"Content-Range": f"bytes */{size}"},
        )
    if len(ranges) > 1 and _overlap(ranges):
        # Overlapping ranges would send some bytes several times (``bytes=0-,0-,...`` sends the
        # file 16 times): RFC 9110 §14.2 lets a server ignore them, so the answer is the whole
        # file once. Disjoint ranges never add up to more than the file.
        return None
    return ranges


def _overlap(ranges: list[ByteRange]) -> bool:
    ordered = sorted(ranges, key=lambda r: r.start)
    return any(b.start <= a.end for a, b in itertools.pairwise(ordered))


class Blob:
    """One stored file opened for serving: size and validators fixed at open time."""

    def __init__(
        self,
        *,
        storage: Storage,
        key: str,
        size: int,
        etag: str,
        modified: datetime | None,
        file: BinaryIO | None = None,
    ) -> None:
        self.storage = storage
        self.key = key
        self.size = size
        self.etag = etag
        self.modified = modified
        self.file = file

    @property
    def last_modified(self) -> str | None:
        if self.modified is None:
            return None
        return format_datetime(self.modified.astimezone(UTC), usegmt=True)

    async def chunks(self, offset: int, length: int) -> AsyncIterator[bytes]:
        if self.file is not None:
            fd = self.file.fileno()
            end = offset + length
            while offset < end:
                chunk = await asyncio.to_thread(
                    os.pread, fd, min(STREAM_CHUNK, end - offset), offset
                )
                if not chunk:
                    raise RuntimeError(f"{self.key} shrank while it was being served")
                offset += len(chunk)
                yield chunk
            return
        async for chunk in self.storage.read(self.key, offset=offset, length=length):
            yield chunk

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def _not_found(storage: str, key: str) -> NotFound:
    return NotFound(f"No stored file {key!r} in storage '{storage}'.", code="blob_not_found")


def check_signature(
    settings: Settings, storage: str, key: str, *, exp: str | None, sig: str | None
) -> None:
    try:
        scope = blob_scope(key)
    except ValueError as exc:
        # No signature covers a key outside an artifact's or a version's prefix.
        raise Forbidden("The URL signature does not match.", code="signature_invalid") from exc
    verify(
        settings.signing_key_bytes(),
        purpose="blob",
        subject=f"{storage}:{scope}",
        exp=exp,
        sig=sig,
    )


BLOB_PATH = "/api/v1/blobs/"
# An nginx `auth_request` passes the original request line's target; a signed blob URL is far
# shorter (a storage name, an artifact's key, exp and sig).
MAX_ORIGINAL_URI = 4096


def check_cached_request(settings: Settings, original_uri: str | None) -> None:
    """The signature of a blob URL a shared cache is about to answer (``GET /api/v1/blob-auth``
    with the original URI in ``X-Original-URI``): 403 unless it is a blob URL whose signature
    is valid now. No storage is touched and no byte is moved: the cache has the bytes, the
    registry decides whether this request may have them."""
    if not original_uri or len(original_uri) > MAX_ORIGINAL_URI:
        raise Forbidden("Not a signed blob URL.", code="signature_invalid")
    parts = urlsplit(original_uri)
    if not parts.path.startswith(BLOB_PATH):
        raise Forbidden("Not a signed blob URL.", code="signature_invalid")
    storage, _, key = unquote(parts.path[len(BLOB_PATH) :]).partition("/")
    try:
        query = parse_qs(parts.query, max_num_fields=8)
    except ValueError:
        raise Forbidden("Not a signed blob URL.", code="signature_invalid") from None
    exp, sig = query.get("exp", [None])[-1], query.get("sig", [None])[-1]
    if not storage or not key:
        raise Forbidden("Not a signed blob URL.", code="signature_invalid")
    check_signature(settings, storage, key, exp=exp, sig=sig)


async def open_blob(
    settings: Settings,
    storages: StorageRegistry,
    storage_name: str,
    key: str,
    *,
    exp: str | None,
    sig: str | None,
) -> Blob:
    """Check the signature (403), then find the file (404)."""
    check_signature(settings, storage_name, key, exp=exp, sig=sig)
    return await open_stored(storages, storage_name, key)


async def open_stored(storages: StorageRegistry, storage_name: str, key: str) -> Blob:
    """Open a stored file for serving (404 ``blob_not_found``); the caller has authorized it
    (a URL signature, or a door that checked the token and looked the key up in its rows)."""
    if check_relative_path(key) is not None or key.split("/", 1)[0] not in SERVABLE_ROOTS:
        raise _not_found(storage_name, key)
    try:
        storage = storages.get(storage_name)
    except AppError as exc:
        raise _not_found(storage_name, key) from exc
    path = storage.local_path(key)
    if path is not None:
        try:
            file = await asyncio.to_thread(_open_regular, path)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise _not_found(storage_name, key) from exc
        st = os.fstat(file.fileno())
        return Blob(
            storage=storage,
            key=key,
            size=st.st_size,
            etag=f'"{st.st_mtime_ns:x}-{st.st_size:x}"',
            modified=datetime.fromtimestamp(st.st_mtime, UTC),
            file=file,
        )
    try:
        info = await storage.stat(key)
    except ObjectNotFound as exc:
        raise _not_found(storage_name, key) from exc
    etag = (info.etag or f"{info.size:x}").strip('"')
    return Blob(storage=storage, key=key, size=info.size, etag=f'"{etag}"', modified=info.modified)


def _open_regular(path: os.PathLike[str]) -> BinaryIO:
    file = open(path, "rb", buffering=0)  # noqa: SIM115 - closed by the response
    if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
        file.close()
        raise IsADirectoryError(str(path))
    return file


def _if_range_allows(if_range: str | None, blob: Blob) -> bool:
    if if_range is None:
        return True
    value = if_range.strip()
    if value.startswith(('"', "W/")):
        return value == blob.etag  # strong comparison: a weak validator never matches
    return blob.last_modified is not None and value == blob.last_modified


def requested_ranges(
    blob: Blob, range_header: str | None, if_range: str | None
) -> list[ByteRange] | None:
    """The ranges to send (None: the whole file), ``If-Range`` against the blob's validators;
    416 when none of them is satisfiable."""
    allowed = _if_range_allows(if_range, blob)
    return parse_range(range_header, blob.size) if allowed else None


async def serve_blob(
    settings: Settings,
    storages: StorageRegistry,
    storage_name: str,
    key: str,
    *,
    method: str,
    exp: str | None,
    sig: str | None,
    range_header: str | None,
    if_range: str | None,
) -> BlobResponse:
    blob = await open_blob(settings, storages, storage_name, key, exp=exp, sig=sig)
    return respond(blob, storage_name, method=method, range_header=range_header, if_range=if_range)


def respond(
    blob: Blob,
    storage_name: str,
    *,
    method: str,
    range_header: str | None,
    if_range: str | None,
    media_type: str | None = None,
) -> BlobResponse:
    """The response for an opened blob (ranges, If-Range, HEAD); closes it on a refusal."""
    try:
        ranges = requested_ranges(blob, range_header, if_range)
        return BlobResponse(
            blob, storage_name, ranges, head=method == "HEAD", media_type=media_type
        )
    except BaseException as exc:
        blob.close()
        if isinstance(exc, RangeNotSatisfiable):
            RESPONSES.labels(storage_name, "416").inc()
        raise


def _content_type(key: str) -> str:
    return "application/json" if key.endswith(".json") else "application/octet-stream"


class BlobResponse(Response):
    """200/206 for a Blob; sends with zero-copy when the server offers it, else streams."""

    def __init__(
        self,
        blob: Blob,
        storage_name: str,
        ranges: list[ByteRange] | None,
        *,
        head: bool,
        media_type: str | None = None,
        extra_headers: dict[str, str] | None = None,
    ):
        self.blob = blob
        self.storage_name = storage_name
        self.head = head
        self.background = None
        media_type = media_type or _content_type(blob.key)
        headers = {
            "accept-ranges": "bytes",
            "etag": blob.etag,
            "cache-control": "private, no-transform",
            **TENANT_BYTES_HEADERS,
        }
        if blob.last_modified:
            headers["last-modified"] = blob.last_modified
        # (header bytes before the part, offset, length) for each part of the body.
        self.parts: list[tuple[bytes, int, int]]
        self.trailer = b""
        if ranges is None:
            self.status_code = 200
            self.parts = [(b"", 0, blob.size)]
            headers["content-type"] = media_type
        elif len(ranges) == 1:
            only = ranges[0]
            self.status_code = 206
            self.parts = [(b"", only.start, only.length)]
            headers["content-type"] = media_type
            headers["content-range"] = f"bytes {only.start}-{only.end}/{blob.size}"
        else:
            self.status_code = 206
            boundary = secrets.token_hex(16)
            headers["content-type"] = f"multipart/byteranges; boundary={boundary}"
            self.parts = [
                (
                    (
                        f"\r\n--{boundary}\r\ncontent-type: {media_type}\r\n"
                        f"content-range: bytes {r.start}-{r.end}/{blob.size}\r\n\r\n"
                    ).encode(),
                    r.start,
                    r.length,
                )
                for r in ranges
            ]
            self.trailer = f"\r\n--{boundary}--\r\n".encode()
        length = sum(len(h) + n for h, _, n in self.parts) + len(self.trailer)
        headers["content-length"] = str(length)
        # A door's own headers (tensor_registry_server.hf_door: the commit, the linked size and
        # etag).
        headers.update(extra_headers or {})
        self.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sent = 0
        status = str(self.status_code)
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            if self.head:
                await send({"type": "http.response.body", "body": b""})
                return
            zerocopy = self.blob.file is not None and ZEROCOPY_SEND in scope.get("extensions", {})
            for header, offset, length in self.parts:
                if header:
                    await send({"type": "http.response.body", "body": header, "more_body": True})
                if zerocopy:
                    message: dict[str, Any] = {
                        "type": ZEROCOPY_SEND,
                        "file": self.blob.file,
                        "offset": offset,
                        "count": length,
                        "more_body": True,
                    }
                    try:
                        await send(message)
                    except ClientGone as exc:  # cut off: count what went out
                        sent += exc.sent
                        raise
                    sent += length
                else:
                    async for chunk in self.blob.chunks(offset, length):
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                        sent += len(chunk)
            await send({"type": "http.response.body", "body": self.trailer})
        except ClientGone:
            status = (
                "499"  # as the access log says (tensor_registry_server.middleware.CLIENT_CLOSED)
            )
            raise
        finally:
            self.blob.close()
            BYTES_SERVED.labels(self.storage_name).inc(sent)
            RESPONSES.labels(self.storage_name, status).inc()
