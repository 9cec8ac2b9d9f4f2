"""The engine's HTTP range reader (tensor_registry/engine/sources.py) against loopback servers that
answer in awkward ways: a body that starts in the headers' packet and trickles in, keep-alive
ranges on one connection, a body cut short, a server that goes silent."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from harness.loopback import QuietHandler, serving
from tensor_registry.api.client import ConnectionFailed, SignatureExpired, TransferTimeout
from tensor_registry.engine import sources
from tensor_registry.engine.sources import HTTPRangeReader

SIZE = 3 * 1024 * 1024 + 11
DATA = os.urandom(SIZE)


def _head(first: int, last: int) -> bytes:
    n = last - first + 1
    return (
        f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {first}-{last}/{SIZE}\r\n"
        f"Content-Length: {n}\r\n\r\n"
    ).encode()


def _range(handler: QuietHandler) -> tuple[int, int]:
    first, last = handler.headers["Range"].removeprefix("bytes=").split("-")
    return int(first), int(last)


def test_a_body_that_starts_with_the_headers_and_trickles_in_arrives_whole() -> None:
    """Headers and the first bytes in one packet (http.client's reader buffers them), then the
    rest in uneven pieces; a second range on the same connection. Without ``landed`` the body
    is taken straight from the socket with MSG_WAITALL, which needs a blocking socket with the
    timeout kept by the kernel."""
    peers: list[tuple[str, int]] = []

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            first, last = _range(self)
            peers.append(self.client_address)
            body = DATA[first : last + 1]
            self.wfile.write(_head(first, last) + body[:1000])
            self.wfile.flush()
            at = 1000
            for step in (1, 7000, 65536, 1 << 20):
                self.wfile.write(body[at : at + step])
                self.wfile.flush()
                at += step
            self.wfile.write(body[at:])

    with serving(Handler) as url:
        reader = HTTPRangeReader(f"{url}/f", SIZE)
        try:
            first = bytearray(2 * 1024 * 1024)
            assert reader(0, memoryview(first)) == len(first)
            rest = bytearray(SIZE - len(first))
            assert reader(len(first), memoryview(rest)) == len(rest)
            assert reader.conn is not None and reader.conn.sock is not None
            assert reader.conn.sock.gettimeout() is None  # the MSG_WAITALL path ran
        finally:
            reader.close()
    assert bytes(first) + bytes(rest) == DATA
    assert len(set(peers)) == 1  # both ranges on one keep-alive connection


def test_a_body_cut_every_time_is_resumed_then_a_short_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server that cuts every answer after 5000 bytes: each cut is resumed from the byte it
    reached (RESUME_RETRIES times), then what arrived is a short read and the connection goes."""
    monkeypatch.setattr(sources, "RESUME_RETRIES", 2)
    monkeypatch.setattr(sources, "RESUME_BACKOFF_SECONDS", 0.01)
    asked: list[int] = []

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            first, last = _range(self)
            asked.append(first)
            self.wfile.write(_head(first, last) + DATA[first : first + 5000])
            self.wfile.flush()
            self.close_connection = True

    with serving(Handler) as url:
        reader = HTTPRangeReader(f"{url}/f", SIZE)
        buffer = bytearray(1024 * 1024)
        try:
            assert reader(100, memoryview(buffer)) == 15000
            assert reader.conn is None  # not reused after a short body
        finally:
            reader.close()
    assert bytes(buffer[:15000]) == DATA[100:15100]
    assert asked == [100, 5100, 10100]


@pytest.mark.parametrize("landed", [False, True])
def test_a_connection_dropped_mid_body_resumes_from_the_byte_it_reached(landed: bool) -> None:
    """Issue 29 §5: a replica killed mid-download must not fail the load. The first answer is
    cut (the socket reset) after 700 kB; the reader asks again from there and the load gets
    every byte, once, in order."""
    asked: list[str] = []

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            first, last = _range(self)
            asked.append(self.headers["Range"])
            if len(asked) == 1:
                self.wfile.write(_head(first, last) + DATA[first : first + 700_000])
                self.wfile.flush()
                self.connection.shutdown(2)
                self.close_connection = True
                return
            self.wfile.write(_head(first, last) + DATA[first : last + 1])

    pieces: list[tuple[int, int]] = []
    with serving(Handler) as url:
        reader = HTTPRangeReader(f"{url}/f", SIZE)
        buffer = bytearray(2 << 20)
        try:
            got = reader(
                1000,
                memoryview(buffer),
                (lambda at, piece: pieces.append((at, len(piece)))) if landed else None,
            )
        finally:
            reader.close()
    assert got == len(buffer) and bytes(buffer) == DATA[1000 : 1000 + len(buffer)]
    assert asked == [f"bytes=1000-{1000 + len(buffer) - 1}", f"bytes=701000-{len(buffer) + 999}"]
    if landed:
        at = 1000
        for start, n in pieces:
            assert start == at
            at += n
        assert at == 1000 + len(buffer)


def test_a_server_that_goes_silent_mid_body_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources, "HTTP_TIMEOUT", 0.5)
    monkeypatch.setattr(sources, "RESUME_BACKOFF_SECONDS", 0.01)  # resumed, silent again
    release = threading.Event()

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            first, last = _range(self)
            self.wfile.write(_head(first, last) + DATA[first : first + 10])
            self.wfile.flush()
            release.wait(30)
            self.close_connection = True

    with serving(Handler) as url:
        reader = HTTPRangeReader(f"{url}/f", SIZE)
        started = time.monotonic()
        try:
            with pytest.raises(ConnectionFailed, match=r"no bytes for 0\.5 s"):
                reader(0, memoryview(bytearray(1024 * 1024)))
        finally:
            release.set()
            reader.close()
    assert time.monotonic() - started < 20


class _Counting(QuietHandler):
    requests: list[tuple[str, int]] = []

    def do_GET(self) -> None:
        first, last = _range(self)
        type(self).requests.append((self.client_address[0], self.client_address[1]))
        self.wfile.write(_head(first, last) + DATA[first : last + 1])


def test_one_request_fills_several_buffers_in_order() -> None:
    """A span is one range request whose body is read into buffer after buffer (the CUDA
    load's ring): fewer requests through the registry's signature check."""
    handler = type("Handler", (_Counting,), {"requests": []})
    pieces = [bytearray(n) for n in (1 << 20, 1 << 20, 5000, SIZE - (2 << 20) - 5000)]
    with serving(handler) as url:
        reader = HTTPRangeReader(f"{url}/f", SIZE)
        try:
            body = reader.span(0, SIZE)
            got = [body.read_into(memoryview(p)) for p in pieces]
            body.close()
            again = bytearray(100)
            assert reader(7, memoryview(again)) == 100  # the connection is reused
        finally:
            reader.close()
    assert got == [len(p) for p in pieces]
    assert b"".join(pieces) == DATA and bytes(again) == DATA[7:107]
    assert len(handler.requests) == 2 and len(set(handler.requests)) == 1


def test_a_span_left_unread_takes_its_connection_with_it() -> None:
    handler = type("Handler", (_Counting,), {"requests": []})
    with serving(handler) as url:
        reader = HTTPRangeReader(f"{url}/f", SIZE)
        try:
            body = reader.span(0, SIZE)
            first = bytearray(1 << 20)
            assert body.read_into(memoryview(first)) == len(first)
            body.close()  # the rest of the body is never read: the connection cannot be reused
            assert reader.conn is None
            again = bytearray(100)
            assert reader(5, memoryview(again)) == 100
        finally:
            reader.close()
    assert bytes(first) == DATA[: 1 << 20] and bytes(again) == DATA[5:105]
    assert len(set(handler.requests)) == 2  # a new connection for the second request


def test_a_range_asked_ahead_is_read_by_its_span_and_resent_where_its_connection_went() -> None:
    """``ask`` sends a request without waiting; ``span`` of the same range reads that answer (no
    second request). Asked on a keep-alive connection the server has meanwhile closed without
    saying so, the answer never comes, and ``span`` asks again on a new connection; a span of
    another range than the one asked drops the asked answer with its connection."""
    asked: list[tuple[int, int]] = []  # (client port, first byte)

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            first, last = _range(self)
            asked.append((self.client_address[1], first))
            self.wfile.write(_head(first, last) + DATA[first : last + 1])
            # After the first answer the server hangs up without saying so (an idle keep-alive
            # connection closed): a request sent on it is never read.
            self.close_connection = first == 10

    with serving(Handler) as url:
        reader = HTTPRangeReader(f"{url}/f", SIZE)
        try:
            reader.ask(10, 100)
            got = bytearray(100)
            assert reader.span(10, 100).read_into(memoryview(got)) == 100
            assert bytes(got) == DATA[10:110] and len(asked) == 1
            reader.ask(200, 50)
            assert reader.span(200, 50).read_into(memoryview(got)[:50]) == 50
            assert bytes(got[:50]) == DATA[200:250]
            reader.ask(300, 10)  # then another range is wanted instead
            assert reader.span(400, 10).read_into(memoryview(got)[:10]) == 10
            assert bytes(got[:10]) == DATA[400:410] and reader.asked is None
        finally:
            reader.close()
    on = {first: [port for port, f in asked if f == first] for first in (10, 200, 400)}
    assert len(on[10]) == 1  # read by its span, not asked twice
    assert len(on[200]) == 1 and on[200][0] != on[10][0]  # resent on a new connection
    assert len(on[400]) == 1 and on[400][0] != on[200][0]  # the asked answer went with its one


@pytest.mark.parametrize("landed", [False, True])
def test_a_server_that_drips_inside_the_idle_timeout_ends_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch, landed: bool
) -> None:
    """A byte every 20 ms never trips the idle timeout; the range's overall deadline (grace +
    length / minimum rate) ends it, in both ways a body is read (straight from the socket,
    and one receive at a time for ``landed``)."""
    monkeypatch.setattr(sources, "HTTP_TIMEOUT", 2.0)
    monkeypatch.setattr(sources, "GRACE_SECONDS", 0.5)
    monkeypatch.setattr(sources, "MIN_BYTES_PER_SECOND", float(1 << 40))
    stop = threading.Event()

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            first, last = _range(self)
            self.wfile.write(_head(first, last))
            self.wfile.flush()
            for index in range(first, min(last + 1, first + 1000)):
                if stop.is_set():
                    break
                try:
                    self.wfile.write(DATA[index : index + 1])
                    self.wfile.flush()
                except OSError:
                    break
                time.sleep(0.02)
            self.close_connection = True

    seen: list[int] = []
    with serving(Handler) as url:
        reader = HTTPRangeReader(f"{url}/f", SIZE)
        started = time.monotonic()
        try:
            with pytest.raises(TransferTimeout, match="past its deadline"):
                reader(
                    0,
                    memoryview(bytearray(1 << 20)),
                    (lambda at, piece: seen.append(len(piece))) if landed else None,
                )
        finally:
            stop.set()
            reader.close()
    assert time.monotonic() - started < 0.5 + 2.0 + 1.0
    assert not landed or 0 < sum(seen) < 1000


def test_tensorizers_stream_ends_a_dripping_range_at_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """tensor_registry.tensorizer_stream.HTTPRangeStream (tensorizer's in-process reader): a
    byte every 20 ms never trips the idle timeout; the range's deadline shuts it down."""
    from tensor_registry import tensorizer_stream

    monkeypatch.setattr(tensorizer_stream, "GRACE_SECONDS", 0.5)
    monkeypatch.setattr(tensorizer_stream, "MIN_BYTES_PER_SECOND", float(1 << 40))
    stop = threading.Event()

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            first, last = _range(self)
            self.wfile.write(_head(first, last))
            self.wfile.flush()
            for index in range(first, min(last + 1, first + 1000)):
                if stop.is_set():
                    break
                try:
                    self.wfile.write(DATA[index : index + 1])
                    self.wfile.flush()
                except OSError:
                    break
                time.sleep(0.02)
            self.close_connection = True

    with serving(Handler) as url:
        started = time.monotonic()
        stream = tensorizer_stream.HTTPRangeStream(f"{url}/f", begin=10, end=SIZE)
        try:
            with pytest.raises(TimeoutError, match="did not arrive in time"):
                stream.readinto(bytearray(4096))
        finally:
            stop.set()
            stream.close()
    assert time.monotonic() - started < 3


def test_a_resume_rides_out_a_503_and_stops_at_an_expired_signature(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The answer to a resume: a 503 (the load balancer between replicas) is tried again; a
    refusal such as an expired signature is raised as the registry's error, not as bytes of
    another range."""
    monkeypatch.setattr(sources, "RESUME_BACKOFF_SECONDS", 0.01)
    script: list[str] = []

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            first, last = _range(self)
            step = script.pop(0) if script else "whole"
            if step == "cut":
                self.wfile.write(_head(first, last) + DATA[first : first + 3000])
                self.wfile.flush()
                self.connection.shutdown(2)
                self.close_connection = True
            elif step in ("503", "403"):
                code = "signature_expired" if step == "403" else "unavailable"
                body = json.dumps({"code": code, "detail": step}).encode()
                self.send_response(int(step))
                self.send_header("Content-Type", "application/problem+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                self.wfile.write(_head(first, last) + DATA[first : last + 1])

    with serving(Handler) as url:
        script[:] = ["cut", "503", "whole"]
        reader = HTTPRangeReader(f"{url}/f", SIZE)
        buffer = bytearray(100_000)
        try:
            assert reader(0, memoryview(buffer)) == len(buffer)
        finally:
            reader.close()
        assert bytes(buffer) == DATA[: len(buffer)]

        script[:] = ["cut", "403"]
        reader = HTTPRangeReader(f"{url}/f", SIZE)
        try:
            with pytest.raises(SignatureExpired):
                reader(0, memoryview(bytearray(100_000)))
        finally:
            reader.close()
