"""Pure ASGI middleware: request ids, one JSON log line per request, metrics, last-resort 500.

Pure ASGI (not BaseHTTPMiddleware) so streaming uploads and downloads pass through untouched.
The log line carries the path without its query string: signed URLs carry their auth there.

The client address (``scope["client"]``, hence ``request.client`` in routes, the log line and
audit rows) is the TCP peer, unless the peer is one of ``security.trusted_proxies``: then it is
the right-most ``X-Forwarded-For`` hop that is not itself a trusted proxy.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import time
import uuid
from collections.abc import Sequence
from typing import Any

from prometheus_client import Counter, Histogram
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tensor_registry_server.blobs.zerocopy import ZEROCOPY_SEND, ClientGone
from tensor_registry_server.core.context import request_id_var
from tensor_registry_server.core.errors import PROBLEM_JSON, internal_error_body, problem_body
from tensor_registry_server.core.metrics import UPLOAD_BYTES

log = logging.getLogger("tensor_registry.access")

REQUESTS = Counter(
    "tensor_registry_http_requests_total", "HTTP requests", ["method", "route", "status"]
)
# Up to hours: a blob download of a large artifact over a slow link takes that long, and a
# histogram whose top bucket is 2 min says nothing about it.
_SUBSECOND = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5)
LATENCY_BUCKETS: tuple[float, ...] = (*_SUBSECOND, 1, 2.5, 5, 10, 30, 120, 300, 900, 1800, 3600)
LATENCY_BUCKETS += (7200, 14400)
LATENCY = Histogram(
    "tensor_registry_http_request_seconds",
    "HTTP request latency (to the end of the response)",
    ["method", "route"],
    buckets=LATENCY_BUCKETS,
)
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._-]{8,64}$")
# Routes whose bodies are raw bytes; every other body must be JSON.
_RAW_BODY_RE = re.compile(r"^/api/v1/models/[^/]+/versions/[^/]+/files/")
# The status counted and logged for a request whose client went away before its answer was
# complete (nginx's convention): no response reached anybody, and it is not a server error.
CLIENT_CLOSED = 499


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _networks(entries: Sequence[str]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(e.strip(), strict=False) for e in entries if e.strip())


def _trusted(address: str, proxies: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in n for n in proxies if n.version == ip.version)


def client_address(
    peer: str | None, forwarded_for: str | None, proxies: tuple[Network, ...]
) -> str | None:
    """The address to log and audit for a request from ``peer``."""
    if peer is None or not forwarded_for or not _trusted(peer, proxies):
        return peer
    hops = [hop.strip() for hop in forwarded_for.split(",")]
    for hop in reversed(hops):
        try:
            address = str(ipaddress.ip_address(hop))
        except ValueError:
            return peer  # a malformed chain: believe only what we saw
        if not _trusted(address, proxies):
            return address
    return peer


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp, *, trusted_proxies: Sequence[str] = ()) -> None:
        self.app = app
        self.trusted_proxies = _networks(trusted_proxies)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        incoming = headers.get("x-request-id", "")
        request_id = incoming if _REQUEST_ID_RE.match(incoming) else uuid.uuid4().hex
        token = request_id_var.set(request_id)
        started = time.perf_counter()
        status_holder = {"status": 500, "started": False, "bytes": 0, "complete": False}
        method = scope["method"]
        path = scope["path"]
        peer = scope.get("client")
        # Every X-Forwarded-For header, in order (a proxy may add its own rather than append).
        forwarded = ",".join(
            v.decode("latin-1") for k, v in scope["headers"] if k.lower() == b"x-forwarded-for"
        )
        client = client_address(peer[0] if peer else None, forwarded, self.trusted_proxies)
        if peer and client != peer[0]:
            scope = {**scope, "client": (client, 0)}
        disconnected = False

        async def receive_wrapper() -> Message:
            nonlocal disconnected
            message = await receive()
            # After the last body message, servers answer receive() with a disconnect too.
            if message["type"] == "http.disconnect" and not status_holder["complete"]:
                disconnected = True
            return message

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_holder["status"] = message["status"]
                status_holder["started"] = True
                raw = list(message.get("headers", []))
                raw.append((b"x-request-id", request_id.encode()))
                message["headers"] = raw
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                status_holder["complete"] = True
            try:
                await send(message)
            except ClientGone as exc:  # a file cut off mid-way: what of it went out counts
                status_holder["bytes"] = int(status_holder["bytes"]) + exc.sent
                raise
            # Bytes count once the server took them (a send to a closed connection raises), so
            # an aborted download logs what went out, not what was meant to.
            if message["type"] == "http.response.body":
                status_holder["bytes"] = int(status_holder["bytes"]) + len(message.get("body", b""))
            elif message["type"] == ZEROCOPY_SEND:
                count = int(message.get("count") or 0)
                status_holder["bytes"] = int(status_holder["bytes"]) + count

        if method == "PUT" and _RAW_BODY_RE.match(path):
            receive = _counting_upload_bytes(receive)
        try:
            rejection = _reject_non_json(method, path, headers)
            if rejection is not None:
                await _send_json(send_wrapper, 415, rejection)
            else:
                await self.app(scope, receive_wrapper, send_wrapper)
        except (ClientDisconnect, ConnectionError, ClientGone) as exc:
            disconnected = True
            _log_disconnect(request_id, method, path, type(exc).__name__)
        except Exception:
            if disconnected:
                # Whatever the app raised after its client left is the departure's echo.
                _log_disconnect(request_id, method, path, None)
                return
            log.exception("unhandled error", extra={"request_id": request_id})
            if not status_holder["started"]:
                await _send_json(send_wrapper, 500, internal_error_body())
            else:
                raise
        finally:
            route = scope.get("route")
            route_path = getattr(route, "path", None) or "unmatched"
            elapsed = time.perf_counter() - started
            status = CLIENT_CLOSED if disconnected else int(status_holder["status"])
            REQUESTS.labels(method, route_path, str(status)).inc()
            LATENCY.labels(method, route_path).observe(elapsed)
            log.info(
                json.dumps(
                    {
                        "event": "request",
                        "request_id": request_id,
                        "method": method,
                        "path": path,
                        "client": client,
                        "route": route_path,
                        "status": status,
                        "duration_ms": round(elapsed * 1000, 2),
                        "bytes_out": status_holder["bytes"],
                    }
                )
            )
            request_id_var.reset(token)


def _counting_upload_bytes(receive: Receive) -> Receive:
    """``receive`` that counts the body bytes of a file upload as they arrive."""

    async def counted() -> Message:
        message = await receive()
        if message["type"] == "http.request":
            UPLOAD_BYTES.inc(len(message.get("body", b"")))
        return message

    return counted


def _reject_non_json(method: str, path: str, headers: dict[str, str]) -> dict[str, Any] | None:
    if method not in {"POST", "PUT", "PATCH"} or not path.startswith("/api/v1/"):
        return None
    if _RAW_BODY_RE.match(path):
        return None
    content_type = headers.get("content-type")
    has_body = headers.get("content-length", "0") not in {"", "0"} or "transfer-encoding" in headers
    if not has_body or content_type is None:
        return None
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/json" or media.endswith("+json"):
        return None
    return problem_body(
        status=415,
        code="unsupported_media_type",
        title="Unsupported media type",
        detail=f"This route takes application/json, not {media}.",
    )


async def _send_json(send: Send, status: int, body: dict[str, Any]) -> None:
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", PROBLEM_JSON.encode()),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


def _log_disconnect(request_id: str, method: str, path: str, error: str | None) -> None:
    fields = {"event": "client_disconnected", "request_id": request_id}
    fields |= {"method": method, "path": path}
    if error is not None:
        fields["error"] = error
    log.info(json.dumps(fields))
