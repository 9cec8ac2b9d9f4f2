"""Plain HTTP/1.1 connections to a signed blob URL, for the node's bulk reads.

A download (tensor_registry/api/download.py) and the engine's URL reads
(tensor_registry/engine/sources.py) read large bodies straight into their own buffers with one
receive per call. httpx reads every body 64 KiB at a time into a fresh ``bytes``: for one 120 MB
file that is about 1,800 reads per connection, and on a loaded node it cost 2-3 times the CPU
of the transfer itself (bench/results/fleet.md, nineteenth session). Signed URLs carry their
auth in the URL and never redirect, so nothing of httpx's is needed here; https uses the same
verifying context as every httpx client of the process (tensor_registry/api/tls.py).
"""

from __future__ import annotations

import http.client
from urllib.parse import SplitResult, urlsplit

import httpx

from tensor_registry.api.errors import ConnectionFailed
from tensor_registry.api.tls import tls_context


def split_url(url: str) -> tuple[SplitResult, str]:
    """(the URL's parts, the request target: path and query); only http(s) with a host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConnectionFailed(f"not an http(s) URL: {parts.scheme}://{parts.hostname}")
    return parts, parts.path + (f"?{parts.query}" if parts.query else "")


def connect(parts: SplitResult, timeout: float) -> http.client.HTTPConnection:
    """A new connection (opened on its first request); ``timeout`` bounds each socket call."""
    if parts.scheme == "https":
        return http.client.HTTPSConnection(
            parts.hostname or "", parts.port, timeout=timeout, context=tls_context()
        )
    return http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)


def as_httpx(response: http.client.HTTPResponse, body: bytes) -> httpx.Response:
    """An answer read here, in the form tensor_registry.api.errors.error_from_response reads."""
    headers = [
        (k, v)
        for k, v in response.getheaders()
        if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")
    ]
    return httpx.Response(response.status, headers=headers, content=body)
