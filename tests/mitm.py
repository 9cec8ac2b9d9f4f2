"""A man in the middle on 127.0.0.1: forwards every request to a real registry and may rewrite
its JSON answers, replay recorded ones or hold a request until the test releases it.

Resolve answers are rewritten so their signed URLs point through the proxy too (the host part
of a URL is not what a blob signature covers), so blob downloads can be held as well.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from harness.loopback import QuietHandler, serving

# (path with query, the answer's JSON) -> the JSON to send instead
Rewrite = Callable[[str, Any], Any]
PASSED_HEADERS = ("content-type", "content-range", "accept-ranges", "etag", "cache-control")


@dataclass
class Hold:
    """Holds the first GET whose path contains ``needle`` until ``release`` is set."""

    needle: str
    arrived: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)


@dataclass
class Mitm:
    upstream: str
    url: str = ""
    rewrite: Rewrite | None = None
    holds: list[Hold] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    answers: list[tuple[str, Any]] = field(default_factory=list)  # resolve answers sent
    lock: threading.Lock = field(default_factory=threading.Lock)

    def hold(self, needle: str) -> Hold:
        held = Hold(needle)
        with self.lock:
            self.holds.append(held)
        return held

    def resolves(self) -> list[dict[str, list[str]]]:
        """The query of every resolve request the client sent, in order."""
        return [
            parse_qs(urlsplit(path).query) for path in self.requests if "/api/v1/resolve" in path
        ]


@contextmanager
def mitm(upstream: str) -> Iterator[Mitm]:
    state = Mitm(upstream=upstream.rstrip("/"))
    http = httpx.Client(timeout=60, follow_redirects=False)

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            self._forward("GET")

        def do_HEAD(self) -> None:
            self._forward("HEAD")

        def _forward(self, method: str) -> None:
            with state.lock:
                state.requests.append(self.path)
                held = next(
                    (h for h in state.holds if h.needle in self.path and not h.arrived.is_set()),
                    None,
                )
                if held is not None:
                    held.arrived.set()
            if held is not None:
                held.release.wait(timeout=120)
            headers = {
                k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")
            }
            answer = http.request(method, state.upstream + self.path, headers=headers)
            body = answer.content
            if answer.headers.get("content-type", "").startswith("application/json") and (
                self.path.startswith(("/api/", "/.well-known/"))
                and not self.path.startswith(("/api/v1/blobs/", "/api/v1/keys/"))
            ):
                text = body.decode()
                if self.path.startswith("/api/v1/resolve"):
                    text = text.replace(state.upstream, state.url)
                data = json.loads(text) if text else None
                if state.rewrite is not None and answer.status_code < 400:
                    data = state.rewrite(self.path, data)
                if self.path.startswith("/api/v1/resolve"):
                    state.answers.append((self.path, data))
                body = json.dumps(data).encode()
            self.send_response(answer.status_code)
            for name in PASSED_HEADERS:
                if name in answer.headers:
                    self.send_header(name, answer.headers[name])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if method != "HEAD":
                self.wfile.write(body)

    try:
        with serving(Handler) as url:
            state.url = url
            yield state
    finally:
        for held in state.holds:
            held.release.set()
        http.close()
