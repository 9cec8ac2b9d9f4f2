"""Upload limits through the API: refused before a byte is stored, nothing left behind."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tensor_registry_server.settings import Settings
from tests.conftest import ADMIN_TOKEN
from tests.factories import create_model, upload

LIMIT = 1000


@pytest.fixture
def settings(database_url: str, data_dir: Path) -> Settings:
    return Settings(
        data_dir=data_dir,
        database={"url": database_url},  # type: ignore[arg-type]
        public_url="http://testserver",
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
        storage={"max_upload_bytes": LIMIT},  # type: ignore[arg-type]
    )


async def test_uploads_over_the_limit_are_413_and_store_nothing(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    model = await create_model(client, name="acme/limits")
    r = await client.post(f"/api/v1/models/{model['id']}/versions", json={})
    number = r.json()["version"]
    ok = await upload(client, model["id"], number, "config.json", b"x" * LIMIT)
    assert ok.status_code == 201
    big = await upload(client, model["id"], number, "model.safetensors", b"x" * (LIMIT + 1))
    assert big.status_code == 413
    assert big.json()["code"] == "file_too_large"
    version = (await client.get(f"/api/v1/models/{model['id']}/versions/{number}")).json()
    assert [f["path"] for f in version["files"]] == ["config.json"]
    root = settings.local_storage_root
    assert [p.name for p in root.rglob("*") if p.is_file()] == ["config.json"]
