"""``ZeroCopyHttpProtocol`` on the wire: request framing edge cases, over raw sockets.

A real uvicorn serves a small raw ASGI app on a loopback port. Every test runs against the
zero-copy protocol and, as the reference for "what uvicorn does", against uvicorn's own httptools
protocol: an assertion that fails only on ``zerocopy`` is a bug in
tensor_registry_server/blobs/zerocopy.py, one that
fails on both is a wrong expectation. Bodies of at least ``DIRECT_BODY_MIN`` bytes are read past
the parser by the zero-copy protocol; the echo reports whether that happened, so the tests also
check that the path under test is the one taken.

Every socket has a timeout: a hang fails the test in seconds, it never stalls the run.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import random
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import pytest
import uvicorn

from harness.loopback import uvicorn_serving
from tensor_registry_server.blobs.direct_body import DIRECT_BODY_MIN, DirectBody
from tensor_registry_server.blobs.zerocopy import (
    LINGER_IDLE_SECONDS,
    ZEROCOPY_SEND,
    ZeroCopyHttpProtocol,
)

MiB = 1024 * 1024
IO_TIMEOUT = 5.0  # seconds any single socket operation may block
BIG = 3 * MiB + 7  # over BODY_HIGH_WATER (2 MiB): reading pauses when the app lags
# A body that cannot have been read whole when an app that never reads it answers: reading
# pauses only once more than BODY_HIGH_WATER is queued, and a direct read adds up to a MiB, so
# up to ~3 MiB (plus what came with the headers) may be consumed first. With BIG the whole body
# was sometimes in before /early-late's answer (CI: keep-alive, no "connection: close").
UNREAD = 8 * MiB + 7
SMALL = b"hello"
KEEP_ALIVE = 1  # uvicorn's keep-alive timeout, in seconds (its default is 5)


# --- the ASGI app -----------------------------------------------------------------------------


class Events:
    """What the app saw, by the ``id`` query parameter (the app runs in the server's thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[str, int]] = {}

    def record(self, key: str, what: str, received: int) -> None:
        with self._lock:
            self._seen[key] = (what, received)

    def wait(self, key: str, timeout: float = IO_TIMEOUT) -> tuple[str, int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if key in self._seen:
                    return self._seen[key]
            time.sleep(0.01)
        raise AssertionError(f"the app recorded nothing for {key!r} within {timeout} s")


async def _reply(send: Any, status: int, body: bytes) -> None:
    headers = [(b"content-length", str(len(body)).encode()), (b"content-type", b"text/plain")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def make_app(events: Events) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        path = scope["path"]
        query = parse_qs(scope["query_string"].decode())
        key = query.get("id", [""])[0]

        if path == "/early":  # answers without reading the body
            await _reply(send, 413, b"too large")
            return
        if path == "/early-late":  # lets the body queue up (and reading pause) first
            await asyncio.sleep(0.1)
            await _reply(send, 413, b"too large")
            return
        if path == "/early-partial":  # reads one message, then gives up
            await receive()
            await _reply(send, 413, b"too large")
            return

        direct = isinstance(getattr(receive, "__self__", None), DirectBody)
        digest = hashlib.sha256()
        length = messages = 0
        all_bytes = True
        if path == "/watch-late":
            await asyncio.sleep(0.15)
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                events.record(key, "disconnect", length)
                return
            assert message["type"] == "http.request", message
            body = message.get("body", b"")
            all_bytes = all_bytes and type(body) is bytes
            digest.update(body)
            length += len(body)
            messages += 1
            if path == "/slow":
                await asyncio.sleep(0.005)
            if not message.get("more_body", False):
                break
        events.record(key, "complete", length)
        after = None
        if path == "/then-wait":  # after the last body message, receive() waits for the end
            try:
                after = (await asyncio.wait_for(receive(), 0.1))["type"]
            except TimeoutError:
                after = "waiting"
        echo = {
            "length": length,
            "sha256": digest.hexdigest(),
            "messages": messages,
            "all_bytes": all_bytes,
            "direct": direct,
            "method": scope["method"],
            "path": path,
            "http_version": scope["http_version"],
            "zerocopy_extension": ZEROCOPY_SEND in scope.get("extensions", {}),
            "after": after,
        }
        await _reply(send, 200, json.dumps(echo).encode())

    return app


# --- the servers ------------------------------------------------------------------------------


@dataclass
class Server:
    kind: str
    port: int
    events: Events
    uvicorn_server: uvicorn.Server

    @property
    def zerocopy(self) -> bool:
        return self.kind == "zerocopy"

    def connect(self) -> Client:
        return Client(self.port)

    def direct(self, size: int) -> bool:
        """Whether a request of ``size`` bytes, not pipelined, is read past the parser."""
        return self.zerocopy and size >= DIRECT_BODY_MIN

    def wait_idle(self, timeout: float = IO_TIMEOUT) -> None:
        """Every connection closed on the server's side and every request task finished."""
        state = self.uvicorn_server.server_state
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not state.connections and not state.tasks:
                return
            time.sleep(0.01)
        raise AssertionError(
            f"server not idle: {len(state.connections)} connections, {len(state.tasks)} tasks"
        )


@pytest.fixture(scope="module", params=["zerocopy", "uvicorn"])
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    events = Events()
    protocol: Any = ZeroCopyHttpProtocol if request.param == "zerocopy" else "httptools"
    with uvicorn_serving(
        make_app(events),
        http=protocol,
        log_config=None,
        log_level="error",
        access_log=False,
        timeout_keep_alive=KEEP_ALIVE,
        timeout_graceful_shutdown=3,
    ) as (base, uv):
        yield Server(request.param, int(base.rsplit(":", 1)[1]), events, uv)


# --- a raw HTTP/1.1 client --------------------------------------------------------------------


@dataclass
class Response:
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes
    interim: list[bytes] = field(default_factory=list)  # raw 1xx responses before this one

    def echo(self) -> dict[str, Any]:
        assert self.status == 200, (self.status, self.body[:200])
        result: dict[str, Any] = json.loads(self.body)
        return result


class Client:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT)
        # Every send() leaves as its own segments, so split points reach the server as split.
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def reset(self) -> None:
        """Abort the connection: close with an RST instead of a FIN."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        data = self.sock.recv(256 * 1024)
        if not data:
            raise EOFError(f"connection closed; unparsed: {bytes(self.buf[:200])!r}")
        self.buf += data

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def _take_line(self) -> bytes:
        while (end := self.buf.find(b"\r\n")) < 0:
            self._fill()
        return self._take(end + 2)

    def read_head(self) -> bytes:
        """The next response head, raw, up to and including the blank line."""
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            self._fill()
        return self._take(end + 4)

    def read_response(self) -> Response:
        interim: list[bytes] = []
        while True:
            head = self.read_head()
            lines = head[:-4].decode("latin-1").split("\r\n")
            version, status, reason = [*lines[0].split(" ", 2), ""][:3]
            assert version == "HTTP/1.1", lines[0]
            if 100 <= int(status) < 200:
                interim.append(head)
                continue
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            if "content-length" in headers:
                body = self._take(int(headers["content-length"]))
            else:
                assert headers.get("transfer-encoding") == "chunked", headers
                parts = []
                while size := int(self._take_line().split(b";")[0], 16):
                    parts.append(self._take(size))
                    assert self._take(2) == b"\r\n"
                assert self._take_line() == b"\r\n"
                body = b"".join(parts)
            return Response(int(status), reason, headers, body, interim)

    def rest_until_eof(self) -> bytes:
        """Whatever arrives before the server closes the connection (a reset counts as a close:
        a server closing with unread request bytes makes the kernel send one)."""
        try:
            while True:
                data = self.sock.recv(256 * 1024)
                if not data:
                    break
                self.buf += data
        except ConnectionResetError:
            pass
        out = bytes(self.buf)
        self.buf.clear()
        return out

    def is_open(self, wait: float = 0.1) -> bool:
        """True when nothing (no close, no bytes) arrives within ``wait`` seconds."""
        self.sock.settimeout(wait)
        try:
            data = self.sock.recv(1)
        except TimeoutError:
            return True
        except ConnectionResetError:
            return False
        finally:
            self.sock.settimeout(IO_TIMEOUT)
        assert not data, f"unexpected bytes from the server: {data!r}"
        return False


def http_request(
    path: str,
    body: bytes = b"",
    *,
    method: str = "PUT",
    version: str = "1.1",
    headers: tuple[str, ...] = (),
    length: int | None = None,
) -> bytes:
    """A request with a Content-Length (of ``body``, or ``length`` when given) and ``body``."""
    length = len(body) if length is None else length
    lines = [f"{method} {path} HTTP/{version}", "Host: test", f"Content-Length: {length}"]
    head = "\r\n".join([*lines, *headers]) + "\r\n\r\n"
    return head.encode() + body


def chunked(body: bytes, sizes: list[int]) -> bytes:
    """``body`` in chunked framing, with chunks of ``sizes`` (cycled) and a trailer."""
    out, offset, i = [], 0, 0
    while offset < len(body):
        piece = body[offset : offset + sizes[i % len(sizes)]]
        ext = b";name=value" if i % 3 == 1 else b""
        out.append(b"%x%s\r\n%s\r\n" % (len(piece), ext, piece))
        offset += len(piece)
        i += 1
    return b"".join(out) + b"0\r\nX-Trailer: done\r\n\r\n"


def payload(size: int, rng: random.Random | None = None) -> bytes:
    return rng.randbytes(size) if rng is not None else os.urandom(size)


def assert_echo(
    response: Response, body: bytes, *, path: str = "/echo", direct: bool | None = None
) -> dict[str, Any]:
    echo = response.echo()
    assert echo["length"] == len(body)
    assert echo["sha256"] == hashlib.sha256(body).hexdigest()
    assert echo["path"] == path
    assert echo["all_bytes"], "an ASGI body was not plain bytes"
    if direct is not None:
        assert echo["direct"] is direct, echo
    return echo


# --- the tests --------------------------------------------------------------------------------


def test_protocol_under_test_is_in_use(server: Server) -> None:
    body = payload(DIRECT_BODY_MIN + 1)
    with server.connect() as client:
        client.send(http_request("/echo", body))
        echo = assert_echo(client.read_response(), body, direct=server.zerocopy)
    assert echo["zerocopy_extension"] is server.zerocopy


@pytest.mark.parametrize("path", ["/echo", "/slow"])
def test_keep_alive_large_bodies_back_to_back(server: Server, path: str) -> None:
    """Several large bodies, one after the other, on one connection; then a small one."""
    bodies = [payload(BIG), payload(2 * MiB + 1), payload(BIG), SMALL]
    with server.connect() as client:
        for body in bodies:
            client.send(http_request(path, body))
            response = client.read_response()
            assert "connection" not in response.headers
            assert_echo(response, body, path=path, direct=server.direct(len(body)))
        assert client.is_open()


def test_sizes_around_the_direct_threshold(server: Server) -> None:
    sizes = [0, 1, DIRECT_BODY_MIN - 1, DIRECT_BODY_MIN, DIRECT_BODY_MIN + 1, 2 * DIRECT_BODY_MIN]
    with server.connect() as client:
        for size in sizes:
            body = payload(size)
            client.send(http_request("/echo", body))
            assert_echo(client.read_response(), body, direct=server.direct(size))


@pytest.mark.parametrize(
    "sizes",
    [(BIG, len(SMALL)), (len(SMALL), BIG), (BIG, BIG), (BIG, 0, DIRECT_BODY_MIN, len(SMALL))],
    ids=["large+small", "small+large", "large+large", "four"],
)
def test_pipelined_requests_after_a_large_body(server: Server, sizes: tuple[int, ...]) -> None:
    """Requests sent in one go: each answered, in order, with its own bytes."""
    bodies = [payload(size) for size in sizes]
    wire = b"".join(http_request(f"/r{i}", body) for i, body in enumerate(bodies))
    with server.connect() as client:
        client.send(wire)
        for i, body in enumerate(bodies):
            echo = assert_echo(client.read_response(), body, path=f"/r{i}")
            if i == 0:  # the first starts as its headers end; later ones may be queued
                assert echo["direct"] is server.direct(len(body))
        # ... and the connection is still good for a large body read past the parser.
        body = payload(BIG)
        client.send(http_request("/after", body))
        assert_echo(client.read_response(), body, path="/after", direct=server.direct(BIG))


@pytest.mark.parametrize("route", ["/early", "/early-late", "/early-partial"])
@pytest.mark.parametrize("when", ["with-headers", "after-response", "pipelined"])
def test_early_413_with_unread_large_body(server: Server, route: str, when: str) -> None:
    """An answer that comes before its request's body: the zero-copy protocol says
    ``connection: close``, reads and drops the rest of the body (the client gets its answer,
    not a reset), never parses what follows and closes. uvicorn keeps the connection instead:
    it drops the rest of the body and parses the next request after it, trusting the framing."""
    body = payload(UNREAD)
    wire = http_request(route, body)
    following = payload(BIG)
    with server.connect() as client:
        if when == "with-headers":
            client.send(wire)
            first = client.read_response()
        elif when == "after-response":  # headers and a little body, the rest once answered
            cut = len(wire) - len(body) + 100_000
            client.send(wire[:cut])
            first = client.read_response()
            client.send(wire[cut:])
        else:  # the next request right behind the body, in the same send
            client.send(wire + http_request("/echo", SMALL))
            first = client.read_response()
            if not server.zerocopy:
                assert_echo(client.read_response(), SMALL)
        assert (first.status, first.body) == (413, b"too large")
        if server.zerocopy:
            assert first.headers["connection"] == "close"
            assert client.rest_until_eof() == b""
            server.wait_idle()
            return
        assert "connection" not in first.headers
        client.send(http_request("/echo", SMALL))
        assert_echo(client.read_response(), SMALL, direct=False)
        client.send(http_request("/echo", following))
        assert_echo(client.read_response(), following, direct=server.direct(BIG))


@pytest.mark.parametrize("size", [100, BIG], ids=["small", "large"])
def test_early_answer_to_a_body_shorter_than_announced(server: Server, size: int) -> None:
    """The desync a fuzzer found: a client announces more body than it sends, is answered
    early, and sends its next request on the same connection. uvicorn takes that request for
    the rest of the body and never answers it; the zero-copy protocol has said
    ``connection: close`` and half-closed, so the client knows at once and nothing it sends
    after the answer is ever parsed as a request."""
    announced = size + 1_000
    body = payload(size)
    with server.connect() as client:
        client.send(http_request("/early", body, length=announced))
        first = client.read_response()
        assert (first.status, first.body) == (413, b"too large")
        client.send(http_request("/echo", SMALL))
        if server.zerocopy:
            assert first.headers["connection"] == "close"
            assert client.rest_until_eof() == b""
        else:
            client.sock.settimeout(0.5)
            with pytest.raises(TimeoutError):
                client.read_response()
    server.wait_idle(timeout=LINGER_IDLE_SECONDS + IO_TIMEOUT)
    with server.connect() as client:  # the server is fine afterwards
        client.send(http_request("/echo", SMALL))
        assert_echo(client.read_response(), SMALL)


def test_lingering_close_is_bounded(server: Server) -> None:
    """A client that announces a body, is answered early and then neither sends nor closes
    is closed after LINGER_IDLE_SECONDS, not held until the body would have arrived (uvicorn:
    after its keep-alive timeout, armed by the response)."""
    with server.connect() as client:
        client.send(http_request("/early", length=10 * MiB))
        first = client.read_response()
        assert (first.headers.get("connection") == "close") is server.zerocopy
        started = time.monotonic()
        server.wait_idle(timeout=LINGER_IDLE_SECONDS + IO_TIMEOUT)
        assert time.monotonic() - started < LINGER_IDLE_SECONDS + 2


@pytest.mark.parametrize("size", [BIG, len(SMALL)], ids=["large", "small"])
def test_expect_100_continue(server: Server, size: int) -> None:
    """The body is sent only after the interim response, which comes once the app reads."""
    body = payload(size)
    with server.connect() as client:
        client.send(http_request("/echo", headers=("Expect: 100-continue",), length=size))
        assert client.read_head() == b"HTTP/1.1 100 Continue\r\n\r\n"
        client.send(body)
        response = client.read_response()
        assert response.interim == []
        assert_echo(response, body, direct=server.direct(size))
        # The next request on the connection has no expectation: no interim response.
        client.send(http_request("/echo", body))
        response = client.read_response()
        assert response.interim == []
        assert_echo(response, body, direct=server.direct(size))


def test_expect_100_continue_with_the_body_sent_at_once(server: Server) -> None:
    """A client that does not wait (curl after its timeout): one interim response, then 200."""
    body = payload(BIG)
    with server.connect() as client:
        client.send(http_request("/echo", body, headers=("Expect: 100-continue",)))
        response = client.read_response()
        assert response.interim == [b"HTTP/1.1 100 Continue\r\n\r\n"]
        assert_echo(response, body, direct=server.direct(BIG))


def test_expect_100_continue_answered_early(server: Server) -> None:
    """An app that answers without reading: no 100 Continue, the 413 straight away. The
    zero-copy protocol closes the connection (the client need not send the body); uvicorn
    keeps it and still expects the announced body, then the next request."""
    body = payload(BIG)
    with server.connect() as client:
        client.send(http_request("/early", headers=("Expect: 100-continue",), length=len(body)))
        response = client.read_response()
        assert response.interim == []
        assert (response.status, response.body) == (413, b"too large")
        if server.zerocopy:
            assert response.headers["connection"] == "close"
            assert client.rest_until_eof() == b""
            return
        assert "connection" not in response.headers
        client.send(body + http_request("/echo", SMALL))
        assert_echo(client.read_response(), SMALL)


@pytest.mark.parametrize("size", [DIRECT_BODY_MIN + 12_345, 5 * MiB // 2, 3_000])
def test_trickled_body(server: Server, size: int) -> None:
    """Headers a few bytes at a time, the body in small uneven pieces with pauses."""
    rng = random.Random(size)
    body = payload(size, rng)
    wire = http_request("/echo", body)
    head_len = len(wire) - size
    with server.connect() as client:
        for offset in range(0, head_len, 7):
            client.send(wire[offset : min(offset + 7, head_len)])
            time.sleep(0.0005)
        time.sleep(0.05)  # the headers alone, for a while
        offset = head_len
        pieces = 0
        while offset < len(wire):
            step = rng.randint(1, 64 * 1024) if size > 3_000 else rng.randint(1, 100)
            client.send(wire[offset : offset + step])
            offset += step
            pieces += 1
            if pieces % 4 == 0:
                time.sleep(0.001)
        assert_echo(client.read_response(), body, direct=server.direct(size))
        client.send(http_request("/echo", SMALL))
        assert_echo(client.read_response(), SMALL, direct=False)


@pytest.mark.parametrize("sizes", [[1_000_000], [3 * MiB], [1, 65_536, 777_777]], ids=str)
def test_chunked_transfer_encoding(server: Server, sizes: list[int]) -> None:
    """Chunked bodies take the parser's path (no Content-Length), large or not."""
    body = payload(BIG)
    wire = b"PUT /echo HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
    wire += chunked(body, sizes)
    with server.connect() as client:
        client.send(wire + http_request("/echo", SMALL))  # and a request right behind it
        assert_echo(client.read_response(), body, direct=False)
        assert_echo(client.read_response(), SMALL, direct=False)
        # a chunked body sent in pieces, after a large body read past the parser
        large = payload(2 * MiB)
        client.send(http_request("/echo", large))
        assert_echo(client.read_response(), large, direct=server.direct(2 * MiB))
        for offset in range(0, len(wire), 500_000):
            client.send(wire[offset : offset + 500_000])
            time.sleep(0.001)
        assert_echo(client.read_response(), body, direct=False)


@pytest.mark.parametrize("keep_alive", [False, True], ids=["plain", "keep-alive-asked"])
def test_http_1_0(server: Server, keep_alive: bool) -> None:
    """uvicorn answers an HTTP/1.0 request with HTTP/1.1 and closes the connection after it,
    even when the request asks for keep-alive."""
    body = payload(BIG)
    headers = ("Connection: keep-alive",) if keep_alive else ()
    with server.connect() as client:
        client.send(http_request("/echo", body, version="1.0", headers=headers))
        response = client.read_response()
        echo = assert_echo(response, body, direct=server.direct(BIG))
        assert echo["http_version"] == "1.0"
        assert response.headers["connection"] == "close"
        assert client.rest_until_eof() == b""


@pytest.mark.parametrize("how", ["fin", "rst"])
@pytest.mark.parametrize(
    ("route", "sent"),
    [("/watch", 2 * MiB + 12_345), ("/watch", 0), ("/watch", 100), ("/watch-late", 2 * MiB)],
    ids=["reading-2MiB", "reading-headers-only", "reading-100B", "not-reading-2MiB"],
)
def test_client_disconnect_mid_body(server: Server, route: str, sent: int, how: str) -> None:
    """The app gets http.disconnect, nothing lingers, the next connection is served."""
    key = f"{route}-{sent}-{how}"
    body = payload(BIG)
    wire = http_request(f"{route}?id={key}", body)
    with server.connect() as client:
        client.send(wire[: len(wire) - len(body) + sent])
        time.sleep(0.05)
        client.reset() if how == "rst" else client.close()
    what, received = server.events.wait(key)
    assert what == "disconnect"
    assert received <= sent
    server.wait_idle()
    with server.connect() as client:
        client.send(http_request("/echo", body))
        assert_echo(client.read_response(), body, direct=server.direct(BIG))


def test_client_disconnect_leaves_other_connections_alone(server: Server) -> None:
    body = payload(BIG)
    with server.connect() as steady, server.connect() as leaving:
        wire = http_request("/echo", body)
        steady.send(wire[: len(wire) // 2])
        leaving.send(http_request("/watch?id=concurrent", body)[: 2 * MiB])
        time.sleep(0.05)
        leaving.reset()
        assert server.events.wait("concurrent")[0] == "disconnect"
        steady.send(wire[len(wire) // 2 :])
        assert_echo(steady.read_response(), body, direct=server.direct(BIG))


def test_connection_close(server: Server) -> None:
    body = payload(BIG)
    with server.connect() as client:
        client.send(http_request("/echo", body, headers=("Connection: close",)))
        response = client.read_response()
        assert_echo(response, body, direct=server.direct(BIG))
        assert response.headers["connection"] == "close"
        assert client.rest_until_eof() == b""


def test_connection_close_ignores_a_pipelined_request(server: Server) -> None:
    """The request behind one with ``Connection: close`` is never answered."""
    body = payload(BIG)
    with server.connect() as client:
        client.send(
            http_request("/echo", body, headers=("Connection: close",)) + http_request("/b", SMALL)
        )
        assert_echo(client.read_response(), body)
        assert client.rest_until_eof() == b""


def test_random_split_points(server: Server) -> None:
    """Pairs of requests (a body of a random or boundary size, then a small one) cut at random
    points (inside the request line, headers, the blank line, the body) into separate sends."""
    rng = random.Random(20240611)
    boundary = [0, 1, DIRECT_BODY_MIN - 1, DIRECT_BODY_MIN, DIRECT_BODY_MIN + 1]
    with server.connect() as client:
        for i in range(16):
            size = boundary[i] if i < len(boundary) else rng.randint(1, 3 * MiB)
            body = payload(size, rng)
            first = http_request(f"/r{i}", body)
            wire = first + http_request("/small", SMALL)
            head_len = len(first) - size
            cuts = {rng.randint(1, head_len - 1), rng.randint(head_len - 4, head_len + 4)}
            cuts |= {rng.randint(1, len(wire) - 1) for _ in range(rng.randint(0, 3))}
            points = [0, *sorted(c for c in cuts if 0 < c < len(wire)), len(wire)]
            for start, end in itertools.pairwise(points):
                client.send(wire[start:end])
                time.sleep(0.002)
            note = f"iteration {i}: size {size}, cuts {points}"
            echo = assert_echo(client.read_response(), body, path=f"/r{i}")
            assert echo["direct"] is server.direct(size), note
            assert_echo(client.read_response(), SMALL, path="/small")


def test_concurrent_uploads(server: Server) -> None:
    """Connections uploading at once keep their bytes apart."""
    failures: list[BaseException] = []

    def upload(seed: int) -> None:
        rng = random.Random(seed)
        try:
            with server.connect() as client:
                for _ in range(3):
                    body = payload(rng.randint(DIRECT_BODY_MIN, 3 * MiB), rng)
                    wire = http_request("/slow", body)
                    for offset in range(0, len(wire), 256 * 1024):
                        client.send(wire[offset : offset + 256 * 1024])
                    assert_echo(client.read_response(), body, path="/slow")
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=upload, args=(seed,)) for seed in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=15)
    assert not any(thread.is_alive() for thread in threads), "an upload hung"
    assert not failures, failures


def test_garbage_after_a_large_body(server: Server) -> None:
    """The fresh parser that takes over after a body read past the old one still rejects an
    invalid request: 400, connection closed, the server fine afterwards."""
    body = payload(BIG)
    with server.connect() as client:
        client.send(http_request("/echo", body))
        assert_echo(client.read_response(), body, direct=server.direct(BIG))
        client.send(b"NOT HTTP AT ALL\r\n\r\n")
        response = client.read_response()
        assert response.status == 400
        assert client.rest_until_eof() == b""
    with server.connect() as client:
        client.send(http_request("/echo", body))
        assert_echo(client.read_response(), body, direct=server.direct(BIG))


def test_early_413_then_the_rest_of_the_body_sent_slowly(server: Server) -> None:
    """After an early answer, a client still sending its body may finish it however slowly it
    sends: uvicorn cancels the keep-alive timer (armed by the response) on every read, drops
    the bytes and parses the next request after the body; the zero-copy protocol drops them
    too (each read restarts its lingering timer), then closes once the body is complete."""
    body = payload(MiB + 300_000)
    wire = http_request("/early", body)
    offset = len(wire) - len(body) + 100_000
    with server.connect() as client:
        client.send(wire[:offset])
        first = client.read_response()
        assert (first.status, first.body) == (413, b"too large")
        for _ in range(5):  # 40 kB every 0.3 s: some bytes in every KEEP_ALIVE window
            time.sleep(0.3)
            client.send(wire[offset : offset + 40_000])
            offset += 40_000
        if server.zerocopy:
            client.send(wire[offset:])
            assert client.rest_until_eof() == b""
            return
        client.send(wire[offset:] + http_request("/echo", SMALL))
        assert_echo(client.read_response(), SMALL, direct=False)


@pytest.mark.parametrize("size", [BIG, len(SMALL)], ids=["large", "small"])
def test_receive_after_the_last_body_message_waits(server: Server, size: int) -> None:
    """An app listening for a disconnect after reading the whole body (as a streaming response
    does) is not handed anything more while the client stays connected."""
    body = payload(size)
    with server.connect() as client:
        client.send(http_request("/then-wait", body))
        echo = assert_echo(client.read_response(), body, path="/then-wait")
        assert echo["direct"] is server.direct(size)
        assert echo["after"] == "waiting"
        client.send(http_request("/echo", body))
        assert_echo(client.read_response(), body, direct=server.direct(size))


@pytest.mark.parametrize(
    "framing",
    [
        ("Content-Length: 2097152", "Transfer-Encoding: chunked"),
        ("Transfer-Encoding: chunked", "Content-Length: 2097152"),
        ("Content-Length: 2097152", "Content-Length: 2097152"),
        ("Content-Length: +2097152",),
    ],
    ids=["cl-then-te", "te-then-cl", "two-cl", "signed-cl"],
)
def test_ambiguous_framing_is_rejected(server: Server, framing: tuple[str, ...]) -> None:
    """Headers the parser refuses are refused before any body is read past it: 400, closed."""
    with server.connect() as client:
        client.send(("PUT /echo HTTP/1.1\r\nHost: test\r\n" + "\r\n".join(framing)).encode())
        client.send(b"\r\n\r\n")
        response = client.read_response()
        assert response.status == 400
        assert response.headers["connection"] == "close"
        assert client.rest_until_eof() == b""
