"""Garbage: deletes remove bytes after commit; the sweep removes what crashes leave."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx

from tensor_registry_server.core.db import create_engine, make_sessionmaker, session_scope
from tensor_registry_server.jobs.sweep import sweep_orphans
from tensor_registry_server.rows.artifacts import Artifact
from tensor_registry_server.rows.versions import Version, VersionStatus
from tensor_registry_server.settings import Settings
from tensor_registry_server.storage.registry import StorageRegistry
from tensor_registry_server.storage.s3 import S3Storage
from tests.factories import create_model, ready_version
from tests.storage.helpers import chunks_of


def stored_files(settings: Settings) -> set[str]:
    root = settings.local_storage_root
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def plant(settings: Settings, key: str, *, age_hours: float) -> str:
    path = settings.local_storage_root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"orphan " + key.encode())
    stamp = time.time() - age_hours * 3600
    os.utime(path, (stamp, stamp))
    return key


async def test_deleting_a_version_removes_its_bytes_after_commit(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    model = await create_model(client, name="acme/gone")
    version = await ready_version(client, model["id"])
    keep = await ready_version(client, model["id"])
    assert {k.split("/")[1] for k in stored_files(settings)} == {version["id"], keep["id"]}
    r = await client.delete(f"/api/v1/models/{model['id']}/versions/{version['version']}")
    assert r.status_code == 204
    assert {k.split("/")[1] for k in stored_files(settings)} == {keep["id"]}


async def test_sweep_removes_old_orphans_and_keeps_everything_a_row_points_at(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    model = await create_model(client, name="acme/sweep")
    version = await ready_version(client, model["id"])
    referenced = stored_files(settings)
    engine = create_engine(settings.database_url)
    sessionmaker = make_sessionmaker(engine)
    importing_id = uuid.uuid4()
    artifact_id = uuid.uuid4()
    async with session_scope(sessionmaker) as session:
        session.add(
            Version(id=importing_id, model_id=uuid.UUID(model["id"]), number=99,
                    status=VersionStatus.IMPORTING, storage="local")
        )  # fmt: skip
        session.add(
            Artifact(id=artifact_id, model_id=uuid.UUID(model["id"]),
                     version_id=uuid.UUID(version["id"]),
                     version_number=version["version"], dtype="float16", format="hf",
                     storage="local", storage_prefix=f"artifacts/{artifact_id}/", status="running")
        )  # fmt: skip
    kept = {
        plant(settings, f"versions/{importing_id}/i0/model.safetensors", age_hours=5),
        plant(settings, f"artifacts/{artifact_id}/model.tensors", age_hours=5),
        plant(settings, f"versions/{uuid.uuid4()}/u1/fresh.bin", age_hours=0),
    }
    orphans = {
        plant(
            settings, f"versions/{version['id']}/uold/config.json", age_hours=2
        ),  # replaced upload
        plant(
            settings, f"versions/{uuid.uuid4()}/u1/model.safetensors", age_hours=3
        ),  # row rolled back
        plant(settings, f"artifacts/{uuid.uuid4()}/model.tensors", age_hours=3),  # artifact deleted
        plant(settings, f"tmp/tensorize/{uuid.uuid4()}", age_hours=3),
    }
    temp = settings.local_storage_root / ".tmp" / "crashed-upload"
    temp.write_bytes(b"half")
    os.utime(temp, (time.time() - 7200, time.time() - 7200))
    storages = StorageRegistry(settings)
    try:
        removed = await sweep_orphans(sessionmaker, storages, older_than=timedelta(hours=1))
    finally:
        await storages.close()
        await engine.dispose()
    assert removed == len(orphans) + 1
    assert stored_files(settings) == referenced | kept
    # The version's files still download: the sweep touched nothing a row names.
    assert (
        await client.get(f"/api/v1/models/{model['id']}/versions/{version['version']}")
    ).status_code == 200


async def test_sweep_on_s3_keeps_referenced_objects(
    client: httpx.AsyncClient, settings: Settings, s3_storage: S3Storage
) -> None:
    model = await create_model(client, name="acme/s3sweep")
    version_id = uuid.uuid4()
    live_key = f"versions/{version_id}/u1/config.json"
    engine = create_engine(settings.database_url)
    sessionmaker = make_sessionmaker(engine)
    async with session_scope(sessionmaker) as session:
        from tensor_registry_server.rows.versions import VersionFile

        session.add(Version(id=version_id, model_id=uuid.UUID(model["id"]), number=7, storage="s3",
                            status=VersionStatus.READY))  # fmt: skip
        await session.flush()
        session.add(VersionFile(version_id=version_id, path="config.json", size=2, sha256="0" * 64,
                                storage_key=live_key))  # fmt: skip
    await s3_storage.put_stream(live_key, chunks_of(b"{}"))
    await s3_storage.put_stream(f"versions/{version_id}/u2/config.json", chunks_of(b"old"))
    await s3_storage.put_stream(f"artifacts/{uuid.uuid4()}/model.tensors", chunks_of(b"x"))
    await asyncio.sleep(1.1)  # S3 times have one-second resolution

    class WithTestBucket(StorageRegistry):
        def get(self, name: str | None = None) -> Any:
            return s3_storage if name == "s3" else super().get(name)

    storages = WithTestBucket(settings)
    try:
        removed = await sweep_orphans(sessionmaker, storages, older_than=timedelta(seconds=0))
    finally:
        await storages.close()
        await engine.dispose()
    assert removed == 2
    assert [i.key async for i in s3_storage.list("")] == [live_key]


def test_plant_helper_sets_old_mtimes(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    key = plant(settings, "versions/x/u/f", age_hours=2)
    assert time.time() - (settings.local_storage_root / key).stat().st_mtime > 7000
