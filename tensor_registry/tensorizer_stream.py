"""An in-process HTTP reader for tensorizer: signed URL bytes straight into tensor memory.

Given a URL string, tensorizer reads HTTP through ``curl`` subprocesses (``CURLStreamFile``):
every byte is received by curl, written into a pipe and read again by Python — two extra copies
and a process per reader, which on a node with few cores costs a third of the throughput. Given
this stream instead, each of its parallel readers is one HTTP/1.1 connection whose socket data
``readinto`` lands directly in the destination buffer.

tensorizer only parallelises streams it can reopen at a byte range, and for HTTP it recognises
its own ``CURLStreamFile`` (whose ``_fork(begin, end)`` opens the range). ``HTTPRangeStream``
therefore *is a* ``CURLStreamFile`` for that check, but shares none of its state: every method
tensorizer calls on a stream (``read``, ``readinto``, ``seek``, ``tell``, ``close``, ``closed``,
``response_headers``, ``_fork``) is implemented here. The client's tests load through it with
tensorizer's own deserializer; if tensorizer's expectations change, they fail there.

It streams bytes that only tensorizer's own hashes check: ``tensor_registry.load_state_dict``
instead fetches the file through the node cache, checked against the signed sha256 first
(docs/trust.md). bench/engine/load.py and bench/engine/gpu_load.py measure both.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import socket
import threading
from typing import Any
from urllib.parse import urlsplit

from tensorizer.stream_io import CURLStreamFile

from tensor_registry.api.client import USER_AGENT

_SKIP_CHUNK = 1 << 20
TIMEOUT_SECONDS = 120.0  # idle: no byte for this long fails a read
# The overall deadline of one opened range (tensor_registry/api/transfer.py): GRACE_SECONDS +
# its Content-Length / MIN_BYTES_PER_SECOND. When it passes, a timer shuts the socket down,
# so a server dripping bytes inside the idle timeout cannot hold a load forever.
GRACE_SECONDS = 60.0
MIN_BYTES_PER_SECOND = float(1 << 20)


class HTTPRangeStream(CURLStreamFile):
    """A readable, forward-seekable HTTP(S) stream of ``uri`` bytes [begin, end)."""

    def __init__(
        self,
        uri: str,
        begin: int | None = None,
        end: int | None = None,
        headers: dict[str, Any] | None = None,
        **_: Any,
    ) -> None:
        # CURLStreamFile.__init__ would start curl: deliberately not called.
        self._uri = uri
        self._begin = begin or 0
        self._end = end  # exclusive
        self._headers = headers
        self._curr = self._begin
        self._closed = False
        self._error_context: list[str] = []
        self.bytes_read = 0
        self.bytes_skipped = 0
        self.read_operations = 0
        self._conn: http.client.HTTPConnection | None = None
        self._response: http.client.HTTPResponse | None = None
        self.response_headers: dict[str, str] = {}
        self._watchdog: threading.Timer | None = None
        self._expired = False
        self._open()

    def _open(self) -> None:
        parts = urlsplit(self._uri)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise OSError(f"not an http(s) URL: {parts.scheme}://{parts.hostname}")
        connection = (
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        )
        self._conn = connection(parts.hostname, parts.port, timeout=TIMEOUT_SECONDS)
        headers = {"Accept-Encoding": "identity", "User-Agent": USER_AGENT}
        ranged = self._begin > 0 or self._end is not None
        if ranged:
            last = "" if self._end is None else str(self._end - 1)
            headers["Range"] = f"bytes={self._begin}-{last}"
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        try:
            self._conn.request("GET", target, headers=headers)
            response = self._conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise OSError(f"Failed to open stream: {exc}") from exc
        self.response_headers = {k.lower(): v for k, v in response.getheaders()}
        if response.status >= 300 or (ranged and self._begin > 0 and response.status != 206):
            self.close()
            # The same wording as tensorizer's curl reader; callers ask the URL what it was.
            raise OSError(f"Failed to open stream: HTTP/1.1 {response.status} {response.reason}")
        self._response = response
        self._arm(response)

    def _arm(self, response: http.client.HTTPResponse) -> None:
        """Start the deadline's timer for this response (none without a Content-Length)."""
        if response.length is None:
            return
        seconds = GRACE_SECONDS + response.length / MIN_BYTES_PER_SECOND
        self._expired = False
        sock = self._conn.sock if self._conn is not None else None
        if sock is None:
            return

        def expire() -> None:
            self._expired = True
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

        self._watchdog = threading.Timer(seconds, expire)
        self._watchdog.daemon = True
        self._watchdog.start()

    def _check_expired(self) -> None:
        if self._expired:
            self.close()
            raise TimeoutError(f"{self._uri.split('?')[0]}: the range did not arrive in time")

    # -- what tensorizer reads with ------------------------------------------------------------

    def readinto(self, buffer: Any) -> int:
        if self._closed or self._response is None:
            raise OSError("HTTPRangeStream closed.")
        view = memoryview(buffer).cast("B")
        total = 0
        while total < len(view):
            try:
                got = self._response.readinto(view[total:])
            except (OSError, http.client.HTTPException):
                self._check_expired()
                raise
            if not got:
                self._check_expired()
                break
            total += got
        self._curr += total
        self.bytes_read += total
        self.read_operations += 1
        return total

    def read(self, size: int | None = None) -> bytes:
        if size is None or size < 0:
            if self._closed or self._response is None:
                raise OSError("HTTPRangeStream closed.")
            try:
                data = self._response.read()
            except (OSError, http.client.HTTPException):
                self._check_expired()
                raise
            self._check_expired()
            self._curr += len(data)
            self.bytes_read += len(data)
            return data
        buffer = bytearray(size)
        got = self.readinto(buffer)
        return bytes(buffer[:got])

    def tell(self) -> int:
        return self._curr

    def seek(self, position: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            position += self._curr
        elif whence != io.SEEK_SET:
            raise ValueError("Unsupported `whence`")
        if position > self._curr:
            skipped = position - self._curr
            scratch = bytearray(min(_SKIP_CHUNK, skipped))
            while self._curr < position:
                want = min(len(scratch), position - self._curr)
                if not self.readinto(memoryview(scratch)[:want]):
                    break
            self.bytes_skipped += skipped
        elif position < self._curr:
            self.close()
            self._begin, self._curr, self._closed = position, position, False
            self._open()
        return self._curr

    def _fork(self, begin: int | None = None, end: int | None = None) -> HTTPRangeStream:
        return HTTPRangeStream(self._uri, begin=begin, end=end, headers=self._headers)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def fileno(self) -> int:
        return -1

    def readline(self, size: int | None = -1) -> bytes:
        raise io.UnsupportedOperation("readline")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        watchdog = getattr(self, "_watchdog", None)
        if watchdog is not None:
            watchdog.cancel()
            self._watchdog = None
        response, conn = getattr(self, "_response", None), getattr(self, "_conn", None)
        self._response = self._conn = None
        if response is not None:
            response.close()
        if conn is not None:
            conn.close()

    def __del__(self) -> None:
        self.close()
