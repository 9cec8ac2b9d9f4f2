"""Per-token request rate: a token bucket, shared by every replica through Redis when
``broker.redis_url`` is set, else counted in this process (the embedded single-process default).

Pure ASGI, in front of every route except health and metrics (a probe or a scrape is never
refused). The key is a hash of the bearer token, so the limit costs no database read; a request
without a bearer token is not rate-limited here (it is refused by the route if it needs one).
If Redis cannot be reached, requests pass (logged): a rate limit must not take the registry
down with its store.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from tensor_registry_server.core.errors import PROBLEM_JSON, problem_body

log = logging.getLogger("tensor_registry.limits")

EXEMPT = ("/healthz", "/readyz", "/livez", "/metrics")

# KEYS[1] bucket; ARGV rate, burst, now (s). Returns {allowed, seconds until one token}.
_LUA = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local state = redis.call('HMGET', KEYS[1], 't', 'at')
local tokens = tonumber(state[1]) or burst
local at = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local allowed = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
end
redis.call('HSET', KEYS[1], 't', tostring(tokens), 'at', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 1)
return {allowed, tostring((1 - tokens) / rate)}
"""


class LocalBuckets:
    """In-process token buckets (one replica)."""

    def __init__(self, rate: float, burst: int, clock: Any = time.monotonic) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self._state: dict[str, tuple[float, float]] = {}

    async def take(self, key: str) -> tuple[bool, float]:
        now = self.clock()
        tokens, at = self._state.get(key, (float(self.burst), now))
        tokens = min(self.burst, tokens + max(0.0, now - at) * self.rate)
        allowed = tokens >= 1
        if allowed:
            tokens -= 1
        if len(self._state) > 100_000:  # full buckets carry no state worth keeping
            self._state = {k: v for k, v in self._state.items() if v[0] < self.burst}
        self._state[key] = (tokens, now)
        return allowed, (1 - tokens) / self.rate


class RedisBuckets:
    """One bucket per token in Redis, updated atomically by a Lua script: every replica draws
    from the same bucket."""

    def __init__(self, url: str, rate: float, burst: int, prefix: str) -> None:
        import redis.asyncio as aioredis

        self.redis = aioredis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
        self.script = self.redis.register_script(_LUA)
        self.rate, self.burst, self.prefix = rate, burst, prefix

    async def take(self, key: str) -> tuple[bool, float]:
        allowed, wait = await self.script(
            keys=[f"{self.prefix}rate/{key}"], args=[self.rate, self.burst, time.time()]
        )
        return bool(int(allowed)), float(wait)


class RateLimitMiddleware:
    def __init__(self, app: ASGIApp, *, buckets: LocalBuckets | RedisBuckets | None) -> None:
        self.app = app
        self.buckets = buckets

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.buckets is None or scope["type"] != "http" or scope["path"] in EXEMPT:
            await self.app(scope, receive, send)
            return
        auth = dict(scope.get("headers") or ()).get(b"authorization", b"")
        if auth[:7].lower() != b"bearer ":
            await self.app(scope, receive, send)
            return
        key = hashlib.sha256(auth[7:].strip()).hexdigest()[:32]
        try:
            allowed, wait = await self.buckets.take(key)
        except Exception as exc:  # Redis down: let the request through
            log.warning("rate limit store unavailable: %s", type(exc).__name__)
            allowed, wait = True, 0.0
        if allowed:
            await self.app(scope, receive, send)
            return
        retry = max(1, math.ceil(wait))
        body = problem_body(
            status=429,
            code="rate_limited",
            title="Too many requests",
            detail=f"This token sends more than {self.buckets.rate:g} requests a second "
            f"(bursts of {self.buckets.burst}); retry in {retry} s.",
            limit="rate_per_second",
            rate_per_second=self.buckets.rate,
            burst=self.buckets.burst,
        )
        payload = json.dumps(body).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 429,
                "headers": [
                    (b"content-type", PROBLEM_JSON.encode()),
                    (b"content-length", str(len(payload)).encode()),
                    (b"retry-after", str(retry).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})


def build_buckets(settings: Any) -> LocalBuckets | RedisBuckets | None:
    limits = settings.limits
    if limits.rate_per_second is None:
        return None
    if settings.broker.redis_url:
        return RedisBuckets(
            settings.broker.redis_url,
            limits.rate_per_second,
            limits.rate_burst,
            settings.broker.key_prefix,
        )
    return LocalBuckets(limits.rate_per_second, limits.rate_burst)
