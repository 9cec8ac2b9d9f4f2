"""One file's download from a signed blob URL: bounded, resumable, hashed.

Large files are read with parallel single-range GETs written in place; small ones with one
streamed GET. Every answer is checked against the range asked for and the signed size, a
dropped connection resumes with ``Range`` within the transfer's deadline
(tensor_registry/api/transfer.py), and the sha256 of what was written is returned for the
caller to compare with what the registry signed. The node cache (tensor_registry/node_cache.py)
and the warm-state restore (tensor_registry/warm/node.py) are its callers in the library: they
decide where the bytes go and whether they are kept.

Bodies are read over plain HTTP/1.1 connections (tensor_registry/api/http1.py), one receive at
a time into one buffer per reader, the deadline checked between receives.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import SplitResult

from tensor_registry.api.client import (
    USER_AGENT,
    ChecksumMismatch,
    ConnectionFailed,
    RegistryError,
    TransferTimeout,
    error_from_response,
)
from tensor_registry.api.http1 import as_httpx, connect, split_url
from tensor_registry.api.transfer import (
    DEFAULT_LIMITS,
    MAX_ERROR_BYTES,
    TransferLimits,
    check_deadline,
)
from tensor_registry.formats.digests import sha256_file

CHUNK = 4 * 1024 * 1024
# Below this size one GET is faster than splitting (and hashing happens on the fly).
PARALLEL_MIN_BYTES = 64 * 1024 * 1024
DEFAULT_READERS = 8

Progress = Callable[[int], None]
Write = Callable[[memoryview, int], None]


def _check_range_response(
    response: http.client.HTTPResponse, start: int, end: int, size: int
) -> None:
    if response.status >= 400:
        raise _capped_error(response)
    whole = start == 0 and end == size - 1
    if response.status == 200 and whole:
        _check_length(response, size)
        return
    expected = f"bytes {start}-{end}/{size}"
    served = response.getheader("content-range")
    if response.status != 206 or served != expected:
        raise RegistryError(
            f"the server answered Range {start}-{end} with HTTP {response.status} "
            f"({served!r}), not {expected!r}",
            code="range_not_honoured",
            status=response.status,
        )
    _check_length(response, end - start + 1)


def _check_length(response: http.client.HTTPResponse, expected: int) -> None:
    declared = response.getheader("content-length")
    if declared is not None and declared.isdigit() and int(declared) != expected:
        raise ChecksumMismatch(
            f"the server announces {int(declared):,} bytes where {expected:,} are expected",
            status=None,
        )


def _capped_error(response: http.client.HTTPResponse) -> RegistryError:
    """The error an answer names, its body read up to MAX_ERROR_BYTES (what
    error_from_response parses), never more."""
    body = response.read(MAX_ERROR_BYTES + 1)
    return error_from_response(as_httpx(response, b"" if len(body) > MAX_ERROR_BYTES else body))


class _Dropped(Exception):
    """The connection ended before the range did: resumed from ``offset`` when allowed."""

    def __init__(self, offset: int, cause: Exception) -> None:
        super().__init__(str(cause))
        self.offset, self.cause = offset, cause


# Answers worth a retry: a replica or proxy in trouble, which another attempt may not meet.
_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


def _read_range(
    url: str,
    *,
    start: int,
    end: int,
    size: int,
    name: str,
    limits: TransferLimits,
    deadline: float,
    write: Write,
    stop: threading.Event | None = None,
) -> None:
    """Bytes [start, end] of ``url`` handed to ``write(piece, offset)`` in order (``piece`` is
    a view of a buffer that is reused: copy what must outlive the call): never a byte past
    ``end`` (a longer answer fails at once), resumed with ``Range`` from the byte reached after
    a dropped connection or a 5xx (``limits.retries`` times, with backoff), all within
    ``deadline``."""
    parts, target = split_url(url)
    buffer = memoryview(bytearray(min(CHUNK, end - start + 2)))
    offset = start
    attempt = 0
    while True:
        check_deadline(deadline, f"download of {name}")
        try:
            offset = _read_once(
                parts, target, offset, end, size, name, limits, deadline, buffer, write, stop
            )
            return
        except _Dropped as dropped:
            offset = dropped.offset
            attempt += 1
            cause = dropped.cause
            if attempt > limits.retries:
                if isinstance(cause, RegistryError):
                    raise cause from None
                if isinstance(cause, TimeoutError):
                    raise TransferTimeout(
                        f"download of {name}: no bytes for {limits.idle_seconds:g} s", status=None
                    ) from cause
                raise ConnectionFailed(f"download of {name} failed: {cause}") from cause
            pause = limits.backoff(attempt)
            if time.monotonic() + pause > deadline:
                raise TransferTimeout(
                    f"download of {name}: no time left to resume from byte {offset} ({cause})",
                    status=None,
                ) from None
            time.sleep(pause)


def _get(
    conn: http.client.HTTPConnection, target: str, limits: TransferLimits, asked: str | None
) -> http.client.HTTPResponse:
    """Send one GET (``asked``: its Range, None for the whole file) and read the answer's
    head; from the request on, each socket call may wait ``limits.idle_seconds``."""
    headers = {"Accept-Encoding": "identity", "User-Agent": USER_AGENT}
    if asked is not None:
        headers["Range"] = asked
    conn.request("GET", target, headers=headers)
    if conn.sock is not None:
        conn.sock.settimeout(limits.idle_seconds)
    return conn.getresponse()


def _read_once(
    parts: SplitResult,
    target: str,
    offset: int,
    end: int,
    size: int,
    name: str,
    limits: TransferLimits,
    deadline: float,
    buffer: memoryview,
    write: Write,
    stop: threading.Event | None,
) -> int:
    """One request for bytes [offset, end], its body handed to ``write``; returns ``end + 1``
    (or where ``stop`` found it). ``_Dropped`` where it may be resumed from."""
    ranged = not (offset == 0 and end == size - 1)
    conn = connect(parts, min(10.0, limits.idle_seconds))
    try:
        try:
            response = _get(conn, target, limits, f"bytes={offset}-{end}" if ranged else None)
            if response.status in _RETRY_STATUSES:
                raise _Dropped(offset, _capped_error(response))
            _check_range_response(response, offset, end, size)
            # A body of known length that is not chunked is read from the socket's reader
            # directly (one receive per call, straight into ``buffer``); any other through
            # http.client's decoding.
            plain = not response.chunked and response.length is not None
            while offset <= end:
                if stop is not None and stop.is_set():
                    return offset
                # One byte more than is left: a body longer than the range shows at once.
                want = min(len(buffer), end + 2 - offset)
                if plain:
                    got = response.fp.readinto1(buffer[:want]) if response.fp else 0
                else:
                    data = response.read1(want)
                    got = len(data)
                    buffer[:got] = data
                if not got:
                    raise _Dropped(offset, ConnectionFailed(f"the body ended at byte {offset}"))
                if offset + got > end + 1:
                    raise ChecksumMismatch(
                        f"{name}: the server sent more than the {size:,} bytes the "
                        "registry signed; reading stopped",
                        status=None,
                    )
                write(buffer[:got], offset)
                offset += got
                check_deadline(deadline, f"download of {name}")
            return offset
        except ssl.SSLCertVerificationError as exc:
            # Not a dropped connection: asking again meets the same certificate.
            raise ConnectionFailed(f"download of {name}: {exc}") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise _Dropped(offset, exc) from exc
    finally:
        conn.close()


def download(
    url: str,
    target: Path,
    *,
    size: int,
    readers: int = DEFAULT_READERS,
    progress: Progress | None = None,
    parallel_min_bytes: int = PARALLEL_MIN_BYTES,
    limits: TransferLimits = DEFAULT_LIMITS,
) -> str:
    """Write ``url`` (``size`` bytes) to ``target``; returns its sha256.

    Large files are read with ``readers`` parallel single-range GETs written in place with
    pwrite, then hashed in one pass (from the page cache); small ones with one streamed GET
    hashed on the fly. Either way nothing past ``size`` is written, a short answer fails, and
    a dropped connection resumes with ``Range`` from where it stopped, within the transfer's
    deadline (tensor_registry/api/transfer.py).
    """
    readers = max(1, readers)
    deadline = limits.deadline(size)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
        if size == 0 or size < parallel_min_bytes or readers == 1:
            digest = hashlib.sha256()

            def append(chunk: memoryview, offset: int) -> None:
                os.pwrite(fd, chunk, offset)
                digest.update(chunk)
                if progress:
                    progress(len(chunk))

            if size > 0:
                _read_range(
                    url,
                    start=0,
                    end=size - 1,
                    size=size,
                    name=target.name,
                    limits=limits,
                    deadline=deadline,
                    write=append,
                )
            else:
                _read_empty(url, target.name, limits)
            return digest.hexdigest()
        os.ftruncate(fd, size)
        bounds = [(size * i // readers, size * (i + 1) // readers - 1) for i in range(readers)]
        failed = threading.Event()

        def place(chunk: memoryview, offset: int) -> None:
            os.pwrite(fd, chunk, offset)
            if progress:
                progress(len(chunk))

        def fetch(start: int, end: int) -> None:
            try:
                _read_range(
                    url,
                    start=start,
                    end=end,
                    size=size,
                    name=target.name,
                    limits=limits,
                    deadline=deadline,
                    write=place,
                    stop=failed,
                )
            except BaseException:
                failed.set()
                raise

        with ThreadPoolExecutor(max_workers=readers, thread_name_prefix="pull") as pool:
            futures = [pool.submit(fetch, start, end) for start, end in bounds if end >= start]
            for future in futures:
                future.result()
    finally:
        os.close(fd)
    return sha256_file(target)


def _read_empty(url: str, name: str, limits: TransferLimits) -> None:
    """A file the registry signed as empty: any byte is one too many."""
    parts, target = split_url(url)
    conn = connect(parts, min(10.0, limits.idle_seconds))
    try:
        response = _get(conn, target, limits, None)
        if response.status >= 400:
            raise _capped_error(response)
        if response.read1(1):
            raise ChecksumMismatch(
                f"{name}: the server sent bytes for a file signed as empty", status=None
            )
    except (OSError, http.client.HTTPException) as exc:
        raise ConnectionFailed(f"download of {name} failed: {exc}") from exc
    finally:
        conn.close()
