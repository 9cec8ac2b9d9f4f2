"""The API server's HTTP protocol: zero-copy file sending and a larger request-body buffer.

uvicorn does not implement the extension, and a file streamed through ASGI ``body`` messages costs
a read into Python, a copy into the transport buffer and a send per chunk: measured at about half
of nginx's throughput on the tensorizer read path (bench/download.py). ``ZeroCopyHttpProtocol``
is uvicorn's httptools protocol plus the extension: a message ``{"type":
"http.response.zerocopysend", "file": <binary file object>, "offset": int, "count": int,
"more_body": bool}`` is written with ``loop.sendfile`` (``os.sendfile`` on the asyncio event
loop: the kernel moves page-cache pages to the socket, the bytes never enter Python).

The extension is advertised in ``scope["extensions"]`` only when the event loop can do it
natively (asyncio's; uvloop has no ``sendfile``); responses fall back to ``body`` messages when
it is absent (tests on httpx's ASGITransport, other servers).

Serve with ``uvicorn.run(app, http=ZeroCopyHttpProtocol, loop="asyncio")``.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

ZEROCOPY_SEND = "http.response.zerocopysend"
# Request body buffered per connection before reading pauses (uvicorn's own mark is 64 KiB).
BODY_HIGH_WATER = 1024 * 1024

Message = dict[str, Any]


def _loop_can_sendfile(loop: asyncio.AbstractEventLoop) -> bool:
    # asyncio's own loops implement loop.sendfile with os.sendfile; uvloop raises
    # NotImplementedError, and then streaming through body messages is the better choice.
    return isinstance(loop, asyncio.BaseEventLoop) and hasattr(os, "sendfile")


class ZeroCopyHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools HTTP/1.1 protocol with the ASGI zero-copy send extension."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._zerocopy = _loop_can_sendfile(self.loop) and hasattr(self, "_start_asgi_task")

    def on_body(self, body: bytes) -> None:
        # uvicorn pauses reading once 64 KiB of request body wait for the app, so an upload
        # becomes one event-loop round trip (and one TCP window stall) per ~256 KiB. A larger
        # mark lets each ASGI receive carry up to about a MiB (bench/upload.py).
        if (
            self.parser.should_upgrade() and self._should_upgrade()
        ) or self.cycle.response_complete:
            return
        self.cycle.body += body
        if len(self.cycle.body) > BODY_HIGH_WATER:
            self.flow.pause_reading()
        self.cycle.message_event.set()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._zerocopy:
            self.scope["extensions"] = {ZEROCOPY_SEND: {}}

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        if ZEROCOPY_SEND in cycle.scope.get("extensions", {}):
            app = _ZeroCopyApp(app, cycle, self.loop)
        super()._start_asgi_task(cycle, app)


class _ZeroCopyApp:
    """Wraps the ASGI app for one request: zerocopysend messages go to the socket directly."""

    def __init__(self, app: Any, cycle: RequestResponseCycle, loop: asyncio.AbstractEventLoop):
        self.app = app
        self.cycle = cycle
        self.loop = loop

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def send_with_zerocopy(message: Message) -> None:
            if message["type"] == ZEROCOPY_SEND:
                await self._send_file(send, message)
            else:
                await send(message)

        await self.app(scope, receive, send_with_zerocopy)

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
            return
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
        try:
            sent = await self.loop.sendfile(cycle.transport, file, offset, count)
        except (ConnectionError, RuntimeError, OSError):
            # The client went away (tensorizer's readers close early by design).
            cycle.disconnected = True
            cycle.transport.close()
            return
        if sent != count:
            # The file shrank under us: the response cannot be completed honestly.
            cycle.transport.close()
            cycle.disconnected = True
            return
        cycle.expected_content_length -= count
        # An empty body message lets uvicorn finish the response (keep-alive, pipelining).
        await send({"type": "http.response.body", "body": b"", "more_body": more_body})
