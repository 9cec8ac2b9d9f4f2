"""Issue 36 §2: namespace limits (storage quota, largest upload, concurrent jobs), per-token
request rates, and usage in the API and /metrics. Refusals leave nothing behind."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import func, select

from tensor_registry_server.core.db import session_scope
from tensor_registry_server.limits.rate import LocalBuckets, RedisBuckets
from tensor_registry_server.limits.service import InsufficientStorage, set_limits
from tensor_registry_server.rows.artifacts import Artifact
from tensor_registry_server.rows.jobs import Job
from tensor_registry_server.rows.versions import VersionFile
from tensor_registry_server.settings import Settings
from tensor_registry_server.versions import service as versions
from tests.conftest import app_and_client
from tests.factories import auth, create_model, create_token, ready_version, upload
from tests.metrics_traffic import pretend_a_gpu_worker_is_live


def _stored(settings: Settings) -> list[Path]:
    root = settings.local_storage_root
    return sorted(p for p in root.rglob("*") if p.is_file() and ".tmp" not in p.parts)


async def _count(app: FastAPI, column: object) -> int:
    async with session_scope(app.state.sessionmaker) as session:  # type: ignore[attr-defined]
        return int(await session.scalar(select(func.count(column))) or 0)


async def _usage(client: httpx.AsyncClient, ns: str) -> dict[str, object]:
    r = await client.get(f"/api/v1/namespaces/{ns}/usage")
    assert r.status_code == 200, r.text
    return dict(r.json())


async def test_usage_counts_sources_and_limits_are_off_by_default(
    client: httpx.AsyncClient,
) -> None:
    model = await create_model(client, name="acme/usage")
    await ready_version(client, model["id"])
    files = (await client.get(f"/api/v1/models/{model['id']}/versions/1")).json()["files"]
    report = await _usage(client, "acme")
    assert report["limits"] == {
        "storage_bytes": None,
        "upload_bytes": None,
        "concurrent_jobs": None,
    }
    assert report["usage"] == {
        "storage_bytes": sum(f["size"] for f in files),
        "active_jobs": 0,
        "models": 1,
    }
    listed = (await client.get("/api/v1/namespaces")).json()["items"]
    assert [item["namespace"] for item in listed] == ["acme"]


async def test_only_admins_set_limits_and_a_token_sees_only_its_namespaces(
    client: httpx.AsyncClient,
) -> None:
    await create_model(client, name="acme/a")
    reader = await create_token(client, scopes=["models:read"], namespaces=["acme"])
    r = await client.put("/api/v1/namespaces/acme/limits", json={}, headers=auth(reader))
    assert r.status_code == 403
    assert (await client.get("/api/v1/namespaces", headers=auth(reader))).status_code == 403
    mine = await client.get("/api/v1/namespaces/acme/usage", headers=auth(reader))
    assert mine.status_code == 200
    other = await client.get("/api/v1/namespaces/other/usage", headers=auth(reader))
    assert other.status_code == 403
    bad = await client.put("/api/v1/namespaces/acme/limits", json={"storage_bytes": -1})
    assert bad.status_code == 422


async def test_an_upload_over_the_largest_upload_is_413_and_stores_nothing(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    model = await create_model(client, name="acme/big")
    assert (await client.post(f"/api/v1/models/{model['id']}/versions", json={})).is_success
    r = await client.put("/api/v1/namespaces/acme/limits", json={"upload_bytes": 10})
    assert r.status_code == 200, r.text
    assert r.json()["limits"]["upload_bytes"] == 10
    before = _stored(settings)
    r = await upload(client, model["id"], 1, "config.json", b"x" * 11)
    assert r.status_code == 413
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert (body["code"], body["limit"], body["limit_bytes"], body["size"]) == (
        "upload_limit_exceeded",
        "upload_bytes",
        10,
        11,
    )
    assert _stored(settings) == before
    assert (await upload(client, model["id"], 1, "config.json", b"x" * 10)).status_code == 201


async def test_an_upload_past_the_quota_is_507_with_the_usage_and_stores_nothing(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings
) -> None:
    model = await create_model(client, name="acme/full")
    assert (await client.post(f"/api/v1/models/{model['id']}/versions", json={})).is_success
    assert (await upload(client, model["id"], 1, "a.json", b"{}" * 10)).status_code == 201
    await client.put("/api/v1/namespaces/acme/limits", json={"storage_bytes": 25})
    before, rows = _stored(settings), await _count(app, VersionFile.id)
    r = await upload(client, model["id"], 1, "b.json", b"y" * 6)
    assert r.status_code == 507
    body = r.json()
    assert (body["code"], body["limit"], body["usage_bytes"], body["limit_bytes"]) == (
        "storage_quota_exceeded",
        "storage_bytes",
        20,
        25,
    )
    assert _stored(settings) == before
    assert await _count(app, VersionFile.id) == rows
    # Replacing a file counts only the difference; another namespace is not limited.
    assert (await upload(client, model["id"], 1, "a.json", b"z" * 25)).status_code == 201
    other = await create_model(client, name="other/m")
    assert (await client.post(f"/api/v1/models/{other['id']}/versions", json={})).is_success
    assert (await upload(client, other["id"], 1, "b.json", b"y" * 100)).status_code == 201
    # null returns the quota to the default (unlimited).
    r = await client.put("/api/v1/namespaces/acme/limits", json={"storage_bytes": None})
    assert r.json()["limits"]["storage_bytes"] is None


async def test_a_quota_filled_while_the_body_streamed_deletes_the_bytes_and_writes_no_row(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings
) -> None:
    """Two uploads raced: both passed the check before their bodies; the one recorded second
    finds the quota passed under the version's lock and leaves no object and no row."""
    model_out = await create_model(client, name="acme/race")
    assert (await client.post(f"/api/v1/models/{model_out['id']}/versions", json={})).is_success
    await client.put("/api/v1/namespaces/acme/limits", json={"storage_bytes": 100})
    storages = app.state.storages  # type: ignore[attr-defined]
    from tensor_registry_server.models.service import get_model

    async with session_scope(app.state.sessionmaker) as session:  # type: ignore[attr-defined]
        from tensor_registry_server.auth import Principal

        admin = Principal(token_id=uuid.uuid4(), name="admin", scopes=frozenset({"admin"}))
        model = await get_model(session, admin, uuid.UUID(model_out["id"]))
        target = await versions.start_upload(
            session, model, 1, "w.json", content_length=60, expected_sha256=None, storages=storages
        )

    async def body() -> object:
        yield b"w" * 60

    stored = await versions.receive_upload(target, body(), storages=storages)  # type: ignore[arg-type]
    assert any(p.name == "w.json" for p in _stored(settings))
    # Meanwhile the namespace filled up.
    assert (await upload(client, model_out["id"], 1, "other.json", b"o" * 50)).status_code == 201
    with pytest.raises(InsufficientStorage):
        async with session_scope(app.state.sessionmaker) as session:  # type: ignore[attr-defined]
            model = await get_model(session, admin, uuid.UUID(model_out["id"]))
            await versions.record_upload(session, admin, model, target, stored, storages=storages)
    assert not any(p.name == "w.json" for p in _stored(settings))
    files = (await client.get(f"/api/v1/models/{model_out['id']}/versions/1")).json()["files"]
    assert [f["path"] for f in files] == ["other.json"]


async def test_tensorize_past_a_limit_is_refused_before_anything_is_enqueued(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    await pretend_a_gpu_worker_is_live(app)
    model = await create_model(client, name="acme/jobs")
    await ready_version(client, model["id"])
    used = (await _usage(client, "acme"))["usage"]["storage_bytes"]  # type: ignore[index]
    await client.put("/api/v1/namespaces/acme/limits", json={"storage_bytes": used + 1})
    url = f"/api/v1/models/{model['id']}/tensorize"
    r = await client.post(url, json={"version": 1, "dtype": "bfloat16", "format": "hf"})
    assert r.status_code == 507, r.text
    assert r.json()["code"] == "storage_quota_exceeded"
    assert (await _count(app, Job.id), await _count(app, Artifact.id)) == (0, 0)

    await client.put(
        "/api/v1/namespaces/acme/limits", json={"storage_bytes": None, "concurrent_jobs": 1}
    )
    first = await client.post(url, json={"version": 1, "dtype": "bfloat16", "format": "hf"})
    assert first.status_code == 202, first.text
    second = await client.post(url, json={"version": 1, "dtype": "float16", "format": "hf"})
    assert second.status_code == 429, second.text
    assert int(second.headers["retry-after"]) > 0
    body = second.json()
    assert (body["code"], body["limit"], body["usage_jobs"], body["limit_jobs"]) == (
        "concurrent_jobs_exceeded",
        "concurrent_jobs",
        1,
        1,
    )
    assert await _count(app, Job.id) == 1
    assert (await _usage(client, "acme"))["usage"]["active_jobs"] == 1  # type: ignore[index]


async def test_metrics_show_usage_and_limits_per_namespace_only_when_names_are_opted_in(
    settings: Settings,
) -> None:
    settings.metrics.model_labels = True
    async with app_and_client(settings) as (_, client):
        model = await create_model(client, name="acme/metrics")
        await ready_version(client, model["id"])
        await client.put("/api/v1/namespaces/acme/limits", json={"storage_bytes": 10**9})
        text = (await client.get("/metrics")).text
        used = (await _usage(client, "acme"))["usage"]["storage_bytes"]  # type: ignore[index]
    assert f'tensor_registry_namespace_storage_bytes{{namespace="acme"}} {float(used)}' in text
    assert 'tensor_registry_namespace_storage_limit_bytes{namespace="acme"} 1e+09' in text
    assert "tensor_registry_namespaces_near_limit 0.0" in text
    settings.metrics.model_labels = False
    async with app_and_client(settings) as (_, client):
        await create_model(client, name="acme/quiet")
        await client.put("/api/v1/namespaces/acme/limits", json={"concurrent_jobs": 0})
        text = (await client.get("/metrics")).text
    assert 'namespace="acme"' not in text
    assert 'tensor_registry_namespace_storage_bytes{namespace="all"}' in text
    assert "tensor_registry_namespaces_near_limit 1.0" in text


async def test_a_token_over_its_rate_gets_429_with_retry_after_and_health_is_never_limited(
    settings: Settings,
) -> None:
    settings.limits.rate_per_second = 0.01  # no refill within the test, however slow
    settings.limits.rate_burst = 3
    async with app_and_client(settings) as (_, client):
        other = await create_token(client, scopes=["models:read"])  # 1st of the admin's 3
        codes = [(await client.get("/api/v1/models")).status_code for _ in range(3)]
        assert codes == [200, 200, 429]
        refused = await client.get("/api/v1/models")
        assert refused.status_code == 429
        assert refused.headers["content-type"] == "application/problem+json"
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.json()["code"] == "rate_limited"
        assert refused.json()["limit"] == "rate_per_second"
        for path in ("/healthz", "/readyz", "/metrics"):
            assert (await client.get(path)).status_code == 200
        # Each token has its own bucket.
        assert (await client.get("/api/v1/models", headers=auth(other))).status_code == 200


async def test_local_buckets_refill_at_the_rate() -> None:
    now = [100.0]
    buckets = LocalBuckets(rate=2, burst=2, clock=lambda: now[0])
    assert [(await buckets.take("t"))[0] for _ in range(3)] == [True, True, False]
    now[0] += 0.5  # one token back
    assert [(await buckets.take("t"))[0] for _ in range(2)] == [True, False]


async def test_redis_buckets_are_shared_by_replicas() -> None:
    """Two replicas (two clients of one Redis) draw from one bucket per token."""
    prefix = f"test-rate-{uuid.uuid4().hex}/"
    url = "redis://127.0.0.1:6379/0"
    one = RedisBuckets(url, rate=0.01, burst=3, prefix=prefix)
    two = RedisBuckets(url, rate=0.01, burst=3, prefix=prefix)
    try:
        taken = [await one.take("tok"), await two.take("tok"), await one.take("tok")]
        assert [allowed for allowed, _ in taken] == [True, True, True]
        allowed, wait = await two.take("tok")
        assert not allowed and wait > 1
        assert (await one.take("another"))[0]
    finally:
        await one.redis.delete(f"{prefix}rate/tok", f"{prefix}rate/another")
        await one.redis.aclose()
        await two.redis.aclose()


async def test_set_limits_keeps_fields_left_out(app: FastAPI) -> None:
    async with session_scope(app.state.sessionmaker) as session:  # type: ignore[attr-defined]
        await set_limits(session, "acme", {"storage_bytes": 5, "concurrent_jobs": 2})
        await set_limits(session, "acme", {"concurrent_jobs": 3})
    async with session_scope(app.state.sessionmaker) as session:  # type: ignore[attr-defined]
        from tensor_registry_server.limits.service import limits_for

        limits = await limits_for(session, app.state.settings, "acme")  # type: ignore[attr-defined]
    assert (limits.storage_bytes, limits.concurrent_jobs, limits.upload_bytes) == (5, 3, None)
