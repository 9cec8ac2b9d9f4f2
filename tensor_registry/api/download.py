"""One file's download from a signed blob URL: bounded, resumable, hashed.

Large files are read with parallel single-range GETs written in place; small ones with one
streamed GET. Every answer is checked against the range asked for and the signed size, a
dropped connection resumes with ``Range`` within the transfer's deadline
(tensor_registry/api/transfer.py), and the sha256 of what was written is returned for the
caller to compare with what the registry signed. The node cache (tensor_registry/node_cache.py)
is its one caller in the library: it decides where the bytes go and whether they are kept.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tensor_registry.api.client import (
    ChecksumMismatch,
    ConnectionFailed,
    RegistryError,
    TransferTimeout,
    error_from_response,
)
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


def _check_range_response(response: httpx.Response, start: int, end: int, size: int) -> None:
    if response.status_code >= 400:
        raise error_from_response(_capped_error(response))
    whole = start == 0 and end == size - 1
    if response.status_code == 200 and whole:
        _check_length(response, size)
        return
    expected = f"bytes {start}-{end}/{size}"
    if response.status_code != 206 or response.headers.get("content-range") != expected:
        raise RegistryError(
            f"the server answered Range {start}-{end} with HTTP {response.status_code} "
            f"({response.headers.get('content-range')!r}), not {expected!r}",
            code="range_not_honoured",
            status=response.status_code,
        )
    _check_length(response, end - start + 1)


def _check_length(response: httpx.Response, expected: int) -> None:
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) != expected:
        raise ChecksumMismatch(
            f"the server announces {int(declared):,} bytes where {expected:,} are expected",
            status=None,
        )


def _capped_error(response: httpx.Response) -> httpx.Response:
    """An error answer with its body read up to MAX_ERROR_BYTES (what error_from_response
    parses), never more."""
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > MAX_ERROR_BYTES:
            body = bytearray()
            break
    return httpx.Response(response.status_code, content=bytes(body), request=response.request)


class _Dropped(Exception):
    """The connection ended before the range did: resumed from ``offset`` when allowed."""

    def __init__(self, offset: int, cause: Exception) -> None:
        super().__init__(str(cause))
        self.offset, self.cause = offset, cause


# Answers worth a retry: a replica or proxy in trouble, which another attempt may not meet.
_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


def _read_range(
    client: httpx.Client,
    url: str,
    *,
    start: int,
    end: int,
    size: int,
    name: str,
    limits: TransferLimits,
    deadline: float,
    write: Callable[[bytes, int], None],
    stop: threading.Event | None = None,
) -> None:
    """Bytes [start, end] of ``url`` handed to ``write(chunk, offset)`` in order: never a byte
    past ``end`` (a longer answer fails at once), resumed with ``Range`` from the byte reached
    after a dropped connection or a 5xx (``limits.retries`` times, with backoff), all within
    ``deadline``."""
    offset = start
    attempt = 0
    while True:
        check_deadline(deadline, f"download of {name}")
        try:
            ranged = not (offset == 0 and end == size - 1)
            headers = {"Accept-Encoding": "identity"}
            if ranged:
                headers["Range"] = f"bytes={offset}-{end}"
            try:
                with client.stream("GET", url, headers=headers, timeout=limits.timeout()) as r:
                    if r.status_code in _RETRY_STATUSES:
                        raise _Dropped(offset, error_from_response(_capped_error(r)))
                    _check_range_response(r, offset, end, size)
                    for chunk in r.iter_bytes():
                        if stop is not None and stop.is_set():
                            return
                        if offset + len(chunk) > end + 1:
                            raise ChecksumMismatch(
                                f"{name}: the server sent more than the {size:,} bytes the "
                                "registry signed; reading stopped",
                                status=None,
                            )
                        write(chunk, offset)
                        offset += len(chunk)
                        check_deadline(deadline, f"download of {name}")
            except httpx.TransportError as exc:
                raise _Dropped(offset, exc) from exc
            if offset != end + 1:
                raise _Dropped(offset, ConnectionFailed(f"the body ended at byte {offset}"))
            return
        except _Dropped as dropped:
            attempt += 1
            cause = dropped.cause
            if attempt > limits.retries:
                if isinstance(cause, RegistryError):
                    raise cause from None
                if isinstance(cause, httpx.TimeoutException):
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


def download(
    client: httpx.Client,
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

            def append(chunk: bytes, offset: int) -> None:
                os.pwrite(fd, chunk, offset)
                digest.update(chunk)
                if progress:
                    progress(len(chunk))

            if size > 0:
                _read_range(
                    client,
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
                _read_empty(client, url, target.name, limits)
            return digest.hexdigest()
        os.ftruncate(fd, size)
        bounds = [(size * i // readers, size * (i + 1) // readers - 1) for i in range(readers)]
        failed = threading.Event()

        def place(chunk: bytes, offset: int) -> None:
            os.pwrite(fd, chunk, offset)
            if progress:
                progress(len(chunk))

        def fetch(start: int, end: int) -> None:
            try:
                _read_range(
                    client,
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


def _read_empty(client: httpx.Client, url: str, name: str, limits: TransferLimits) -> None:
    """A file the registry signed as empty: any byte is one too many."""
    try:
        with client.stream("GET", url, timeout=limits.timeout()) as r:
            if r.status_code >= 400:
                raise error_from_response(_capped_error(r))
            for chunk in r.iter_bytes():
                if chunk:
                    raise ChecksumMismatch(
                        f"{name}: the server sent bytes for a file signed as empty", status=None
                    )
    except httpx.TransportError as exc:
        raise ConnectionFailed(f"download of {name} failed: {exc}") from exc
