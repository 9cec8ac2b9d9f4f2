"""Routing a job with no live worker at all: a 409 that says what is missing."""

from __future__ import annotations

import httpx

from tests.factories import create_model, ready_version


async def test_tensorize_without_any_live_worker_names_what_is_missing(
    client: httpx.AsyncClient,
) -> None:
    model = await create_model(client, name="acme/no-worker")
    await ready_version(client, model["id"])
    for body in (
        {"dtype": "float16", "format": "hf"},
        {"dtype": "float16", "format": "hf", "encrypt": True},
        {"dtype": "float16", "format": "vllm"},
    ):
        r = await client.post(f"/api/v1/models/{model['id']}/tensorize", json=body)
        assert r.status_code == 409, r.text
        problem = r.json()
        assert problem["code"] == "no_capable_worker"
        assert problem["live_workers"] == 0
        assert problem["missing"] and all(problem["missing"])
        assert "it needs ." not in problem["detail"]
        assert "none has sent a heartbeat" in problem["detail"]
