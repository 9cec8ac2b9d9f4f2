"""Open event streams against a real `tensor-registry serve` (issue 33 §3): one cap per token for
``/api/v1/events`` and job event streams together, and a stream of either kind ends within
seconds of its token being revoked or expiring (``http.stream_token_check_seconds``), although
keepalives would otherwise hold it open for ever."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import update

from harness.hf_bytes import tiny_safetensors
from harness.serve_process import ServeProcess, free_port
from tensor_registry_server.core.db import create_engine, utcnow
from tensor_registry_server.rows.tokens import ApiToken
from tests.conftest import ADMIN_TOKEN
from tests.factories import auth, create_model

CHECK_SECONDS = 0.5
# Far past CHECK_SECONDS and far below the 15 s keepalive that held streams open before.
ENDS_WITHIN = 8.0


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    server = ServeProcess(
        data_dir=tmp_path / "data",
        port=free_port(),
        env={
            "TENSOR_REGISTRY_ADMIN_TOKEN": ADMIN_TOKEN,
            "TENSOR_REGISTRY_HTTP__MAX_EVENT_STREAMS_PER_TOKEN": "2",
            "TENSOR_REGISTRY_HTTP__STREAM_TOKEN_CHECK_SECONDS": str(CHECK_SECONDS),
            "TENSOR_REGISTRY_STORAGE__IMPORT_ROOTS": json.dumps([str(tmp_path / "imports")]),
        },
    ).start()
    try:
        yield server
    finally:
        server.stop()


async def _token(client: httpx.AsyncClient, name: str) -> tuple[str, str]:
    r = await client.post("/api/v1/tokens", json={"name": name, "scopes": ["models:read"]})
    assert r.status_code == 201, r.text
    return str(r.json()["token"]), str(r.json()["id"])


async def _queued_job(client: httpx.AsyncClient, root: Path) -> str:
    """An import job that stays queued (serve runs without a worker here): its stream stays
    open until the job ends, which it does not."""
    source = root / secrets.token_hex(4)
    source.mkdir(parents=True)
    (source / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (source / "model.safetensors").write_bytes(tiny_safetensors())
    model = await create_model(client, name=f"acme/s{secrets.token_hex(3)}")
    r = await client.post(
        f"/api/v1/models/{model['id']}/versions", json={"source_uri": source.as_uri() + "/"}
    )
    assert r.status_code in (201, 202), r.text
    return str(r.json()["job_id"])


async def _ended_within(chunks: AsyncIterator[bytes], seconds: float) -> float:
    """Reads a response's ``chunks`` to their end; the seconds it took (fails past ``seconds``)."""
    started = time.monotonic()
    async with asyncio.timeout(seconds):
        async for _ in chunks:
            pass
    return time.monotonic() - started


async def test_events_and_job_streams_share_one_cap(serve: ServeProcess, tmp_path: Path) -> None:
    async with httpx.AsyncClient(base_url=serve.url, headers=auth(ADMIN_TOKEN), timeout=10) as c:
        job = await _queued_job(c, tmp_path / "imports")
        token, _ = await _token(c, "streams")
        mine = auth(token)
        async with (
            c.stream("GET", "/api/v1/events", headers=mine) as one,
            c.stream("GET", f"/api/v1/jobs/{job}/events", headers=mine) as two,
        ):
            assert (one.status_code, two.status_code) == (200, 200)
            for route in ("/api/v1/events", f"/api/v1/jobs/{job}/events"):
                third = await c.get(route, headers=mine)
                assert third.status_code == 429, third.text
                assert third.json()["code"] == "too_many_event_streams"
                assert third.json()["limit"] == 2 and third.headers["retry-after"] == "5"
            # Another token has its own slots.
            async with c.stream("GET", "/api/v1/events") as theirs:
                assert theirs.status_code == 200
        # Hung-up streams give their slots back (once the server has noticed).
        deadline = time.monotonic() + 30
        while True:
            async with c.stream("GET", "/api/v1/events", headers=mine) as again:
                if again.status_code == 200:
                    break
            assert time.monotonic() < deadline, "the closed streams kept their slots"
            await asyncio.sleep(0.1)


async def test_streams_end_when_their_token_is_revoked(serve: ServeProcess, tmp_path: Path) -> None:
    async with httpx.AsyncClient(
        base_url=serve.url, headers=auth(ADMIN_TOKEN), timeout=httpx.Timeout(10, read=None)
    ) as c:
        job = await _queued_job(c, tmp_path / "imports")
        token, token_id = await _token(c, "revoked")
        mine = auth(token)
        async with (
            c.stream("GET", "/api/v1/events", headers=mine) as events,
            c.stream("GET", f"/api/v1/jobs/{job}/events", headers=mine) as job_events,
        ):
            assert (events.status_code, job_events.status_code) == (200, 200)
            # Both are open (each has sent its first message) before the revocation.
            events_raw, job_raw = events.aiter_raw(), job_events.aiter_raw()
            assert (await anext(events_raw)).startswith(b"retry:")
            assert b"event: job" in await anext(job_raw)
            r = await c.delete(f"/api/v1/tokens/{token_id}")
            assert r.status_code == 204
            assert (await c.get("/api/v1/events", headers=mine)).status_code == 401
            took = await asyncio.gather(
                _ended_within(events_raw, ENDS_WITHIN), _ended_within(job_raw, ENDS_WITHIN)
            )
            assert max(took) < ENDS_WITHIN


async def test_streams_end_when_their_token_expires(serve: ServeProcess, tmp_path: Path) -> None:
    async with httpx.AsyncClient(
        base_url=serve.url, headers=auth(ADMIN_TOKEN), timeout=httpx.Timeout(10, read=None)
    ) as c:
        token, _ = await _token(c, "expiring")
        async with c.stream("GET", "/api/v1/events", headers=auth(token)) as events:
            assert events.status_code == 200
            raw = events.aiter_raw()
            assert (await anext(raw)).startswith(b"retry:")
            # The token's expiry passes while the stream is open.
            database = f"sqlite+aiosqlite:///{serve.data_dir.resolve() / 'registry.db'}"
            engine = create_engine(database)
            try:
                async with engine.begin() as conn:
                    await conn.execute(
                        update(ApiToken)
                        .where(ApiToken.name == "expiring")
                        .values(expires_at=utcnow() - timedelta(seconds=1))
                    )
            finally:
                await engine.dispose()
            assert await _ended_within(raw, ENDS_WITHIN) < ENDS_WITHIN
