"""Resolve hands out no URLs into a store /readyz says is down (issue 29 §5): with its bucket
missing, /readyz answers 503 naming the backend and resolve answers 503
``storage_unavailable``; once the bucket exists both recover, and a store that goes away
without anyone polling /readyz is noticed by resolve's own background re-check."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import boto3
import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import update

from harness.artifacts import make_artifact
from harness.waiting import poll_async
from tensor_registry_server.core.db import session_scope
from tensor_registry_server.rows.artifacts import Artifact
from tensor_registry_server.settings import S3Settings, Settings
from tests.conftest import app_and_client
from tests.factories import create_model, ready_version
from tests.storage.conftest import S3_KEY_ID, S3_SECRET
from tests.storage.conftest import s3_endpoint as s3_endpoint  # the S3 server fixture


def _s3(endpoint: str) -> object:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=S3_KEY_ID,
        aws_secret_access_key=S3_SECRET,
        region_name="us-east-1",
    )


@pytest.fixture
async def missing_bucket_app(
    settings: Settings, s3_endpoint: str, database_url: str
) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient, Settings, str]]:
    bucket = f"missing-{uuid.uuid4().hex[:12]}"
    s3 = S3Settings.model_validate(
        {
            "endpoint_url": s3_endpoint,
            "access_key_id": S3_KEY_ID,
            "secret_access_key": S3_SECRET,
            "bucket": bucket,
        }
    )
    configured = settings.model_copy(
        update={"storage": settings.storage.model_copy(update={"s3": s3})}
    )
    async with app_and_client(configured) as (application, client):
        yield application, client, configured, bucket


async def test_no_urls_into_a_store_readyz_says_is_down(
    missing_bucket_app: tuple[FastAPI, httpx.AsyncClient, Settings, str],
    s3_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app, client, settings, bucket = missing_bucket_app
    model = await create_model(client, name="acme/bucketless")
    await ready_version(client, model["id"])
    made = await make_artifact(settings, model="acme/bucketless", version=1)
    async with session_scope(app.state.sessionmaker) as session:
        await session.execute(update(Artifact).where(Artifact.id == made.id).values(storage="s3"))

    async def resolve() -> httpx.Response:
        return await client.get("/api/v1/resolve", params={"model": "acme/bucketless"})

    ready = await client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["checks"]["storage"].startswith("unavailable: s3: ")
    refused = await resolve()
    assert (refused.status_code, refused.json()["code"]) == (503, "storage_unavailable")
    assert refused.headers["retry-after"]
    assert "X-Amz-Signature" not in refused.text

    _s3(s3_endpoint).create_bucket(Bucket=bucket)  # type: ignore[attr-defined]
    assert (await client.get("/readyz")).status_code == 200
    served = await resolve()
    assert served.status_code == 200, served.text
    assert all("X-Amz-Signature=" in f["url"] for f in served.json()["files"])

    # The bucket goes away and nobody polls /readyz: resolve's own re-check notices.
    monkeypatch.setattr(app.state.storages, "recheck_seconds", 0.05)
    _s3(s3_endpoint).delete_bucket(Bucket=bucket)  # type: ignore[attr-defined]
    gone = await poll_async(
        resolve,
        what="resolve to notice the bucket is gone",
        ready=lambda r: r.status_code == 503,
        timeout=15,
    )
    assert gone.json()["code"] == "storage_unavailable"
