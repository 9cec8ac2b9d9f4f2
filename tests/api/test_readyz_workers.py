"""/readyz without an embedded worker (scaled API replica): live workers are shown, and do
not decide readiness."""

from __future__ import annotations

from typing import Any

import httpx

from app.db import session_scope, utcnow
from app.worker_pool.service import heartbeat


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
