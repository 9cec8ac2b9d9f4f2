"""Jobs for the API: reading, listing, idempotency lookups, cancelling, and the figures
/metrics reads. Every state change of a job (and of the artifact or version it drives) is
made by tensor_registry_server.jobs.lifecycle.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry_server.audit.service import record
from tensor_registry_server.auth import Principal
from tensor_registry_server.core.errors import Conflict, NotFound
from tensor_registry_server.core.pagination import Page, paginate
from tensor_registry_server.jobs import lifecycle
from tensor_registry_server.rows.artifacts import Artifact
from tensor_registry_server.rows.jobs import Job, JobKind, JobStatus
from tensor_registry_server.rows.models import Model

log = logging.getLogger("tensor_registry.jobs")

# ---------------------------------------------------------------------------------------------
# API side


async def get_job(session: AsyncSession, principal: Principal, job_id: uuid.UUID) -> Job:
    job = await session.get(Job, job_id)
    if job is None:
        raise NotFound(f"No job with id {job_id}.", code="job_not_found")
    await _require_job_namespace(session, principal, job)
    return job


async def _require_job_namespace(session: AsyncSession, principal: Principal, job: Job) -> None:
    if principal.namespaces is None:
        return
    namespace = None
    if job.model_id is not None:
        namespace = await session.scalar(select(Model.namespace).where(Model.id == job.model_id))
    if namespace is None or not principal.can_access_namespace(namespace):
        # Same answer as a missing job: a limited token learns nothing about other namespaces.
        raise NotFound(f"No job with id {job.id}.", code="job_not_found")


async def list_jobs(
    session: AsyncSession,
    principal: Principal,
    *,
    model_id: uuid.UUID | None,
    status: str | None,
    kind: str | None,
    cursor: str | None,
    limit: int,
) -> Page[Job]:
    stmt = select(Job)
    if principal.namespaces is not None:
        stmt = stmt.where(
            Job.model_id.in_(
                select(Model.id).where(Model.namespace.in_(sorted(principal.namespaces)))
            )
        )
    if model_id is not None:
        stmt = stmt.where(Job.model_id == model_id)
    if status is not None:
        stmt = stmt.where(Job.status == status)
    if kind is not None:
        stmt = stmt.where(Job.kind == kind)
    return await paginate(
        session, stmt, keys=[Job.created_at, Job.id], cursor=cursor, limit=limit, descending=True
    )


async def model_names(session: AsyncSession, jobs: list[Job]) -> dict[uuid.UUID, str]:
    """Names of the jobs' models in one query, for lists (no lookup per row)."""
    ids = {j.model_id for j in jobs if j.model_id is not None}
    if not ids:
        return {}
    rows = await session.execute(select(Model.id, Model.name).where(Model.id.in_(ids)))
    return {model_id: name for model_id, name in rows}


async def job_artifacts(session: AsyncSession, jobs: list[Job]) -> dict[uuid.UUID, Artifact]:
    """The artifact rows the jobs make, in one query (what a job makes is its artifact's
    variant; a deleted artifact, or a cancelled job's, is missing from the answer)."""
    ids = {j.artifact_id for j in jobs if j.artifact_id is not None}
    if not ids:
        return {}
    rows = await session.execute(select(Artifact).where(Artifact.id.in_(ids)))
    return {artifact.id: artifact for artifact in rows.scalars()}


async def find_idempotent_job(session: AsyncSession, principal: Principal, key: str) -> Job | None:
    return (
        await session.execute(
            select(Job).where(Job.token_id == principal.token_id, Job.idempotency_key == key)
        )
    ).scalar_one_or_none()


async def cancel_job(session: AsyncSession, principal: Principal, job_id: uuid.UUID) -> Job:
    """Queued: cancelled at once. Running: ``cancel_requested``; the worker stops at its next
    progress check, removes what it wrote and marks the job cancelled."""
    job = await get_job(session, principal, job_id)
    principal.require_scope(
        "tensorize" if job.kind in (JobKind.TENSORIZE, JobKind.WARM) else "models:write"
    )
    if job.status == JobStatus.CANCELLED:
        return job
    if job.status in (JobStatus.SUCCEEDED, JobStatus.FAILED):
        raise Conflict(
            f"Job {job.id} already {job.status}; there is nothing to cancel.",
            code="job_finished",
            status_now=job.status,
        )
    await lifecycle.cancel(session, job)
    record(
        session,
        action="job.cancel",
        actor=principal,
        target_type="job",
        target_id=job.id,
        kind=job.kind,
    )
    await session.flush()
    await session.refresh(job)
    return job


# ---------------------------------------------------------------------------------------------
# Figures for /metrics (tensor_registry_server.system.metrics): indexed reads, bounded per scrape


async def active_job_counts(
    session: AsyncSession,
) -> list[tuple[str, str, str, int, datetime | None]]:
    """(kind, status, queue, count, oldest created_at) of the queued and running jobs."""
    stmt = (
        select(Job.kind, Job.status, Job.queue, func.count(), func.min(Job.created_at))
        .where(Job.status.in_((JobStatus.QUEUED, JobStatus.RUNNING)))
        .group_by(Job.kind, Job.status, Job.queue)
    )
    return [tuple(row) for row in (await session.execute(stmt)).all()]  # type: ignore[misc]


async def running_job_ages(session: AsyncSession) -> list[tuple[str, datetime | None, datetime]]:
    """(kind, earliest start, earliest last change) of the running jobs, per kind: how long the
    oldest has run, and how long the stalest has gone without progress (every progress write
    moves ``updated_at``)."""
    stmt = (
        select(
            Job.kind,
            func.min(func.coalesce(Job.started_at, Job.created_at)),
            func.min(Job.updated_at),
        )
        .where(Job.status == JobStatus.RUNNING)
        .group_by(Job.kind)
    )
    return [tuple(row) for row in (await session.execute(stmt)).all()]  # type: ignore[misc]


@dataclass(frozen=True)
class FinishedJob:
    id: uuid.UUID
    kind: str
    status: str
    started_at: datetime | None
    finished_at: datetime
    bytes_done: int
    result: dict[str, Any]

    @property
    def seconds(self) -> float | None:
        if self.started_at is None:
            return None
        return max((self.finished_at - self.started_at).total_seconds(), 0.0)

    @property
    def bytes_per_second(self) -> float | None:
        """The job's own figure when it reports one (tensorize: the serialize stage), else the
        bytes it moved over its wall time; None for jobs that moved no bytes."""
        reported = (self.result or {}).get("bytes_per_second")
        if isinstance(reported, int | float) and reported > 0:
            return float(reported)
        seconds = self.seconds
        if self.bytes_done > 0 and seconds:
            return self.bytes_done / seconds
        return None


async def jobs_finished_since(
    session: AsyncSession, since: datetime, *, limit: int = 5000
) -> list[FinishedJob]:
    """Jobs in a final state with ``finished_at >= since``, oldest first, at most ``limit``."""
    stmt = (
        select(
            Job.id,
            Job.kind,
            Job.status,
            Job.started_at,
            Job.finished_at,
            Job.bytes_done,
            Job.result,
        )
        .where(Job.finished_at >= since, Job.status.in_(JobStatus.FINAL))
        .order_by(Job.finished_at)
        .limit(limit)
    )
    return [FinishedJob(*row) for row in (await session.execute(stmt)).all()]
