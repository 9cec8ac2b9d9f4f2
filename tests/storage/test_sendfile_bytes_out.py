"""The access log's ``bytes_out`` and ``tensor_registry_blob_bytes_served_total`` for local
files sent by ``os.sendfile`` (tensor_registry_server.blobs.zerocopy), on the event loop and on the
sending
threads: a full download counts its size, a Range request the range's length, and a client
that hangs up mid-body is logged 499 with ``client_disconnected`` and counted with the bytes
that actually went out (at least what the client read, less than the file), as the streamed
S3 path does (tests/storage/test_aborted_downloads.py)."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from harness.serve_process import ServeProcess, free_port
from harness.waiting import poll
from tensor_registry_server.storage.signing import blob_url
from tests.storage.helpers import blob_responses, bytes_served, payload, request_lines

SIGNING_KEY = "sendfile-bytes-out-signing-key-0123456789abcdef"
MiB = 1024 * 1024
SIZE = 24 * MiB
DATA = payload(SIZE, seed=7)


@dataclass
class Served:
    server: ServeProcess
    url: str

    @property
    def path(self) -> str:
        return httpx.URL(self.url).path

    def logged(self, count: int) -> list[dict[str, Any]]:
        """The first ``count`` request lines about the file (in the order they were logged)."""
        lines = poll(
            lambda: [
                e
                for e in request_lines(self.server.lines, self.path)
                if e.get("event") == "request"
            ],
            what=f"{count} request log line(s)",
            ready=lambda found: len(found) >= count,
            timeout=30,
        )
        return lines[:count]


@pytest.fixture(scope="module", params=["loop", "threads"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    data_dir = tmp_path_factory.mktemp("sendfile") / "data"
    key = f"artifacts/{uuid.uuid4()}/model.tensors"
    target = data_dir / "storage" / key
    target.parent.mkdir(parents=True)
    target.write_bytes(DATA)
    server = ServeProcess(
        data_dir=data_dir,
        port=free_port(),
        env={
            "TENSOR_REGISTRY_SECURITY__SIGNING_KEY": SIGNING_KEY,
            "TENSOR_REGISTRY_HTTP__SENDFILE_THREADS": "0" if request.param == "loop" else "4",
        },
    ).start()
    try:
        url = blob_url(server.url, SIGNING_KEY.encode(), storage="local", key=key, ttl=3600)
        yield Served(server, url)
    finally:
        server.stop()


def test_a_full_download_logs_and_counts_its_size(served: Served) -> None:
    already = len([e for e in request_lines(served.server.lines, served.path)])
    before = bytes_served(served.server.url, "local")
    ok = blob_responses(served.server.url, "local", "200")
    r = httpx.get(served.url, timeout=60)
    assert r.status_code == 200 and r.content == DATA
    part = httpx.get(served.url, headers={"Range": "bytes=1000-3146727"}, timeout=60)
    assert part.status_code == 206 and part.content == DATA[1000:3146728]
    full, ranged = served.logged(already + 2)[already:]
    assert (full["status"], full["bytes_out"]) == (200, SIZE), full
    assert (ranged["status"], ranged["bytes_out"]) == (206, 3 * MiB), ranged
    assert bytes_served(served.server.url, "local") - before == SIZE + 3 * MiB
    assert blob_responses(served.server.url, "local", "200") == ok + 1


def test_an_aborted_download_logs_499_and_the_bytes_that_went_out(served: Served) -> None:
    already = len([e for e in request_lines(served.server.lines, served.path)])
    before = bytes_served(served.server.url, "local")
    aborted = blob_responses(served.server.url, "local", "499")
    with socket.create_connection(("127.0.0.1", served.server.port), timeout=10) as sock:
        # A small receive buffer keeps the kernel from taking the whole file at once.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        target = httpx.URL(served.url).raw_path.decode()
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        got = b""
        while len(got) < 256 * 1024:
            got += sock.recv(65536)
        assert got.startswith(b"HTTP/1.1 200 ")
        read = len(got) - got.index(b"\r\n\r\n") - 4
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    [request] = served.logged(already + 1)[already:]
    assert request["status"] == 499, "\n".join(served.server.lines[-8:])
    assert read <= request["bytes_out"] < SIZE, (read, request)
    assert any(
        "client_disconnected" in line and served.path in line for line in served.server.lines
    ), "\n".join(served.server.lines[-20:])
    counted = bytes_served(served.server.url, "local") - before
    assert counted == request["bytes_out"], (counted, request)
    assert blob_responses(served.server.url, "local", "499") == aborted + 1
