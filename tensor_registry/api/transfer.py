"""Bounds on every transfer a node makes: bytes, idle time, an overall deadline, retries.

A lying or broken server must not exhaust the node (threat-model.md rule 8): a small document (a
key, the keys document, a JSON answer) is read while streaming and refused the moment it passes
its cap, never read whole first; a file stops at the size the (signed) manifest gives; every
transfer has an idle timeout (no byte for ``idle_seconds``) and an overall deadline derived
from its size (``grace_seconds`` + size / ``min_bytes_per_second``); a dropped download is
resumed with ``Range`` from the byte it reached, ``retries`` times with exponential backoff
and jitter, within that same deadline (tensor_registry/node_cache.py).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from tensor_registry.api.errors import (
    ConnectionFailed,
    ResponseTooLarge,
    TransferTimeout,
    error_from_response,
)

# JSON answers of the API (a resolve answer, a page of 500 items) stay far below this.
MAX_JSON_BYTES = 32 << 20
# What a problem+json error body may take.
MAX_ERROR_BYTES = 64 << 10


@dataclass(frozen=True)
class TransferLimits:
    idle_seconds: float = 60.0
    # The slowest transfer accepted on average: 1 MiB/s (a 10 GB file may take 2.8 hours).
    min_bytes_per_second: float = float(1 << 20)
    grace_seconds: float = 60.0
    retries: int = 4
    backoff_seconds: float = 0.5
    backoff_max_seconds: float = 8.0

    def deadline(self, size: int, *, start: float | None = None) -> float:
        """The monotonic time by which ``size`` bytes must have arrived."""
        begun = time.monotonic() if start is None else start
        return begun + self.grace_seconds + max(0, size) / self.min_bytes_per_second

    def timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.idle_seconds, connect=min(10.0, self.idle_seconds))

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before retry ``attempt`` (1, 2, ...): exponential, full jitter."""
        ceiling = min(self.backoff_max_seconds, self.backoff_seconds * 2 ** (attempt - 1))
        return random.uniform(ceiling / 2, ceiling)


DEFAULT_LIMITS = TransferLimits()


def check_deadline(deadline: float, what: str) -> None:
    if time.monotonic() > deadline:
        raise TransferTimeout(f"{what}: did not finish within its deadline", status=None)


def read_capped(
    http: httpx.Client,
    method: str,
    url: str,
    *,
    cap: int,
    what: str,
    limits: TransferLimits = DEFAULT_LIMITS,
    on_error: Callable[[httpx.Response], Exception] = error_from_response,
    **kwargs: Any,
) -> httpx.Response:
    """The answer to one request with its body read while streaming and refused past ``cap``
    bytes (decoded: a compressed bomb is counted as it inflates), within the idle timeout and
    a deadline for ``cap`` bytes. Error answers (>= 400) raise ``on_error`` (their body capped
    at MAX_ERROR_BYTES). Returns a response whose ``content`` is the body."""
    deadline = limits.deadline(cap)
    kwargs.setdefault("timeout", limits.timeout())
    try:
        with http.stream(method, url, **kwargs) as response:
            limit = cap if response.status_code < 400 else MAX_ERROR_BYTES
            declared = response.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > limit:
                if response.status_code >= 400:
                    raise on_error(_rebuilt(response, b""))
                raise ResponseTooLarge(
                    f"{what}: the answer declares {int(declared):,} bytes, more than {limit:,}",
                    status=response.status_code,
                )
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > limit:
                    if response.status_code >= 400:
                        raise on_error(_rebuilt(response, b""))
                    raise ResponseTooLarge(
                        f"{what}: the answer went past {limit:,} bytes; reading stopped",
                        status=response.status_code,
                    )
                check_deadline(deadline, what)
    except httpx.TimeoutException as exc:
        raise TransferTimeout(f"{what}: no bytes for {limits.idle_seconds:g} s ({exc})") from exc
    except httpx.TransportError as exc:
        raise ConnectionFailed(f"{what}: {exc}") from exc
    rebuilt = _rebuilt(response, bytes(body))
    if rebuilt.status_code >= 400:
        raise on_error(rebuilt)
    return rebuilt


def _rebuilt(response: httpx.Response, body: bytes) -> httpx.Response:
    # The body is already decoded: the rebuilt answer must not decode it again.
    headers = [
        (k, v)
        for k, v in response.headers.multi_items()
        if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")
    ]
    return httpx.Response(
        response.status_code, headers=headers, content=body, request=response.request
    )
