"""What one client connection may make the API server hold, as ``serve`` configures its
protocol (tensor_registry_server/blobs/zerocopy.py; settings ``http.*``)."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.exceptions import HTTPException


@dataclass(frozen=True)
class HttpLimits:
    """Bounds on what one client may make the server hold (settings: ``http.*``).

    httptools has no header limit of its own (it buffers a header of any length), and uvicorn
    bounds neither how long headers may take to arrive nor how long a body may stall.
    """

    max_header_bytes: int = 64 * 1024
    header_timeout_seconds: float = 30.0
    body_idle_timeout_seconds: float = 60.0
    # Threads sending files (0: the event loop sends them) and how long one may wait for a
    # client that takes no bytes before the response is cut off.
    sendfile_threads: int = 0
    send_idle_timeout_seconds: float = 60.0


class RequestBodyTimeout(HTTPException):
    """The client stopped sending its body: the app answers 408 and the connection closes."""

    def __init__(self, seconds: float) -> None:
        super().__init__(408, f"No request body bytes arrived for {seconds:g} s.")
