"""Where a file's bytes come from, a block at a time: a local file or HTTP range connections.

A local file (the node cache's copy) is read with ``preadv`` into the caller's buffer. A signed
URL is read through ``_HTTPRangeReader``s, each one HTTP/1.1 keep-alive connection fetching
exact ranges (206, exact Content-Range) for one of the loader's threads; a whole-file 200 or
another range is refused (``_WrongRange``, which app.client.engine.checks turns into a
``ChunkMismatch``), and a file shorter than the manifest says comes back as a short read.
"""

from __future__ import annotations

import http.client
import os
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from app.client.api import USER_AGENT, ConnectionFailed, error_from_response
from app.client.layout import FileLayout

BLOCK_BYTES = 64 << 20
PIECE_BYTES = 4 << 20  # at most this much per landed piece where a body is read by http.client
DEFAULT_CONNECTIONS = 16
HTTP_TIMEOUT = 120.0


class _FileSource:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)

    def reader(self) -> Callable[[int, memoryview], int]:
        fd = self.fd

        def read_into(offset: int, buffer: memoryview) -> int:
            got = 0
            while got < len(buffer):
                n = os.preadv(fd, [buffer[got:]], offset + got)
                if n <= 0:
                    break
                got += n
            return got

        return read_into

    def close(self) -> None:
        os.close(self.fd)


class _WrongRange(Exception):
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


class _HTTPRangeReader:
    """One keep-alive HTTP/1.1 connection reading exact byte ranges of ``url``."""

    def __init__(self, url: str, size: int) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConnectionFailed(f"not an http(s) URL: {parts.scheme}://{parts.hostname}")
        self.parts = parts
        self.size = size
        self.target = parts.path + (f"?{parts.query}" if parts.query else "")
        self.conn: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        kind = (
            http.client.HTTPSConnection
            if self.parts.scheme == "https"
            else http.client.HTTPConnection
        )
        return kind(self.parts.hostname or "", self.parts.port, timeout=HTTP_TIMEOUT)

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
        end = offset + len(buffer) - 1
        headers = {"Range": f"bytes={offset}-{end}", "Accept-Encoding": "identity"}
        headers["User-Agent"] = USER_AGENT
        for attempt in (1, 2):
            if self.conn is None:
                self.conn = self._connect()
            try:
                self.conn.request("GET", self.target, headers=headers)
                response = self.conn.getresponse()
                break
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if attempt == 2:
                    raise ConnectionFailed(f"range {offset}-{end}: {exc}") from exc
        if response.status == 416:
            response.read()
            return 0  # past the end: the file is shorter than the manifest says
        if response.status >= 300:
            body = response.read(64 * 1024)
            self.close()
            raise error_from_response(
                httpx.Response(response.status, headers=dict(response.getheaders()), content=body)
            )
        served = response.getheader("content-range")
        want = len(buffer)
        if response.status != 206 or served != f"bytes {offset}-{end}/{self.size}":
            shorter = _shorter_file(served, offset, end, self.size)
            if response.status != 206 or shorter is None:
                # A whole-file 200 or another range: bytes this load must not use.
                self.close()
                raise _WrongRange(
                    offset, end + 1, f"HTTP {response.status}, Content-Range {served!r}"
                )
            want = shorter  # the stored file is shorter than the manifest: a short read
        # http.client's readinto fills all it is given, one receive after another, before it
        # returns; its buffered reader's readinto1 returns after one receive (≈ 1.5 MB each on
        # loopback), so ``landed`` sees each piece at once. That is for a plain body of exactly
        # the bytes asked for (closed by hand once they are all in); any other body is read
        # through http.client, in pieces of at most PIECE_BYTES when ``landed`` wants them.
        one = landed is not None and not response.chunked and response.length == want
        piece = PIECE_BYTES if landed is not None else want
        got = 0
        try:
            while got < want:
                if one:
                    n = response.fp.readinto1(buffer[got:want])
                else:
                    n = response.readinto(buffer[got : min(want, got + piece)])
                if not n:
                    break
                if landed is not None:
                    landed(offset + got, buffer[got : got + n])
                got += n
            if one and got == want:
                response.close()  # its whole body is in: the connection can be reused
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise ConnectionFailed(f"range {offset}-{end}: {exc}") from exc
        except BaseException:
            self.close()  # ``landed`` refused a piece: the rest of the body stays unread
            raise
        if got < len(buffer) or response.will_close:
            self.close()
        return got

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _blocks(size: int, block: int) -> list[tuple[int, int]]:
    return [(s, min(size, s + block)) for s in range(0, size, block)]


def _block_size(file: FileLayout, block_bytes: int) -> int:
    return max(file.chunk_bytes, block_bytes // file.chunk_bytes * file.chunk_bytes)
