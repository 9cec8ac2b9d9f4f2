"""Presigned resolve answers are memoized like the registry's own signed ones (issue 29 §5):
within one second every node asking the same question gets the same bytes and S3 presigns once
per file, not once per request; the next second mints fresh URLs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import update

from harness.artifacts import make_artifact
from tensor_registry_server.core.db import session_scope
from tensor_registry_server.resolve import service as resolve_service
from tensor_registry_server.rows.artifacts import Artifact
from tensor_registry_server.settings import S3Settings, Settings
from tensor_registry_server.storage.s3 import S3Storage
from tests.conftest import app_and_client
from tests.factories import create_model, ready_version
from tests.storage.conftest import S3_KEY_ID, S3_SECRET, make_bucket
from tests.storage.conftest import s3_endpoint as s3_endpoint  # the S3 server fixture


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


@pytest.fixture
async def presigning(
    settings: Settings, s3_endpoint: str, database_url: str
) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient, Settings]]:
    s3 = {
        "endpoint_url": s3_endpoint,
        "access_key_id": S3_KEY_ID,
        "secret_access_key": S3_SECRET,
        # A bucket that exists: a missing one marks the store down and resolve refuses to
        # hand out URLs into it (test_storage_down.py).
        "bucket": make_bucket(s3_endpoint),
        "presign_downloads": True,
    }
    storage = settings.storage.model_copy(update={"s3": S3Settings.model_validate(s3)})
    configured = settings.model_copy(update={"storage": storage})
    async with app_and_client(configured) as (application, client):
        yield application, client, configured


async def test_presigned_answers_are_memoized_within_the_second(
    presigning: tuple[FastAPI, httpx.AsyncClient, Settings],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    app, client, settings = presigning
    model = await create_model(client, name="acme/presigned")
    await ready_version(client, model["id"])
    made = await make_artifact(settings, model="acme/presigned", version=1)
    async with session_scope(app.state.sessionmaker) as session:
        # The artifact's files live in S3 (presigning needs no object: it is a local signature).
        await session.execute(update(Artifact).where(Artifact.id == made.id).values(storage="s3"))
    presigns = 0
    original = S3Storage.download_url

    async def counted(self: S3Storage, key: str, ttl: int) -> Any:
        nonlocal presigns
        presigns += 1
        return await original(self, key, ttl)

    monkeypatch.setattr(S3Storage, "download_url", counted)
    clock = Clock(2_000_000_000.25)
    monkeypatch.setattr(resolve_service, "time", clock)

    async def resolve() -> dict[str, Any]:
        r = await client.get("/api/v1/resolve", params={"model": "acme/presigned"})
        assert r.status_code == 200, r.text
        return dict(r.json())

    first = await resolve()
    urls = [f["url"] for f in first["files"]]
    assert all("X-Amz-Signature=" in u for u in urls), urls
    per_answer = presigns
    assert per_answer == len(urls)
    clock.now += 0.5  # the same second
    again = await resolve()
    assert again == first and presigns == per_answer
    clock.now += 1  # the next second: fresh URLs, a later expiry
    later = await resolve()
    assert presigns == 2 * per_answer
    assert later["expires_at"] > first["expires_at"]
