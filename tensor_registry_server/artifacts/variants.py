"""Asking for an artifact of a variant, by tensorizing or by registering one made elsewhere:
what both requests share.

A variant is (version, dtype, format, tensor_parallel_size, encrypted). At most one live
(pending/running/ready) artifact exists per variant (a partial unique index), so asking twice
returns the same job, and asking once it is ready returns the artifact. An Idempotency-Key
brings back the job it first made, as long as the body is the same (its fingerprint).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload

from tensor_registry.formats.variant import Variant
from tensor_registry_server.auth import Principal
from tensor_registry_server.core.errors import Conflict, Invalid, NotFound
from tensor_registry_server.jobs.artifact_reads import artifact_row
from tensor_registry_server.jobs.service import find_idempotent_job
from tensor_registry_server.rows.artifacts import Artifact, ArtifactStatus
from tensor_registry_server.rows.jobs import Job
from tensor_registry_server.rows.models import Model
from tensor_registry_server.rows.versions import Version, VersionStatus


@dataclass
class Outcome:
    """What a tensorize/register request led to: a job to follow, or a ready artifact."""

    artifact: Artifact
    job: Job | None


def fingerprint(operation: str, model_id: uuid.UUID, body: dict[str, Any]) -> str:
    canonical = json.dumps(
        {"op": operation, "model_id": str(model_id), **body}, sort_keys=True, default=str
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


async def idempotent(
    session: AsyncSession, principal: Principal, key: str | None, fingerprint: str
) -> Outcome | None:
    if not key:
        return None
    job = await find_idempotent_job(session, principal, key)
    if job is None:
        return None
    if job.params.get("fingerprint") != fingerprint:
        raise Invalid(
            "This Idempotency-Key was already used with a different request.",
            code="idempotency_key_reused",
            job_id=str(job.id),
        )
    artifact = await artifact_row(session, job.artifact_id) if job.artifact_id else None
    if artifact is None:
        raise NotFound(
            "The job of this Idempotency-Key has no artifact any more.", code="artifact_not_found"
        )
    return Outcome(artifact=artifact, job=job)


async def ready_version(session: AsyncSession, model: Model, number: int | None) -> Version:
    stmt = select(Version).where(Version.model_id == model.id)
    if number is None:
        stmt = stmt.where(Version.status == VersionStatus.READY).order_by(Version.number.desc())
        version = (await session.execute(stmt.limit(1))).scalar_one_or_none()
        if version is None:
            raise Conflict(
                f"Model '{model.name}' has no ready version to tensorize.", code="no_ready_version"
            )
        return version
    version = (await session.execute(stmt.where(Version.number == number))).scalar_one_or_none()
    if version is None:
        raise NotFound(f"Model '{model.name}' has no version {number}.", code="version_not_found")
    if version.status != VersionStatus.READY:
        raise Conflict(
            f"Version {number} of '{model.name}' is {version.status}, not ready.",
            code="version_not_ready",
        )
    return version


async def live_variant(
    session: AsyncSession, version: Version, variant: Variant
) -> Artifact | None:
    stmt = (
        select(Artifact)
        .where(
            Artifact.version_id == version.id,
            Artifact.dtype == variant.dtype,
            Artifact.format == variant.format,
            Artifact.tensor_parallel_size == variant.tensor_parallel_size,
            Artifact.encrypted == variant.encrypted,
            Artifact.status.in_(ArtifactStatus.LIVE),
        )
        .options(selectinload(Artifact.files))
    )
    return (await session.execute(stmt)).scalar_one_or_none()


async def existing_outcome(session: AsyncSession, artifact: Artifact) -> Outcome:
    job = await session.get(Job, artifact.job_id) if artifact.job_id else None
    if artifact.status == ArtifactStatus.READY:
        return Outcome(artifact=artifact, job=None)
    return Outcome(artifact=artifact, job=job)


async def insert_rows(session: AsyncSession, artifact: Artifact, job: Job) -> bool:
    """Insert both rows in a savepoint; True when a unique constraint says someone raced us."""
    try:
        async with session.begin_nested():
            session.add(job)
            await session.flush()
            artifact.job_id = job.id
            session.add(artifact)
            await session.flush()
    except IntegrityError:
        return True
    return False
