"""Blob bytes sent on threads: a blocking ``os.sendfile`` per download, off the event loop.

A sendfile call does the kernel's TCP work for what it sends (on loopback the receiving side's
too), so on uvicorn's event loop, one thread, every download of a ``serve`` shared one core's
worth of it: 5.6-8.8 GB/s to a 16-core H200 host's loader, against 21-28 GB/s on threads
(bench/RESULTS.md). tensor_registry_server.blobs.zerocopy uses a ``SendfilePool`` thread when
one is free and the event loop's own sendfile otherwise.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from concurrent.futures import ThreadPoolExecutor


class SendfilePool:
    """Threads for blocking-style sendfile calls; used only by the event loop's thread, so the
    busy count needs no lock."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.busy = 0
        self._executor: ThreadPoolExecutor | None = None

    def take(self) -> ThreadPoolExecutor | None:
        """A free thread's pool (counted busy until ``give``), or None when all are sending."""
        if self.busy >= self.threads:
            return None
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="sendfile")
        self.busy += 1
        return self._executor

    def give(self) -> None:
        self.busy -= 1


def sendfile_blocking(sock_fd: int, file_fd: int, offset: int, count: int, idle: float) -> int:
    """Send ``count`` bytes of the file from ``offset`` on the socket; returns the bytes sent
    (fewer: the file ended). Raises TimeoutError when the client takes nothing for ``idle``
    seconds, OSError when it goes away.

    The socket is blocking for the duration (``O_NONBLOCK`` off, ``SO_SNDTIMEO`` ``idle``) and
    back as it was after: a blocking sendfile waits for room inside the kernel and goes on in
    the same call, where a non-blocking one returns, is polled and called again. On a 16-core
    H200 host loopback TCP carried 35.5 GB/s so against 25.5 (bench/engine/url_ceiling.py, ``tcp``
    and ``tcp-poll`` as first measured). Nothing else touches the socket meanwhile: the
    transport's reading is paused and its write buffer is empty.

    The socket is used through a duplicate descriptor: should the event loop close the
    transport meanwhile, this thread still writes to the same socket, never to a descriptor
    number the process has since given to something else.

    As asyncio's ``loop.sendfile``, the file's position ends just past the bytes sent (once
    any were), also when it raises: the caller learns how much of a cut-off file went out."""
    fd = os.dup(sock_fd)
    sent = 0
    try:
        os.set_blocking(fd, True)
        _send_timeout(fd, idle)
        while sent < count:
            try:
                n = os.sendfile(fd, file_fd, offset + sent, min(count - sent, 1 << 30))
            except BlockingIOError:  # SO_SNDTIMEO passed with nothing taken
                raise TimeoutError(f"the client took no bytes for {idle:g} s") from None
            if n == 0:
                break
            sent += n
        return sent
    finally:
        with contextlib.suppress(OSError):
            _send_timeout(fd, 0.0)
            os.set_blocking(fd, False)
        os.close(fd)
        if sent:
            os.lseek(file_fd, offset + sent, os.SEEK_SET)


def _send_timeout(fd: int, seconds: float) -> None:
    """SO_SNDTIMEO of the socket behind ``fd`` (0: none)."""
    whole = int(seconds)
    limit = struct.pack("ll", whole, int((seconds - whole) * 1e6))
    sock = socket.socket(fileno=fd)  # a handle for setsockopt only: detached, never closed
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)
    finally:
        sock.detach()
