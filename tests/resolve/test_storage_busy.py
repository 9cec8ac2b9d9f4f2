"""A busy store is not a down store (issue 33 §6): under a fleet's pulls the replica's storage
probe timed out while the store was streaming gigabytes, and every resolve got 503
``storage_unavailable``. Here the probe is a stand-in that never answers in time while real
reads of the same store succeed: resolve keeps answering. A store that answers neither probes
nor reads is still called down (503), and one slow probe alone never is."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.artifacts import make_artifact
from tensor_registry_server.settings import Settings
from tensor_registry_server.storage.registry import StorageRegistry
from tests.conftest import app_and_client
from tests.factories import create_model, ready_version


class SlowProbe:
    """A storage check that takes far longer than the probe's timeout (a store under load)."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1
        await asyncio.sleep(30)


def _fast_checks(settings: Settings) -> Settings:
    storage = settings.storage.model_copy(
        update={"check_timeout_seconds": 0.05, "recheck_seconds": 2.0}
    )
    return settings.model_copy(update={"storage": storage})


async def test_resolves_keep_answering_while_the_store_serves_but_its_probe_times_out(
    settings: Settings,
) -> None:
    configured = _fast_checks(settings)
    async with app_and_client(configured) as (app, client):
        model = await create_model(client, name="acme/busy")
        await ready_version(client, model["id"])
        await make_artifact(configured, model="acme/busy", version=1)

        async def resolve() -> httpx.Response:
            return await client.get("/api/v1/resolve", params={"model": "acme/busy"})

        first = await resolve()
        assert first.status_code == 200, first.text
        url = next(f["url"] for f in first.json()["files"] if f["path"] == "model.tensors")
        probe = SlowProbe()
        storages: Any = app.state.storages  # type: ignore[attr-defined]
        storages.get("local").check = probe

        # The fleet pulls (each pull a real read that succeeds) while every probe times out.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        answered = 0
        while probe.calls < 3 or answered < 20:
            assert loop.time() < deadline, f"{probe.calls} probes, {answered} resolves"
            pulled = await client.get(url, headers={"Range": "bytes=0-1023"})
            assert pulled.status_code == 206
            answer = await resolve()
            assert answer.status_code == 200, (probe.calls, answer.text)
            answered += 1
            await asyncio.sleep(0.02)

        # The pulls stop and the store still answers no probe: now it is down.
        down = await _poll(resolve, lambda r: r.status_code == 503, timeout=30)
        assert down.json()["code"] == "storage_unavailable"


async def _poll(call: Any, ready: Any, *, timeout: float) -> httpx.Response:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        answer = await call()
        if ready(answer) or loop.time() > deadline:
            assert ready(answer), answer.text
            return answer
        await asyncio.sleep(0.02)


def _registry(tmp_path: Path) -> StorageRegistry:
    settings = Settings(
        data_dir=tmp_path,
        database={"url": f"sqlite+aiosqlite:///{tmp_path / 'r.db'}"},  # type: ignore[arg-type]
        storage={"check_timeout_seconds": 0.05, "recheck_seconds": 30},  # type: ignore[arg-type]
        security={},  # type: ignore[arg-type]
    )
    return StorageRegistry(settings)


async def test_one_slow_probe_is_not_an_outage_two_are(tmp_path: Path) -> None:
    storages = _registry(tmp_path)
    backend: Any = storages.get("local")
    backend.check = SlowProbe()
    await storages.check("local")  # a timeout, forgiven: the first in a row
    storages.require_up("local")
    with pytest.raises(TimeoutError):
        await storages.check("local")  # the second in a row, nothing served: down
    with pytest.raises(Exception, match="unavailable") as refused:
        storages.require_up("local")
    assert getattr(refused.value, "code", None) == "storage_unavailable"
    # A real read succeeds: the store is up again whatever the probe said.
    storages.note_served("local")
    storages.require_up("local")
    await storages.close()


async def test_a_probe_error_with_nothing_served_is_down_at_once(tmp_path: Path) -> None:
    storages = _registry(tmp_path)
    backend: Any = storages.get("local")

    async def refused() -> None:
        raise ConnectionRefusedError

    backend.check = refused
    with pytest.raises(ConnectionRefusedError):
        await storages.check("local")
    with pytest.raises(Exception, match="unavailable"):
        storages.require_up("local")
    await storages.close()
