"""The resolve cache (Redis, scaled mode): hits, invalidation on every change, races, outages."""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import delete

from harness.artifacts import make_artifact
from tensor_registry_server.core.choice_cache import (
    ResolveCache,
    Selection,
    invalidate_model,
    query_key,
)
from tensor_registry_server.core.db import create_engine, make_sessionmaker, session_scope
from tensor_registry_server.rows.artifacts import Artifact
from tensor_registry_server.settings import Settings
from tests.factories import create_model, ready_version

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _redis_available() -> bool:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping()
        return True
    except Exception:
        return False


pytestmark = pytest.mark.skipif(
    not _redis_available() and os.environ.get("CI", "").lower() != "true",
    reason="Redis not reachable",
)


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={"broker": settings.broker.model_copy(update={"redis_url": REDIS_URL})}
    )


async def _resolve(client: httpx.AsyncClient, **params: Any) -> httpx.Response:
    return await client.get("/api/v1/resolve", params={"model": "acme/llama", **params})


async def _warm(client: httpx.AsyncClient, **params: Any) -> dict[str, Any]:
    """Resolve until the answer comes from the cache (the first sight of a name never fills)."""
    seen = []
    for _ in range(3):
        r = await _resolve(client, **params)
        assert r.status_code == 200, r.text
        seen.append(r.headers["x-resolve-cache"])
        if seen[-1] == "hit":
            return dict(r.json())
    raise AssertionError(f"never a cache hit: {seen}")


async def test_alias_moves_and_deletes_are_seen_at_once(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings
) -> None:
    model = await create_model(client, name="acme/llama")
    for _ in range(2):
        await ready_version(client, model["id"])
    one = await make_artifact(settings, model="acme/llama", version=1)
    two = await make_artifact(settings, model="acme/llama", version=2)
    alias = f"/api/v1/models/{model['id']}/aliases/prod"
    await client.put(alias, json={"version": 1})
    assert (await _warm(client, ref="prod"))["artifact"]["id"] == str(one.id)

    await client.put(alias, json={"version": 2})
    moved = await _resolve(client, ref="prod")
    assert moved.headers["x-resolve-cache"] == "miss"
    assert moved.json()["version"] == 2 and moved.json()["artifact"]["id"] == str(two.id)
    assert (await _warm(client, ref="prod"))["version"] == 2

    assert (await client.delete(alias)).status_code == 204
    gone = await _resolve(client, ref="prod")
    assert (gone.status_code, gone.json()["code"]) == (404, "alias_not_found")

    # What Redis holds is the choice, never a signature or a key.
    cache: ResolveCache = app.state.resolve_cache
    stored = [
        await cache.redis.get(k)
        async for k in cache.redis.scan_iter(f"{cache.prefix}e:{model['id']}:*")
    ]
    assert stored and all(b"sig=" not in v and b"/keys/" not in v for v in stored)


async def test_new_versions_artifact_and_model_deletes_invalidate(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings
) -> None:
    model = await create_model(client, name="acme/llama")
    await ready_version(client, model["id"])
    first = await make_artifact(settings, model="acme/llama", version=1)
    assert (await _warm(client))["version"] == 1

    # Finalizing version 2 moves `latest` (which has no artifact yet): no stale version 1.
    await ready_version(client, model["id"])
    r = await _resolve(client)
    assert (r.status_code, r.json()["code"], r.json()["version"]) == (
        404,
        "no_matching_artifact",
        2,
    )
    second = await make_artifact(settings, model="acme/llama", version=2)
    assert (await _warm(client))["artifact"]["id"] == str(second.id)

    # An artifact removed behind the API's back: whoever removes it calls invalidate_model.
    engine = create_engine(settings.database_url)
    async with session_scope(make_sessionmaker(engine)) as session:
        await session.execute(delete(Artifact).where(Artifact.id == second.id))
    await engine.dispose()
    assert (await _resolve(client)).headers["x-resolve-cache"] == "hit"  # stale until told
    await invalidate_model(app.state, model["id"])
    r = await _resolve(client)
    assert (r.status_code, r.json()["code"]) == (404, "no_matching_artifact")
    assert r.json()["versions_with_match"] == [1]
    assert (await _warm(client, ref="1"))["artifact"]["id"] == str(first.id)

    # Deleting version 2 and then the model drops what was cached at once.
    assert (await client.delete(f"/api/v1/models/{model['id']}/versions/2")).status_code == 204
    assert (await _resolve(client)).json()["version"] == 1
    assert (await client.delete(f"/api/v1/models/{model['id']}")).status_code == 204
    r = await _resolve(client, ref="1")
    assert (r.status_code, r.json()["code"]) == (404, "model_not_found")


async def test_a_writer_that_calls_nothing_still_invalidates(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings
) -> None:
    # Invalidation follows the session's flushes: an ORM change to an artifact row through any
    # sessionmaker bound to the cache drops the cached choice once it commits, and not before.
    model = await create_model(client, name="acme/llama")
    await ready_version(client, model["id"])
    made = await make_artifact(settings, model="acme/llama", version=1)
    assert (await _warm(client))["artifact"]["id"] == str(made.id)

    async with session_scope(app.state.sessionmaker) as session:
        artifact = await session.get(Artifact, made.id)
        assert artifact is not None
        await session.delete(artifact)
        await session.flush()
        assert (await _resolve(client)).headers["x-resolve-cache"] == "hit"  # not committed
    r = await _resolve(client)
    assert (r.status_code, r.json()["code"]) == (404, "no_matching_artifact")

    # A rolled-back change invalidates nothing.
    second = await make_artifact(settings, model="acme/llama", version=1)
    assert (await _warm(client))["artifact"]["id"] == str(second.id)
    with pytest.raises(RuntimeError):
        async with session_scope(app.state.sessionmaker) as session:
            artifact = await session.get(Artifact, second.id)
            assert artifact is not None
            await session.delete(artifact)
            await session.flush()
            raise RuntimeError("abandon")
    assert (await _resolve(client)).headers["x-resolve-cache"] == "hit"


def _selection(model_id: str, version: int) -> Selection:
    return Selection(
        model_id=model_id,
        model="acme/race",
        namespace="acme",
        version=version,
        artifact_id=str(uuid.uuid4()),
        dtype="float16",
        format="hf",
        tensor_parallel_size=1,
        encrypted=False,
        key_id=None,
        encryption_algorithm=None,
        storage="local",
        storage_prefix="artifacts/x/",
        tensorizer_version=None,
        files=(),
    )


async def test_a_fill_racing_an_invalidation_is_never_served() -> None:
    cache = ResolveCache.from_url(REDIS_URL, ttl_seconds=60, prefix=f"trg:test:{uuid.uuid4().hex}:")
    model_id = str(uuid.uuid4())
    qkey = query_key("acme/race", "prod", {})
    try:
        # First sight of the name: nothing read beforehand, so nothing is stored.
        first = await cache.lookup("acme/race", qkey)
        await cache.store(first, qkey, _selection(model_id, 1))
        assert (await cache.lookup("acme/race", qkey)).selection is None

        # A miss reads the generation, then the database answers with the old state while an
        # alias move commits and bumps the generation: the late fill must not be served.
        before = await cache.lookup("acme/race", qkey)
        await cache.invalidate(model_id)
        await cache.store(before, qkey, _selection(model_id, 1))
        assert (await cache.lookup("acme/race", qkey)).selection is None

        after = await cache.lookup("acme/race", qkey)
        await cache.store(after, qkey, _selection(model_id, 2))
        hit = await cache.lookup("acme/race", qkey)
        assert hit.selection is not None and hit.selection.version == 2

        # A re-created model (same name, new id) is never answered from the old id's entries.
        recreated = await cache.lookup("acme/race", qkey)
        await cache.store(recreated, qkey, _selection(str(uuid.uuid4()), 7))
        assert (await cache.lookup("acme/race", qkey)).selection is None
    finally:
        await cache.redis.delete(*[k async for k in cache.redis.scan_iter(f"{cache.prefix}*")])
        await cache.close()


class CountingRedis:
    """The real Redis client, counting the round trips that read entries."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self.reads = 0

    async def mget(self, keys: list[str]) -> Any:
        self.reads += 1
        return await self.redis.mget(keys)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.redis, name)


async def test_concurrent_lookups_share_a_read_but_never_across_an_invalidation() -> None:
    real = ResolveCache.from_url(REDIS_URL, ttl_seconds=60, prefix=f"trg:test:{uuid.uuid4().hex}:")
    counting = CountingRedis(real.redis)
    cache = ResolveCache(counting, ttl_seconds=60, prefix=real.prefix)
    model_id = str(uuid.uuid4())
    qkey = query_key("acme/race", "prod", {})
    try:
        await cache.store(await cache.lookup("acme/race", qkey), qkey, _selection(model_id, 1))
        await cache.store(await cache.lookup("acme/race", qkey), qkey, _selection(model_id, 1))
        counting.reads = 0
        answers = await asyncio.gather(*[cache.lookup("acme/race", qkey) for _ in range(20)])
        assert counting.reads == 1
        assert all(a.selection is not None and a.selection.version == 1 for a in answers)

        # A lookup in flight when this process invalidates is not joined by later ones.
        early = asyncio.ensure_future(cache.lookup("acme/race", qkey))
        await asyncio.sleep(0)
        await cache.invalidate(model_id)
        late = await cache.lookup("acme/race", qkey)
        await early
        assert counting.reads == 3 and late.selection is None
    finally:
        await real.redis.delete(*[k async for k in real.redis.scan_iter(f"{real.prefix}*")])
        await real.close()


async def test_redis_down_means_slower_not_broken(settings: Settings) -> None:
    from tensor_registry_server.main import create_app
    from tests.conftest import ADMIN_TOKEN, _reset

    await _reset(settings.database_url)
    dead = settings.model_copy(
        update={"broker": settings.broker.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})}
    )
    application = create_app(dead)
    from tensor_registry_server.tokens.service import ensure_bootstrap_admin

    engine = create_engine(settings.database_url)
    async with session_scope(make_sessionmaker(engine)) as session:
        await ensure_bootstrap_admin(session, ADMIN_TOKEN)
    await engine.dispose()
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://testserver",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        ) as client:
            model = await create_model(client, name="acme/llama")
            await ready_version(client, model["id"])
            await make_artifact(settings, model="acme/llama", version=1)
            for _ in range(3):
                r = await _resolve(client)
                assert r.status_code == 200 and r.headers["x-resolve-cache"] == "miss"
            await client.put(f"/api/v1/models/{model['id']}/aliases/prod", json={"version": 1})
            assert (await _resolve(client, ref="prod")).status_code == 200


async def test_deleting_an_artifact_through_the_api_is_seen_at_once(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    model = await create_model(client, name="acme/llama")
    await ready_version(client, model["id"])
    artifact = await make_artifact(settings, model="acme/llama", version=1)
    assert (await _warm(client))["artifact"]["id"] == str(artifact.id)
    assert (await client.delete(f"/api/v1/artifacts/{artifact.id}")).status_code == 204
    r = await _resolve(client)
    assert (r.status_code, r.json()["code"]) == (404, "no_matching_artifact")
