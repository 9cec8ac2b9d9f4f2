"""HTTP conventions: problem+json everywhere, request ids, 404/405/415, health, metrics, logs."""

from __future__ import annotations

import logging

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN


async def test_unknown_route_and_wrong_method_are_problems(client: httpx.AsyncClient) -> None:
    r = await client.get("/api/v1/nothing-here")
    assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"
    assert r.json()["code"] == "not_found" and r.json()["request_id"] == r.headers["x-request-id"]
    r = await client.put("/api/v1/models", json={})
    assert r.status_code == 405 and r.json()["code"] == "method_not_allowed"


async def test_non_json_body_is_415(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/api/v1/models",
        content=b"name=acme/x",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 415 and r.json()["code"] == "unsupported_media_type"
    r = await client.post(
        "/api/v1/models", content=b"{bad json", headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 422 and r.json()["code"] == "validation_error"


async def test_request_id_is_echoed_when_sane(client: httpx.AsyncClient) -> None:
    r = await client.get("/healthz", headers={"X-Request-Id": "trace-1234567890"})
    assert r.headers["x-request-id"] == "trace-1234567890"
    r = await client.get("/healthz", headers={"X-Request-Id": "bad id\twith spaces"})
    assert (
        r.headers["x-request-id"] != "bad id\twith spaces" and len(r.headers["x-request-id"]) == 32
    )


async def test_health_ready_metrics(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"database": "ok", "storage": "ok", "broker": "ok"}
    await client.get("/api/v1/models")
    metrics = (await client.get("/metrics")).text
    assert (
        'tensor_registry_http_requests_total{method="GET",route="/api/v1/models",status="200"}'
        in metrics
    )


async def test_readyz_reports_a_missing_broker_as_503(client: httpx.AsyncClient, settings) -> None:
    import shutil

    shutil.rmtree(settings.broker_dir / "out")
    r = await client.get("/readyz")
    assert r.status_code == 503 and r.headers["retry-after"]
    assert r.json()["checks"]["broker"].startswith("unavailable")


async def test_openapi_document_lists_the_contract_routes(client: httpx.AsyncClient) -> None:
    paths = (await client.get("/openapi.json")).json()["paths"]
    for route in (
        "/api/v1/models",
        "/api/v1/models/{model_id}",
        "/api/v1/models/{model_id}/versions",
        "/api/v1/models/{model_id}/versions/{number}/files/{path}",
        "/api/v1/models/{model_id}/versions/{number}/finalize",
        "/api/v1/models/{model_id}/aliases/{alias}",
        "/api/v1/tokens",
        "/api/v1/audit",
    ):
        assert route in paths, route


async def test_access_log_is_json_and_never_holds_tokens_or_queries(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tensor_registry.access")
    created = await client.post("/api/v1/tokens", json={"name": "x", "scopes": ["models:read"]})
    await client.get(
        "/api/v1/models?q=secret-query",
        headers={"Authorization": f"Bearer {created.json()['token']}"},
    )
    lines = [r.getMessage() for r in caplog.records if r.name == "tensor_registry.access"]
    assert len(lines) == 2
    import json

    parsed = [json.loads(line) for line in lines]
    assert parsed[1]["path"] == "/api/v1/models" and parsed[1]["status"] == 200
    text = "\n".join(lines)
    assert ADMIN_TOKEN not in text and created.json()["token"] not in text
    assert "secret-query" not in text
