"""Traffic that moves every operator metric, and a parsed /metrics scrape.

Shared by tests/api/test_metrics.py (each figure) and tests/deploy/test_monitoring.py (every
metric the dashboard and the alert rules name is on a real scrape). The worker's part is played
on the job row with the lifecycle functions workers call (claim, finish), so no worker process
is needed; a heartbeat row stands in for a live GPU worker.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from harness.artifacts import make_artifact
from tensor_registry_server.core.db import session_scope, utcnow
from tensor_registry_server.jobs import lifecycle as jobs
from tensor_registry_server.jobs.pool import service as worker_pool
from tensor_registry_server.rows.jobs import Job, JobStatus
from tensor_registry_server.settings import Settings
from tensor_registry_server.storage import signing
from tests.factories import create_model, ready_version

FAKE_WORKER = "metrics-tests-fake-gpu-worker"
GPU_CAPABILITIES: dict[str, Any] = {
    "cuda": {"available": True, "device_count": 1, "devices": [{"total_memory": 80 * 1024**3}]},
    "cpu": {"memory_total": 64 * 1024**3},
    "versions": {"vllm": "0.24.0"},
    "formats": ["hf", "vllm"],
    "encryption": True,
}


@dataclass
class Scrape:
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]
    text: str

    def value(self, name: str, **labels: str) -> float:
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def names(self) -> set[str]:
        return {name for name, _ in self.samples}


async def scrape(client: httpx.AsyncClient) -> Scrape:
    r = await client.get("/metrics", headers={"Authorization": ""})
    assert r.status_code == 200, r.text
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return Scrape(samples, r.text)


async def pretend_a_gpu_worker_is_live(app: FastAPI) -> None:
    async with session_scope(app.state.sessionmaker) as session:
        await worker_pool.heartbeat(
            session,
            worker_id=FAKE_WORKER,
            hostname="nowhere",
            queues=["gpu", "cpu"],
            capabilities=GPU_CAPABILITIES,
            started_at=utcnow(),
        )


async def queue_tensorize(client: httpx.AsyncClient, model_id: str, dtype: str) -> uuid.UUID:
    r = await client.post(f"/api/v1/models/{model_id}/tensorize", json={"dtype": dtype})
    assert r.status_code == 202, r.text
    return uuid.UUID(r.json()["id"])


async def _never_abandoned(_: str | None) -> bool:
    return False


async def claim(app: FastAPI, job_id: uuid.UUID) -> None:
    async with session_scope(app.state.sessionmaker) as session:
        job = await jobs.claim_job(
            session, job_id, worker=FAKE_WORKER, abandoned=_never_abandoned, max_attempts=5
        )
        assert job is not None and job.status == JobStatus.RUNNING
        job.bytes_done = 4096


async def play_worker(
    app: FastAPI, job_id: uuid.UUID, *, status: str, result: dict[str, Any] | None = None
) -> None:
    """Claim the job as the fake worker, then give it its final ``status``."""
    await claim(app, job_id)
    async with session_scope(app.state.sessionmaker) as session:
        job = await session.get(Job, job_id)
        assert job is not None
        assert await jobs.finish_job(session, job, worker=FAKE_WORKER, status=status, result=result)


async def drive_traffic(client: httpx.AsyncClient, app: FastAPI, settings: Settings) -> None:
    """A bit of everything: upload, resolve with a key, downloads, refused signed URLs, jobs
    queued, running and finished, and a live worker."""
    await scrape(client)  # the first scrape starts the finished-jobs count
    model = await create_model(client, name="acme/metrics")
    await ready_version(client, model["id"])
    made = await make_artifact(settings, model="acme/metrics", version=1, encrypted=True)
    await pretend_a_gpu_worker_is_live(app)
    # Limits set on the namespace: the limit gauges are on the scrape too (docs/limits.md).
    limits = {"storage_bytes": 10**12, "upload_bytes": 10**11, "concurrent_jobs": 64}
    r = await client.put("/api/v1/namespaces/acme/limits", json=limits)
    assert r.status_code == 200, r.text

    r = await client.get("/api/v1/resolve", params={"model": "acme/metrics"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["encryption_key_url"]
    for url in (body["encryption_key_url"], body["tensorizer_uri"]):
        assert (await client.get(url, headers={"Authorization": ""})).status_code == 200
    secret = settings.signing_key_bytes()
    expired = signing.blob_url(
        "http://testserver", secret, storage="local", key=f"artifacts/{made.id}/x", ttl=-5
    )
    assert (await client.get(expired)).status_code == 403
    forged = signing.key_url("http://testserver", secret, artifact_id=str(made.id), ttl=60)
    assert (await client.get(forged[:-3] + "AAA")).status_code == 403

    succeeded = await queue_tensorize(client, model["id"], "float16")
    await play_worker(app, succeeded, status=JobStatus.SUCCEEDED, result={"bytes_per_second": 5e8})
    failed = await queue_tensorize(client, model["id"], "bfloat16")
    await play_worker(app, failed, status=JobStatus.FAILED)
    running = await queue_tensorize(client, model["id"], "float32")
    await claim(app, running)
    r = await client.post(
        f"/api/v1/models/{model['id']}/tensorize", json={"dtype": "float16", "encrypt": True}
    )
    assert r.status_code == 202, r.text  # stays queued
