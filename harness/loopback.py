"""Servers on 127.0.0.1 in a thread: a request handler, for tests that play a remote party (a
proxy, a registry that misbehaves), or an ASGI app under uvicorn (the server's own protocol)."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from harness.waiting import poll


class QuietHandler(BaseHTTPRequestHandler):
    """An HTTP/1.1 handler (keep-alive, as the loaders' range readers want) that logs nothing."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        return None


@contextmanager
def serving(
    handler: type[BaseHTTPRequestHandler], *, tls: ssl.SSLContext | None = None
) -> Iterator[str]:
    """Serve ``handler`` on a free loopback port (https with ``tls``, a server-side context);
    yields its base URL, shuts down after."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@contextmanager
def uvicorn_serving(app: Any, **config: Any) -> Iterator[tuple[str, Any]]:
    """Serve the ASGI ``app`` with uvicorn (asyncio loop, no lifespan; ``config`` adds to or
    overrides uvicorn.Config's options) on a loopback port held from the start; yields (base
    URL, the uvicorn.Server) once it is started, and waits for it to shut down after."""
    import uvicorn

    options: dict[str, Any] = {"loop": "asyncio", "lifespan": "off", "log_level": "warning"}
    server = uvicorn.Server(uvicorn.Config(app, **{**options, **config}))
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    poll(lambda: server.started or not thread.is_alive(), what="uvicorn to start", timeout=10)
    assert thread.is_alive(), "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        listener.close()
        assert not thread.is_alive(), "uvicorn did not shut down"
