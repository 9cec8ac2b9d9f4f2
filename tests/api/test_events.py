"""The events outbox and its stream, in process, on SQLite and PostgreSQL: every change worth
reacting to writes one event in its own transaction (none for a change that rolls back), ids
grow in commit order, and the stream replays from a cursor, filters by the token's namespaces
and follows new events through the process's one reader."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy import event as sqla_event
from sqlalchemy import select

from tensor_registry.formats.variant import Variant
from tensor_registry_server.auth import Principal
from tensor_registry_server.core.db import session_scope
from tensor_registry_server.core.events_outbox import Event, EventRecord, emit, read_after
from tensor_registry_server.events.service import stream
from tensor_registry_server.jobs import lifecycle, problems
from tensor_registry_server.models import service as models_service
from tensor_registry_server.rows.jobs import Job, JobKind, JobStatus
from tensor_registry_server.rows.models import Model
from tensor_registry_server.rows.versions import Version
from tests.factories import auth, create_model, create_token, ready_version


async def _events(app: Any, after: int = 0) -> list[EventRecord]:
    async with app.state.sessionmaker() as session:
        return await read_after(session, after)


def _principal(namespaces: set[str] | None = None, scopes: set[str] | None = None) -> Principal:
    return Principal(
        token_id=uuid.uuid4(),
        name="node",
        scopes=frozenset(scopes or {"resolve"}),
        namespaces=frozenset(namespaces) if namespaces is not None else None,
    )


async def _next_event(frames: AsyncIterator[str], timeout: float = 30) -> dict[str, Any]:
    """The next SSE message that carries an event (keepalives and retry hints skipped)."""
    async with asyncio.timeout(timeout):
        while True:
            frame = await anext(frames)
            fields = dict(
                line.split(": ", 1) for line in frame.strip().splitlines() if ": " in line
            )
            if "data" in fields:
                payload = json.loads(fields["data"])
                assert fields["id"] == payload["id"] and fields["event"] == payload["type"]
                return dict(payload)


async def test_changes_write_events_with_growing_ids(client: httpx.AsyncClient, app: Any) -> None:
    model = await create_model(client, name="acme/events")
    await ready_version(client, model["id"])
    await ready_version(client, model["id"])
    base = f"/api/v1/models/{model['id']}/aliases/prod"
    assert (await client.put(base, json={"version": 1})).status_code == 201
    assert (await client.put(base, json={"version": 2})).status_code == 200
    assert (await client.delete(base)).status_code == 204

    events = await _events(app)
    assert [e.type for e in events] == [
        "version.ready",
        "version.ready",
        "alias.moved",
        "alias.moved",
        "alias.deleted",
    ]
    assert [e.id for e in events] == sorted({e.id for e in events})
    assert {e.namespace for e in events} == {"acme"}
    moved = events[3].data
    assert moved["model"] == "acme/events" and moved["alias"] == "prod"
    assert (moved["from_version"], moved["to_version"]) == (1, 2)
    assert events[0].data == {
        "model": "acme/events",
        "model_id": model["id"],
        "version": 1,
        "source": "finalize",
    }


async def test_a_move_that_fails_leaves_no_event(client: httpx.AsyncClient, app: Any) -> None:
    model = await create_model(client, name="acme/stale")
    await ready_version(client, model["id"])
    await ready_version(client, model["id"])
    base = f"/api/v1/models/{model['id']}/aliases/prod"
    assert (await client.put(base, json={"version": 1})).status_code == 201
    newest = (await _events(app))[-1].id
    stale = await client.put(base, json={"version": 2}, headers={"If-Match": '"999"'})
    assert stale.status_code == 412
    assert await _events(app, newest) == []


async def test_a_transaction_that_rolls_back_leaves_no_event(app: Any) -> None:
    """The event is inserted with the change: when the commit itself fails (here a duplicate
    model name, found at the flush inside the commit), the event goes with it."""
    sessionmaker = app.state.sessionmaker
    async with session_scope(sessionmaker) as session:
        session.add(Model(name="acme/dup", namespace="acme", description=""))
    before = await _events(app)
    with pytest.raises(Exception, match=r"(?i)unique|duplicate"):
        async with session_scope(sessionmaker) as session:
            emit(session, "alias.moved", namespace="acme", data={"model": "acme/dup"})
            session.add(Model(name="acme/dup", namespace="acme", description=""))
    with pytest.raises(RuntimeError):
        async with session_scope(sessionmaker) as session:
            emit(session, "alias.moved", namespace="acme", data={"model": "acme/dup"})
            raise RuntimeError("the change failed")
    assert await _events(app) == before
    # The next committed event is seen, after the failed ones.
    async with session_scope(sessionmaker) as session:
        emit(session, "alias.moved", namespace="acme", data={"model": "acme/ok"})
    [after] = await _events(app, before[-1].id if before else 0)
    assert after.data == {"model": "acme/ok"}


async def test_concurrent_writers_commit_ids_in_order(app: Any) -> None:
    """Ids follow commit order, so a reader past id N has seen every event up to N."""
    sessionmaker = app.state.sessionmaker

    async def write(i: int) -> None:
        async with session_scope(sessionmaker) as session:
            emit(session, "alias.moved", namespace="acme", data={"i": i})

    start = (await _events(app))[-1].id if await _events(app) else 0
    seen: list[int] = []

    async def read_while_writing() -> None:
        cursor = start
        while len(seen) < 20:
            for event in await _events(app, cursor):
                seen.append(event.id)
                cursor = event.id
            await asyncio.sleep(0)

    await asyncio.gather(read_while_writing(), *(write(i) for i in range(20)))
    everything = [e.id for e in await _events(app, start)]
    assert seen == everything and len(everything) == 20


async def test_stream_replays_filters_and_follows(client: httpx.AsyncClient, app: Any) -> None:
    hub = app.state.event_hub
    acme = await create_model(client, name="acme/llama")
    other = await create_model(client, name="other/llama")
    await ready_version(client, acme["id"])
    await ready_version(client, other["id"])
    events = await _events(app)
    assert [e.namespace for e in events] == ["acme", "other"]

    # From the start (Last-Event-ID 0): the acme event only, for a token limited to acme.
    frames = stream(hub, app.state.sessionmaker, _principal({"acme"}), 0, keepalive_seconds=0.2)
    replayed = await _next_event(frames)
    assert replayed["type"] == "version.ready" and replayed["data"]["model"] == "acme/llama"
    assert replayed["id"] == str(events[0].id)

    # Then live: a move in 'other' is skipped, the move in 'acme' arrives.
    r = await client.put(f"/api/v1/models/{other['id']}/aliases/prod", json={"version": 1})
    assert r.status_code == 201
    r = await client.put(f"/api/v1/models/{acme['id']}/aliases/prod", json={"version": 1})
    assert r.status_code == 201
    live = await _next_event(frames)
    assert live["type"] == "alias.moved" and live["data"]["model"] == "acme/llama"
    assert int(live["id"]) > events[-1].id
    await frames.aclose()


async def test_streams_share_one_reader(client: httpx.AsyncClient, app: Any, settings: Any) -> None:
    """Ten streams following the hub cost the database one read per batch of events, not one
    poll per stream."""
    hub = app.state.event_hub
    streams = [
        stream(hub, app.state.sessionmaker, _principal(), hub.newest, keepalive_seconds=30)
        for _ in range(10)
    ]
    for frames in streams:  # the retry hint: each stream is now waiting on the hub
        assert (await anext(frames)).startswith("retry:")
    waiting = [asyncio.create_task(_next_event(frames)) for frames in streams]
    reads = hub.reads
    await create_model(client, name="acme/one")
    model = await create_model(client, name="acme/two")
    await ready_version(client, model["id"])
    got = await asyncio.gather(*waiting)
    assert {g["type"] for g in got} == {"version.ready"}
    # One read per nudge at most (here one commit), plus the slow fallback poll that might fall
    # in this window: never one per stream.
    assert hub.reads - reads <= 3
    for frames in streams:
        await frames.aclose()


async def test_a_draining_hub_ends_the_streams_and_only_them(
    client: httpx.AsyncClient, app: Any
) -> None:
    """Server shutdown drains the hub: a stream waiting for events ends at once (its client
    resumes with Last-Event-ID), while another waiter (the webhook loop's kind) keeps waiting
    and still sees the next event."""
    hub = app.state.event_hub
    frames = stream(hub, app.state.sessionmaker, _principal(), hub.newest, keepalive_seconds=30)
    assert (await anext(frames)).startswith("retry:")
    ended = asyncio.create_task(anext(frames, None))
    other = asyncio.create_task(hub.wait(hub.newest, 30))
    await asyncio.sleep(0.05)  # both are waiting on the hub now
    assert not ended.done() and not other.done()
    hub.drain()
    async with asyncio.timeout(10):
        assert await ended is None  # the stream ended, with no keep-alive frame first
    await asyncio.sleep(0.05)
    assert not other.done()
    model = await create_model(client, name="acme/after-drain")
    await ready_version(client, model["id"])  # an event
    async with asyncio.timeout(10):
        assert await other is True


async def test_events_route_needs_a_reading_scope(client: httpx.AsyncClient, anon: Any) -> None:
    assert (await anon.get("/api/v1/events")).status_code == 401
    keys_only = await create_token(client, scopes=["keys:read"])
    r = await client.get("/api/v1/events", headers=auth(keys_only))
    assert r.status_code == 403 and r.json()["code"] == "insufficient_scope"
    bad = await client.get("/api/v1/events", headers={"Last-Event-ID": "x1"})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_event_id"
    unknown = await client.get("/api/v1/events?types=alias.moved,nope")
    assert unknown.status_code == 422 and unknown.json()["code"] == "unknown_event_type"


async def test_event_rows_are_json(app: Any) -> None:
    async with session_scope(app.state.sessionmaker) as session:
        emit(session, "job.failed", namespace="acme", data={"error": {"code": "x"}})
    async with app.state.sessionmaker() as session:
        row = (await session.execute(select(Event).order_by(Event.id.desc()))).scalars().first()
    assert row is not None and row.data == {"error": {"code": "x"}}


async def _pending_job(
    app: Any, model_id: str, dtype: str, version_number: int = 1
) -> tuple[uuid.UUID, uuid.UUID]:
    """A queued tensorize job and its pending artifact, as the tensorize route writes them."""
    async with session_scope(app.state.sessionmaker) as session:
        model = await session.get(Model, uuid.UUID(model_id))
        assert model is not None
        version = (
            await session.execute(
                select(Version).where(
                    Version.model_id == model.id, Version.number == version_number
                )
            )
        ).scalar_one()
        artifact, job = lifecycle.pending_artifact_and_job(
            _principal(scopes={"admin"}),
            model,
            version,
            kind=JobKind.TENSORIZE,
            origin="tensorize",
            storage="local",
            queue="cpu",
            variant=Variant(dtype, "hf"),
            idempotency_key=None,
            params={},
        )
        session.add(job)
        await session.flush()
        artifact.job_id = job.id
        session.add(artifact)
    return job.id, artifact.id


async def _claim(app: Any, job_id: uuid.UUID) -> Job:
    async def abandoned(_: str | None) -> bool:
        return True

    async with session_scope(app.state.sessionmaker) as session:
        job = await lifecycle.claim_job(
            session, job_id, worker="node/1", abandoned=abandoned, max_attempts=5
        )
        assert job is not None and job.artifact_id is not None
        await lifecycle.mark_running(session, job.artifact_id)
        return job


async def test_job_and_artifact_transitions_write_their_events(
    client: httpx.AsyncClient, app: Any
) -> None:
    """artifact.ready with the publish, artifact.deleted with the delete, job.failed with the
    failure: each in the transaction of its lifecycle transition."""
    model = await create_model(client, name="acme/jobs")
    await ready_version(client, model["id"])
    start = (await _events(app))[-1].id

    job_id, artifact_id = await _pending_job(app, model["id"], "float16")
    job = await _claim(app, job_id)
    async with session_scope(app.state.sessionmaker) as session:
        published = await lifecycle.publish(
            session,
            job,
            worker="node/1",
            files=[lifecycle.PublishedFile("model.tensors", 3, "ab" * 32, "k/model.tensors")],
            fields={},
            result={},
        )
        assert published
    [ready] = await _events(app, start)
    assert ready.type == "artifact.ready" and ready.namespace == "acme"
    assert ready.data == {
        "model": "acme/jobs",
        "model_id": model["id"],
        "version": 1,
        "artifact_id": str(artifact_id),
        "dtype": "float16",
        "format": "hf",
        "tensor_parallel_size": 1,
        "encrypted": False,
    }
    assert (await client.delete(f"/api/v1/artifacts/{artifact_id}")).status_code == 204
    [deleted] = await _events(app, ready.id)
    assert deleted.type == "artifact.deleted" and deleted.data == ready.data

    job_id, _ = await _pending_job(app, model["id"], "bfloat16")
    job = await _claim(app, job_id)
    async with session_scope(app.state.sessionmaker) as session:
        assert await lifecycle.finish_job(
            session,
            job,
            worker="node/1",
            status=JobStatus.FAILED,
            error=problems.problem("internal_error", "out of memory", status=500),
        )
    [failed] = await _events(app, deleted.id)
    assert failed.type == "job.failed"
    assert failed.data["job_id"] == str(job_id) and failed.data["kind"] == "tensorize"
    assert failed.data["error"] == {"code": "internal_error", "detail": "out of memory"}


async def _ready_artifact(app: Any, model_id: str, version_number: int, dtype: str) -> str:
    """An artifact published by a (claimed) tensorize job, as a worker ends one."""
    job_id, artifact_id = await _pending_job(app, model_id, dtype, version_number)
    job = await _claim(app, job_id)
    async with session_scope(app.state.sessionmaker) as session:
        assert await lifecycle.publish(
            session,
            job,
            worker="node/1",
            files=[lifecycle.PublishedFile("model.tensors", 3, "ab" * 32, f"{job_id}/m.tensors")],
            fields={},
            result={},
        )
    return str(artifact_id)


async def _model_with_artifacts(
    client: httpx.AsyncClient, app: Any, name: str
) -> tuple[str, dict[int, list[str]]]:
    """A model with two ready versions of two ready artifacts each (float16, bfloat16)."""
    model = await create_model(client, name=name)
    artifacts: dict[int, list[str]] = {}
    for number in (1, 2):
        await ready_version(client, model["id"])
        artifacts[number] = [
            await _ready_artifact(app, model["id"], number, dtype)
            for dtype in ("float16", "bfloat16")
        ]
    return model["id"], artifacts


async def test_deleting_a_model_announces_each_of_its_artifacts(
    client: httpx.AsyncClient, app: Any
) -> None:
    """A listener that tracks artifacts sees every artifact of a deleted model go: one
    artifact.deleted per artifact, with artifact.ready's payload, in the outbox and on the
    stream. Another model's artifact is not announced."""
    model_id, artifacts = await _model_with_artifacts(client, app, "acme/gone")
    _, kept = await _model_with_artifacts(client, app, "acme/kept")
    ready = {
        e.data["artifact_id"]: e.data for e in await _events(app) if e.type == "artifact.ready"
    }
    start = (await _events(app))[-1].id
    hub, sessionmaker = app.state.event_hub, app.state.sessionmaker
    frames = stream(hub, sessionmaker, _principal({"acme"}), start, keepalive_seconds=0.2)

    assert (await client.delete(f"/api/v1/models/{model_id}")).status_code == 204

    deleted = [e for e in await _events(app, start) if e.type == "artifact.deleted"]
    expected = [*artifacts[1], *artifacts[2]]
    assert sorted(e.data["artifact_id"] for e in deleted) == sorted(expected)
    assert all(e.data == ready[e.data["artifact_id"]] for e in deleted)
    assert {e.namespace for e in deleted} == {"acme"}
    assert not {*kept[1], *kept[2]} & {e.data["artifact_id"] for e in deleted}
    on_stream = [await _next_event(frames) for _ in expected]
    await frames.aclose()
    assert [(m["type"], m["data"]["artifact_id"]) for m in on_stream] == [
        ("artifact.deleted", e.data["artifact_id"]) for e in deleted
    ]
    assert (await client.get(f"/api/v1/artifacts/{expected[0]}")).status_code == 404


async def test_deleting_a_version_announces_its_artifacts_only(
    client: httpx.AsyncClient, app: Any
) -> None:
    model_id, artifacts = await _model_with_artifacts(client, app, "acme/versioned")
    start = (await _events(app))[-1].id
    assert (await client.delete(f"/api/v1/models/{model_id}/versions/1")).status_code == 204
    deleted = await _events(app, start)
    assert {e.type for e in deleted} == {"artifact.deleted"}
    assert sorted(e.data["artifact_id"] for e in deleted) == sorted(artifacts[1])
    assert {e.data["version"] for e in deleted} == {1}
    for artifact_id in artifacts[2]:
        assert (await client.get(f"/api/v1/artifacts/{artifact_id}")).status_code == 200


async def test_a_model_delete_that_rolls_back_announces_nothing(
    client: httpx.AsyncClient, app: Any
) -> None:
    """The events are inserted in the delete's transaction: a failure after the outbox insert
    (a before_commit hook that runs after it and raises) rolls the events back with the rows."""
    model_id, artifacts = await _model_with_artifacts(client, app, "acme/stays")
    before = await _events(app)
    inserted_before_failure: list[int] = []

    def fail_after_the_outbox(session: Any) -> None:
        rows = session.execute(
            select(Event.id).where(Event.id > before[-1].id, Event.type == "artifact.deleted")
        )
        inserted_before_failure.extend(rows.scalars())
        raise RuntimeError("the commit failed after the outbox insert")

    with pytest.raises(RuntimeError, match="after the outbox insert"):
        async with session_scope(app.state.sessionmaker) as session:
            sqla_event.listen(session.sync_session, "before_commit", fail_after_the_outbox)
            model = await session.get(Model, uuid.UUID(model_id))
            assert model is not None
            await models_service.delete_model(
                session, _principal(scopes={"admin"}), model, storages=app.state.storages
            )

    assert len(inserted_before_failure) == 4  # the outbox did write them, then rolled back
    assert await _events(app) == before
    r = await client.get(f"/api/v1/artifacts/{artifacts[1][0]}")
    assert r.status_code == 200 and r.json()["status"] == "ready"


async def test_cancelling_a_queued_job_announces_its_removed_artifact(
    client: httpx.AsyncClient, app: Any
) -> None:
    """A cancelled job's pending artifact row is removed, so it is announced like any other."""
    model = await create_model(client, name="acme/cancelled")
    await ready_version(client, model["id"])
    job_id, artifact_id = await _pending_job(app, model["id"], "float16")
    start = (await _events(app))[-1].id
    assert (await client.post(f"/api/v1/jobs/{job_id}/cancel")).status_code == 200
    [deleted] = await _events(app, start)
    assert deleted.type == "artifact.deleted"
    assert deleted.data["artifact_id"] == str(artifact_id) and deleted.data["dtype"] == "float16"
    assert (await client.get(f"/api/v1/artifacts/{artifact_id}")).status_code == 404
