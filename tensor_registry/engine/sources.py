"""Where a file's bytes come from, a block at a time: a local file or HTTP range connections.

A local file (the node cache's copy) is read with ``preadv`` into the caller's buffer. A signed
URL is read through ``HTTPRangeReader``s, each one HTTP/1.1 keep-alive connection fetching
exact ranges (206, exact Content-Range) for one of the loader's threads; a whole-file 200 or
another range is refused (``WrongRange``, which tensor_registry.engine.checks turns into a
``ChunkMismatch``), and a file shorter than the manifest says comes back as a short read.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import random
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path

from tensor_registry.api.client import (
    USER_AGENT,
    ConnectionFailed,
    TransferTimeout,
    error_from_response,
)
from tensor_registry.api.http1 import as_httpx, connect, split_url
from tensor_registry.formats.layout import FileLayout

BLOCK_BYTES = 64 << 20
# The most one range request asks for: a file is read in many requests whatever its size (each
# passes the registry's signature check, and a failed one costs a bounded retry).
URL_RANGE_MAX = 1 << 30
PIECE_BYTES = 4 << 20  # at most this much per landed piece where a body is read by http.client
DEFAULT_CONNECTIONS = 16
HTTP_TIMEOUT = 120.0  # idle: no byte for this long fails the read
# Every range request also has an overall deadline from its length (tensor_registry/api/
# transfer.py): GRACE_SECONDS + length / MIN_BYTES_PER_SECOND, so a server that drips a byte
# at a time inside the idle timeout cannot hold a load forever.
GRACE_SECONDS = 60.0
MIN_BYTES_PER_SECOND = float(1 << 20)
# A range whose connection drops mid-body (a replica killed, a proxy reset, an idle timeout)
# is asked again from the first byte not received, up to RESUME_RETRIES times per range with
# exponential backoff and jitter, within the range's deadline (issue 29 §5).
RESUME_RETRIES = 4
RESUME_BACKOFF_SECONDS = 0.25
RESUME_BACKOFF_MAX_SECONDS = 4.0


class FileSource:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)

    def span(self, offset: int, length: int) -> _FileSpan:
        """Bytes [offset, offset + length), read in order into the caller's buffers."""
        return _FileSpan(self.fd, offset)

    def close(self) -> None:
        os.close(self.fd)


class _FileSpan:
    def __init__(self, fd: int, offset: int) -> None:
        self.fd, self.at = fd, offset

    def read_into(self, buffer: memoryview) -> int:
        """The next ``len(buffer)`` bytes (fewer: the file ended)."""
        got = 0
        while got < len(buffer):
            n = os.preadv(self.fd, [buffer[got:]], self.at + got)
            if n <= 0:
                break
            got += n
        self.at += got
        return got

    def close(self) -> None:
        return None


class _Cut(Exception):
    """A body's connection failed after ``got`` bytes of this read had arrived."""

    def __init__(self, got: int, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.got, self.cause = got, cause


class WrongRange(Exception):
    def __init__(self, start: int, end: int, what: str) -> None:
        super().__init__(what)
        self.start, self.end, self.what = start, end, what


def _shorter_file(served: str | None, offset: int, end: int, size: int) -> int | None:
    """Bytes a 206 carries when it answers ``offset``-``end`` of a file shorter than ``size``
    ("bytes OFFSET-LAST/TOTAL" with LAST < end and TOTAL < size); else None."""
    try:
        span, _, total = (served or "").removeprefix("bytes ").partition("/")
        first, _, last = span.partition("-")
        if int(first) == offset and int(last) < end and int(last) + 1 == int(total) < size:
            return int(last) - offset + 1
    except ValueError:
        pass
    return None


class HTTPRangeReader:
    """One keep-alive HTTP/1.1 connection reading exact byte ranges of ``url``."""

    def __init__(self, url: str, size: int) -> None:
        self.parts, self.target = split_url(url)
        self.size = size
        self.conn: http.client.HTTPConnection | None = None
        self.asked: tuple[int, int] | None = None  # a range requested, its answer not yet read

    def _connect(self) -> http.client.HTTPConnection:
        return connect(self.parts, HTTP_TIMEOUT)

    def __call__(
        self,
        offset: int,
        buffer: memoryview,
        landed: Callable[[int, memoryview], None] | None = None,
    ) -> int:
        """Read bytes [offset, offset + len(buffer)) into ``buffer``; returns the count read.
        With ``landed``, it is called with (file offset, bytes) of every piece, in order, as
        soon as one receive call has put it in ``buffer``: the caller sees each piece while it
        is still in the CPU's cache, and while the rest of the range is still arriving."""
        body = self.span(offset, len(buffer))
        try:
            return body.read_into(buffer, landed)
        finally:
            body.close()

    def _request(self, offset: int, length: int) -> None:
        if self.conn is None:
            self.conn = self._connect()
        headers = {
            "Range": f"bytes={offset}-{offset + length - 1}",
            "Accept-Encoding": "identity",
            "User-Agent": USER_AGENT,
        }
        self.conn.request("GET", self.target, headers=headers)

    def ask(self, offset: int, length: int) -> None:
        """Send the request for bytes [offset, offset + length) now and return at once:
        ``span`` of the same range then reads its answer. The loader asks for a reader's next
        span on a second connection while the last block of the current one arrives, so the
        server's handling of the request (a signature check and a file opened, on its event
        loop) overlaps the transfer instead of following it (tensor_registry.engine.cuda). A request
        that could not be sent is sent again by ``span``."""
        self.asked = None
        try:
            self._request(offset, length)
            self.asked = (offset, length)
        except (OSError, http.client.HTTPException):
            self.close()

    def span(self, offset: int, length: int) -> _RangeBody:
        """Ask for bytes [offset, offset + length) in one request (unless ``ask`` did); the
        body is then read in pieces, in order (``_RangeBody.read_into``): one request for many
        ring buffers."""
        end = offset + length - 1
        for attempt in (1, 2):
            try:
                if self.asked != (offset, length):
                    if self.asked is not None:
                        self.close()  # the answer to another range: never read here
                    self._request(offset, length)
                self.asked = None
                response = self.conn.getresponse()  # type: ignore[union-attr]
                break
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if attempt == 2:
                    raise ConnectionFailed(f"range {offset}-{end}: {exc}") from exc
        if response.status == 416:
            response.read()
            # Past the end: the file is shorter than the manifest says.
            return _RangeBody(self, response, offset, length, 0)
        if response.status >= 300:
            body = response.read(64 * 1024)
            self.close()
            raise error_from_response(as_httpx(response, body))
        served = response.getheader("content-range")
        want = length
        if response.status != 206 or served != f"bytes {offset}-{end}/{self.size}":
            shorter = _shorter_file(served, offset, end, self.size)
            if response.status != 206 or shorter is None:
                # A whole-file 200 or another range: bytes this load must not use.
                self.close()
                raise WrongRange(
                    offset, end + 1, f"HTTP {response.status}, Content-Range {served!r}"
                )
            want = shorter  # the stored file is shorter than the manifest: a short read
        return _RangeBody(self, response, offset, length, want)

    def close(self) -> None:
        self.asked = None
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class _RangeBody:
    """The body of one range request, read in order into the caller's buffers.

    A plain body of exactly the bytes expected (closed by hand once they are all in, so the
    connection is reused) is read past http.client: without ``landed`` straight from the
    socket with MSG_WAITALL (_receive_all); with it through the buffered reader's readinto1,
    which returns after one receive (≈ 1.5 MB each on loopback), so ``landed`` sees each piece
    at once. Any other body is read through http.client, in pieces of at most PIECE_BYTES when
    ``landed`` wants them. A body not read to its end closes the connection (``close``)."""

    def __init__(
        self,
        reader: HTTPRangeReader,
        response: http.client.HTTPResponse,
        offset: int,
        length: int,
        want: int,
    ) -> None:
        self.reader, self.response = reader, response
        self.at, self.left = offset, want
        self.deadline = time.monotonic() + GRACE_SECONDS + max(want, 0) / MIN_BYTES_PER_SECOND
        self.plain = not response.chunked and response.length == want
        self.drained = False  # what http.client buffered with the headers is taken
        # The exact range was promised (206, its Content-Range): a body that ends before it
        # did is a dropped connection, resumed; a shorter file's body is not.
        self.exact = want == length and want > 0
        self.resumes = 0

    def read_into(
        self, buffer: memoryview, landed: Callable[[int, memoryview], None] | None = None
    ) -> int:
        """The next ``len(buffer)`` bytes of the range (fewer: the body ended early). A
        connection that drops before the range is complete is resumed (``_resume``)."""
        want = min(len(buffer), self.left)
        got = 0
        try:
            while True:
                error: BaseException | None = None
                try:
                    got += self._receive(buffer[got:want], landed, self.at + got)
                except _Cut as cut:
                    got += cut.got
                    error = cut.cause
                if got >= want or (error is None and not self.exact):
                    break
                if not self._resume(self.at + got, self.left - got):
                    if error is not None:
                        raise ConnectionFailed(f"range at {self.at}: {error}") from error
                    break
        except BaseException:
            self.reader.close()  # ``landed`` refused a piece, or the body failed for good
            raise
        self.at += got
        self.left -= got
        response = self.response
        if got < len(buffer):
            self.left = 0
            self.reader.close()  # ended early: nothing more of it to read or reuse
        elif self.left == 0:
            if self.plain:
                response.close()  # its whole body is in: the connection can be reused
            if response.will_close or not self.plain:
                self.reader.close()
        return got

    def _receive(
        self, view: memoryview, landed: Callable[[int, memoryview], None] | None, at: int
    ) -> int:
        """Bytes of the current answer into ``view`` (fewer: its body ended); ``_Cut`` with the
        count received when the connection fails."""
        response, conn = self.response, self.reader.conn
        got = 0
        try:
            if self.plain and landed is None and self.reader.parts.scheme == "http":
                assert conn is not None
                got = _receive_all(
                    conn, response, view, drain=not self.drained, deadline=self.deadline
                )
                self.drained = True
            else:
                # One receive per call (readinto1 / read1), the deadline checked between them:
                # a read never waits more than the idle timeout past it.
                piece = PIECE_BYTES if landed is not None else len(view)
                while got < len(view):
                    if self.plain:
                        n = response.fp.readinto1(view[got:])
                    else:
                        data = response.read1(min(len(view), got + piece) - got)
                        n = len(data)
                        view[got : got + n] = data
                    if not n:
                        break
                    if landed is not None:
                        landed(at + got, view[got : got + n])
                    got += n
                    if got < len(view) and time.monotonic() > self.deadline:
                        raise TransferTimeout(f"range at {at}: past its deadline", status=None)
        except (OSError, http.client.HTTPException) as exc:
            raise _Cut(got, exc) from exc
        return got

    def _resume(self, start: int, length: int) -> bool:
        """Ask again for bytes [start, start + length) on a new connection, after a backoff;
        False when the retries or the deadline are spent. The answer must be exactly that
        range (else ``WrongRange``)."""
        end = start + length - 1
        while self.resumes < RESUME_RETRIES and length > 0:
            self.resumes += 1
            ceiling = min(
                RESUME_BACKOFF_MAX_SECONDS, RESUME_BACKOFF_SECONDS * 2 ** (self.resumes - 1)
            )
            pause = random.uniform(ceiling / 2, ceiling)
            if time.monotonic() + pause > self.deadline:
                return False
            time.sleep(pause)
            self.reader.close()
            try:
                self.reader._request(start, length)
                response = self.reader.conn.getresponse()  # type: ignore[union-attr]
            except (OSError, http.client.HTTPException):
                self.reader.close()
                continue
            if response.status in (429, 502, 503, 504):
                self.reader.close()  # a replica or proxy in trouble: the next try may not meet it
                continue
            if response.status >= 300:
                body = response.read(64 * 1024)
                self.reader.close()  # an expired signature, say: the caller's to handle
                raise error_from_response(as_httpx(response, body))
            served = response.getheader("content-range")
            if response.status != 206 or served != f"bytes {start}-{end}/{self.reader.size}":
                self.reader.close()
                raise WrongRange(
                    start, end + 1, f"HTTP {response.status}, Content-Range {served!r}"
                )
            self.response = response
            self.plain = not response.chunked and response.length == length
            self.drained = False
            return True
        return False

    def close(self) -> None:
        """Done with the range: a body left unread takes the connection with it."""
        if self.left > 0:
            self.reader.close()


def _receive_all(
    conn: http.client.HTTPConnection,
    response: http.client.HTTPResponse,
    view: memoryview,
    *,
    drain: bool = True,
    deadline: float | None = None,
) -> int:
    """Fill ``view`` with the response's body: first what http.client's reader buffered
    with the headers, then the rest straight from the socket, ``MSG_WAITALL`` (the kernel
    copies segment after segment in one call and wakes the thread once, not once per receive:
    24 loopback TCP connections into pinned memory on 16-core H200 hosts carried 29.8-35.5 GB/s
    so against 22.4-26.9 with plain receives, bench/engine/url_ceiling.py; bench/RESULTS.md).
    Returns the bytes received (fewer: the server closed early); a peer silent for HTTP_TIMEOUT
    seconds raises TimeoutError.

    MSG_WAITALL waits only on a blocking socket, so the connection's socket is made blocking
    here with the same timeout kept by the kernel (SO_RCVTIMEO, SO_SNDTIMEO): the headers of
    the connection's later requests are read under it too.

    With ``deadline`` (monotonic) one receive waits at most until then (the kernel timeout is
    lowered to what is left for it, and put back after): past it, ``TransferTimeout``."""
    sock = conn.sock
    assert sock is not None
    if sock.gettimeout() is not None:
        sock.settimeout(None)
        _kernel_timeouts(sock, HTTP_TIMEOUT, send=True)
    got = 0
    lowered = False
    try:
        if drain and response.fp is not None:
            # What came with the headers (when nothing did: one receive of the reader's size).
            buffered = len(response.fp.peek(1)[: len(view)])
            got = response.fp.readinto(view[:buffered]) if buffered else 0
        while got < len(view):
            wait = HTTP_TIMEOUT
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TransferTimeout(f"range: past its deadline at byte {got}", status=None)
                if left < HTTP_TIMEOUT:
                    wait, lowered = left, True
                    _kernel_timeouts(sock, wait)
            try:
                n = sock.recv_into(view[got:], len(view) - got, socket.MSG_WAITALL)
            except BlockingIOError:
                if deadline is not None and time.monotonic() >= deadline:
                    continue  # the deadline's turn to speak
                raise TimeoutError(f"no bytes for {HTTP_TIMEOUT:g} s") from None
            if not n:
                break
            got += n
    except OSError as exc:
        raise _Cut(got, exc) from exc
    finally:
        if lowered:
            with contextlib.suppress(OSError):
                _kernel_timeouts(sock, HTTP_TIMEOUT)
    return got


def _kernel_timeouts(sock: socket.socket, seconds: float, *, send: bool = False) -> None:
    # A zero timeval means "wait forever" to the kernel: never less than one microsecond.
    micros = max(1, int(seconds * 1e6))
    limit = struct.pack("ll", micros // 1_000_000, micros % 1_000_000)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
    if send:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)


def block_ranges(size: int, block: int) -> list[tuple[int, int]]:
    return [(s, min(size, s + block)) for s in range(0, size, block)]


def block_size_for(file: FileLayout, block_bytes: int) -> int:
    return max(file.chunk_bytes, block_bytes // file.chunk_bytes * file.chunk_bytes)
