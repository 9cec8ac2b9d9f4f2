"""Blob bytes sent on the zero-copy protocol's sendfile threads (``http.sendfile_threads``).

A real uvicorn serves a raw ASGI app that answers with ``http.response.zerocopysend`` on a
loopback port. The threads must send exactly the bytes the loop would (after a body part, a
slice, many at once, keep-alive), a client that stops reading must be cut off after the idle
timeout and give its thread back, and while every thread is held by such a client the other
downloads must still go out (on the event loop).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.loopback import uvicorn_serving
from harness.waiting import poll
from tensor_registry_server.blobs.http_limits import HttpLimits
from tensor_registry_server.blobs.zerocopy import ZEROCOPY_SEND, ZeroCopyHttpProtocol
from tests.storage.helpers import payload

MiB = 1024 * 1024


def _app(path: Path, size: int) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        offset, count = (123, 4 * MiB + 5) if scope["path"] == "/part" else (0, size)
        headers = [(b"content-length", str(count + 4).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"pre:", "more_body": True})
        with path.open("rb") as fh:
            await send({"type": ZEROCOPY_SEND, "file": fh, "offset": offset, "count": count})

    return app


@contextmanager
def _server(
    tmp_path: Path, data: bytes, limits: HttpLimits
) -> Iterator[tuple[str, type[ZeroCopyHttpProtocol]]]:
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    protocol = ZeroCopyHttpProtocol.with_limits(limits)
    with uvicorn_serving(_app(path, len(data)), http=protocol) as (base, _):
        yield base, protocol


def _sendfile_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("sendfile")}


@pytest.mark.parametrize("threads", [0, 2], ids=["loop", "threads"])
def test_files_go_out_byte_for_byte(tmp_path: Path, threads: int) -> None:
    data = payload(9 * MiB + 17, seed=5)
    limits = HttpLimits(sendfile_threads=threads)
    with _server(tmp_path, data, limits) as (base, protocol):
        with httpx.Client(timeout=30) as client:  # one keep-alive connection, several answers
            assert client.get(f"{base}/whole").content == b"pre:" + data
            assert client.get(f"{base}/part").content == b"pre:" + data[123 : 123 + 4 * MiB + 5]
            assert client.get(f"{base}/whole").content == b"pre:" + data

        def fetch(_: int) -> bytes:
            return httpx.get(f"{base}/whole", timeout=30).content

        with ThreadPoolExecutor(6) as pool:  # more downloads at once than threads
            assert all(got == b"pre:" + data for got in pool.map(fetch, range(6)))
        if threads:
            assert _sendfile_threads(), "no sendfile thread sent anything"
            assert protocol.sendfile_pool is not None and protocol.sendfile_pool.busy == 0
        else:
            assert protocol.sendfile_pool is None


def _stalled_download(base: str) -> socket.socket:
    """A client that asks for the whole file and reads nothing (a small receive buffer, so the
    server's sendfile soon finds the socket full)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    host, port = base.removeprefix("http://").split(":")
    sock.connect((host, int(port)))
    sock.sendall(b"GET /whole HTTP/1.1\r\nHost: test\r\n\r\n")
    return sock


def test_a_client_that_stops_reading_is_cut_off_and_never_blocks_the_others(
    tmp_path: Path,
) -> None:
    data = payload(32 * MiB + 1, seed=6)
    limits = HttpLimits(sendfile_threads=1, send_idle_timeout_seconds=2.0)
    part = b"pre:" + data[123 : 123 + 4 * MiB + 5]
    with _server(tmp_path, data, limits) as (base, protocol):
        pool = protocol.sendfile_pool
        assert pool is not None
        stalled = _stalled_download(base)
        try:
            poll(lambda: pool.busy == 1, what="the stalled download to hold the thread")
            # Every thread is held: this download goes out on the event loop, whole, without
            # waiting for the stalled one to be cut off.
            assert httpx.get(f"{base}/part", timeout=30).content == part
            assert pool.busy == 1, "the other download waited for the stalled one"
            # The idle timeout ends the stalled one and its thread is free again.
            poll(lambda: pool.busy == 0, what="the stalled download to be cut off", timeout=30)
            stalled.settimeout(10)
            received = 0
            try:
                while chunk := stalled.recv(1 << 20):
                    received += len(chunk)
            except ConnectionResetError:
                pass
            assert 0 < received < len(data), "the stalled client got the whole file"
        finally:
            stalled.close()
        assert httpx.get(f"{base}/part", timeout=30).content == part
