"""One reader of the events outbox per process, feeding every stream and the webhook loop.

Each API process runs one ``EventHub``: a task that reads ``events`` rows past the newest it has
(one query for all streams, never one poll per stream) into a bounded in-memory window, and
wakes whoever waits (SSE streams, the webhook delivery loop). It reads when

- this process committed events (the sessionmaker's notifier calls ``notify``);
- another process did: with Redis (scaled), writers publish the newest id on the channel
  ``<broker.key_prefix>tensor-registry:events`` after commit, and every hub subscribes, so N API
  replicas and the workers fan out through Redis pub/sub;
- and at a slow interval anyway (``poll_seconds``): a writer that died between its commit and
  its publish, or a Redis outage, costs latency, never an event. Without Redis (embedded) the
  interval is short, since the worker beside the API cannot reach this process.

The outbox hands out ids in commit order (tensor_registry_server/core/events_outbox.py), so ``id >
newest`` never
skips an event. A stream whose cursor is older than the window (a resume after a long
disconnect or a restart) reads the gap from the database itself, then joins the window.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tensor_registry_server.core.events_outbox import EventRecord, newest_id, read_after
from tensor_registry_server.settings import Settings

log = logging.getLogger("tensor_registry.events")

CHANNEL = "tensor-registry:events"
WINDOW = 4096
READ_BATCH = 500


def events_channel(settings: Settings) -> str:
    """The pub/sub channel, under the broker's key prefix (registries may share a Redis)."""
    return f"{settings.broker.key_prefix}{CHANNEL}"


def redis_publisher(redis_url: str, channel: str) -> Callable[[int], Awaitable[None]]:
    """A notifier for processes without a hub (workers): publish the newest id on Redis."""
    client: Any = None

    async def publish(newest: int) -> None:
        nonlocal client
        try:
            if client is None:
                from redis.asyncio import Redis

                client = Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=5)
            await client.publish(channel, str(newest))
        except Exception:
            # Readers poll slowly as well: a lost nudge is latency, not a lost event.
            log.warning("events: could not publish on Redis", exc_info=True)

    return publish


class EventHub:
    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        *,
        redis_url: str | None,
        channel: str,
        poll_seconds: float,
        window: int = WINDOW,
    ) -> None:
        self._sessionmaker = sessionmaker
        self._redis_url = redis_url
        self._channel = channel
        self._poll_seconds = poll_seconds
        self._window: deque[EventRecord] = deque(maxlen=window)
        # Every event with floor < id <= newest is in the window.
        self.floor = 0
        self.newest = 0
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._publisher = redis_publisher(redis_url, channel) if redis_url else None
        self.reads = 0  # database reads so far (tests check one reader per process)
        # False until the newest id was read once (a database down at start).
        self.ready = False
        # True once the server shuts down: waits end and the streams with them (drain).
        self.draining = False

    async def start(self) -> None:
        try:
            await self._init()
        except Exception:
            # The API starts without its database (readiness says so); the reader retries.
            log.warning("events: database unavailable at start; the event stream waits for it")
        self._tasks.append(asyncio.create_task(self._read_loop(), name="events-hub-read"))
        if self._redis_url:
            self._tasks.append(asyncio.create_task(self._listen(), name="events-hub-redis"))

    async def _init(self) -> None:
        async with self._sessionmaker() as session:
            self.newest = self.floor = await newest_id(session)
        self.ready = True

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

    async def notify(self, newest: int) -> None:
        """This process committed events up to ``newest``: read them, and tell the others."""
        self._wake.set()
        if self._publisher is not None:
            await self._publisher(newest)

    def after(self, cursor: int) -> list[EventRecord] | None:
        """The events after ``cursor`` in the window, or None when the window starts later."""
        if cursor < self.floor:
            return None
        return [e for e in self._window if e.id > cursor]

    def drain(self) -> None:
        """The server is shutting down: the streams' waits end now (False), so the streams end
        with what they have sent and their clients resume elsewhere or after the restart,
        instead of holding the shutdown for its grace period. Other waiters (the webhook
        loop) just wake and wait again."""
        self.draining = True
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait(self, cursor: int, seconds: float, *, drains: bool = False) -> bool:
        """Until an event past ``cursor`` is in (True) or ``seconds`` pass (False); with
        ``drains``, also False as soon as the hub drains (a stream, which then ends)."""
        while self.newest <= cursor:
            if drains and self.draining:
                return False
            changed = self._changed
            try:
                async with asyncio.timeout(seconds):
                    await changed.wait()
            except TimeoutError:
                return self.newest > cursor
        return True

    async def _read_loop(self) -> None:
        failures = 0
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll_seconds):
                    await self._wake.wait()
            self._wake.clear()
            try:
                if self.ready:
                    await self._read_new()
                else:
                    await self._init()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception:
                failures += 1
                log.warning("events: reading the outbox failed", exc_info=True)
                await asyncio.sleep(min(30.0, 0.5 * 2**failures))

    async def _read_new(self) -> None:
        while True:
            async with self._sessionmaker() as session:
                batch = await read_after(session, self.newest, limit=READ_BATCH)
            self.reads += 1
            if not batch:
                return
            for event in batch:
                if len(self._window) == self._window.maxlen:
                    self.floor = self._window[0].id
                self._window.append(event)
            self.newest = batch[-1].id
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()
            if len(batch) < READ_BATCH:
                return

    async def _listen(self) -> None:
        from redis.asyncio import Redis

        failures = 0
        while True:
            client = Redis.from_url(self._redis_url or "", socket_connect_timeout=5)
            pubsub = client.pubsub()
            try:
                await pubsub.subscribe(self._channel)
                # Whatever was published while we were not subscribed: read now.
                self._wake.set()
                failures = 0
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception:
                failures += 1
                log.warning("events: Redis subscription lost; polling until it is back")
                await asyncio.sleep(min(30.0, 0.5 * 2**failures))
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
                    await client.aclose()
