"""Races and starvation: finalize against uploads, same-path uploads, slow uploads and the pool.

Every request goes through the ASGI app; concurrency is asyncio.gather on one loop, the way
many clients reach one API process.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from harness.hf_bytes import tiny_safetensors
from tensor_registry_server.main import create_app
from tensor_registry_server.rows.versions import VersionFile
from tensor_registry_server.settings import Settings
from tests.conftest import ADMIN_TOKEN, migrated_database
from tests.factories import create_model, upload

CONFIG = json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}).encode()
CORRUPT_WEIGHTS = b"\x10\x00\x00\x00\x00\x00\x00\x00not a json header"


async def stored_keys(app: Any) -> set[str]:
    storage = app.state.storages.get("local")
    return {info.key async for info in storage.list("versions/")}


async def row_keys(app: Any) -> set[str]:
    async with app.state.sessionmaker() as session:
        return set((await session.execute(select(VersionFile.storage_key))).scalars())


async def draft(client: httpx.AsyncClient, model_id: str) -> int:
    r = await client.post(f"/api/v1/models/{model_id}/versions", json={})
    assert r.status_code == 201, r.text
    number = int(r.json()["version"])
    for path, data in (("config.json", CONFIG), ("model.safetensors", tiny_safetensors())):
        r = await upload(client, model_id, number, path, data)
        assert r.status_code == 201, r.text
    return number


async def test_finalize_racing_an_upload_never_freezes_unvalidated_files(
    app: Any, client: httpx.AsyncClient
) -> None:
    model = await create_model(client)
    mid = model["id"]
    numbers = [await draft(client, mid) for _ in range(20)]

    async def race(number: int) -> tuple[httpx.Response, httpx.Response]:
        put = upload(client, mid, number, "model-extra.safetensors", CORRUPT_WEIGHTS)
        fin = client.post(f"/api/v1/models/{mid}/versions/{number}/finalize")
        put_r, fin_r = await asyncio.gather(put, fin)
        return put_r, fin_r

    outcomes = await asyncio.gather(*(race(n) for n in numbers))
    for number, (put_r, fin_r) in zip(numbers, outcomes, strict=True):
        version = (await client.get(f"/api/v1/models/{mid}/versions/{number}")).json()
        paths = {f["path"] for f in version["files"]}
        if fin_r.status_code == 200:
            # Frozen first: the upload must have been refused, and nothing corrupt is ready.
            assert put_r.status_code == 409, put_r.text
            assert put_r.json()["code"] == "version_frozen"
            assert version["status"] == "ready"
            assert paths == {"config.json", "model.safetensors"}
            assert fin_r.json()["files"] == version["files"]
        else:
            # The upload landed first: finalize validated it and refused.
            assert put_r.status_code == 201, put_r.text
            assert fin_r.status_code == 422, fin_r.text
            assert fin_r.json()["code"] == "invalid_version"
            assert version["status"] == "draft"
            assert "model-extra.safetensors" in paths
    # Refused uploads removed their bytes: storage holds exactly what rows point at.
    assert await stored_keys(app) == await row_keys(app)


async def test_finalize_racing_a_delete_never_freezes_without_the_file(
    app: Any, client: httpx.AsyncClient
) -> None:
    model = await create_model(client)
    mid = model["id"]
    numbers = [await draft(client, mid) for _ in range(10)]

    async def race(number: int) -> tuple[httpx.Response, httpx.Response]:
        rm = client.delete(f"/api/v1/models/{mid}/versions/{number}/files/model.safetensors")
        fin = client.post(f"/api/v1/models/{mid}/versions/{number}/finalize")
        rm_r, fin_r = await asyncio.gather(rm, fin)
        return rm_r, fin_r

    for number, (rm_r, fin_r) in zip(
        numbers, await asyncio.gather(*(race(n) for n in numbers)), strict=True
    ):
        version = (await client.get(f"/api/v1/models/{mid}/versions/{number}")).json()
        if fin_r.status_code == 200:
            assert rm_r.status_code == 409, rm_r.text
            assert {f["path"] for f in version["files"]} == {"config.json", "model.safetensors"}
        else:
            assert rm_r.status_code == 204, rm_r.text
            assert fin_r.status_code == 422, fin_r.text
            assert version["status"] == "draft"


async def test_concurrent_uploads_of_one_path_leave_one_object(
    app: Any, client: httpx.AsyncClient
) -> None:
    model = await create_model(client)
    mid = model["id"]
    r = await client.post(f"/api/v1/models/{mid}/versions", json={})
    number = r.json()["version"]
    bodies = [f"generation {i}".encode() * 100 for i in range(12)]
    for _ in range(3):
        results = await asyncio.gather(
            *(upload(client, mid, number, "tokenizer.json", body) for body in bodies)
        )
        assert all(r.status_code in (201, 409) for r in results), [r.text for r in results]
        assert any(r.status_code == 201 for r in results)
        version = (await client.get(f"/api/v1/models/{mid}/versions/{number}")).json()
        (only,) = version["files"]
        assert only["sha256"] in {hashlib.sha256(b).hexdigest() for b in bodies}
        keys = await stored_keys(app)
        assert len(keys) == 1
        assert keys == await row_keys(app)


# --- a slow upload holds no database connection ---------------------------------------------


@pytest.fixture(scope="module")
def postgres_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with migrated_database("postgresql", tmp_path_factory, label="pool") as url:
        yield url


@pytest.fixture
async def small_pool_client(postgres_url: str, tmp_path: Path) -> AsyncIterator[Any]:
    from tensor_registry_server.core.db import create_engine, make_sessionmaker, session_scope
    from tensor_registry_server.tokens.service import ensure_bootstrap_admin

    engine = create_engine(postgres_url)
    async with session_scope(make_sessionmaker(engine)) as session:
        await ensure_bootstrap_admin(session, ADMIN_TOKEN)
    await engine.dispose()
    settings = Settings(
        data_dir=tmp_path / "data",
        database={"url": postgres_url, "pool_size": 2},  # type: ignore[arg-type]
        public_url="http://testserver",
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
    )
    (tmp_path / "data").mkdir()
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://testserver",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=60,
        ) as c:
            yield c


async def test_trickling_uploads_do_not_exhaust_the_postgresql_pool(
    small_pool_client: httpx.AsyncClient,
) -> None:
    client = small_pool_client
    model = await create_model(client, name="acme/pool")
    mid = model["id"]
    r = await client.post(f"/api/v1/models/{mid}/versions", json={})
    number = r.json()["version"]
    # pool_size 2 allows 2 + 2 overflow connections: one upload more than that is in flight.
    uploads = 5
    streaming = asyncio.Semaphore(0)
    release = asyncio.Event()
    part = b"x" * 1000

    async def trickle() -> AsyncIterator[bytes]:
        yield part
        # The app asked for more: it has read the first part and waits on the client.
        streaming.release()
        await release.wait()
        yield part

    tasks = [
        asyncio.create_task(
            client.put(
                f"/api/v1/models/{mid}/versions/{number}/files/f{i}.bin",
                content=trickle(),
                headers={
                    "Content-Type": "application/octet-stream",
                    "Content-Length": str(2 * len(part)),
                },
            )
        )
        for i in range(uploads)
    ]
    try:
        for _ in range(uploads):
            await asyncio.wait_for(streaming.acquire(), 30)
        started = time.perf_counter()
        listing = await asyncio.wait_for(client.get("/api/v1/models"), 10)
        assert listing.status_code == 200, listing.text
        assert time.perf_counter() - started < 5
    finally:
        release.set()
        results = await asyncio.gather(*tasks)
    assert [r.status_code for r in results] == [201] * uploads, [r.text for r in results]
    version = (await client.get(f"/api/v1/models/{mid}/versions/{number}")).json()
    assert len(version["files"]) == uploads
