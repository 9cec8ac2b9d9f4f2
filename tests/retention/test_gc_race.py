"""GC never removes what an alias points at, also when the alias moves while GC runs.

GC plans without locks, then removes each version in its own transaction after deciding again
under the version's row lock. The races, with two connections:
- a move committed between the plan and the delete: the re-check sees it (both databases);
- a move in flight (uncommitted) when GC takes the lock: GC waits for it, then sees it;
- a move that starts after GC took the lock: the alias's foreign key waits on GC's lock and then
  fails; the alias keeps its old target (PostgreSQL: real row locks).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from tensor_registry_server.core.db import create_engine, make_sessionmaker
from tensor_registry_server.retention import gc as gc_module
from tensor_registry_server.retention.gc import plan, remove
from tensor_registry_server.settings import Settings
from tensor_registry_server.storage.registry import StorageRegistry
from tests.factories import create_model, ready_version

MOVE_PROD = (
    "UPDATE aliases SET version_id = :version_id, version_number = :number, "
    "revision = revision + 1 WHERE model_id = :model_id AND name = 'prod'"
)


@pytest.fixture
async def engine(settings: Settings) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(settings.database_url)
    yield engine
    await engine.dispose()


async def _two_versions_prod_on_2(client: httpx.AsyncClient) -> tuple[dict[str, Any], list[Any]]:
    """v1 may go (keep_last 1, no alias), v2 is prod's."""
    model = await create_model(client, name="acme/race")
    versions = [await ready_version(client, model["id"]) for _ in range(2)]
    r = await client.put(f"/api/v1/models/{model['id']}/aliases/prod", json={"version": 2})
    assert r.status_code == 201
    r = await client.put(f"/api/v1/models/{model['id']}/retention", json={"keep_last": 1})
    assert r.status_code == 200
    return model, versions


async def _candidate(engine: AsyncEngine, settings: Settings) -> gc_module.Decision:
    async with make_sessionmaker(engine)() as session:
        decisions = await plan(session, settings.retention)
    (candidate,) = [d for d in decisions if d.remove]
    assert candidate.version == 1
    return candidate


async def _wait_for_a_lock_wait(engine: AsyncEngine, deadline_s: float = 30.0) -> None:
    """Until some PostgreSQL backend waits on a lock (the racing statement is blocked)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        async with engine.connect() as conn:
            waiting = (
                await conn.execute(text("SELECT count(*) FROM pg_locks WHERE NOT granted"))
            ).scalar_one()
        if waiting:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("nothing waited on a lock")


async def _version_exists(client: httpx.AsyncClient, model: dict[str, Any], n: int) -> bool:
    r = await client.get(f"/api/v1/models/{model['id']}/versions/{n}")
    return r.status_code == 200


async def test_an_alias_moved_between_plan_and_delete_saves_the_version(
    client: httpx.AsyncClient, engine: AsyncEngine, settings: Settings
) -> None:
    model, _ = await _two_versions_prod_on_2(client)
    candidate = await _candidate(engine, settings)
    r = await client.put(f"/api/v1/models/{model['id']}/aliases/prod", json={"version": 1})
    assert r.status_code == 200
    storages = StorageRegistry(settings)
    try:
        after = await remove(make_sessionmaker(engine), storages, settings.retention, candidate)
    finally:
        await storages.close()
    assert after.remove is False
    assert "alias 'prod' points at it" in after.reasons
    assert await _version_exists(client, model, 1)
    assert (await client.get(f"/api/v1/models/{model['id']}/aliases/prod")).json()["version"] == 1


async def test_an_alias_move_in_flight_when_gc_locks_saves_the_version(
    client: httpx.AsyncClient, engine: AsyncEngine, settings: Settings, postgresql_only: None
) -> None:
    model, versions = await _two_versions_prod_on_2(client)
    candidate = await _candidate(engine, settings)
    storages = StorageRegistry(settings)
    mover = await engine.connect()
    try:
        tx = await mover.begin()
        await mover.execute(
            text(MOVE_PROD),
            {
                "version_id": uuid.UUID(versions[0]["id"]),
                "number": 1,
                "model_id": uuid.UUID(model["id"]),
            },
        )
        # GC now waits on the version's row (the move's foreign key holds a share lock on it).
        gc_task = asyncio.create_task(
            remove(make_sessionmaker(engine), storages, settings.retention, candidate)
        )
        await _wait_for_a_lock_wait(engine)
        assert not gc_task.done()
        await tx.commit()
        after = await asyncio.wait_for(gc_task, 60)
    finally:
        await mover.close()
        await storages.close()
    assert after.remove is False and "alias 'prod' points at it" in after.reasons
    assert await _version_exists(client, model, 1)


async def test_an_alias_move_after_gc_locked_fails_and_keeps_its_old_target(
    client: httpx.AsyncClient,
    engine: AsyncEngine,
    settings: Settings,
    postgresql_only: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, versions = await _two_versions_prod_on_2(client)
    candidate = await _candidate(engine, settings)
    locked, release = asyncio.Event(), asyncio.Event()
    real_delete = gc_module._delete

    async def held_delete(*args: Any, **kwargs: Any) -> None:
        # GC has decided under the lock: hold it here while the alias move is tried.
        locked.set()
        await release.wait()
        await real_delete(*args, **kwargs)

    monkeypatch.setattr(gc_module, "_delete", held_delete)
    storages = StorageRegistry(settings)
    mover = await engine.connect()
    try:
        gc_task = asyncio.create_task(
            remove(make_sessionmaker(engine), storages, settings.retention, candidate)
        )
        await asyncio.wait_for(locked.wait(), 30)

        async def move() -> None:
            async with mover.begin():
                await mover.execute(
                    text(MOVE_PROD),
                    {"version_id": uuid.UUID(versions[0]["id"]), "number": 1,
                     "model_id": uuid.UUID(model["id"])},
                )  # fmt: skip

        move_task = asyncio.create_task(move())
        await _wait_for_a_lock_wait(engine)
        assert not move_task.done()
        release.set()
        after = await asyncio.wait_for(gc_task, 60)
        with pytest.raises(IntegrityError):
            await asyncio.wait_for(move_task, 60)
    finally:
        await mover.close()
        await storages.close()
    assert after.remove is True
    assert not await _version_exists(client, model, 1)
    assert (await client.get(f"/api/v1/models/{model['id']}/aliases/prod")).json()["version"] == 2
