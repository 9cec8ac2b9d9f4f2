"""broker.key_prefix covers every key the registry writes in Redis, not only Celery's (issue 29
§5): the resolve cache (``trg:resolve:v1:…``) and the job event channels, so two registries
sharing one Redis database never read, drop or hear each other's entries."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from redis.asyncio import Redis

from harness.artifacts import make_artifact
from tensor_registry_server.core.choice_cache import DEFAULT_PREFIX, ResolveCache
from tensor_registry_server.jobs import events
from tensor_registry_server.jobs.router import to_out
from tensor_registry_server.settings import Settings
from tests.api.test_job_event_streams import _first_event, _queued_import
from tests.factories import create_model, ready_version
from tests.resolve.test_cache import REDIS_URL


@pytest.fixture
def prefix() -> str:
    return f"reg-{uuid.uuid4().hex[:8]}:"


@pytest.fixture
def settings(settings: Settings, prefix: str) -> Settings:
    return settings.model_copy(
        update={
            "broker": settings.broker.model_copy(
                update={"redis_url": REDIS_URL, "key_prefix": prefix}
            )
        }
    )


async def test_resolve_cache_keys_carry_the_prefix(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings, prefix: str
) -> None:
    cache: ResolveCache = app.state.resolve_cache
    assert cache.prefix == f"{prefix}{DEFAULT_PREFIX}"
    model = await create_model(client, name="acme/prefixed")
    await ready_version(client, model["id"])
    await make_artifact(settings, model="acme/prefixed", version=1)
    for _ in range(3):
        r = await client.get("/api/v1/resolve", params={"model": "acme/prefixed"})
        assert r.status_code == 200
    assert r.headers["x-resolve-cache"] == "hit"
    ours = [k async for k in cache.redis.scan_iter(f"{prefix}*")]
    assert ours and all(k.decode().startswith(f"{prefix}{DEFAULT_PREFIX}") for k in ours)
    # Nothing of this model's was written outside the prefix.
    unprefixed = [k async for k in cache.redis.scan_iter(f"{DEFAULT_PREFIX}*{model['id']}*")]
    assert unprefixed == []


async def test_job_event_channels_carry_the_prefix(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings, prefix: str
) -> None:
    job_id = uuid.uuid4()
    assert events.channel(job_id, prefix) == f"{prefix}{events.CHANNEL_PREFIX}{job_id}"
    redis = Redis.from_url(REDIS_URL)
    try:
        listener = redis.pubsub()
        await listener.subscribe(events.channel(job_id, prefix))
        bare = redis.pubsub()
        await bare.subscribe(events.channel(job_id))
        await events.publish(redis, job_id, {"stage": "x"}, key_prefix=prefix)

        async def next_message(pubsub: Any) -> Any:
            return await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)

        got = None
        for _ in range(5):
            got = got or await next_message(listener)
        assert got is not None and json.loads(got["data"]) == {"stage": "x"}
        assert await next_message(bare) is None
        await listener.aclose()
        await bare.aclose()
    finally:
        await redis.aclose()


async def test_a_stream_hears_its_registrys_nudges(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings, prefix: str
) -> None:
    """The API's stream subscribes under the prefix: a nudge published there wakes it."""
    job = await _queued_import(client, settings.data_dir.parent / "imports", "acme/nudged")
    stream = events.job_events(
        app.state.sessionmaker,
        settings,
        uuid.UUID(job),
        lambda row: to_out(row, None).model_dump_json(),
    )
    first = await _first_event(stream)
    assert first["status"] == "queued"
    redis = Redis.from_url(REDIS_URL)
    try:
        waiting = asyncio.create_task(_first_event(stream))
        numsub = 0
        deadline = time.monotonic() + 15  # the stream subscribes; a loaded machine is slow
        while time.monotonic() < deadline:
            [(_, numsub)] = await redis.pubsub_numsub(events.channel(job, prefix))
            if numsub:
                break
            await asyncio.sleep(0.02)
        assert numsub == 1
        assert (await client.post(f"/api/v1/jobs/{job}/cancel")).status_code == 200
        await events.publish(redis, job, {"status": "cancelled"}, key_prefix=prefix)
        changed = await asyncio.wait_for(waiting, timeout=4)  # long before the 5 s poll
        assert changed["status"] == "cancelled"
    finally:
        await stream.aclose()
        await redis.aclose()
