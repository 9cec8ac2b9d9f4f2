"""Jobs: reading and cancelling (API), and the state changes workers make (claim, progress,
finish, retry), plus the sweep that recovers jobs whose worker died.

Every state change a worker makes is a compare-and-set on the row (``WHERE status = … AND
worker = …``), so two deliveries of the same message, a sweep and a worker, or a cancel and a
worker can race without either overwriting the other: the loser sees ``rowcount == 0``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.artifacts.models import Artifact, ArtifactStatus
from app.audit.service import record
from app.auth import Principal
from app.core.queue import (
    IMPORT_TASK,
    TENSORIZE_TASK,
    VERIFY_TASK,
    TaskSender,
    enqueue_after_commit,
)
from app.db import utcnow
from app.errors import Conflict, NotFound
from app.fleet.service import live_worker_ids
from app.jobs.models import Job, JobKind, JobStatus
from app.models.models import Model
from app.pagination import Page, paginate

log = logging.getLogger("tensor_registry.jobs")

TASK_FOR_KIND = {
    JobKind.TENSORIZE: TENSORIZE_TASK,
    JobKind.VERIFY: VERIFY_TASK,
    JobKind.IMPORT: IMPORT_TASK,
}

_TITLES = {
    "cancelled": "Job cancelled",
    "storage_unavailable": "Storage unavailable",
    "database_unavailable": "Database unavailable",
    "too_many_attempts": "Job abandoned",
    "internal_error": "Internal error",
}


def problem(
    code: str, detail: str, *, status: int = 422, title: str | None = None
) -> dict[str, Any]:
    """A job error in the API's problem format (RFC 9457 plus ``code``)."""
    return {
        "type": f"urn:tensor-registry:problem:{code}",
        "title": title or _TITLES.get(code, "Job failed"),
        "status": status,
        "detail": detail,
        "code": code,
    }


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
    principal.require_scope("tensorize" if job.kind == JobKind.TENSORIZE else "models:write")
    if job.status == JobStatus.CANCELLED:
        return job
    if job.status in (JobStatus.SUCCEEDED, JobStatus.FAILED):
        raise Conflict(
            f"Job {job.id} already {job.status}; there is nothing to cancel.",
            code="job_finished",
            status_now=job.status,
        )
    now = utcnow()
    cancelled = await session.execute(
        update(Job)
        .where(Job.id == job.id, Job.status == JobStatus.QUEUED)
        .values(
            status=JobStatus.CANCELLED,
            cancel_requested=True,
            stage="cancelled",
            finished_at=now,
            updated_at=now,
            error=problem("cancelled", "The job was cancelled before it started.", status=409),
        )
    )
    if cancelled.rowcount == 1:  # type: ignore[attr-defined]
        await _fail_job_subject(session, job, "cancelled before it started")
    else:
        # A worker took it in the meantime: ask it to stop.
        await session.execute(
            update(Job)
            .where(Job.id == job.id, Job.status == JobStatus.RUNNING)
            .values(cancel_requested=True, updated_at=now)
        )
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


async def _fail_job_subject(session: AsyncSession, job: Job, reason: str) -> None:
    """The artifact (or version) a job was producing fails with it; it never went ready."""
    if job.artifact_id is not None:
        await session.execute(
            update(Artifact)
            .where(
                Artifact.id == job.artifact_id,
                Artifact.status.in_((ArtifactStatus.PENDING, ArtifactStatus.RUNNING)),
            )
            .values(status=ArtifactStatus.FAILED, error=reason)
        )
    if job.kind == JobKind.IMPORT and job.version_id is not None:
        from app.versions.models import Version, VersionStatus

        await session.execute(
            update(Version)
            .where(Version.id == job.version_id, Version.status == VersionStatus.IMPORTING)
            .values(status=VersionStatus.FAILED)
        )


# ---------------------------------------------------------------------------------------------
# Worker side


class Ownership(Enum):
    OK = "ok"
    CANCEL = "cancel"
    LOST = "lost"


Abandoned = Callable[[str | None], Awaitable[bool]]


async def claim_job(
    session: AsyncSession,
    job_id: uuid.UUID,
    *,
    worker: str,
    abandoned: Abandoned,
    max_attempts: int,
) -> Job | None:
    """Take the job for ``worker``, or return None when it is not ours to run.

    Not ours: unknown, final, or running on a worker that is still alive (a duplicate
    delivery). A job running on a dead worker (acks_late re-delivery after a crash, or the
    sweep) is taken over: the caller starts clean. A job that has already used
    ``max_attempts`` fails here rather than crash-looping a fleet.
    """
    job = await session.get(Job, job_id, populate_existing=True)
    if job is None or job.status in JobStatus.FINAL:
        return None
    if job.status == JobStatus.RUNNING and not await abandoned(job.worker):
        return None
    now = utcnow()
    if job.cancel_requested:
        await finish_job(
            session,
            job,
            worker=job.worker,
            status=JobStatus.CANCELLED,
            error=problem("cancelled", "The job was cancelled.", status=409),
            expect_status=job.status,
        )
        return None
    if job.attempts >= max_attempts:
        await finish_job(
            session,
            job,
            worker=job.worker,
            status=JobStatus.FAILED,
            error=problem(
                "too_many_attempts",
                f"The job was started {job.attempts} times and never finished; its worker "
                "was lost each time (killed, or out of memory).",
                status=500,
            ),
            expect_status=job.status,
        )
        return None
    result = await session.execute(
        update(Job)
        .where(Job.id == job.id, Job.status == job.status, Job.attempts == job.attempts)
        .values(
            status=JobStatus.RUNNING,
            attempts=job.attempts + 1,
            worker=worker,
            stage="starting",
            bytes_done=0,
            bytes_total=None,
            started_at=func.coalesce(Job.started_at, now),
            updated_at=now,
        )
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        return None
    await session.flush()
    await session.refresh(job)
    return job


async def set_progress(
    session: AsyncSession,
    job_id: uuid.UUID,
    *,
    worker: str,
    stage: str,
    bytes_done: int,
    bytes_total: int | None,
) -> Ownership:
    """Write progress; tell the worker whether to go on, stop (cancel) or give up (lost)."""
    result = await session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.RUNNING, Job.worker == worker)
        .values(stage=stage, bytes_done=bytes_done, bytes_total=bytes_total, updated_at=utcnow())
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        return Ownership.LOST
    cancel = await session.scalar(select(Job.cancel_requested).where(Job.id == job_id))
    return Ownership.CANCEL if cancel else Ownership.OK


async def finish_job(
    session: AsyncSession,
    job: Job,
    *,
    worker: str | None,
    status: str,
    error: dict[str, Any] | None = None,
    result: dict[str, Any] | None = None,
    expect_status: str = JobStatus.RUNNING,
) -> bool:
    """Final status, only if ``worker`` still owns the job; the artifact fails with it."""
    now = utcnow()
    values: dict[str, Any] = {
        "status": status,
        "stage": status,
        "finished_at": now,
        "updated_at": now,
        "error": error,
    }
    if result is not None:
        values["result"] = result
    stmt = update(Job).where(Job.id == job.id, Job.status == expect_status)
    stmt = stmt.where(Job.worker.is_(None) if worker is None else Job.worker == worker)
    done = await session.execute(stmt.values(**values))
    if done.rowcount != 1:  # type: ignore[attr-defined]
        return False
    if status != JobStatus.SUCCEEDED:
        await _fail_job_subject(session, job, (error or {}).get("detail") or status)
    await session.flush()
    return True


async def release_for_retry(
    session: AsyncSession, job: Job, *, worker: str, error: dict[str, Any]
) -> bool:
    """Back to ``queued`` after a transient failure; the caller re-sends it after a backoff."""
    now = utcnow()
    done = await session.execute(
        update(Job)
        .where(Job.id == job.id, Job.status == JobStatus.RUNNING, Job.worker == worker)
        .values(status=JobStatus.QUEUED, stage="retry_wait", error=error, updated_at=now)
    )
    if done.rowcount != 1:  # type: ignore[attr-defined]
        return False
    if job.artifact_id is not None:
        await session.execute(
            update(Artifact)
            .where(Artifact.id == job.artifact_id, Artifact.status == ArtifactStatus.RUNNING)
            .values(status=ArtifactStatus.PENDING)
        )
    await session.flush()
    return True


async def recover_jobs(
    session: AsyncSession,
    sender: TaskSender,
    *,
    live_after_seconds: float,
    resend_queued_after_seconds: float,
) -> list[uuid.UUID]:
    """The sweep every worker runs with its heartbeat.

    - ``running`` on a worker that stopped heartbeating: back to ``queued`` and sent again
      (the broker's own re-delivery may come too; ``claim_job`` makes duplicates harmless).
    - ``queued`` and not sent for ``resend_queued_after_seconds``: sent again, for messages
      lost by a broker without acknowledgements or an enqueue that failed after commit.
    """
    now = utcnow()
    live = await live_worker_ids(session, live_after_seconds)
    resent: list[uuid.UUID] = []
    running = (
        await session.execute(
            select(Job.id, Job.worker, Job.kind, Job.queue).where(Job.status == JobStatus.RUNNING)
        )
    ).all()
    for job_id, worker, kind, queue in running:
        node = (worker or "").rsplit("/", 1)[0]
        if node in live:
            continue
        moved = await session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == JobStatus.RUNNING, Job.worker == worker)
            .values(status=JobStatus.QUEUED, stage="requeued", updated_at=now)
        )
        if moved.rowcount == 1:  # type: ignore[attr-defined]
            log.warning("job %s was running on lost worker %s; sent again", job_id, worker)
            enqueue_after_commit(session, sender, TASK_FOR_KIND[kind], job_id, queue)
            resent.append(job_id)
    stale = now - timedelta(seconds=resend_queued_after_seconds)
    queued = (
        await session.execute(
            select(Job.id, Job.kind, Job.queue, Job.updated_at).where(
                Job.status == JobStatus.QUEUED, Job.updated_at < stale
            )
        )
    ).all()
    for job_id, kind, queue, updated_at in queued:
        touched = await session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == JobStatus.QUEUED, Job.updated_at == updated_at)
            .values(updated_at=now)
        )
        if touched.rowcount == 1:  # type: ignore[attr-defined]
            enqueue_after_commit(session, sender, TASK_FOR_KIND[kind], job_id, queue)
            resent.append(job_id)
    await session.flush()
    return resent


# ---------------------------------------------------------------------------------------------
# Figures for /metrics (app.system.metrics): indexed reads, bounded per scrape


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
