"""Warm requests on SQLite and PostgreSQL: 409 no_capable_worker without a vLLM worker, one live
bundle per artifact and serve arguments, the allow-list of serve arguments, resolve listing only
ready bundles with a signed URL, cancel removing the pending bundle, and bundles going with
their artifact."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from sqlalchemy import update

from harness.artifacts import make_artifact
from tensor_registry_server.core.db import session_scope, utcnow
from tensor_registry_server.core.invalidation import mark_changed
from tensor_registry_server.jobs.pool.service import heartbeat
from tensor_registry_server.rows.warm_bundles import BundleStatus, WarmBundle
from tensor_registry_server.settings import Settings
from tests.factories import create_model, ready_version

VLLM_CPU_WORKER = {
    "cuda": {"available": False, "device_count": 0, "devices": []},
    "versions": {"vllm": "0.24.0", "torch": "2.13.0"},
    "formats": ["hf", "vllm"],
}


async def _artifact(client: httpx.AsyncClient, settings: Settings, name: str) -> dict[str, Any]:
    model = await create_model(client, name=name)
    await ready_version(client, model["id"])
    made = await make_artifact(settings, model=name, version=1, format="vllm")
    return {"model": model, "artifact_id": str(made.id)}


async def _vllm_worker(app: Any) -> None:
    async with session_scope(app.state.sessionmaker) as session:
        await heartbeat(
            session,
            worker_id="host-a:1",
            hostname="host-a",
            queues=["cpu"],
            capabilities=VLLM_CPU_WORKER,
            started_at=utcnow(),
        )


WARM = {"dtype": "float32", "format": "vllm", "serve_args": ["--max-model-len", "512"]}


async def test_no_worker_with_vllm_is_a_409_naming_it(
    app: Any, client: httpx.AsyncClient, settings: Settings
) -> None:
    made = await _artifact(client, settings, "acme/warm-none")
    url = f"/api/v1/models/{made['model']['id']}/warm"
    r = await client.post(url, json=WARM)
    assert r.status_code == 409, r.text
    assert r.json()["code"] == "no_capable_worker"
    async with session_scope(app.state.sessionmaker) as session:
        await heartbeat(
            session,
            worker_id="host-b:1",
            hostname="host-b",
            queues=["cpu", "gpu"],
            capabilities={"versions": {"torch": "2.13.0"}, "formats": ["hf"]},
            started_at=utcnow(),
        )
    r = await client.post(url, json=WARM)
    assert r.status_code == 409
    assert any("vLLM" in m for m in r.json()["missing"])


async def test_a_warm_job_makes_one_bundle_per_serve_arguments(
    app: Any, client: httpx.AsyncClient, settings: Settings
) -> None:
    made = await _artifact(client, settings, "acme/warm-one")
    await _vllm_worker(app)
    url = f"/api/v1/models/{made['model']['id']}/warm"
    first = await client.post(url, json=WARM)
    assert first.status_code == 202, first.text
    job = first.json()
    assert (job["kind"], job["queue"], job["artifact_id"]) == ("warm", "cpu", made["artifact_id"])
    assert job["params"]["serve_args"] == ["--max-model-len=512"]
    # The same arguments in another spelling: the same bundle and job.
    again = await client.post(url, json={**WARM, "serve_args": ["--max-model-len=512"]})
    assert again.status_code == 202 and again.json()["id"] == job["id"]
    other = await client.post(url, json={**WARM, "serve_args": ["--max-model-len=1024"]})
    assert other.status_code == 202 and other.json()["id"] != job["id"]
    listed = await client.get(f"/api/v1/models/{made['model']['id']}/warm-bundles")
    assert listed.status_code == 200
    bundles = listed.json()["items"]
    assert sorted(b["serve_args"][0] for b in bundles) == [
        "--max-model-len=1024",
        "--max-model-len=512",
    ]
    assert {b["status"] for b in bundles} == {"pending"}
    # Cancelled before a worker took it: its bundle is gone, the artifact stays ready.
    cancel = await client.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert cancel.status_code in (200, 202), cancel.text
    left = (await client.get(f"/api/v1/models/{made['model']['id']}/warm-bundles")).json()
    assert [b["serve_args"] for b in left["items"]] == [["--max-model-len=1024"]]
    artifact = (await client.get(f"/api/v1/artifacts/{made['artifact_id']}")).json()
    assert artifact["status"] == "ready"


async def test_serve_arguments_outside_the_allow_list_and_unknown_variants_are_refused(
    app: Any, client: httpx.AsyncClient, settings: Settings
) -> None:
    made = await _artifact(client, settings, "acme/warm-bad")
    await _vllm_worker(app)
    url = f"/api/v1/models/{made['model']['id']}/warm"
    for args in (["--trust-remote-code"], ["--download-dir=/etc"], ["--max-model-len"]):
        r = await client.post(url, json={**WARM, "serve_args": args})
        assert r.status_code == 422, r.text
        assert r.json()["code"] == "bad_serve_args"
    r = await client.post(url, json={**WARM, "dtype": "bfloat16"})
    assert r.status_code == 404 and r.json()["code"] == "no_matching_artifact"


async def test_resolve_lists_ready_bundles_with_a_signed_url_and_they_go_with_the_artifact(
    app: Any, client: httpx.AsyncClient, settings: Settings
) -> None:
    made = await _artifact(client, settings, "acme/warm-resolve")
    await _vllm_worker(app)
    url = f"/api/v1/models/{made['model']['id']}/warm"
    assert (await client.post(url, json=WARM)).status_code == 202
    resolve = "/api/v1/resolve?model=acme/warm-resolve&ref=1"
    assert (await client.get(resolve)).json()["warm_bundles"] == []  # pending: not offered
    key = f"artifacts/{made['artifact_id']}/warm/x/warm.tar"
    async with session_scope(app.state.sessionmaker) as session:
        await session.execute(
            update(WarmBundle).values(
                status=BundleStatus.READY,
                storage_key=key,
                size=10,
                sha256="a" * 64,
                key={"model": "/m", "serve_args": ["--max-model-len=512"]},
                cache={"dirs": ["torch_compile_cache/0123456789"]},
                statement="{}",
                ready_at=utcnow(),
            )
        )
        mark_changed(session, uuid.UUID(made["model"]["id"]))
    # Another ttl: not the answer memoized for this second (tensor_registry_server/resolve/memo.py).
    answer = (await client.get(resolve + "&ttl=601")).json()
    [listed] = answer["warm_bundles"]
    assert listed["url"].split("?")[0].endswith(f"/api/v1/blobs/local/{key}")
    assert listed["cache"]["dirs"] == ["torch_compile_cache/0123456789"]
    assert (await client.delete(f"/api/v1/artifacts/{made['artifact_id']}")).status_code == 204
    left = (await client.get(f"/api/v1/models/{made['model']['id']}/warm-bundles")).json()
    assert left["items"] == []
