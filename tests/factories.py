"""Keyword-only factories that go through the public API (so they exercise it too)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import httpx

from harness.hf_bytes import tiny_safetensors


async def create_model(
    client: httpx.AsyncClient,
    *,
    name: str = "acme/llama",
    description: str = "",
    tags: list[str] | None = None,
) -> dict[str, Any]:
    r = await client.post(
        "/api/v1/models", json={"name": name, "description": description, "tags": tags or []}
    )
    assert r.status_code == 201, r.text
    return dict(r.json())


async def create_token(
    client: httpx.AsyncClient,
    *,
    scopes: list[str],
    namespaces: list[str] | None = None,
    name: str = "t",
) -> str:
    body: dict[str, Any] = {"name": name, "scopes": scopes}
    if namespaces is not None:
        body["namespaces"] = namespaces
    r = await client.post("/api/v1/tokens", json=body)
    assert r.status_code == 201, r.text
    return str(r.json()["token"])


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def upload(
    client: httpx.AsyncClient, model_id: str, number: int, path: str, data: bytes, **headers: str
) -> httpx.Response:
    return await client.put(
        f"/api/v1/models/{model_id}/versions/{number}/files/{path}",
        content=data,
        headers={"Content-Type": "application/octet-stream", **headers},
    )


async def ready_version(
    client: httpx.AsyncClient, model_id: str, *, config: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A finalized version holding a config and one small valid safetensors file."""
    r = await client.post(f"/api/v1/models/{model_id}/versions", json={})
    assert r.status_code == 201, r.text
    number = r.json()["version"]
    cfg = config or {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    for path, data in (
        ("config.json", json.dumps(cfg).encode()),
        ("model.safetensors", tiny_safetensors()),
    ):
        r = await upload(client, model_id, number, path, data)
        assert r.status_code == 201, r.text
        assert r.json()["sha256"] == hashlib.sha256(data).hexdigest()
    r = await client.post(f"/api/v1/models/{model_id}/versions/{number}/finalize")
    assert r.status_code == 200, r.text
    return dict(r.json())
