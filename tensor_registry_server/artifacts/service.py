"""Artifacts: reading, listing and deleting the tensorized variants of a version.

Making one is a request that queues a job: ``tensorize.py`` (tensorize a version here) and
``register.py`` (register one made elsewhere), sharing ``variants.py``. The worker's publish
step, like every job-driven state change, is tensor_registry_server.jobs.lifecycle's.
"""

from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload

from tensor_registry_server.audit.service import record
from tensor_registry_server.auth import Principal
from tensor_registry_server.core.errors import Conflict, NotFound
from tensor_registry_server.core.pagination import Page, paginate
from tensor_registry_server.jobs.artifact_reads import artifact_row
from tensor_registry_server.jobs.transition_events import announce_artifacts_deleted
from tensor_registry_server.rows.artifacts import Artifact, ArtifactStatus
from tensor_registry_server.rows.models import Model
from tensor_registry_server.storage.deferred_delete import delete_after_commit
from tensor_registry_server.storage.registry import StorageRegistry


async def list_artifacts(
    session: AsyncSession,
    model: Model,
    *,
    dtype: str | None,
    format: str | None,
    status: str | None,
    version: int | None,
    cursor: str | None,
    limit: int,
) -> Page[Artifact]:
    stmt = (
        select(Artifact).where(Artifact.model_id == model.id).options(selectinload(Artifact.files))
    )
    if dtype:
        stmt = stmt.where(Artifact.dtype == dtype)
    if format:
        stmt = stmt.where(Artifact.format == format)
    if status:
        stmt = stmt.where(Artifact.status == status)
    if version is not None:
        stmt = stmt.where(Artifact.version_number == version)
    return await paginate(
        session,
        stmt,
        keys=[Artifact.created_at, Artifact.id],
        cursor=cursor,
        limit=limit,
        descending=True,
    )


async def get_artifact(
    session: AsyncSession, principal: Principal, artifact_id: uuid.UUID
) -> tuple[Artifact, Model]:
    artifact = await artifact_row(session, artifact_id)
    model = await session.get(Model, artifact.model_id) if artifact is not None else None
    if artifact is None or model is None or not principal.can_access_namespace(model.namespace):
        raise NotFound(f"No artifact with id {artifact_id}.", code="artifact_not_found")
    return artifact, model


async def delete_artifact(
    session: AsyncSession,
    principal: Principal,
    artifact_id: uuid.UUID,
    *,
    storages: StorageRegistry,
) -> None:
    artifact, model = await get_artifact(session, principal, artifact_id)
    if artifact.status in (ArtifactStatus.PENDING, ArtifactStatus.RUNNING):
        raise Conflict(
            f"Artifact {artifact.id} is {artifact.status}; cancel job {artifact.job_id} first.",
            code="artifact_in_progress",
            job_id=str(artifact.job_id) if artifact.job_id else None,
        )
    record(
        session,
        action="artifact.delete",
        actor=principal,
        target_type="artifact",
        target_id=artifact.id,
        model=model.name,
        version=artifact.version_number,
        dtype=artifact.dtype,
        format=artifact.format,
    )
    await announce_artifacts_deleted(session, model.name, Artifact.id == artifact.id)
    await session.delete(artifact)
    await session.flush()
    delete_after_commit(session, storages, artifact.storage, artifact.storage_prefix)


def artifact_size(artifact: Artifact) -> int:
    return sum(f.size for f in artifact.files)
