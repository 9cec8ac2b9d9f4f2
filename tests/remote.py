"""A programmable "remote" HTTP server on 127.0.0.1 that records every request it gets.

Attack tests point the registry at it through addresses the fetcher must refuse and assert
``requests == []`` (nothing was connected to); positive tests allow-list it explicitly.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Route = Callable[[BaseHTTPRequestHandler, threading.Event], None]


@dataclass
class RemoteServer:
    port: int
    requests: list[tuple[str, str]] = field(default_factory=list)  # (path, Host header)
    routes: dict[str, Route] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def url(self, path: str = "/", *, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def add(
        self,
        path: str,
        body: bytes = b"",
        *,
        status: int = 200,
        headers: dict[str, str] | None = None,
    ) -> None:
        def route(handler: BaseHTTPRequestHandler, _: threading.Event) -> None:
            handler.send_response(status)
            for name, value in (headers or {}).items():
                handler.send_header(name, value)
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)

        self.routes[path] = route

    def redirect(self, path: str, location: str, *, status: int = 302) -> None:
        self.add(path, status=status, headers={"Location": location})

    def stream(self, path: str, chunk: bytes, *, every: float = 0.0, head: bytes = b"") -> None:
        """``head`` then ``chunk`` again and again (every ``every`` seconds) until the client
        goes away or the server stops: no Content-Length, so it never ends by itself."""

        def route(handler: BaseHTTPRequestHandler, stop: threading.Event) -> None:
            handler.send_response(200)
            handler.send_header("Connection", "close")
            handler.end_headers()
            try:
                handler.wfile.write(head)
                handler.wfile.flush()
                while not stop.is_set():
                    handler.wfile.write(chunk)
                    handler.wfile.flush()
                    if every:
                        stop.wait(every)
            except OSError:
                return

        self.routes[path] = route


def _handler(server: RemoteServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            server.requests.append((self.path, self.headers.get("Host", "")))
            route = server.routes.get(self.path.split("?", 1)[0])
            if route is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            route(self, server.stop)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler


@contextmanager
def remote_server() -> Iterator[RemoteServer]:
    state = RemoteServer(port=0)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    httpd.daemon_threads = True
    state.port = int(httpd.server_address[1])
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.stop.set()
        httpd.shutdown()
        httpd.server_close()


def without_urls(text: str) -> str:
    """``text`` with every URL cut out: a leak check must not trip on a random port (":34013"
    holds "401")."""
    return re.sub(r"\S+://\S+", "<url>", text)
