"""A client that leaves mid-request is logged as client_disconnected and counted as 499."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest

from tensor_registry_server.middleware import CLIENT_CLOSED
from tests.conftest import ADMIN_TOKEN
from tests.factories import create_model

ROUTE = "/api/v1/models/{model_id}/versions/{number}/files/{path:path}"


def counted(metrics: str, status: int) -> float:
    total = 0.0
    for line in metrics.splitlines():
        if (
            line.startswith("tensor_registry_http_requests_total{")
            and f'route="{ROUTE}"' in line
            and 'method="PUT"' in line
            and f'status="{status}"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_an_upload_whose_client_leaves_is_a_499_not_a_500(
    app: Any, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    model = await create_model(client)
    r = await client.post(f"/api/v1/models/{model['id']}/versions", json={})
    number = r.json()["version"]
    before = (await client.get("/metrics")).text
    path = f"/api/v1/models/{model['id']}/versions/{number}/files/model.bin"
    messages = [
        {"type": "http.request", "body": b"x" * 100, "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "PUT",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "server": ("testserver", 80),
        "client": ("127.0.0.1", 5000),
        "headers": [
            (b"host", b"testserver"),
            (b"authorization", f"Bearer {ADMIN_TOKEN}".encode()),
            (b"content-type", b"application/octet-stream"),
            (b"content-length", b"1000"),
        ],
    }
    with caplog.at_level(logging.DEBUG):
        await app(scope, receive, send)
    after = (await client.get("/metrics")).text
    assert counted(after, CLIENT_CLOSED) == counted(before, CLIENT_CLOSED) + 1
    assert counted(after, 500) == counted(before, 500)
    events = [r for r in caplog.records if r.name == "tensor_registry.access"]
    assert not [r for r in events if r.levelno >= logging.WARNING], [r.message for r in events]
    assert "unhandled error" not in caplog.text
    logged = [json.loads(r.getMessage()) for r in events]
    assert any(e["event"] == "client_disconnected" for e in logged)
    request_lines = [e for e in logged if e["event"] == "request"]
    assert request_lines[-1]["status"] == CLIENT_CLOSED
    # Nothing was recorded and no bytes stayed behind.
    version = (await client.get(f"/api/v1/models/{model['id']}/versions/{number}")).json()
    assert version["files"] == []
    storage = app.state.storages.get("local")
    assert [o async for o in storage.list("versions/")] == []


async def test_completed_requests_keep_their_status(app: Any, client: httpx.AsyncClient) -> None:
    from tests.factories import ready_version

    model = await create_model(client)
    await ready_version(client, model["id"])
    r = await client.get(f"/api/v1/models/{model['id']}/versions/1")
    assert r.status_code == 200
    metrics = (await client.get("/metrics")).text
    prefix = "tensor_registry_http_requests_total{"
    lines = [line for line in metrics.splitlines() if line.startswith(prefix)]
    assert not [line for line in lines if 'status="499"' in line and 'method="GET"' in line]
    assert any('status="201"' in line and 'method="PUT"' in line for line in lines)
