"""A real `serve` bounds each client: header size (431), header and body read timeouts (408).

Raw sockets on 127.0.0.1; short timeouts come from the environment, and every wait is a
bounded poll for the state (an answer, a closed socket), never a fixed sleep.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.serve_process import ServeProcess, free_port
from tests.conftest import ADMIN_TOKEN

HEADER_TIMEOUT = 1.5
BODY_IDLE_TIMEOUT = 1.5


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    data = tmp_path_factory.mktemp("serve-limits")
    proc = ServeProcess(
        data_dir=Path(data),
        port=free_port(),
        env={
            "TENSOR_REGISTRY_ADMIN_TOKEN": ADMIN_TOKEN,
            "TENSOR_REGISTRY_HTTP__HEADER_TIMEOUT_SECONDS": str(HEADER_TIMEOUT),
            "TENSOR_REGISTRY_HTTP__BODY_IDLE_TIMEOUT_SECONDS": str(BODY_IDLE_TIMEOUT),
        },
    ).start()
    try:
        yield proc
    finally:
        proc.stop()


def connect(serve: ServeProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", serve.port), timeout=10)
    return sock


def read_until_closed(sock: socket.socket, limit: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes; and how long that took."""
    started = time.monotonic()
    sock.settimeout(limit)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data, time.monotonic() - started


def status_and_body(raw: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"application/problem+json" in head.lower(), head
    return status, json.loads(body)


def test_a_one_mib_header_is_refused_with_431(serve: ServeProcess) -> None:
    with connect(serve) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
        # Refused (and the socket closed) maybe before all of it was taken.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(b"a" * (1024 * 1024) + b"\r\n\r\n")
        raw, _ = read_until_closed(sock, 10)
    status, body = status_and_body(raw)
    assert status == 431
    assert body["code"] == "headers_too_large"


def test_many_small_headers_over_the_limit_are_refused(serve: ServeProcess) -> None:
    headers = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(1000))
    with connect(serve) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        raw, _ = read_until_closed(sock, 10)
    assert status_and_body(raw)[0] == 431


def test_headers_under_the_limit_are_served(serve: ServeProcess) -> None:
    with connect(serve) as sock:
        sock.sendall(
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Ok: " + b"a" * 30_000 + b"\r\n"
            b"Connection: close\r\n\r\n"
        )
        raw, _ = read_until_closed(sock, 10)
    assert raw.startswith(b"HTTP/1.1 200"), raw[:200]


def test_a_client_that_stops_mid_headers_is_cut_off(serve: ServeProcess) -> None:
    with connect(serve) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: a")
        raw, took = read_until_closed(sock, HEADER_TIMEOUT + 10)
    status, body = status_and_body(raw)
    assert status == 408 and body["code"] == "header_timeout"
    assert HEADER_TIMEOUT * 0.9 <= took < HEADER_TIMEOUT + 5


def test_a_client_that_never_sends_is_cut_off(serve: ServeProcess) -> None:
    with connect(serve) as sock:
        raw, took = read_until_closed(sock, HEADER_TIMEOUT + 10)
    assert took < HEADER_TIMEOUT + 5
    assert raw == b"" or status_and_body(raw)[0] == 408


def test_an_upload_that_stalls_mid_body_gets_408_and_is_closed(serve: ServeProcess) -> None:
    import httpx

    api = httpx.Client(base_url=serve.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    model = api.post("/api/v1/models", json={"name": "acme/stall"}).json()
    number = api.post(f"/api/v1/models/{model['id']}/versions", json={}).json()["version"]
    path = f"/api/v1/models/{model['id']}/versions/{number}/files/model.bin"
    for total in (4096, 4 * 1024 * 1024):  # through the parser, and read past it
        with connect(serve) as sock:
            sock.sendall(
                f"PUT {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n"
                "Content-Type: application/octet-stream\r\n"
                f"Content-Length: {total}\r\n\r\n".encode()
                + b"x" * 1000
            )
            raw, took = read_until_closed(sock, BODY_IDLE_TIMEOUT + 10)
        status, body = status_and_body(raw)
        assert status == 408, raw[:300]
        assert body["code"] == "request_timeout"
        assert took < BODY_IDLE_TIMEOUT + 5
    version = api.get(f"/api/v1/models/{model['id']}/versions/{number}").json()
    assert version["files"] == []
    # The server still answers everybody else.
    assert api.get("/healthz").status_code == 200
