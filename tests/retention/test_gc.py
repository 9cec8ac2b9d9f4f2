"""Garbage collection by retention policy (retention/gc.py), on SQLite and PostgreSQL: what a
policy keeps (newest N, aliased now or within D days, reported by a node within D days), that
nothing goes without a policy, and that a removal takes the rows, the bytes, and leaves one
event and one audit row per thing removed."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from tensor_registry_server.core.db import create_engine, make_sessionmaker, session_scope, utcnow
from tensor_registry_server.core.events_outbox import Event
from tensor_registry_server.retention.gc import Report, collect
from tensor_registry_server.rows.artifacts import Artifact, ArtifactFile
from tensor_registry_server.rows.audit import AuditEvent
from tensor_registry_server.settings import Settings
from tensor_registry_server.storage.registry import StorageRegistry
from tests.factories import create_model, ready_version
from tests.storage.test_sweep import plant, stored_files


@pytest.fixture
async def gc(settings: Settings) -> AsyncIterator[Any]:
    """``await gc(dry_run=…, now=…)``: one collection over the test's database and storage."""
    engine = create_engine(settings.database_url)
    storages = StorageRegistry(settings)

    async def run(*, dry_run: bool, now: Any = None, **kw: Any) -> Report:
        return await collect(
            make_sessionmaker(engine),
            storages,
            settings.retention,
            dry_run=dry_run,
            orphan_grace=timedelta(hours=1),
            now=now,
            **kw,
        )

    run.sessionmaker = make_sessionmaker(engine)  # type: ignore[attr-defined]
    yield run
    await storages.close()
    await engine.dispose()


async def _artifact(gc: Any, settings: Settings, version: dict[str, Any]) -> str:
    """A ready artifact of ``version`` with one stored file."""
    artifact_id = uuid.uuid4()
    key = f"artifacts/{artifact_id}/model.tensors"
    plant(settings, key, age_hours=0)
    async with session_scope(gc.sessionmaker) as session:
        session.add(
            Artifact(id=artifact_id, model_id=uuid.UUID(version["model_id"]),
                     version_id=uuid.UUID(version["id"]), version_number=version["version"],
                     dtype="float16", format="hf", storage="local",
                     storage_prefix=f"artifacts/{artifact_id}/", status="ready")
        )  # fmt: skip
        await session.flush()
        session.add(
            ArtifactFile(artifact_id=artifact_id, path="model.tensors", size=100,
                         sha256="0" * 64, storage_key=key)
        )  # fmt: skip
    return str(artifact_id)


async def _fleet(client: httpx.AsyncClient, model: dict[str, Any], gc: Any, settings: Settings):  # type: ignore[no-untyped-def]
    """v1 nothing keeps; v2 `prod` names now; v3 `staging` named and left; v4 a node caches an
    artifact of; v5 the newest."""
    versions = [await ready_version(client, model["id"]) for _ in range(5)]
    base = f"/api/v1/models/{model['id']}/aliases"
    assert (await client.put(f"{base}/prod", json={"version": 2})).status_code == 201
    assert (await client.put(f"{base}/staging", json={"version": 3})).status_code == 201
    assert (await client.put(f"{base}/staging", json={"version": 5})).status_code == 200
    doomed_artifact = await _artifact(gc, settings, versions[0])
    cached = await _artifact(gc, settings, versions[3])
    r = await client.post(
        "/api/v1/nodes/checkin", json={"node_id": "n1", "hostname": "gpu1", "cached": [cached]}
    )
    assert r.status_code == 200, r.text
    return versions, doomed_artifact, cached


async def test_without_a_policy_nothing_is_planned_or_removed(
    client: httpx.AsyncClient, gc: Any, settings: Settings
) -> None:
    model = await create_model(client, name="acme/nopolicy")
    for _ in range(3):
        await ready_version(client, model["id"])
    before = stored_files(settings)
    report = await gc(dry_run=False, now=utcnow() + timedelta(days=400))
    assert report.decisions == [] and report.removed == []
    assert stored_files(settings) == before
    listed = (await client.get(f"/api/v1/models/{model['id']}/versions")).json()["items"]
    assert [v["version"] for v in listed] == [1, 2, 3]


async def test_dry_run_says_what_would_go_and_what_keeps_the_rest(
    client: httpx.AsyncClient, gc: Any, settings: Settings
) -> None:
    model = await create_model(client, name="acme/dry")
    await _fleet(client, model, gc, settings)
    r = await client.put(
        f"/api/v1/models/{model['id']}/retention", json={"keep_last": 1, "keep_days": 7}
    )
    assert r.status_code == 200, r.text
    before = stored_files(settings)
    report = await gc(dry_run=True)
    why = {d.version: (d.remove, " | ".join(d.reasons)) for d in report.decisions}
    assert why[1][0] is True and "not among the newest 1" in why[1][1]
    assert why[2][0] is False and why[2][1].startswith("alias 'prod' points at it")
    assert why[3][0] is False and "alias 'staging' named it" in why[3][1]
    assert why[4][0] is False and "a node reported artifact" in why[4][1]
    assert why[5][0] is False and "among the newest 1" in why[5][1]
    # A dry run removes nothing.
    assert stored_files(settings) == before
    assert report.as_json()["would_remove"][0]["version"] == 1

    # Ten days on, the alias history and the node's report are older than keep_days: only
    # what an alias names now and the newest stay.
    later = await gc(dry_run=True, now=utcnow() + timedelta(days=10))
    assert sorted(d.version for d in later.removed) == [1, 3, 4]


async def test_gc_removes_rows_and_bytes_with_an_event_and_an_audit_row_each(
    client: httpx.AsyncClient, gc: Any, settings: Settings
) -> None:
    model = await create_model(client, name="acme/gc")
    versions, doomed_artifact, cached = await _fleet(client, model, gc, settings)
    other = await create_model(client, name="other/untouched")
    await ready_version(client, other["id"])
    await ready_version(client, other["id"])
    r = await client.put("/api/v1/namespaces/acme/retention", json={"keep_last": 1})
    assert r.status_code == 200, r.text

    report = await gc(dry_run=False)

    assert [(d.model, d.version) for d in report.removed] == [("acme/gc", 1)]
    r = await client.get(f"/api/v1/models/{model['id']}/versions/1")
    assert r.status_code == 404
    assert (await client.get(f"/api/v1/artifacts/{doomed_artifact}")).status_code == 404
    assert (await client.get(f"/api/v1/artifacts/{cached}")).status_code == 200
    owners = {k.split("/")[1] for k in stored_files(settings)}
    assert versions[0]["id"] not in owners and doomed_artifact not in owners
    assert {v["id"] for v in versions[1:]} | {cached} <= owners
    listed = (await client.get(f"/api/v1/models/{other['id']}/versions")).json()["items"]
    assert [v["version"] for v in listed] == [1, 2]
    async with gc.sessionmaker() as session:
        events = (await session.execute(select(Event).order_by(Event.id))).scalars().all()
        audit = (
            (
                await session.execute(
                    select(AuditEvent).where(AuditEvent.actor_name == "retention-gc")
                )
            )
            .scalars()
            .all()
        )
    gone = [(e.type, e.data.get("version"), e.data.get("artifact_id")) for e in events][-2:]
    assert gone == [("artifact.deleted", 1, doomed_artifact), ("version.deleted", 1, None)]
    assert sorted((a.action, a.target_id) for a in audit) == sorted(
        [("artifact.delete", doomed_artifact), ("version.delete", versions[0]["id"])]
    )
    # A second run finds nothing more to remove.
    assert (await gc(dry_run=False)).removed == []


async def test_the_settings_default_covers_models_without_a_policy(
    client: httpx.AsyncClient, settings: Settings, gc: Any
) -> None:
    model = await create_model(client, name="acme/default")
    for _ in range(3):
        await ready_version(client, model["id"])
    settings.retention.default_keep_last = 2
    report = await gc(dry_run=False)
    assert [d.version for d in report.removed] == [1]
    r = await client.get(f"/api/v1/models/{model['id']}/retention")
    assert r.json()["policy"] is None
    assert r.json()["effective"]["source"] == "settings"


async def test_orphans_are_listed_by_a_dry_run_and_swept_by_a_run(
    client: httpx.AsyncClient, gc: Any, settings: Settings
) -> None:
    model = await create_model(client, name="acme/orphans")
    await ready_version(client, model["id"])
    orphan = plant(settings, f"versions/{uuid.uuid4()}/u1/model.safetensors", age_hours=3)
    young = plant(settings, f"versions/{uuid.uuid4()}/u1/model.safetensors", age_hours=0)
    dry = await gc(dry_run=True)
    assert dry.orphans == [f"local:{orphan}"]
    assert orphan in stored_files(settings)
    done = await gc(dry_run=False)
    assert done.orphans == [f"local:{orphan}"]
    assert orphan not in stored_files(settings) and young in stored_files(settings)
