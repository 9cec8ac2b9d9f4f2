"""Retention GC deletes bytes from whichever backend holds them: S3 (moto, on loopback) and Redis,
not only the local directory; orphans there are swept too (issue 36 §3)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import httpx
import pytest

from tensor_registry_server.core.db import create_engine, make_sessionmaker, session_scope, utcnow
from tensor_registry_server.retention.gc import collect
from tensor_registry_server.rows.artifacts import Artifact, ArtifactFile
from tensor_registry_server.rows.versions import Version, VersionFile, VersionStatus
from tensor_registry_server.settings import Settings
from tensor_registry_server.storage.base import Storage
from tensor_registry_server.storage.registry import StorageRegistry
from tests.factories import create_model, ready_version
from tests.storage.conftest import (  # noqa: F401 - the backends' fixtures, used by name
    redis_storage,
    redis_url,
    s3_endpoint,
    s3_storage,
)
from tests.storage.helpers import chunks_of


@pytest.fixture(params=["s3", "redis"])
def backend(request: pytest.FixtureRequest) -> Storage:
    """A fresh S3 bucket or Redis key prefix (tests/storage/conftest.py)."""
    return request.getfixturevalue(f"{request.param}_storage")  # type: ignore[no-any-return]


async def _keys(storage: Storage) -> set[str]:
    return {info.key async for info in storage.list("")}


async def test_gc_deletes_a_removed_versions_objects_and_orphans_on_the_backend(
    client: httpx.AsyncClient, settings: Settings, backend: Storage, request: pytest.FixtureRequest
) -> None:
    name = request.node.callspec.params["backend"]
    model = await create_model(client, name=f"acme/gc-{name}")
    model_id = uuid.UUID(model["id"])
    engine = create_engine(settings.database_url)
    sessionmaker = make_sessionmaker(engine)
    old_version, old_artifact, new_artifact = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    old_source = f"versions/{old_version}/u1/config.json"
    old_weights = f"artifacts/{old_artifact}/model.tensors"
    new_weights = f"artifacts/{new_artifact}/model.tensors"
    orphan = f"artifacts/{uuid.uuid4()}/model.tensors"  # its row was rolled back

    # Version 1 and its artifact live on the backend; version 2 (the newest) was uploaded
    # locally and has an artifact on the backend too.
    async with session_scope(sessionmaker) as session:
        session.add(Version(id=old_version, model_id=model_id, number=1, storage=name,
                            status=VersionStatus.READY))  # fmt: skip
        await session.flush()
        session.add(VersionFile(version_id=old_version, path="config.json", size=2,
                                sha256="0" * 64, storage_key=old_source))  # fmt: skip
    newest = await ready_version(client, model["id"])
    assert newest["version"] == 2
    async with session_scope(sessionmaker) as session:
        for artifact_id, version_id, number in (
            (old_artifact, old_version, 1),
            (new_artifact, uuid.UUID(newest["id"]), 2),
        ):
            session.add(Artifact(id=artifact_id, model_id=model_id, version_id=version_id,
                                 version_number=number, dtype="float16", format="hf",
                                 storage=name, storage_prefix=f"artifacts/{artifact_id}/",
                                 status="ready"))  # fmt: skip
            await session.flush()
            key = f"artifacts/{artifact_id}/model.tensors"
            session.add(ArtifactFile(artifact_id=artifact_id, path="model.tensors", size=1,
                                     sha256="0" * 64, storage_key=key))  # fmt: skip
    for key in (old_source, old_weights, new_weights, orphan):
        await backend.put_stream(key, chunks_of(b"x" if key != old_source else b"{}"))
    # The sweep's clock runs five seconds ahead: the orphan just written is past its grace
    # (0 s) whatever the backend's time resolution (S3's is one second).
    later = utcnow() + timedelta(seconds=5)
    r = await client.put("/api/v1/namespaces/acme/retention", json={"keep_last": 1})
    assert r.status_code == 200, r.text

    class WithTestBackend(StorageRegistry):
        def get(self, storage_name: str | None = None) -> Any:
            return backend if storage_name == name else super().get(storage_name)

    storages = WithTestBackend(settings)
    try:
        dry = await collect(
            sessionmaker,
            storages,
            settings.retention,
            dry_run=True,
            orphan_grace=timedelta(0),
            now=later,
        )
        assert [(d.version, d.remove) for d in dry.decisions] == [(1, True), (2, False)]
        assert dry.orphans == [f"{name}:{orphan}"]
        assert await _keys(backend) == {old_source, old_weights, new_weights, orphan}

        report = await collect(
            sessionmaker,
            storages,
            settings.retention,
            dry_run=False,
            orphan_grace=timedelta(0),
            now=later,
        )
    finally:
        await storages.close()
        await engine.dispose()
    assert [(d.model, d.version) for d in report.removed] == [(f"acme/gc-{name}", 1)]
    assert report.orphans == [f"{name}:{orphan}"]
    # The removed version's source and artifact and the orphan are gone from the backend; what
    # the kept version's artifact stores stays.
    assert await _keys(backend) == {new_weights}
    assert (await client.get(f"/api/v1/artifacts/{old_artifact}")).status_code == 404
    assert (await client.get(f"/api/v1/artifacts/{new_artifact}")).status_code == 200
