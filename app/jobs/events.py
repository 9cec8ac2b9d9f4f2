"""Live job progress for ``GET /api/v1/jobs/{id}/events`` (server-sent events).

The job row is the source of truth in both modes. Embedded (no Redis) the stream re-reads the
row at a short interval. Scaled, workers publish a nudge on a Redis channel after every
progress commit, and the stream re-reads the row when nudged (and at a slow interval anyway, so
a lost message costs latency, never correctness). The stream ends after a final status.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.core import sse
from app.jobs.tables import Job, JobStatus
from app.settings import Settings

log = logging.getLogger("tensor_registry.jobs")

CHANNEL_PREFIX = "tensor-registry:job:"
EMBEDDED_POLL_SECONDS = 0.25
SCALED_POLL_SECONDS = 5.0
KEEPALIVE_SECONDS = 15.0


def channel(job_id: uuid.UUID | str) -> str:
    return f"{CHANNEL_PREFIX}{job_id}"


async def publish(redis: Any, job_id: uuid.UUID | str, state: dict[str, Any]) -> None:
    """Nudge listeners of ``job_id`` (the payload is informative; they re-read the row)."""
    await redis.publish(channel(job_id), json.dumps(state, default=str))


def _fingerprint(job: Job) -> tuple[Any, ...]:
    return (
        job.status,
        job.stage,
        job.bytes_done,
        job.bytes_total,
        job.attempts,
        job.cancel_requested,
    )


async def job_events(
    sessionmaker: async_sessionmaker[AsyncSession],
    settings: Settings,
    job_id: uuid.UUID,
    render: Callable[[Job], str],
) -> AsyncIterator[str]:
    """``event: job`` with the job's JSON on every change; ends after a final status."""
    redis = pubsub = None
    if settings.broker.redis_url:
        from redis.asyncio import Redis

        redis = Redis.from_url(settings.broker.redis_url)
        pubsub = redis.pubsub()
        try:
            # Subscribe before the first read: no change can fall between the two.
            await pubsub.subscribe(channel(job_id))
        except Exception:
            log.warning("job events: Redis unavailable, falling back to polling")
            await _close(redis, pubsub)
            redis = pubsub = None
    seen: tuple[Any, ...] | None = None
    seq = 0
    last_sent = time.monotonic()
    try:
        while True:
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
            else:
                await asyncio.sleep(EMBEDDED_POLL_SECONDS)
    finally:
        await _close(redis, pubsub)


async def _close(redis: Any, pubsub: Any) -> None:
    try:
        if pubsub is not None:
            await pubsub.aclose()
        if redis is not None:
            await redis.aclose()
    except Exception:
        log.debug("job events: error closing Redis", exc_info=True)
