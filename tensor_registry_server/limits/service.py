"""Namespace limits: what applies (settings default, admin override), what is used, and the
checks that refuse work before anything is written.

Usage is read from the rows (the bytes of every version file and artifact file of the
namespace's models; the jobs queued or running), so every replica and worker sees the same
figure without a counter that could drift. The checks are made where the size is known before
any byte is stored (an upload's Content-Length, a tensorize's source bytes) and again under the
version's write lock when an upload's row is written, so two concurrent uploads cannot both
slip under the quota: the loser's bytes are deleted and no row is left.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry_server.core.errors import AppError, PayloadTooLarge
from tensor_registry_server.rows.artifacts import Artifact, ArtifactFile
from tensor_registry_server.rows.jobs import Job, JobStatus
from tensor_registry_server.rows.limits import NamespaceLimit
from tensor_registry_server.rows.models import Model
from tensor_registry_server.rows.versions import Version, VersionFile
from tensor_registry_server.settings import Settings

# Retry-After of a 429 concurrent_jobs_exceeded: jobs take minutes; a client retries later.
JOBS_RETRY_AFTER = 30


class InsufficientStorage(AppError):
    status, code, title = 507, "storage_quota_exceeded", "Insufficient storage"


class TooManyRequests(AppError):
    status, code, title = 429, "rate_limited", "Too many requests"


@dataclass(frozen=True)
class Limits:
    storage_bytes: int | None
    upload_bytes: int | None
    concurrent_jobs: int | None


@dataclass(frozen=True)
class Usage:
    storage_bytes: int
    active_jobs: int
    models: int


async def limits_for(session: AsyncSession, settings: Settings, namespace: str) -> Limits:
    row = await session.get(NamespaceLimit, namespace)
    defaults = settings.limits

    def pick(name: str) -> int | None:
        value = getattr(row, name, None) if row is not None else None
        return value if value is not None else getattr(defaults, name)

    return Limits(pick("storage_bytes"), pick("upload_bytes"), pick("concurrent_jobs"))


async def usage_of(session: AsyncSession, namespace: str) -> Usage:
    sources = await session.scalar(
        select(func.coalesce(func.sum(VersionFile.size), 0))
        .join(Version, Version.id == VersionFile.version_id)
        .join(Model, Model.id == Version.model_id)
        .where(Model.namespace == namespace)
    )
    artifacts = await session.scalar(
        select(func.coalesce(func.sum(ArtifactFile.size), 0))
        .join(Artifact, Artifact.id == ArtifactFile.artifact_id)
        .join(Model, Model.id == Artifact.model_id)
        .where(Model.namespace == namespace)
    )
    jobs = await session.scalar(
        select(func.count())
        .select_from(Job)
        .join(Model, Model.id == Job.model_id)
        .where(Model.namespace == namespace, Job.status.in_((JobStatus.QUEUED, JobStatus.RUNNING)))
    )
    models = await session.scalar(
        select(func.count()).select_from(Model).where(Model.namespace == namespace)
    )
    return Usage(int(sources or 0) + int(artifacts or 0), int(jobs or 0), int(models or 0))


async def all_usage(session: AsyncSession, settings: Settings) -> dict[str, tuple[Limits, Usage]]:
    """Every namespace's limits and usage in four grouped reads (for /metrics and the admin
    list), not four reads per namespace."""
    sources = dict(
        (
            await session.execute(
                select(Model.namespace, func.sum(VersionFile.size))
                .join(Version, Version.id == VersionFile.version_id)
                .join(Model, Model.id == Version.model_id)
                .group_by(Model.namespace)
            )
        ).all()
    )
    artifacts = dict(
        (
            await session.execute(
                select(Model.namespace, func.sum(ArtifactFile.size))
                .join(Artifact, Artifact.id == ArtifactFile.artifact_id)
                .join(Model, Model.id == Artifact.model_id)
                .group_by(Model.namespace)
            )
        ).all()
    )
    jobs = dict(
        (
            await session.execute(
                select(Model.namespace, func.count())
                .select_from(Job)
                .join(Model, Model.id == Job.model_id)
                .where(Job.status.in_((JobStatus.QUEUED, JobStatus.RUNNING)))
                .group_by(Model.namespace)
            )
        ).all()
    )
    models = dict(
        (
            await session.execute(select(Model.namespace, func.count()).group_by(Model.namespace))
        ).all()
    )
    overrides = {row.namespace: row for row in (await session.scalars(select(NamespaceLimit)))}
    defaults = settings.limits
    out: dict[str, tuple[Limits, Usage]] = {}
    for ns in sorted(set(models) | set(overrides)):
        row = overrides.get(ns)

        def pick(name: str, row: NamespaceLimit | None = row) -> int | None:
            value = getattr(row, name) if row is not None else None
            return value if value is not None else getattr(defaults, name)

        limits = Limits(pick("storage_bytes"), pick("upload_bytes"), pick("concurrent_jobs"))
        used = int(sources.get(ns) or 0) + int(artifacts.get(ns) or 0)
        out[ns] = (limits, Usage(used, int(jobs.get(ns) or 0), int(models.get(ns) or 0)))
    return out


def report(namespace: str, limits: Limits, usage: Usage) -> dict[str, Any]:
    return {"namespace": namespace, "limits": asdict(limits), "usage": asdict(usage)}


async def check_upload(
    session: AsyncSession, settings: Settings, namespace: str, size: int, *, replacing: int = 0
) -> None:
    """Refuse an upload of ``size`` bytes: 413 upload_limit_exceeded, 507 storage_quota_exceeded.

    ``replacing``: the size of the file row this upload replaces (its bytes go once it lands)."""
    limits = await limits_for(session, settings, namespace)
    if limits.upload_bytes is not None and size > limits.upload_bytes:
        raise PayloadTooLarge(
            f"The file is {size} bytes; namespace {namespace!r} takes uploads of at most "
            f"{limits.upload_bytes} bytes.",
            code="upload_limit_exceeded",
            limit="upload_bytes",
            namespace=namespace,
            limit_bytes=limits.upload_bytes,
            size=size,
        )
    if limits.storage_bytes is not None:
        await _check_quota(session, namespace, limits.storage_bytes, size - replacing)


async def _check_quota(session: AsyncSession, namespace: str, quota: int, adding: int) -> None:
    used = (await usage_of(session, namespace)).storage_bytes
    if used + adding > quota:
        raise InsufficientStorage(
            f"Namespace {namespace!r} stores {used} of its {quota} bytes; {adding} more "
            "would pass the quota. Delete versions or ask an admin for more.",
            limit="storage_bytes",
            namespace=namespace,
            limit_bytes=quota,
            usage_bytes=used,
            size=adding,
        )


async def check_job(
    session: AsyncSession, settings: Settings, namespace: str, *, expected_bytes: int
) -> None:
    """Before a job is enqueued: 429 concurrent_jobs_exceeded, 507 storage_quota_exceeded (the
    artifact is estimated at ``expected_bytes``, its source's size)."""
    limits = await limits_for(session, settings, namespace)
    if limits.concurrent_jobs is not None:
        active = (await usage_of(session, namespace)).active_jobs
        if active >= limits.concurrent_jobs:
            raise TooManyRequests(
                f"Namespace {namespace!r} has {active} jobs queued or running; its limit is "
                f"{limits.concurrent_jobs}. Retry when one finishes.",
                code="concurrent_jobs_exceeded",
                headers={"Retry-After": str(JOBS_RETRY_AFTER)},
                limit="concurrent_jobs",
                namespace=namespace,
                limit_jobs=limits.concurrent_jobs,
                usage_jobs=active,
            )
    if limits.storage_bytes is not None:
        await _check_quota(session, namespace, limits.storage_bytes, expected_bytes)


async def quota_left(
    session: AsyncSession, settings: Settings, namespace: str, adding: int
) -> InsufficientStorage | None:
    """For a worker at publish: the refusal, or None when ``adding`` bytes still fit."""
    limits = await limits_for(session, settings, namespace)
    if limits.storage_bytes is None:
        return None
    try:
        await _check_quota(session, namespace, limits.storage_bytes, adding)
    except InsufficientStorage as exc:
        return exc
    return None


async def set_limits(session: AsyncSession, namespace: str, values: dict[str, Any]) -> None:
    row = await session.get(NamespaceLimit, namespace)
    if row is None:
        row = NamespaceLimit(namespace=namespace)
        session.add(row)
    for name in ("storage_bytes", "upload_bytes", "concurrent_jobs"):
        if name in values:
            setattr(row, name, values[name])
    await session.flush()
