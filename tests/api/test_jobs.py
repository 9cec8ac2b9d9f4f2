"""GET /api/v1/jobs: the jobs page's list, filtered, paginated and limited to the token's
namespaces, with each job's model name."""

from __future__ import annotations

import json
import secrets
import uuid
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy import delete, update

from harness.hf_bytes import tiny_safetensors
from tensor_registry_server.core.db import session_scope
from tensor_registry_server.rows.artifacts import Artifact
from tensor_registry_server.rows.jobs import Job
from tensor_registry_server.settings import Settings
from tests.factories import auth, create_model, create_token, ready_version
from tests.metrics_traffic import pretend_a_gpu_worker_is_live


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


# ---------------------------------------------------------------------------------------------
# What a job makes: one typed variant, read from its artifact row (issue 27)

VARIANT_KEYS = {"version", "dtype", "format", "tensor_parallel_size", "storage", "encrypt"}


async def _tensorize(client: httpx.AsyncClient, app: FastAPI, name: str) -> dict[str, Any]:
    await pretend_a_gpu_worker_is_live(app)
    model = await create_model(client, name=name)
    await ready_version(client, model["id"])
    await ready_version(client, model["id"])
    r = await client.post(
        f"/api/v1/models/{model['id']}/tensorize",
        json={"version": 1, "dtype": "bfloat16", "format": "vllm", "encrypt": True},
    )
    assert r.status_code == 202, r.text
    return dict(r.json())


async def _job_row(app: FastAPI, job_id: str) -> Job:
    async with session_scope(app.state.sessionmaker) as session:
        job = await session.get(Job, uuid.UUID(job_id))
        assert job is not None
        return job


async def test_a_tensorize_job_answers_its_artifacts_variant_and_stores_no_copy(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    queued = await _tensorize(client, app, "acme/variant-home")
    artifact = (await client.get(f"/api/v1/artifacts/{queued['artifact_id']}")).json()
    expected = {
        "version": artifact["version"],
        "dtype": artifact["dtype"],
        "format": artifact["format"],
        "tensor_parallel_size": artifact["tensor_parallel_size"],
        "encrypted": artifact["encryption"]["enabled"],
        "storage": artifact["storage"],
    }
    assert expected == {
        "version": 1,
        "dtype": "bfloat16",
        "format": "vllm",
        "tensor_parallel_size": 1,
        "encrypted": True,
        "storage": "local",
    }
    job = (await client.get(f"/api/v1/jobs/{queued['id']}")).json()
    listed = (await client.get("/api/v1/jobs", params={"kind": "tensorize"})).json()["items"]
    assert queued["variant"] == job["variant"] == listed[0]["variant"] == expected

    # The row keeps the job's own parameters only; what it makes lives on the artifact row.
    row = await _job_row(app, queued["id"])
    assert set(row.params) == {"source_bytes", "fingerprint"}, row.params
    # Older clients still read the deprecated keys, derived from the artifact row.
    assert {k: job["params"][k] for k in VARIANT_KEYS} == {
        **{k: v for k, v in expected.items() if k != "encrypted"},
        "encrypt": True,
    }
    assert "fingerprint" not in job["params"]


async def test_an_old_job_rows_copy_loses_to_the_artifact_row_and_stands_in_once_it_is_gone(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    queued = await _tensorize(client, app, "acme/old-copy")
    stale = {
        "version": 2,
        "dtype": "float32",
        "format": "hf",
        "tensor_parallel_size": 1,
        "storage": "s3",
        "encrypt": False,
        "source_bytes": 5,
    }
    async with session_scope(app.state.sessionmaker) as session:
        await session.execute(
            update(Job).where(Job.id == uuid.UUID(queued["id"])).values(params=stale)
        )
    job = (await client.get(f"/api/v1/jobs/{queued['id']}")).json()
    assert job["variant"] == queued["variant"]
    assert job["params"]["dtype"] == "bfloat16" and job["params"]["storage"] == "local"
    assert job["params"]["source_bytes"] == 5

    # The artifact row gone, a job from before the change still says what it made.
    async with session_scope(app.state.sessionmaker) as session:
        await session.execute(
            delete(Artifact).where(Artifact.id == uuid.UUID(queued["artifact_id"]))
        )
    job = (await client.get(f"/api/v1/jobs/{queued['id']}")).json()
    assert job["variant"] == {
        "version": 2,
        "dtype": "float32",
        "format": "hf",
        "tensor_parallel_size": 1,
        "encrypted": False,
        "storage": "s3",
    }


async def test_a_cancelled_jobs_variant_is_gone_with_its_artifact_and_imports_have_none(
    client: httpx.AsyncClient, app: FastAPI, settings: Settings
) -> None:
    queued = await _tensorize(client, app, "acme/cancelled")
    r = await client.post(f"/api/v1/jobs/{queued['id']}/cancel")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "cancelled" and r.json()["variant"] is None
    row = await _job_row(app, queued["id"])
    assert not VARIANT_KEYS & set(row.params)

    model = await create_model(client, name="acme/imported")
    job = (await client.get(f"/api/v1/jobs/{await _import_job(client, settings, model)}")).json()
    assert job["variant"] is None
    assert set(job["params"]) == {"source_uri"}
