"""Every state change of a job and of the rows it drives (its artifact, or the version an
import fills): the one writer of those states. The API (queue, cancel) and the workers (claim,
progress, publish, finish, retry) and the heartbeat sweep (recover) call it.

    queued ──claim──▶ running ──publish──▶ succeeded   (artifact ready with its files)
      ▲                 │  ├──finish─────▶ failed | cancelled   (artifact/version fails too)
      └──retry/recover──┘  └──progress (stage, bytes; answers go on / cancel / lost)

Every change is a compare-and-set on the row (``WHERE status = … AND worker = …``), so two
deliveries of the same message, a sweep and a worker, or a cancel and a worker can race without
either overwriting the other: the loser sees ``rowcount == 0``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry.formats.variant import Variant
from tensor_registry_server.auth import Principal
from tensor_registry_server.checkpoints.finalize import ValidationReport
from tensor_registry_server.core.db import new_id, utcnow
from tensor_registry_server.core.events_outbox import emit, namespace_of
from tensor_registry_server.core.invalidation import mark_changed
from tensor_registry_server.core.queue import (
    CONVERT_TASK,
    IMPORT_TASK,
    TENSORIZE_TASK,
    VERIFY_TASK,
    WARM_TASK,
    TaskSender,
    enqueue_after_commit,
)
from tensor_registry_server.core.redact import redact_uri
from tensor_registry_server.jobs.artifact_reads import artifact_row
from tensor_registry_server.jobs.pool.service import live_worker_ids
from tensor_registry_server.jobs.problems import problem
from tensor_registry_server.jobs.transition_events import (
    announce_artifacts_deleted,
    artifact_event_data,
    job_failed_event,
    version_ready_event,
)
from tensor_registry_server.rows.artifacts import Artifact, ArtifactFile, ArtifactStatus
from tensor_registry_server.rows.jobs import Job, JobKind, JobStatus
from tensor_registry_server.rows.models import Model
from tensor_registry_server.rows.versions import Version, VersionStatus
from tensor_registry_server.rows.warm_bundles import BundleStatus, WarmBundle
from tensor_registry_server.storage.object_keys import artifact_prefix

log = logging.getLogger("tensor_registry.jobs")

TASK_FOR_KIND = {
    JobKind.TENSORIZE: TENSORIZE_TASK,
    JobKind.VERIFY: VERIFY_TASK,
    JobKind.IMPORT: IMPORT_TASK,
    JobKind.CONVERT: CONVERT_TASK,
    JobKind.WARM: WARM_TASK,
}


def pending_artifact_and_job(
    principal: Principal,
    model: Model,
    version: Version,
    *,
    kind: str,
    origin: str,
    storage: str,
    queue: str,
    variant: Variant,
    idempotency_key: str | None,
    params: dict[str, Any],
    **artifact_fields: Any,
) -> tuple[Artifact, Job]:
    """→ queued: a pending artifact of ``variant`` and the job that will fill it (the caller
    adds them, with its idempotency and race handling, and enqueues after commit)."""
    artifact_id = new_id()
    artifact = Artifact(
        id=artifact_id,
        model_id=model.id,
        version_id=version.id,
        version_number=version.number,
        storage=storage,
        storage_prefix=artifact_prefix(artifact_id),
        status=ArtifactStatus.PENDING,
        origin=origin,
        stats={},
        files=[],
        dtype=variant.dtype,
        format=variant.format,
        tensor_parallel_size=variant.tensor_parallel_size,
        encrypted=variant.encrypted,
        **artifact_fields,
    )
    job = Job(
        kind=kind,
        model_id=model.id,
        version_id=version.id,
        artifact_id=artifact_id,
        queue=queue,
        # The job's own parameters only: what it makes (version, variant, storage) is the
        # artifact row's, read from there (issue 27), never a second copy here.
        params=params,
        idempotency_key=idempotency_key,
        token_id=principal.token_id,
    )
    return artifact, job


async def cancel(session: AsyncSession, job: Job) -> None:
    """queued → cancelled (and its artifact or version fails), or, when a worker took it in the
    meantime, running with ``cancel_requested`` (the worker ends it as cancelled)."""
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
        await _fail_job_subject(session, job, "cancelled before it started", cancelled=True)
    else:
        # A worker took it in the meantime: ask it to stop.
        await session.execute(
            update(Job)
            .where(Job.id == job.id, Job.status == JobStatus.RUNNING)
            .values(cancel_requested=True, updated_at=now)
        )


async def _fail_job_subject(
    session: AsyncSession, job: Job, reason: str, *, cancelled: bool = False
) -> None:
    """The artifact (or version) a job was producing fails with it; it never went ready.

    A cancelled job's artifact is removed instead: someone chose not to have it, so it is no
    failure to list (`artifacts ls` showed a `failed 0 B` row), and the variant can be asked
    for again. The job keeps its ``artifact_id``; whatever the worker wrote under the prefix
    it removed before ending the job (or the storage sweep does)."""
    if job.kind == JobKind.WARM:  # its artifact was ready before and stays so; its bundle fails
        unfinished = (
            WarmBundle.id == uuid.UUID(str((job.params or {}).get("bundle_id"))),
            WarmBundle.status.in_((BundleStatus.PENDING, BundleStatus.RUNNING)),
        )
        if cancelled:
            await session.execute(delete(WarmBundle).where(*unfinished))
        else:
            await session.execute(
                update(WarmBundle)
                .where(*unfinished)
                .values(status=BundleStatus.FAILED, error=reason)
            )
        return
    if job.artifact_id is not None:
        unfinished = (
            Artifact.id == job.artifact_id,
            Artifact.status.in_((ArtifactStatus.PENDING, ArtifactStatus.RUNNING)),
        )
        if cancelled:
            model_name = await session.scalar(select(Model.name).where(Model.id == job.model_id))
            if model_name is not None:
                await announce_artifacts_deleted(session, model_name, *unfinished)
            await session.execute(delete(Artifact).where(*unfinished))
        else:
            await session.execute(
                update(Artifact)
                .where(*unfinished)
                .values(status=ArtifactStatus.FAILED, error=reason)
            )
    if job.kind in (JobKind.IMPORT, JobKind.CONVERT) and job.version_id is not None:
        await fail_import(session, job.version_id)


def queued_import(principal: Principal, model: Model, version: Version, source_uri: str) -> Job:
    """→ importing, queued: ``version`` waits for the files at ``source_uri``; the job (not yet
    added) will copy them. The raw URI (it may carry credentials) stays on the version row for
    the job; what the job shows is the redacted form."""
    version.status = VersionStatus.IMPORTING
    version.source_uri = source_uri
    return Job(
        kind=JobKind.IMPORT,
        model_id=model.id,
        queue="cpu",
        params={"source_uri": redact_uri(source_uri)},
        token_id=principal.token_id,
    )


def queued_conversion(
    principal: Principal, model: Model, version: Version, source: Version, files: list[str]
) -> Job:
    """→ importing, queued: ``version`` waits for the safetensors a convert job makes of
    ``source``'s pickle-based ``files``; the job (not yet added) converts them."""
    version.status = VersionStatus.IMPORTING
    return Job(
        kind=JobKind.CONVERT,
        model_id=model.id,
        queue="cpu",
        params={
            "source_version": source.number,
            "source_version_id": str(source.id),
            "files": files,
        },
        token_id=principal.token_id,
    )


async def mark_imported(session: AsyncSession, version: Version, report: ValidationReport) -> None:
    """importing → ready: the import's files passed finalize's checks; keep what they read."""
    version.status = VersionStatus.READY
    version.finalized_at = utcnow()
    version.architecture = report.architecture
    version.parameter_count = report.parameter_count
    version.dtype_breakdown = report.dtype_breakdown
    version.remote_code = report.remote_code
    model_name = await session.scalar(select(Model.name).where(Model.id == version.model_id))
    if model_name is not None:
        version_ready_event(session, model_name, version, source="import")


async def fail_import(session: AsyncSession, version_id: uuid.UUID) -> None:
    """importing → failed: the version an import was filling will never be ready."""
    await session.execute(
        update(Version)
        .where(Version.id == version_id, Version.status == VersionStatus.IMPORTING)
        .values(status=VersionStatus.FAILED)
    )


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
        await _fail_job_subject(
            session,
            job,
            (error or {}).get("detail") or status,
            cancelled=status == JobStatus.CANCELLED,
        )
    if status == JobStatus.FAILED:
        await job_failed_event(session, job, error)
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
# Publish: the tensorize job's end


@dataclass(frozen=True)
class PublishedFile:
    path: str
    size: int
    sha256: str
    storage_key: str


async def mark_running(session: AsyncSession, artifact_id: uuid.UUID) -> Artifact | None:
    """pending|running → running: the worker that claimed the job starts writing the artifact."""
    await session.execute(
        update(Artifact)
        .where(
            Artifact.id == artifact_id,
            Artifact.status.in_((ArtifactStatus.PENDING, ArtifactStatus.RUNNING)),
        )
        .values(status=ArtifactStatus.RUNNING, error=None)
    )
    return await artifact_row(session, artifact_id)


async def succeed_job(
    session: AsyncSession,
    job: Job,
    *,
    worker: str,
    result: dict[str, Any],
    now: datetime | None = None,
) -> bool:
    """running → succeeded for a job whose subject is not an artifact's files (a warm job: its
    bundle is tensor_registry_server.jobs.warm_bundles'); False when it is no longer ``worker``'s
    or a cancel came."""
    now = now or utcnow()
    done = await session.execute(
        update(Job)
        .where(
            Job.id == job.id,
            Job.status == JobStatus.RUNNING,
            Job.worker == worker,
            Job.cancel_requested.is_(False),
        )
        .values(
            status=JobStatus.SUCCEEDED,
            stage=JobStatus.SUCCEEDED,
            finished_at=now,
            updated_at=now,
            error=None,
            result=result,
        )
    )
    return bool(done.rowcount == 1)  # type: ignore[attr-defined]


async def publish(
    session: AsyncSession,
    job: Job,
    *,
    worker: str,
    files: list[PublishedFile],
    fields: dict[str, Any],
    result: dict[str, Any],
) -> bool:
    """One transaction: the job succeeds and the artifact is ready with all its files.

    False (nothing changed) when the job is no longer this worker's or a cancel arrived: the
    caller then removes the bytes it wrote.
    """
    now = utcnow()
    if not await succeed_job(session, job, worker=worker, result=result, now=now):
        return False
    readied = await session.execute(
        update(Artifact)
        .where(Artifact.id == job.artifact_id, Artifact.status == ArtifactStatus.RUNNING)
        .values(status=ArtifactStatus.READY, ready_at=now, error=None, **fields)
    )
    if readied.rowcount != 1:  # type: ignore[attr-defined]
        raise RuntimeError(f"artifact {job.artifact_id} vanished while its job ran")
    for f in files:
        session.add(
            ArtifactFile(
                artifact_id=job.artifact_id,
                path=f.path,
                size=f.size,
                sha256=f.sha256,
                storage_key=f.storage_key,
            )
        )
    await session.flush()
    # The READY update above is a bulk statement the flush events cannot see.
    mark_changed(session, job.model_id)
    artifact = await artifact_row(session, job.artifact_id)  # type: ignore[arg-type]
    model_name = await session.scalar(select(Model.name).where(Model.id == job.model_id))
    if artifact is not None and model_name is not None:
        emit(
            session,
            "artifact.ready",
            namespace=namespace_of(model_name),
            data=artifact_event_data(model_name, artifact),
        )
    return True
