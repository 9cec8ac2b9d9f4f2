"""The API server's HTTP protocol: zero-copy file sending and zero-copy request bodies.

Downloads. uvicorn does not implement the extension, and a file streamed through ASGI ``body``
messages costs a read into Python, a copy into the transport buffer and a send per chunk:
measured at about half of nginx's throughput on the tensorizer read path
(bench/serving/download.py). ``ZeroCopyHttpProtocol`` is uvicorn's httptools protocol plus the
extension: a message ``{"type": "http.response.zerocopysend", "file": <binary file object>,
"offset": int, "count": int, "more_body": bool}`` is written with ``os.sendfile`` (the kernel moves
page-cache pages to the socket, the bytes never enter Python), by ``loop.sendfile`` on the event
loop. With ``HttpLimits.sendfile_threads`` > 0 they run on a pool of that many threads instead, one
blocking call per file (tensor_registry_server/blobs/sendfile.py: one loop thread capped every
download of the process
at one core's worth of the kernel's TCP work). A response whose client stops reading for
``send_idle_timeout_seconds`` is cut off, and when every thread is busy the next file goes out
on the loop as before: a few slow readers cannot make the others wait.

The extension is advertised in ``scope["extensions"]`` only when the event loop can do it
natively (asyncio's; uvloop has no ``sendfile``); responses fall back to ``body`` messages when
it is absent (tests on httpx's ASGITransport, other servers).

Uploads: bodies of a ``Content-Length`` of at least ``DIRECT_BODY_MIN`` are read past the
parser, in whole socket reads (tensor_registry_server/blobs/direct_body.py says why and how).

Answers that come before their request's body. uvicorn keeps such a connection alive and reads
the rest of the body to drop it, trusting the request's framing to say where the next request
starts. A client whose ``Content-Length`` promises more than it sends (a fuzzer did, through an
explicit header) then has its next request swallowed as "body": it is never answered, and a
fragment of it is parsed as a request of its own (``Invalid HTTP request received.``): parser
and client disagree on where requests start, which is what request smuggling is made of. So a
response that starts while its request's body is still due says ``connection: close`` and the
connection is never reused: once the answer is out the server half-closes (FIN) and goes on
reading only to drop the bytes still in flight, so the client reads its answer rather than a
reset, until the declared body has arrived, the client closes, the line is idle for
``LINGER_IDLE_SECONDS`` or ``LINGER_MAX_SECONDS`` have passed (nginx's lingering close).
Nothing read after such an answer ever reaches a parser.

Serve with ``uvicorn.run(app, http=ZeroCopyHttpProtocol, loop="asyncio")``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from tensor_registry_server.blobs.direct_body import (
    BODY_HIGH_WATER,
    DIRECT_READ_SIZE,
    DirectBody,
    Message,
    declared_length,
    direct_body_length,
)
from tensor_registry_server.blobs.http_limits import HttpLimits, RequestBodyTimeout
from tensor_registry_server.blobs.sendfile import SendfilePool, sendfile_blocking
from tensor_registry_server.core.errors import PROBLEM_JSON, problem_body

ZEROCOPY_SEND = "http.response.zerocopysend"
# Lingering close after an answer that came before its request's body (nginx: lingering_timeout
# 5 s, lingering_time 30 s).
LINGER_IDLE_SECONDS = 5.0
LINGER_MAX_SECONDS = 30.0


def _loop_can_sendfile(loop: asyncio.AbstractEventLoop) -> bool:
    # asyncio's own loops implement loop.sendfile with os.sendfile; uvloop raises
    # NotImplementedError, and then streaming through body messages is the better choice.
    return isinstance(loop, asyncio.BaseEventLoop) and hasattr(os, "sendfile")


def _new_parser(protocol: HttpToolsProtocol) -> httptools.HttpRequestParser:
    parser = httptools.HttpRequestParser(protocol)
    # Configured as uvicorn configures its own parser (the setting exists from httptools 0.6.3).
    with contextlib.suppress(AttributeError):
        parser.set_dangerous_leniencies(lenient_data_after_close=True)
    return parser


class ZeroCopyHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools HTTP/1.1 protocol with zero-copy file responses and request bodies,
    and the bounds of ``HttpLimits`` (431 past the header limit, 408 on a stalled client)."""

    limits = HttpLimits()
    sendfile_pool: SendfilePool | None = None

    @classmethod
    def with_limits(cls, limits: HttpLimits) -> type[ZeroCopyHttpProtocol]:
        pool = SendfilePool(limits.sendfile_threads) if limits.sendfile_threads > 0 else None
        return type(cls.__name__, (cls,), {"limits": limits, "sendfile_pool": pool})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Between a message's first byte (or the connection's start) and its headers' end.
        self._in_headers = True
        self._header_bytes = 0
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._last_data = 0.0
        self._rejected = False
        # The cycle whose body stalled; its receive raises RequestBodyTimeout.
        self.timed_out_cycle: RequestResponseCycle | None = None
        # Content-Length of the request whose headers are being handled, when eligible.
        self._direct_length = 0
        # The body being received past the parser, and how many of its bytes are still due.
        self._body: DirectBody | None = None
        self._body_left = 0
        self._reading_direct = False
        self._default_read_size: int | None = None
        self._read_size = 0
        # The request body's declared length (None: chunked or none) and the bytes of it seen.
        self._declared_length: int | None = None
        self._body_seen = 0
        # Set once an answer went out before its body: bytes from here on are dropped unparsed.
        self._lingering = False
        self._linger_until = 0.0
        self._linger_timer: asyncio.TimerHandle | None = None

    def send_400_response(self, msg: str) -> None:
        # A request the parser cannot read is answered like every other error: problem+json
        # (uvicorn sends text/plain), with uvicorn's message as the detail. A rejection (431,
        # 408) stops the parser with an error too: that one is answered already.
        if self._rejected:
            return
        body = json.dumps(
            problem_body(status=400, code="bad_request", title="Bad request", detail=msg)
        ).encode()
        head = [b"HTTP/1.1 400 Bad Request\r\n"]
        for name, value in self.server_state.default_headers:
            head.extend([name, b": ", value, b"\r\n"])
        head.append(
            b"content-type: " + PROBLEM_JSON.encode() + b"\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n"
            b"connection: close\r\n\r\n"
        )
        self.transport.write(b"".join(head) + body)
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()
        self._zerocopy = _loop_can_sendfile(self.loop) and hasattr(self, "_start_asgi_task")
        # asyncio's socket transports read max_size bytes per recv(); others have no such knob
        # and deliver what they deliver (still correct, bodies are split wherever needed).
        read_size = getattr(transport, "max_size", None)
        self._default_read_size = read_size if isinstance(read_size, int) else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._body, self._body_left, self._reading_direct = None, 0, False
        self._cancel_timers()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        super().connection_lost(exc)

    # --- limits --------------------------------------------------------------------------

    def _cancel_timers(self) -> None:
        for timer in (self._header_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._body_timer = None

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(
                self.limits.header_timeout_seconds, self._header_timed_out
            )

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if self._in_headers and not self.transport.is_closing():
            self._reject(
                408, "header_timeout", "Request Timeout", "The request headers took too long."
            )

    def _reject(self, status: int, code: str, title: str, detail: str) -> None:
        """Answer a request the app never saw (problem+json) and close the connection."""
        self._rejected = True
        self._cancel_timers()
        body = json.dumps(problem_body(status=status, code=code, title=title, detail=detail))
        payload = body.encode()
        head = (
            f"HTTP/1.1 {status} {title}\r\ncontent-type: {PROBLEM_JSON}\r\n"
            f"content-length: {len(payload)}\r\nconnection: close\r\n\r\n"
        ).encode()
        if not self.transport.is_closing():
            self.transport.write(head + payload)
            self.transport.close()

    def _headers_too_large(self) -> None:
        self._reject(
            431,
            "headers_too_large",
            "Request Header Fields Too Large",
            f"The request line and headers exceed {self.limits.max_header_bytes} bytes.",
        )

    def _arm_body_timer(self, delay: float) -> None:
        self._body_timer = self.loop.call_later(delay, self._body_idle_check)

    def _body_idle_check(self) -> None:
        self._body_timer = None
        cycle = self.cycle
        if cycle is None or not cycle.more_body or self.transport.is_closing():
            return
        timeout = self.limits.body_idle_timeout_seconds
        now = time.monotonic()
        if self.flow.read_paused:
            # Reading is paused because the app is behind, not the client: not idle.
            self._last_data = now
        idle = now - self._last_data
        if idle < timeout:
            self._arm_body_timer(timeout - idle)
            return
        cycle.keep_alive = False
        if cycle.response_started:
            self.transport.close()
            return
        # Let the app answer 408 (its receive raises), then the connection closes; if it
        # does not answer within another timeout, close anyway.
        self.timed_out_cycle = cycle
        cycle.message_event.set()
        self._body_timer = self.loop.call_later(timeout, self.transport.close)

    def check_body_timeout(self, cycle: RequestResponseCycle) -> None:
        """Raise RequestBodyTimeout in the app once ``cycle``'s body has stalled."""
        if self.timed_out_cycle is cycle:
            raise RequestBodyTimeout(self.limits.body_idle_timeout_seconds)

    # --- answers before the body: connection: close, then a lingering close -----------------

    def answering_before_body(self, cycle: RequestResponseCycle) -> None:
        """``cycle``'s response starts while its request body is still due: the response says
        ``connection: close``, and ending it starts a lingering close instead of a close."""
        cycle.keep_alive = False
        cycle.transport = _LingeringTransport(self.transport, self)  # type: ignore[assignment]

    def linger(self) -> None:
        """The answer is written: half-close, then drop what still arrives, within bounds."""
        if self.transport.is_closing():
            return
        self._lingering = True
        self._cancel_timers()
        self._reading_direct = False
        self._tune_reads(0)
        if self._linger_done():
            self.transport.close()
            return
        self.flow.resume_reading()
        self.transport.write_eof()
        now = time.monotonic()
        self._linger_until = now + LINGER_MAX_SECONDS
        self._arm_linger_timer(now)

    def _linger_done(self) -> bool:
        return self._declared_length is not None and self._body_seen >= self._declared_length

    def _arm_linger_timer(self, now: float) -> None:
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        delay = min(LINGER_IDLE_SECONDS, max(self._linger_until - now, 0.0))
        self._linger_timer = self.loop.call_later(delay, self.transport.close)

    def _drop_lingering(self, data: bytes) -> None:
        self._body_seen += len(data)
        if self._linger_done() or time.monotonic() >= self._linger_until:
            self.transport.close()
        else:
            self._arm_linger_timer(time.monotonic())

    def data_received(self, data: bytes) -> None:
        self._last_data = time.monotonic()
        if self._lingering:
            self._drop_lingering(data)
            return
        if self._rejected:
            return
        if self._in_headers:
            self._header_bytes += len(data)
            self._feed(data)
            # Still inside the headers after this read: every byte counted was a header byte.
            if self._in_headers and self._header_bytes > self.limits.max_header_bytes:
                self._headers_too_large()
            return
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        if self._reading_direct:
            data = self._receive_body(data)
            if not data:
                return
        super().data_received(data)
        if self._body is not None and self._body_left > 0 and not self.transport.is_closing():
            # The parser consumed all it was given and stands inside this body: the next
            # _body_left bytes on the wire are body bytes, and they bypass it from here on.
            self._reading_direct = True
            self._tune_reads(min(DIRECT_READ_SIZE, self._body_left))

    def _receive_body(self, data: bytes) -> bytes:
        """Queue the body's share of ``data`` for the app; returns what follows the body."""
        body = self._body
        assert body is not None
        self._unset_keepalive_if_required()  # as uvicorn's data_received does
        rest = b""
        if len(data) > self._body_left:  # never with asyncio's transport (reads are capped)
            data, rest = data[: self._body_left], data[self._body_left :]
        self._body_left -= len(data)
        self._body_seen += len(data)
        body.feed(data)
        if self._body_left:
            self._tune_reads(self._direct_read_size(body))
            return rest
        # The body is complete. The old parser still waits for it: the next request (maybe
        # already in ``rest``) goes to a fresh one.
        self._reading_direct = False
        self._tune_reads(0)
        self.parser = _new_parser(self)
        self.on_message_complete()
        return rest

    def _direct_read_size(self, body: DirectBody) -> int:
        # Once the app has answered (an early 413/401) the rest is only drained: wake on every
        # arrival again, since each read is what cancels the keep-alive timer the response
        # armed; holding reads back to a MiB would let it cut a slow client off mid-body.
        if body.cycle.response_complete:
            return 0
        return min(DIRECT_READ_SIZE, self._body_left)

    def on_response_complete(self) -> None:
        if self._lingering:
            # Never another request on this connection (uvicorn would arm keep-alive here).
            self.server_state.total_requests += 1
            return
        if self._reading_direct:
            self._tune_reads(0)
        super().on_response_complete()

    def _tune_reads(self, size: int) -> None:
        """Read ``size`` bytes per recv(), woken only once they have arrived; 0: the defaults.

        SO_RCVLOWAT keeps epoll quiet until the socket holds ``size`` bytes, so a body costs one
        loop iteration, one recv() and one ASGI message per MiB instead of one per ~100 KiB
        that curl has sent: 0.13-0.19 s of CPU per GB instead of 0.3-0.4 (bench/RESULTS.md).
        Only on asyncio's plain socket transport, whose reads this is about (TLS and uvloop
        keep their own).
        """
        if self._default_read_size is None or size == self._read_size:
            return
        self._read_size = size
        self.transport.max_size = size or self._default_read_size  # type: ignore[attr-defined]
        sock = self.transport.get_extra_info("socket")
        if sock is not None and hasattr(socket, "SO_RCVLOWAT"):
            # Linux caps it below the receive buffer (growing the buffer to fit), so it cannot
            # stall a connection; a FIN or an error wakes the loop whatever the mark.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, max(size, 1))

    def on_message_begin(self) -> None:
        self._in_headers = True
        self._header_bytes = 0
        self._arm_header_timer()
        super().on_message_begin()
        if self._zerocopy:
            self.scope["extensions"] = {ZEROCOPY_SEND: {}}

    def on_headers_complete(self) -> None:
        self._in_headers = False
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        size = len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)
        if size > self.limits.max_header_bytes:
            self._headers_too_large()
            raise httptools.HttpParserError("headers too large")
        self._declared_length = declared_length(self.headers)
        self._body_seen = 0
        # uvicorn creates the request's cycle and starts its task in here (unless pipelined).
        self._direct_length = direct_body_length(self.headers)
        try:
            super().on_headers_complete()
        finally:
            self._direct_length = 0
        if self._body_timer is None and self.limits.body_idle_timeout_seconds > 0:
            self._last_data = time.monotonic()
            self._arm_body_timer(self.limits.body_idle_timeout_seconds)

    def on_body(self, body: bytes) -> None:
        # uvicorn pauses reading once 64 KiB of request body wait for the app; a larger mark
        # lets each ASGI receive carry more (bench/serving/upload.py). Bodies read directly get here
        # only for the part that arrived with the headers.
        if self._body is not None:
            self._body_left -= len(body)
        self._body_seen += len(body)
        if (
            self.parser.should_upgrade() and self._should_upgrade()
        ) or self.cycle.response_complete:
            return
        self.cycle.body += body
        if len(self.cycle.body) > BODY_HIGH_WATER:
            self.flow.pause_reading()
        self.cycle.message_event.set()

    def on_message_complete(self) -> None:
        self._body, self._body_left = None, 0
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().on_message_complete()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        body = None
        if self._direct_length and cycle is self.cycle and not self.parser.should_upgrade():
            # Only a request started as its headers end (not a pipelined one, whose body the
            # parser buffers while it waits) has its body read directly.
            body = DirectBody(cycle, self)
            self._body, self._body_left = body, self._direct_length
        app = _ZeroCopyApp(app, cycle, self.loop, body, protocol=self)
        super()._start_asgi_task(cycle, app)


class ClientGone(OSError):
    """``send`` after the client left (ASGI: a server-specific OSError). Not a ConnectionError:
    the app maps those to 503 (a dependency down), and this one has nobody to answer.

    ``sent``: how many bytes of the failed message did go out first (a file cut off mid-way),
    which the access log and the blob metrics count."""

    def __init__(self, message: str, *, sent: int = 0) -> None:
        super().__init__(message)
        self.sent = sent


class _LingeringTransport:
    """The transport as a cycle answering before its body sees it: ``close()`` (which uvicorn
    calls once a ``connection: close`` response is written) starts the protocol's lingering
    close; everything else is the transport's own."""

    def __init__(self, transport: asyncio.Transport, protocol: ZeroCopyHttpProtocol) -> None:
        self._transport = transport
        self._protocol = protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        self._protocol.linger()


class _ZeroCopyApp:
    """Wraps the ASGI app for one request: zerocopysend messages go to the socket directly, and
    a body read past the parser is received from its queue."""

    def __init__(
        self,
        app: Any,
        cycle: RequestResponseCycle,
        loop: asyncio.AbstractEventLoop,
        body: DirectBody | None = None,
        *,
        protocol: ZeroCopyHttpProtocol,
    ):
        self.app = app
        self.cycle = cycle
        self.loop = loop
        self.body = body
        self.protocol = protocol

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        receive = self.body.receive if self.body is not None else self._until_idle(receive)
        cycle, protocol = self.cycle, self.protocol

        async def send_closing_early(message: Message) -> None:
            if (
                message["type"] == "http.response.start"
                and not cycle.response_started
                and cycle.more_body
                and not cycle.disconnected
            ):
                protocol.answering_before_body(cycle)
            if cycle.disconnected and message["type"] == "http.response.body":
                # uvicorn drops a body sent to a closed connection without a word, so a
                # streamed download (S3) went on reading the whole object and counted every
                # byte as sent. ASGI says a server raises an OSError here.
                raise ClientGone("the client closed the connection")
            await send(message)

        if ZEROCOPY_SEND not in scope.get("extensions", {}):
            await self.app(scope, receive, send_closing_early)
            return

        async def send_with_zerocopy(message: Message) -> None:
            if message["type"] == ZEROCOPY_SEND:
                await self._send_file(send_closing_early, message)
            else:
                await send_closing_early(message)

        await self.app(scope, receive, send_with_zerocopy)

    def _until_idle(self, receive: Any) -> Any:
        protocol, cycle = self.protocol, self.cycle

        async def receive_until_idle() -> Message:
            message: Message = await receive()
            protocol.check_body_timeout(cycle)
            return message

        return receive_until_idle

    async def _send_file(self, send: Any, message: Message) -> None:
        cycle = self.cycle
        if not cycle.response_started or cycle.response_complete:
            raise RuntimeError(f"Unexpected ASGI message '{ZEROCOPY_SEND}' at this point.")
        file = message["file"]
        offset = int(message.get("offset") or 0)
        count = message.get("count")
        if count is None:
            count = os.fstat(file.fileno()).st_size - offset
        more_body = bool(message.get("more_body", False))
        if cycle.disconnected:
            raise ClientGone("the client closed the connection")
        if cycle.scope["method"] == "HEAD" or cycle.chunked_encoding or count == 0:
            # Nothing to send, or framing that sendfile cannot produce: let uvicorn handle it.
            body = b"" if cycle.scope["method"] == "HEAD" or count == 0 else None
            if body is None:
                body = await asyncio.to_thread(os.pread, file.fileno(), count, offset)
            await send({"type": "http.response.body", "body": body, "more_body": more_body})
            return
        if count > cycle.expected_content_length:
            raise RuntimeError("Response content longer than Content-Length")
        if cycle.flow.write_paused:
            await cycle.flow.drain()
        transport = self.protocol.transport
        # Both senders leave the file's position just past what went out, also when they fail
        # (asyncio's contract for loop.sendfile, kept by sendfile_blocking): from here it says
        # how much of a cut-off file was sent.
        os.lseek(file.fileno(), offset, os.SEEK_SET)
        try:
            sent = await self._sendfile(transport, file, offset, count)
        except (ConnectionError, RuntimeError, OSError) as exc:
            # The client went away (tensorizer's readers close early by design).
            cycle.disconnected = True
            transport.close()
            went_out = os.lseek(file.fileno(), 0, os.SEEK_CUR) - offset
            raise ClientGone(
                "the client closed the connection", sent=max(0, min(went_out, count))
            ) from exc
        if sent != count:
            # The file shrank under us: the response cannot be completed honestly.
            transport.close()
            cycle.disconnected = True
            raise ClientGone("the response could not be completed")
        cycle.expected_content_length -= count
        # An empty body message lets uvicorn finish the response (keep-alive, pipelining).
        await send({"type": "http.response.body", "body": b"", "more_body": more_body})

    async def _sendfile(self, transport: Any, file: Any, offset: int, count: int) -> int:
        """On a pool thread when one is free and nothing is left in the transport's buffer
        (headers not yet on the socket would come after the file), else on the loop."""
        pool = self.protocol.sendfile_pool
        sock = transport.get_extra_info("socket")
        executor = None
        if pool is not None and sock is not None and not transport.get_write_buffer_size():
            executor = pool.take()
        if executor is None:
            return int(await self.loop.sendfile(transport, file, offset, count))
        reading = transport.is_reading()
        transport.pause_reading()  # as asyncio's own sendfile does
        try:
            idle = self.protocol.limits.send_idle_timeout_seconds
            return await self.loop.run_in_executor(
                executor, sendfile_blocking, sock.fileno(), file.fileno(), offset, count, idle
            )
        finally:
            pool.give()  # type: ignore[union-attr]
            if reading and not transport.is_closing():
                transport.resume_reading()
