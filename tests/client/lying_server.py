"""A lying registry on 127.0.0.1: a resolve answer and blob bodies the test chooses.

    liar = Liar()
    liar.file("config.json", b"{}")                        # an honest file (Range honoured)
    liar.file("../../x", b"escape")                        # a path the node must refuse
    liar.file("model.tensors", data, body=Endless())       # answer with a body that never ends
    with liar.serving() as url:                            # http://127.0.0.1:PORT
        ...                                                # GET /api/v1/resolve, /blob/N
    liar.requests                                          # (path, Range header) seen

Every misbehaving body stops by itself (a byte cap and a time cap), so a client that fails to
stop it cannot hang the suite: it fails its assertion instead.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from harness.loopback import QuietHandler, serving

# Caps on what a misbehaving body sends, whatever the client does.
MAX_BAD_BYTES = 64 << 20
MAX_BAD_SECONDS = 20.0


@dataclass
class Honest:
    """The bytes, with Range honoured (206 and an exact Content-Range)."""


@dataclass
class Endless:
    """200 without Content-Length, then bytes until the client leaves (or the caps)."""


@dataclass
class Oversize:
    """The bytes and ``extra`` more, announced honestly in Content-Length."""

    extra: int = 1 << 20


@dataclass
class Drip:
    """A Content-Length of the full size, then one byte every ``every`` seconds."""

    every: float = 0.05


@dataclass
class DropOnce:
    """The first request gets ``at`` bytes of its body, then the connection is cut; later
    requests (with Range) are served honestly."""

    at: int
    dropped: bool = False


@dataclass
class Served:
    path: str
    data: bytes
    body: Honest | Endless | Oversize | Drip | DropOnce
    kind: str = "config"


@dataclass
class Liar:
    files: list[Served] = field(default_factory=list)
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Other routes (the resolve answer, the keys document) answered with a body that never ends.
    endless: set[str] = field(default_factory=set)
    sent: int = 0  # bytes the endless bodies sent before the client left

    def file(
        self,
        path: str,
        data: bytes,
        *,
        body: Honest | Endless | Oversize | Drip | DropOnce | None = None,
        kind: str = "config",
    ) -> None:
        self.files.append(Served(path, data, body or Honest(), kind))

    def answer(self, base: str) -> dict[str, Any]:
        return {
            "model": "acme/liar",
            "version": 1,
            "artifact": {
                "id": "00000000-0000-0000-0000-000000000001",
                "dtype": "float16",
                "format": "hf",
                "tensor_parallel_size": 1,
                "encryption": {"enabled": False},
            },
            "files": [
                {
                    "path": f.path,
                    "size": len(f.data),
                    "sha256": hashlib.sha256(f.data).hexdigest(),
                    "url": f"{base}/blob/{index}",
                    "kind": f.kind,
                }
                for index, f in enumerate(self.files)
            ],
            "tensorizer_uri": f"{base}/blob/0",
            "tensorizer_uris": [f"{base}/blob/0"],
            "expires_at": "2099-01-01T00:00:00Z",
            "deserializer": {"num_readers": 1, "verify_hash": False},
            "vllm": {"args": [], "model_loader_extra_config": {}},
        }

    @contextmanager
    def serving(self) -> Iterator[str]:
        # Every answer names a weights file, as a registry's does (pull prints the vLLM
        # command from it); the tests' own files are what the lies are about.
        if not any(f.kind == "weights" for f in self.files):
            self.file("model.tensors", b"\0" * 8, kind="weights")
        liar = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                with liar.lock:
                    liar.requests.append((self.path, self.headers.get("Range")))
                if any(self.path.startswith(route) for route in liar.endless):
                    liar._endless(self)
                elif self.path.startswith("/api/v1/resolve"):
                    host = self.headers.get("Host")
                    self._send(200, json.dumps(liar.answer(f"http://{host}")).encode())
                elif self.path.startswith("/blob/"):
                    liar._blob(self, liar.files[int(self.path.split("/")[2])])
                else:
                    self._send(404, b'{"code": "not_found"}')

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        with serving(Handler) as url:
            yield url

    def _endless(self, handler: QuietHandler) -> None:
        handler.close_connection = True
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Connection", "close")
        handler.end_headers()
        piece, started = b"[" * 65536, time.monotonic()
        try:
            while self.sent < MAX_BAD_BYTES and time.monotonic() - started < MAX_BAD_SECONDS:
                handler.wfile.write(piece)
                with self.lock:
                    self.sent += len(piece)
        except (BrokenPipeError, ConnectionResetError):
            return

    def _blob(self, handler: QuietHandler, served: Served) -> None:
        data, body = served.data, served.body
        try:
            if isinstance(body, Endless):
                self._endless(handler)
            elif isinstance(body, Oversize):
                payload = data + b"y" * body.extra
                handler.send_response(200)
                handler.send_header("Content-Length", str(len(payload)))
                handler.end_headers()
                handler.wfile.write(payload)
            elif isinstance(body, Drip):
                handler.close_connection = True
                dripped = _head(handler, data)
                started = time.monotonic()
                for index in range(len(dripped)):
                    if time.monotonic() - started > MAX_BAD_SECONDS:
                        break
                    handler.wfile.write(dripped[index : index + 1])
                    handler.wfile.flush()
                    time.sleep(body.every)
            elif isinstance(body, DropOnce) and not body.dropped:
                body.dropped = True
                handler.close_connection = True
                _honest(handler, data, cut_after=body.at)
            else:
                _honest(handler, data)
        except (BrokenPipeError, ConnectionResetError):
            handler.close_connection = True


def _head(handler: QuietHandler, data: bytes) -> bytes:
    """Status and headers for the bytes asked for (Range honoured); returns that body."""
    start, end = 0, len(data) - 1
    asked = handler.headers.get("Range")
    if asked:
        first, _, last = asked.removeprefix("bytes=").partition("-")
        start, end = int(first), int(last) if last else len(data) - 1
        handler.send_response(206)
        handler.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
    else:
        handler.send_response(200)
    handler.send_header("Content-Length", str(end - start + 1))
    handler.end_headers()
    return data[start : end + 1]


def _honest(handler: QuietHandler, data: bytes, *, cut_after: int | None = None) -> None:
    """The bytes asked for; with ``cut_after`` only that many of the body are sent, then the
    connection closes (a replica killed mid-download)."""
    body = _head(handler, data)
    handler.wfile.write(body if cut_after is None else body[:cut_after])
    handler.wfile.flush()
