"""Request bodies read past httptools' parser, for the API server's protocol
(tensor_registry_server/blobs/zerocopy.py).

Uploads. uvicorn passes a request body through httptools: each socket read (256 KiB at most) is
copied by the parser into a new ``bytes``, appended to a per-request ``bytearray`` and copied again
into the ASGI message, and reading pauses at 64 KiB. Profiled during a 1 GB upload, those copies
and the page faults of their fresh buffers were a third of the event loop's CPU; ``curl -T`` of
1 GB into a do-nothing ASGI app cost the server 0.9-1.2 s of CPU, a bare ``recv_into`` loop
0.15-0.2 s. So a body with a ``Content-Length`` of at least ``DIRECT_BODY_MIN`` is taken off the
parser once the headers are parsed: each socket read (``DIRECT_READ_SIZE``, never past the end
of the body) becomes the ``body`` of the next ``http.request`` message as it is, plain ``bytes``
that Python never copies. With the read mark below, the do-nothing app costs what the bare loop
does (0.13-0.19 s of CPU per GB). httptools cannot skip bytes it has not seen, so when the body
ends the connection gets a fresh parser for its next request. Apps see standard ASGI messages
either way; shorter bodies, chunked ones and pipelined requests take uvicorn's path.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

if TYPE_CHECKING:
    from tensor_registry_server.blobs.zerocopy import ZeroCopyHttpProtocol

Message = dict[str, Any]

# Request body buffered per request before reading pauses (uvicorn's own mark is 64 KiB), and
# the level it must fall under before reading resumes (one pause/resume pair per few reads, not
# one per message: each costs two epoll_ctl calls).
BODY_HIGH_WATER = 2 * 1024 * 1024
BODY_LOW_WATER = 1024 * 1024
# Bodies at least this long are read past the parser; shorter ones are not worth the swap.
DIRECT_BODY_MIN = 1024 * 1024
# Bytes asked of one socket read while a body is read directly (asyncio's default: 256 KiB).
DIRECT_READ_SIZE = 1024 * 1024


def direct_body_length(headers: list[tuple[bytes, bytes]]) -> int:
    """The Content-Length of a body worth reading past the parser, else 0."""
    length = 0
    for name, value in headers:
        if name == b"transfer-encoding":
            return 0
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                return 0
    return length if length >= DIRECT_BODY_MIN else 0


def declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The request body's Content-Length; None for a chunked body (the parser has refused
    both together, and malformed values, before this is asked)."""
    length = None
    for name, value in headers:
        if name == b"transfer-encoding":
            return None
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                return None
    return 0 if length is None else length


class DirectBody:
    """A request body read past the parser: whole socket reads, queued as ASGI messages."""

    def __init__(self, cycle: RequestResponseCycle, protocol: ZeroCopyHttpProtocol) -> None:
        self.cycle = cycle
        self.protocol = protocol
        self.chunks: deque[bytes] = deque()
        self.queued = 0

    def feed(self, chunk: bytes) -> None:
        cycle = self.cycle
        if cycle.response_complete or cycle.disconnected:
            # Answered already (a 413, a 401): the rest of the body is read and dropped, as
            # uvicorn does, so that the connection can serve its next request.
            self.chunks.clear()
            self.queued = 0
            return
        self.chunks.append(chunk)
        self.queued += len(chunk)
        if self.queued > BODY_HIGH_WATER:
            cycle.flow.pause_reading()
        cycle.message_event.set()

    async def receive(self) -> Message:
        """uvicorn's ``RequestResponseCycle.receive``, taking whole reads from the queue."""
        cycle = self.cycle
        if cycle.waiting_for_100_continue and not cycle.transport.is_closing():
            cycle.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            cycle.waiting_for_100_continue = False
        if not cycle.disconnected and not cycle.response_complete:
            if self.queued < BODY_LOW_WATER:
                cycle.flow.resume_reading()
            if not (cycle.body or self.chunks):
                await cycle.message_event.wait()
            cycle.message_event.clear()
        if cycle.disconnected or cycle.response_complete:
            self.chunks.clear()
            self.queued = 0
            return {"type": "http.disconnect"}
        self.protocol.check_body_timeout(cycle)
        if cycle.body:  # the part that came with the headers, through the parser
            body = bytes(cycle.body)
            cycle.body = bytearray()
        elif self.chunks:
            body = self.chunks.popleft()
            self.queued -= len(body)
        else:
            body = b""
        more_body = cycle.more_body or bool(self.chunks)
        return {"type": "http.request", "body": body, "more_body": more_body}
