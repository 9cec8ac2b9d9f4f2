"""Live job progress for ``GET /api/v1/jobs/{id}/events`` (server-sent events).

The job row is the source of truth in both modes. Embedded (no Redis) one poller per job and
process (``JobWatch``) reads the row's progress at a short interval, whatever the number of
streams following that job, and wakes its streams when it changed; a stream reads the whole row
only then. Scaled, workers publish a nudge on a Redis channel after every progress commit, and
the stream re-reads the row when nudged (and at a slow interval anyway, so a lost message costs
latency, never correctness). The stream ends after a final status.

Streams are capped per token and process together with ``GET /api/v1/events``, and end when
their token is revoked (tensor_registry_server.core.streams): one token cannot hold an unbounded
number of open streams (and, embedded, pollers).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tensor_registry_server.core import sse
from tensor_registry_server.rows.jobs import Job, JobStatus
from tensor_registry_server.settings import Settings

log = logging.getLogger("tensor_registry.jobs")

CHANNEL_PREFIX = "tensor-registry:job:"
EMBEDDED_POLL_SECONDS = 0.25
SCALED_POLL_SECONDS = 5.0
KEEPALIVE_SECONDS = 15.0


def channel(job_id: uuid.UUID | str, key_prefix: str = "") -> str:
    """The Redis channel of ``job_id``'s nudges; ``key_prefix`` is broker.key_prefix, so
    registries sharing a Redis database never hear each other's jobs."""
    return f"{key_prefix}{CHANNEL_PREFIX}{job_id}"


async def publish(
    redis: Any, job_id: uuid.UUID | str, state: dict[str, Any], *, key_prefix: str = ""
) -> None:
    """Nudge listeners of ``job_id`` (the payload is informative; they re-read the row)."""
    await redis.publish(channel(job_id, key_prefix), json.dumps(state, default=str))


def _fingerprint(job: Job) -> tuple[Any, ...]:
    return (
        job.status,
        job.stage,
        job.bytes_done,
        job.bytes_total,
        job.attempts,
        job.cancel_requested,
    )


class _Watch:
    def __init__(self) -> None:
        self.version = 0
        self.subscribers = 0
        self.changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None


class JobWatch:
    """Embedded mode: one poller per job, shared by every stream following it in this process.

    The poller reads the job's progress every ``interval`` seconds while at least one stream
    follows the job, and stops with the last one; a change bumps ``version`` and wakes them.
    """

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        interval: float = EMBEDDED_POLL_SECONDS,
    ) -> None:
        self.sessionmaker = sessionmaker
        self.interval = interval
        self._watches: dict[uuid.UUID, _Watch] = {}
        # Database reads made by the pollers (what tests and operators can check).
        self.polls = 0

    def pollers(self) -> int:
        return sum(1 for w in self._watches.values() if w.task is not None and not w.task.done())

    def subscribe(self, job_id: uuid.UUID) -> _Watch:
        watch = self._watches.get(job_id)
        if watch is None:
            watch = self._watches[job_id] = _Watch()
        watch.subscribers += 1
        if watch.task is None or watch.task.done():
            watch.task = asyncio.create_task(self._poll(job_id, watch))
        return watch

    def unsubscribe(self, job_id: uuid.UUID, watch: _Watch) -> None:
        watch.subscribers -= 1
        if watch.subscribers <= 0:
            if watch.task is not None:
                watch.task.cancel()
            if self._watches.get(job_id) is watch:
                del self._watches[job_id]

    async def wait(self, watch: _Watch, seen_version: int) -> None:
        """Until ``watch`` moves past ``seen_version`` (callers bound it with a timeout)."""
        if watch.version == seen_version:
            await watch.changed.wait()

    async def _poll(self, job_id: uuid.UUID, watch: _Watch) -> None:
        seen: tuple[Any, ...] | None = None
        while watch.subscribers > 0:
            current: tuple[Any, ...] | None
            try:
                async with self.sessionmaker() as session:
                    job = await session.get(Job, job_id)
                    current = ("gone",) if job is None else _fingerprint(job)
                self.polls += 1
            except Exception:
                log.warning("job events: could not read job %s", job_id, exc_info=True)
                current = seen
            if current != seen:
                seen = current
                watch.version += 1
                changed, watch.changed = watch.changed, asyncio.Event()
                changed.set()
            await asyncio.sleep(self.interval)


def _sse(event: str, data: str, seq: int) -> str:
    return f"id: {seq}\nevent: {event}\ndata: {data}\n\n"


async def job_events(
    sessionmaker: async_sessionmaker[AsyncSession],
    settings: Settings,
    job_id: uuid.UUID,
    render: Callable[[Job], str],
    *,
    watch: JobWatch | None = None,
    release: Callable[[], None] | None = None,
) -> AsyncIterator[str]:
    """``event: job`` with the job's JSON on every change; ends after a final status.

    Without Redis, ``watch`` (one shared poller per job) says when to re-read the row; without
    either, the stream polls on its own. ``release`` (its stream slot) is called at the end.
    """
    try:
        async for chunk in _job_events(sessionmaker, settings, job_id, render, watch):
            yield chunk
    finally:
        if release is not None:
            release()


async def _job_events(
    sessionmaker: async_sessionmaker[AsyncSession],
    settings: Settings,
    job_id: uuid.UUID,
    render: Callable[[Job], str],
    job_watch: JobWatch | None,
) -> AsyncIterator[str]:
    redis = pubsub = None
    if settings.broker.redis_url:
        from redis.asyncio import Redis

        redis = Redis.from_url(settings.broker.redis_url)
        pubsub = redis.pubsub()
        try:
            # Subscribe before the first read: no change can fall between the two.
            await pubsub.subscribe(channel(job_id, settings.broker.key_prefix))
        except Exception:
            log.warning("job events: Redis unavailable, falling back to polling")
            await _close(redis, pubsub)
            redis = pubsub = None
    seen: tuple[Any, ...] | None = None
    seq = 0
    last_sent = time.monotonic()
    watch = job_watch.subscribe(job_id) if job_watch is not None and pubsub is None else None
    try:
        while True:
            seen_version = watch.version if watch is not None else 0
            async with sessionmaker() as session:
                job = await session.get(Job, job_id)
                if job is None:
                    seq += 1
                    yield sse.frame("gone", json.dumps({"id": str(job_id)}), seq)
                    return
                current = _fingerprint(job)
                if current != seen:
                    seen = current
                    seq += 1
                    last_sent = time.monotonic()
                    yield sse.frame("job", render(job), seq)
                final = job.status in JobStatus.FINAL
            if final:
                return
            if time.monotonic() - last_sent > KEEPALIVE_SECONDS:
                last_sent = time.monotonic()
                yield sse.KEEPALIVE
            if pubsub is not None:
                try:
                    await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=SCALED_POLL_SECONDS
                    )
                    # Drain the burst: one re-read covers them all.
                    while await pubsub.get_message(ignore_subscribe_messages=True, timeout=0):
                        pass
                except Exception:
                    log.warning("job events: Redis connection lost, falling back to polling")
                    await _close(redis, pubsub)
                    redis = pubsub = None
            elif watch is not None and job_watch is not None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(KEEPALIVE_SECONDS):
                        await job_watch.wait(watch, seen_version)
            else:
                await asyncio.sleep(EMBEDDED_POLL_SECONDS)
    finally:
        if watch is not None and job_watch is not None:
            job_watch.unsubscribe(job_id, watch)
        await _close(redis, pubsub)


async def _close(redis: Any, pubsub: Any) -> None:
    try:
        if pubsub is not None:
            await pubsub.aclose()
        if redis is not None:
            await redis.aclose()
    except Exception:
        log.debug("job events: error closing Redis", exc_info=True)
