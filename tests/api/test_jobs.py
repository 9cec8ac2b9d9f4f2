"""GET /api/v1/jobs: the jobs page's list, filtered, paginated and limited to the token's
namespaces, with each job's model name."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import httpx

from app.settings import Settings
from harness.hf_bytes import tiny_safetensors
from tests.factories import auth, create_model, create_token


def _source(settings: Settings, name: str) -> str:
    directory = settings.data_dir.parent / "imports" / name
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (directory / "model.safetensors").write_bytes(tiny_safetensors())
    return Path(directory).as_uri() + "/"


async def _import_job(client: httpx.AsyncClient, settings: Settings, model: dict) -> str:
    source = _source(settings, secrets.token_hex(4))
    r = await client.post(f"/api/v1/models/{model['id']}/versions", json={"source_uri": source})
    assert r.status_code in (201, 202), r.text
    return str(r.json()["job_id"])


async def test_jobs_list_filters_pages_and_names_the_model(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    acme = await create_model(client, name="acme/llama")
    other = await create_model(client, name="other/mistral")
    acme_jobs = [await _import_job(client, settings, acme) for _ in range(3)]
    other_job = await _import_job(client, settings, other)
    r = await client.post(f"/api/v1/jobs/{acme_jobs[0]}/cancel")
    assert r.status_code == 200, r.text

    everything = (await client.get("/api/v1/jobs")).json()
    assert [j["id"] for j in everything["items"]] == [other_job, *reversed(acme_jobs)]
    assert {j["model_name"] for j in everything["items"]} == {"acme/llama", "other/mistral"}
    assert everything["next_cursor"] is None

    first = (await client.get("/api/v1/jobs", params={"limit": 2})).json()
    second = (
        await client.get("/api/v1/jobs", params={"limit": 2, "cursor": first["next_cursor"]})
    ).json()
    assert [j["id"] for j in first["items"] + second["items"]] == [
        j["id"] for j in everything["items"]
    ]

    cancelled = (await client.get("/api/v1/jobs", params={"status": "cancelled"})).json()
    assert [j["id"] for j in cancelled["items"]] == [acme_jobs[0]]
    imports = (await client.get("/api/v1/jobs", params={"kind": "import"})).json()["items"]
    assert len(imports) == 4
    assert (await client.get("/api/v1/jobs", params={"kind": "tensorize"})).json()["items"] == []
    by_model = (await client.get("/api/v1/jobs", params={"model_id": other["id"]})).json()
    assert [j["id"] for j in by_model["items"]] == [other_job]

    # A token limited to a namespace sees only that namespace's jobs.
    token = await create_token(client, scopes=["models:read"], namespaces=["other"])
    limited = await client.get("/api/v1/jobs", headers=auth(token))
    assert [j["id"] for j in limited.json()["items"]] == [other_job]


async def test_jobs_list_refuses_unknown_filters_and_bounds_limit(
    client: httpx.AsyncClient,
) -> None:
    for params in ({"status": "done"}, {"kind": "build"}, {"limit": 501}, {"limit": 0}):
        r = await client.get("/api/v1/jobs", params=params)
        assert r.status_code == 422, params
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["code"] == "validation_error"
    r = await client.get("/api/v1/jobs", params={"cursor": "not-a-cursor"})
    assert r.status_code in (400, 422) and r.json()["code"]
    anon = await client.get("/api/v1/jobs", headers={"Authorization": ""})
    assert anon.status_code == 401
