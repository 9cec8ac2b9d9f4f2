"""/readyz without an embedded worker (scaled API replica): live workers are shown, and do
not decide readiness."""

from __future__ import annotations

from typing import Any

import httpx

from tensor_registry_server.core.db import session_scope, utcnow
from tensor_registry_server.jobs.pool.service import heartbeat
from tests.factories import auth, create_token


async def test_readyz_shows_live_workers_without_depending_on_them(
    app: Any, client: httpx.AsyncClient
) -> None:
    r = await client.get("/readyz")
    assert r.status_code == 200
    assert r.json()["workers"] == {"live": 0}
    assert "worker" not in r.json()["checks"]
    async with session_scope(app.state.sessionmaker) as session:
        await heartbeat(
            session,
            worker_id="gpu-node-1:42",
            hostname="gpu-node-1",
            queues=["gpu"],
            capabilities={},
            started_at=utcnow(),
        )
    r = await client.get("/readyz")
    assert r.status_code == 200 and r.json()["workers"] == {"live": 1}


async def test_worker_hosts_are_shown_to_admin_tokens_only(
    app: Any, client: httpx.AsyncClient
) -> None:
    """Any models:read token learns what workers can run; only admin learns where they run."""
    async with session_scope(app.state.sessionmaker) as session:
        await heartbeat(
            session,
            worker_id="gpu-node-7.corp.internal:4242",
            hostname="gpu-node-7.corp.internal",
            queues=["gpu"],
            capabilities={"formats": ["vllm"]},
            started_at=utcnow(),
        )
    admin_view = (await client.get("/api/v1/workers")).json()["items"]
    assert [(w["id"], w["hostname"]) for w in admin_view] == [
        ("gpu-node-7.corp.internal:4242", "gpu-node-7.corp.internal")
    ]
    reader = await create_token(client, scopes=["models:read", "models:write", "tensorize"])
    r = await client.get("/api/v1/workers", headers=auth(reader))
    assert r.status_code == 200
    (seen,) = r.json()["items"]
    assert seen["hostname"] is None
    assert seen["id"].startswith("worker-") and "gpu-node-7" not in r.text
    assert seen["capabilities"] == {"formats": ["vllm"]} and seen["queues"] == ["gpu"]
    # Stable: the same worker has the same handle on every read.
    again = (await client.get("/api/v1/workers", headers=auth(reader))).json()["items"]
    assert again[0]["id"] == seen["id"]
