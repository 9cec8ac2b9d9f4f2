"""The events that announce the lifecycle's transitions (``version.ready``, ``job.failed``,
``artifact.ready``'s data, ``artifact.deleted``): emitted into the caller's transaction, never a
state write (those are tensor_registry_server.jobs.lifecycle's)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.elements import ColumnElement

from tensor_registry_server.core.events_outbox import emit, namespace_of
from tensor_registry_server.rows.artifacts import Artifact
from tensor_registry_server.rows.jobs import Job
from tensor_registry_server.rows.models import Model
from tensor_registry_server.rows.versions import Version


def version_ready_event(
    session: AsyncSession, model_name: str, version: Version, *, source: str
) -> None:
    """The ``version.ready`` event of a version that just froze (finalize or import)."""
    emit(
        session,
        "version.ready",
        namespace=namespace_of(model_name),
        data={
            "model": model_name,
            "model_id": str(version.model_id),
            "version": version.number,
            "source": source,
        },
    )


async def job_failed_event(session: AsyncSession, job: Job, error: dict[str, Any] | None) -> None:
    """The ``job.failed`` event of a job that just failed (nothing when it has no model)."""
    model_name = (
        await session.scalar(select(Model.name).where(Model.id == job.model_id))
        if job.model_id is not None
        else None
    )
    if model_name is None:
        return
    error = error or {}
    emit(
        session,
        "job.failed",
        namespace=namespace_of(model_name),
        data={
            "job_id": str(job.id),
            "kind": job.kind,
            "model": model_name,
            "model_id": str(job.model_id),
            "artifact_id": str(job.artifact_id) if job.artifact_id else None,
            "attempts": job.attempts,
            "error": {"code": error.get("code"), "detail": error.get("detail")},
        },
    )


def artifact_event_data(model_name: str, artifact: Artifact) -> dict[str, Any]:
    """What ``artifact.ready`` and ``artifact.deleted`` say about the artifact."""
    return {
        "model": model_name,
        "model_id": str(artifact.model_id),
        "version": artifact.version_number,
        "artifact_id": str(artifact.id),
        "dtype": artifact.dtype,
        "format": artifact.format,
        "tensor_parallel_size": artifact.tensor_parallel_size,
        "encrypted": bool(artifact.encrypted),
    }


async def announce_artifacts_deleted(
    session: AsyncSession, model_name: str, *where: ColumnElement[bool]
) -> list[Artifact]:
    """One ``artifact.deleted`` per artifact row matching ``where``, in this transaction.

    Every path that removes artifact rows calls it before the delete (the route for one
    artifact, a model's or a version's delete, a cancelled job's pending artifact), so a
    listener sees each artifact go whichever row was deleted. Returns the artifacts, whose
    bytes the caller schedules for deletion."""
    artifacts = list(
        (
            await session.execute(
                select(Artifact).where(*where).order_by(Artifact.created_at, Artifact.id)
            )
        ).scalars()
    )
    for artifact in artifacts:
        emit(
            session,
            "artifact.deleted",
            namespace=namespace_of(model_name),
            data=artifact_event_data(model_name, artifact),
        )
    return artifacts
