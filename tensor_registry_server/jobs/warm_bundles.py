"""Every state change of a warm bundle and its job (the one writer; docs/warm-state.md).

    queued job + pending bundle ──claim──▶ running ──publish──▶ succeeded + bundle ready
                                             └──finish────▶ failed | cancelled (bundle fails,
                                                            or is removed when cancelled:
                                                            jobs/lifecycle.py, with its job)

The job's ``artifact_id`` is the ready artifact the bundle warms, which a warm job never
changes (jobs/lifecycle.py leaves ready artifacts alone); its ``params.bundle_id`` names the
bundle it fills.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry_server.auth import Principal
from tensor_registry_server.core.db import new_id, utcnow
from tensor_registry_server.core.invalidation import mark_changed
from tensor_registry_server.jobs.lifecycle import succeed_job
from tensor_registry_server.rows.artifacts import Artifact
from tensor_registry_server.rows.jobs import Job, JobKind
from tensor_registry_server.rows.warm_bundles import BundleStatus, WarmBundle


def bundle_key(artifact: Artifact, bundle_id: uuid.UUID) -> str:
    """Under the artifact's prefix: its bytes go with the artifact's, and the storage sweep
    keeps them while the artifact lives."""
    prefix = (
        artifact.storage_prefix
        if artifact.storage_prefix.endswith("/")
        else (artifact.storage_prefix + "/")
    )
    return f"{prefix}warm/{bundle_id}/warm.tar"


def pending_bundle_and_job(
    principal: Principal,
    artifact: Artifact,
    *,
    queue: str,
    fingerprint: str,
    serve_args: list[str],
    idempotency_key: str | None,
    params: dict[str, Any],
) -> tuple[WarmBundle, Job]:
    """→ queued: a pending bundle of ``artifact`` and the job that will make it."""
    bundle_id = new_id()
    job = Job(
        id=new_id(),
        kind=JobKind.WARM,
        model_id=artifact.model_id,
        version_id=artifact.version_id,
        artifact_id=artifact.id,
        queue=queue,
        params={**params, "bundle_id": str(bundle_id), "serve_args": serve_args},
        idempotency_key=idempotency_key,
        token_id=principal.token_id,
    )
    bundle = WarmBundle(
        id=bundle_id,
        artifact_id=artifact.id,
        model_id=artifact.model_id,
        status=BundleStatus.PENDING,
        fingerprint=fingerprint,
        serve_args=serve_args,
        key={},
        cache={},
        storage=artifact.storage,
        job_id=job.id,
        token_id=principal.token_id,
    )
    return bundle, job


def bundle_id_of(job: Job) -> uuid.UUID | None:
    try:
        return uuid.UUID(str((job.params or {}).get("bundle_id")))
    except ValueError:
        return None


async def mark_running(session: AsyncSession, bundle_id: uuid.UUID) -> WarmBundle | None:
    await session.execute(
        update(WarmBundle)
        .where(
            WarmBundle.id == bundle_id,
            WarmBundle.status.in_((BundleStatus.PENDING, BundleStatus.RUNNING)),
        )
        .values(status=BundleStatus.RUNNING, error=None)
    )
    return await session.get(WarmBundle, bundle_id, populate_existing=True)


async def publish(
    session: AsyncSession,
    job: Job,
    *,
    worker: str,
    fields: dict[str, Any],
    result: dict[str, Any],
) -> bool:
    """One transaction: the job succeeds and its bundle is ready with ``fields`` (storage key,
    size, sha256, key, cache, statement). False when the job is no longer this worker's or a
    cancel came first: the caller removes what it wrote."""
    if not await succeed_job(session, job, worker=worker, result=result):
        return False
    now = utcnow()
    readied = await session.execute(
        update(WarmBundle)
        .where(WarmBundle.id == bundle_id_of(job), WarmBundle.status == BundleStatus.RUNNING)
        .values(status=BundleStatus.READY, ready_at=now, error=None, **fields)
    )
    if readied.rowcount != 1:  # type: ignore[attr-defined]
        raise RuntimeError(f"warm bundle of job {job.id} vanished while its job ran")
    mark_changed(session, job.model_id)  # resolve lists ready bundles
    await session.flush()
    return True
