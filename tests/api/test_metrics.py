"""/metrics carries what an operator pages on: jobs, queues, workers, resolves and key issues per
model, signed-URL failures, upload and download bytes."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import httpx
from fastapi import FastAPI
from sqlalchemy import update

from harness.artifacts import make_artifact
from harness.serve_process import free_port
from tensor_registry_server.core.db import session_scope, utcnow
from tensor_registry_server.core.metrics import ALL_MODELS, OTHER_MODEL, BoundedLabels
from tensor_registry_server.jobs.pool.service import opaque_worker_id
from tensor_registry_server.main import create_app
from tensor_registry_server.rows.jobs import Job
from tensor_registry_server.rows.worker_pool import WorkerRecord
from tensor_registry_server.settings import Settings
from tensor_registry_server.tokens.service import ensure_bootstrap_admin
from tests.conftest import ADMIN_TOKEN, reset_database
from tests.factories import create_model, ready_version, upload
from tests.metrics_traffic import (
    FAKE_WORKER,
    claim,
    drive_traffic,
    play_worker,
    pretend_a_gpu_worker_is_live,
    queue_tensorize,
    scrape,
)


async def test_job_queue_and_worker_figures_come_from_the_database(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    empty = await scrape(client)
    assert empty.value("tensor_registry_metrics_database_up") == 1
    for kind in ("tensorize", "import", "verify"):
        for state in ("queued", "running"):
            assert ("tensor_registry_jobs", frozenset({("kind", kind), ("state", state)})) in (
                empty.samples
            )
    assert empty.value("tensor_registry_job_queue_depth", queue="gpu") == 0
    assert empty.value("tensor_registry_live_workers", capability="any") == 0

    model = await create_model(client, name="acme/jobs")
    await ready_version(client, model["id"])
    await pretend_a_gpu_worker_is_live(app)
    first = await queue_tensorize(client, model["id"], "float16")
    second = await queue_tensorize(client, model["id"], "bfloat16")
    now = await scrape(client)
    assert now.value("tensor_registry_jobs", kind="tensorize", state="queued") == 2
    assert now.value("tensor_registry_job_queue_depth", queue="gpu") == 2
    assert now.value("tensor_registry_job_oldest_queued_seconds", queue="gpu") > 0
    for capability in ("any", "gpu_queue", "cpu_queue", "cuda", "vllm", "encryption"):
        assert now.value("tensor_registry_live_workers", capability=capability) == 1, capability

    await claim(app, first)
    now = await scrape(client)
    assert now.value("tensor_registry_jobs", kind="tensorize", state="running") == 1
    assert now.value("tensor_registry_jobs", kind="tensorize", state="queued") == 1

    before = now
    await play_worker(app, second, status="succeeded", result={"bytes_per_second": 3e8})
    after = await scrape(client)
    labels = {"kind": "tensorize", "state": "succeeded"}
    finished = "tensor_registry_jobs_finished_total"
    assert after.value(finished, **labels) == before.value(finished, **labels) + 1
    duration = "tensor_registry_job_duration_seconds_count"
    assert after.value(duration, **labels) == before.value(duration, **labels) + 1
    rate = "tensor_registry_job_throughput_bytes_per_second"
    assert after.value(f"{rate}_count", kind="tensorize") == (
        before.value(f"{rate}_count", kind="tensorize") + 1
    )
    assert after.value(f"{rate}_sum", kind="tensorize") == (
        before.value(f"{rate}_sum", kind="tensorize") + 3e8
    )
    assert after.value("tensor_registry_job_queue_depth", queue="gpu") == 0
    # A finished job is counted once, however often it is scraped.
    again = await scrape(client)
    assert again.value(finished, **labels) == after.value(finished, **labels)
    assert again.value(duration, **labels) == after.value(duration, **labels)


async def _resolve_three_times(client: httpx.AsyncClient, settings: Settings, name: str) -> None:
    model = await create_model(client, name=name)
    await ready_version(client, model["id"])
    await make_artifact(settings, model=name, version=1, encrypted=True)
    for _ in range(3):
        r = await client.get("/api/v1/resolve", params={"model": name})
        assert r.status_code == 200 and r.json()["encryption_key_url"]


async def test_metrics_show_no_model_names_by_default(
    client: httpx.AsyncClient, anon: httpx.AsyncClient, settings: Settings
) -> None:
    """The attacker's view: /metrics needs no token, so it names no model unless an operator
    opts in (metrics.model_labels); resolves and key issues still count, as model="all"."""
    assert settings.metrics.model_labels is False
    before = await scrape(anon)
    await _resolve_three_times(client, settings, "other/secret-project")
    after = await scrape(anon)
    assert "secret-project" not in after.text
    resolves, keys = "tensor_registry_resolves_total", "tensor_registry_key_issues_total"
    assert after.value(resolves, model=ALL_MODELS, cache="off") == (
        before.value(resolves, model=ALL_MODELS, cache="off") + 3
    )
    assert after.value(keys, model=ALL_MODELS) == before.value(keys, model=ALL_MODELS) + 3


async def test_resolves_and_key_issues_are_counted_per_model_when_opted_in(
    data_dir: Path, database_url: str
) -> None:
    settings = Settings(
        data_dir=data_dir,
        database={"url": database_url},  # type: ignore[arg-type]
        public_url="http://testserver",
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
        metrics={"model_labels": True},  # type: ignore[arg-type]
    )
    await reset_database(database_url)
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        async with session_scope(application.state.sessionmaker) as session:
            await ensure_bootstrap_admin(session, ADMIN_TOKEN)
        transport = httpx.ASGITransport(app=application)
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://testserver", headers=headers
        ) as client:
            before = await scrape(client)
            await _resolve_three_times(client, settings, "acme/counted")
            r = await client.get("/api/v1/resolve", params={"model": "acme/nope"})
            assert r.status_code == 404
            after = await scrape(client)
    resolves = "tensor_registry_resolves_total"
    assert after.value(resolves, model="acme/counted", cache="off") == (
        before.value(resolves, model="acme/counted", cache="off") + 3
    )
    assert not any(("model", "acme/nope") in labels for _, labels in after.samples)
    keys = "tensor_registry_key_issues_total"
    assert after.value(keys, model="acme/counted") == before.value(keys, model="acme/counted") + 3


def test_model_labels_are_bounded() -> None:
    label = BoundedLabels(2)
    assert [label(n) for n in ("a/1", "a/2", "a/3", "a/1", "a/4")] == [
        "a/1",
        "a/2",
        OTHER_MODEL,
        "a/1",
        OTHER_MODEL,
    ]


async def test_signed_url_failures_upload_and_download_bytes(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings
) -> None:
    before = await scrape(client)
    await drive_traffic(client, app, settings)
    after = await scrape(client)
    failures = "tensor_registry_signed_url_failures_total"
    assert after.value(failures, purpose="blob", reason="expired") == (
        before.value(failures, purpose="blob", reason="expired") + 1
    )
    assert after.value(failures, purpose="key", reason="invalid") == (
        before.value(failures, purpose="key", reason="invalid") + 1
    )
    served = "tensor_registry_blob_bytes_served_total"
    assert after.value(served, storage="local") > before.value(served, storage="local")

    model = await create_model(client, name="acme/uploads")
    r = await client.post(f"/api/v1/models/{model['id']}/versions", json={})
    middle = await scrape(client)
    data = b"x" * 12345
    uploaded_file = await upload(client, model["id"], r.json()["version"], "a.bin", data)
    assert uploaded_file.status_code == 201
    last = await scrape(client)
    uploaded = "tensor_registry_upload_bytes_total"
    assert last.value(uploaded) == middle.value(uploaded) + len(data)


async def test_metrics_still_answer_when_the_database_is_down(data_dir: Path) -> None:
    closed = free_port()  # nothing listens there: connection refused at once
    url = f"postgresql+asyncpg://postgres@127.0.0.1:{closed}/none"
    settings = Settings(data_dir=data_dir, database={"url": url})  # type: ignore[arg-type]
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            scraped = await scrape(c)
    assert scraped.value("tensor_registry_metrics_database_up") == 0
    assert "tensor_registry_http_requests_total" in scraped.text


async def test_hung_jobs_and_silent_workers_can_be_alerted_on(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    """Age of the oldest running job and of the stalest progress, per-worker heartbeat age
    (by opaque id: /metrics needs no token), latency buckets that reach hours."""
    idle = await scrape(client)
    assert idle.value("tensor_registry_job_oldest_running_seconds", kind="tensorize") == 0
    assert idle.value("tensor_registry_job_progress_age_seconds", kind="tensorize") == 0
    model = await create_model(client, name="acme/hung")
    await ready_version(client, model["id"])
    await pretend_a_gpu_worker_is_live(app)
    job_id = await queue_tensorize(client, model["id"], "float16")
    await claim(app, job_id)
    now = utcnow()
    async with session_scope(app.state.sessionmaker) as session:
        # The clock, moved: started 10 minutes ago, last progress 5 minutes ago; the worker's
        # last heartbeat 90 s ago.
        await session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(
                started_at=now - timedelta(seconds=600), updated_at=now - timedelta(seconds=300)
            )
        )
        await session.execute(
            update(WorkerRecord)
            .where(WorkerRecord.id == FAKE_WORKER)
            .values(last_seen_at=now - timedelta(seconds=90))
        )
    scraped = await scrape(client)
    oldest = scraped.value("tensor_registry_job_oldest_running_seconds", kind="tensorize")
    stalest = scraped.value("tensor_registry_job_progress_age_seconds", kind="tensorize")
    assert 600 <= oldest < 660 and 300 <= stalest < 360, (oldest, stalest)
    worker = opaque_worker_id(FAKE_WORKER)
    assert 90 <= scraped.value("tensor_registry_worker_heartbeat_age_seconds", worker=worker) < 150
    assert FAKE_WORKER not in scraped.text and "nowhere" not in scraped.text
    buckets = {
        float(dict(labels)["le"])
        for name, labels in scraped.samples
        if name == "tensor_registry_http_request_seconds_bucket"
    }
    assert max(b for b in buckets if b != float("inf")) >= 4 * 3600
