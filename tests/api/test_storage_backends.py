"""Only configured storage backends are accepted (issue 26 §7.3): naming another on tensorize,
register or a new version answers 422 `storage_not_configured` and creates nothing; nothing
falls back to a default address; GET /api/v1/storage says what is configured (the UI reads it).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import redis
from fastapi import FastAPI
from pydantic import ValidationError

from tensor_registry_server.settings import Settings
from tests.factories import auth, create_model, create_token, ready_version
from tests.metrics_traffic import pretend_a_gpu_worker_is_live


async def test_the_embedded_default_offers_local_only(client: httpx.AsyncClient) -> None:
    r = await client.get("/api/v1/storage")
    assert r.status_code == 200
    assert r.json() == {"default": "local", "configured": ["local"]}
    reader = await create_token(client, scopes=["models:read"])
    assert (await client.get("/api/v1/storage", headers=auth(reader))).status_code == 200
    assert (await client.get("/api/v1/storage", headers={"Authorization": ""})).status_code == 401


@pytest.mark.parametrize("backend", ["s3", "redis"])
async def test_an_unconfigured_backend_is_refused_before_anything_is_made(
    app: FastAPI, client: httpx.AsyncClient, backend: str
) -> None:
    model = await create_model(client, name=f"acme/{backend}")
    await ready_version(client, model["id"])
    await pretend_a_gpu_worker_is_live(app)
    # Redis answers on 127.0.0.1:6379 here: the old default address. Nothing may land there.
    local_redis = redis.Redis.from_url("redis://127.0.0.1:6379/1")
    before = set(local_redis.scan_iter("tensor-registry/*"))
    attempts = [
        ("tensorize", {"dtype": "float16", "format": "hf", "storage": backend}),
        (
            "artifacts",
            {
                "version": 1,
                "dtype": "float16",
                "format": "hf",
                "tensor_parallel_size": 1,
                "uri": "https://example.invalid/m/model.tensors",
                "storage": backend,
            },
        ),
        ("versions", {"storage": backend}),
    ]
    for route, body in attempts:
        r = await client.post(f"/api/v1/models/{model['id']}/{route}", json=body)
        assert r.status_code == 422, (route, r.text)
        assert r.json()["code"] == "storage_not_configured", r.text
        assert r.json()["configured"] == ["local"]
    assert (await client.get("/api/v1/jobs")).json()["items"] == []
    assert (await client.get(f"/api/v1/models/{model['id']}/artifacts")).json()["items"] == []
    versions = (await client.get(f"/api/v1/models/{model['id']}/versions")).json()["items"]
    assert [v["version"] for v in versions] == [1]
    assert set(local_redis.scan_iter("tensor-registry/*")) == before
    local_redis.close()


def test_redis_storage_has_no_default_address(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"storage\.redis\.url is required"):
        Settings(data_dir=tmp_path, storage={"default_backend": "redis"})  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=r"storage\.redis\.url is required"):
        Settings(data_dir=tmp_path, storage={"backends": ["local", "redis"]})  # type: ignore[arg-type]


def test_configured_backends_follow_the_settings(tmp_path: Path) -> None:
    def configured(**storage: object) -> list[str]:
        return Settings(data_dir=tmp_path, storage=storage).storage.configured  # type: ignore[arg-type]

    assert configured() == ["local"]
    assert configured(s3={"endpoint_url": "http://127.0.0.1:9"}) == ["local", "s3"]
    assert configured(redis={"url": "redis://127.0.0.1:9/0"}) == ["local", "redis"]
    assert configured(default_backend="s3") == ["s3"]
    assert configured(default_backend="s3", local_root=str(tmp_path)) == ["local", "s3"]
    assert configured(backends=["s3"], s3={"endpoint_url": "http://127.0.0.1:9"}) == [
        "local",
        "s3",
    ]
