"""Artifacts: tensorized variants of a version. Requesting one (tensorize), registering one made
elsewhere (verify), reading, deleting, and the worker's final publish step.

A variant is (version, dtype, format, tensor_parallel_size, encrypted). At most one live
(pending/running/ready) artifact exists per variant (a partial unique index), so asking twice
returns the same job, and asking once it is ready returns the artifact.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload

from app.artifacts.schemas import ENCRYPTION_ALGORITHM, ArtifactRegister, TensorizeRequest
from app.artifacts.tables import Artifact, ArtifactStatus
from app.audit.service import record
from app.auth import Principal
from app.core.queue import TENSORIZE_TASK, VERIFY_TASK, TaskSender, enqueue_after_commit
from app.core.redact import redact_uri
from app.crypto import KEY_BYTES, new_key_id, wrap_key
from app.errors import Conflict, Invalid, NotFound
from app.fleet.service import Requirement, routable_workers, route
from app.jobs import lifecycle
from app.jobs.service import find_idempotent_job
from app.jobs.tables import Job, JobKind
from app.models.tables import Model
from app.pagination import Page, paginate
from app.settings import Settings
from app.storage.deferred_delete import delete_after_commit
from app.storage.registry import StorageRegistry
from app.versions.tables import Version, VersionFile, VersionStatus


@dataclass
class Outcome:
    """What a tensorize/register request led to: a job to follow, or a ready artifact."""

    artifact: Artifact
    job: Job | None


def _fingerprint(operation: str, model_id: uuid.UUID, body: dict[str, Any]) -> str:
    canonical = json.dumps(
        {"op": operation, "model_id": str(model_id), **body}, sort_keys=True, default=str
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


async def _idempotent(
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
    artifact = await _load(session, job.artifact_id) if job.artifact_id else None
    if artifact is None:
        raise NotFound(
            "The job of this Idempotency-Key has no artifact any more.", code="artifact_not_found"
        )
    return Outcome(artifact=artifact, job=job)


async def _load(session: AsyncSession, artifact_id: uuid.UUID) -> Artifact | None:
    stmt = (
        select(Artifact)
        .where(Artifact.id == artifact_id)
        .options(selectinload(Artifact.files))
        .execution_options(populate_existing=True)
    )
    return (await session.execute(stmt)).scalar_one_or_none()


async def _ready_version(session: AsyncSession, model: Model, number: int | None) -> Version:
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


async def _live_variant(
    session: AsyncSession,
    version: Version,
    *,
    dtype: str,
    format: str,
    tensor_parallel_size: int,
    encrypted: bool,
) -> Artifact | None:
    stmt = (
        select(Artifact)
        .where(
            Artifact.version_id == version.id,
            Artifact.dtype == dtype,
            Artifact.format == format,
            Artifact.tensor_parallel_size == tensor_parallel_size,
            Artifact.encrypted == encrypted,
            Artifact.status.in_(ArtifactStatus.LIVE),
        )
        .options(selectinload(Artifact.files))
    )
    return (await session.execute(stmt)).scalar_one_or_none()


async def _existing_outcome(session: AsyncSession, artifact: Artifact) -> Outcome:
    job = await session.get(Job, artifact.job_id) if artifact.job_id else None
    if artifact.status == ArtifactStatus.READY:
        return Outcome(artifact=artifact, job=None)
    return Outcome(artifact=artifact, job=job)


async def _source_bytes(session: AsyncSession, version: Version) -> int:
    sizes = (
        await session.execute(
            select(VersionFile.path, VersionFile.size).where(VersionFile.version_id == version.id)
        )
    ).all()
    return sum(size for path, size in sizes if path.endswith(".safetensors"))


async def request_tensorize(
    session: AsyncSession,
    principal: Principal,
    model: Model,
    data: TensorizeRequest,
    *,
    idempotency_key: str | None,
    storages: StorageRegistry,
    sender: TaskSender,
) -> Outcome:
    fingerprint = _fingerprint("tensorize", model.id, data.model_dump())
    if (found := await _idempotent(session, principal, idempotency_key, fingerprint)) is not None:
        return found
    if data.format == "hf" and data.tensor_parallel_size != 1:
        raise Invalid(
            "Format 'hf' holds whole tensors and is loaded at any tensor-parallel size; ask "
            "for tensor_parallel_size 1, or format 'vllm' for per-rank files.",
            code="unsupported_variant",
        )
    version = await _ready_version(session, model, data.version)
    storage = storages.get(data.storage).name
    variant: dict[str, Any] = {
        "dtype": data.dtype,
        "format": data.format,
        "tensor_parallel_size": data.tensor_parallel_size,
        "encrypted": data.encrypt,
    }
    existing = await _live_variant(session, version, **variant)
    if existing is not None:
        return await _existing_outcome(session, existing)

    settings = storages.settings
    source_bytes = await _source_bytes(session, version)
    queue = route(
        await routable_workers(session, settings),
        Requirement(
            kind="tensorize",
            format=data.format,
            tensor_parallel_size=data.tensor_parallel_size,
            encrypted=data.encrypt,
            source_bytes=source_bytes,
        ),
        settings,
    )
    artifact, job = lifecycle.pending_artifact_and_job(
        principal,
        model,
        version,
        kind=JobKind.TENSORIZE,
        origin="tensorize",
        storage=storage,
        queue=queue,
        variant=variant,
        idempotency_key=idempotency_key,
        params={
            "encrypt": data.encrypt,
            "source_bytes": source_bytes,
            "fingerprint": fingerprint,
        },
        encryption_algorithm=ENCRYPTION_ALGORITHM if data.encrypt else None,
    )
    raced = await _insert(session, artifact, job)
    if raced:
        # A concurrent request made the same variant (or used the same key) first.
        if (
            found := await _idempotent(session, principal, idempotency_key, fingerprint)
        ) is not None:
            return found
        existing = await _live_variant(session, version, **variant)
        if existing is None:
            raise Conflict("A concurrent request changed this variant; retry.", code="conflict")
        return await _existing_outcome(session, existing)
    enqueue_after_commit(session, sender, TENSORIZE_TASK, job.id, queue)
    record(
        session,
        action="tensorize.request",
        actor=principal,
        target_type="artifact",
        target_id=artifact.id,
        model=model.name,
        version=version.number,
        job_id=str(job.id),
        queue=queue,
        **variant,
    )
    return Outcome(artifact=artifact, job=job)


async def _insert(session: AsyncSession, artifact: Artifact, job: Job) -> bool:
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


def _check_register_uri(uri: str, tensor_parallel_size: int, settings: Settings) -> None:
    from app.versions.import_sources import check_source_uri

    check_source_uri(uri, settings)
    parsed = urlparse(uri)
    if parsed.scheme in ("http", "https"):
        template = "%03d" in parsed.path
        if tensor_parallel_size > 1 and not template:
            raise Invalid(
                "An https:// uri for tensor_parallel_size > 1 must name the rank files with a "
                "%03d template, e.g. https://host/path/model-rank-%03d.tensors.",
                code="invalid_source_uri",
            )
        if tensor_parallel_size == 1 and (template or not parsed.path.endswith(".tensors")):
            raise Invalid(
                "An https:// uri must name the .tensors file itself.", code="invalid_source_uri"
            )
    if "%" in uri.replace("%03d", ""):
        raise Invalid(
            "The uri may contain no '%' other than a %03d template.", code="invalid_source_uri"
        )


def _decode_key(encoded: str) -> bytes:
    try:
        key = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise Invalid(
            "encryption_key_b64 is not valid base64.", code="invalid_encryption_key"
        ) from exc
    if len(key) != KEY_BYTES:
        raise Invalid(
            f"encryption_key_b64 must decode to exactly {KEY_BYTES} bytes, not {len(key)}.",
            code="invalid_encryption_key",
        )
    return key


async def register_artifact(
    session: AsyncSession,
    principal: Principal,
    model: Model,
    data: ArtifactRegister,
    *,
    idempotency_key: str | None,
    storages: StorageRegistry,
    sender: TaskSender,
) -> Outcome:
    settings = storages.settings
    # The key is never part of the fingerprint, the job or a log: only its wrapped form is kept.
    fingerprint = _fingerprint(
        "register",
        model.id,
        {
            **data.model_dump(exclude={"encryption_key_b64"}),
            "encrypted": bool(data.encryption_key_b64),
        },
    )
    if (found := await _idempotent(session, principal, idempotency_key, fingerprint)) is not None:
        return found
    if data.format == "hf" and data.tensor_parallel_size != 1:
        raise Invalid(
            "Format 'hf' artifacts are one file; tensor_parallel_size must be 1.",
            code="unsupported_variant",
        )
    key = (
        _decode_key(data.encryption_key_b64.get_secret_value())
        if data.encryption_key_b64 is not None
        else None
    )
    _check_register_uri(data.uri, data.tensor_parallel_size, settings)
    version = await _ready_version(session, model, data.version)
    storage = storages.get(data.storage).name
    variant: dict[str, Any] = {
        "dtype": data.dtype,
        "format": data.format,
        "tensor_parallel_size": data.tensor_parallel_size,
        "encrypted": key is not None,
    }
    existing = await _live_variant(session, version, **variant)
    if existing is not None:
        raise Conflict(
            f"Version {version.number} already has a {existing.status} artifact of this variant.",
            code="variant_exists",
            artifact_id=str(existing.id),
        )
    queue = route(
        await routable_workers(session, settings),
        Requirement(
            kind="verify",
            format=data.format,
            tensor_parallel_size=data.tensor_parallel_size,
            encrypted=key is not None,
            source_bytes=0,
        ),
        settings,
    )
    artifact, job = lifecycle.pending_artifact_and_job(
        principal,
        model,
        version,
        kind=JobKind.VERIFY,
        origin="registered",
        storage=storage,
        queue=queue,
        variant=variant,
        idempotency_key=idempotency_key,
        # The raw uri stays on the artifact row for the verify job; the job shows it redacted.
        params={
            "uri": redact_uri(data.uri),
            "encrypted": key is not None,
            "fingerprint": fingerprint,
        },
        source_uri=data.uri,
    )
    if key is not None:
        artifact.wrapped_key = wrap_key(settings.master_key_bytes(), key, artifact_id=artifact.id)
        artifact.key_id = new_key_id()
        artifact.encryption_algorithm = ENCRYPTION_ALGORITHM
    if await _insert(session, artifact, job):
        if (
            found := await _idempotent(session, principal, idempotency_key, fingerprint)
        ) is not None:
            return found
        raise Conflict("A concurrent request registered this variant.", code="variant_exists")
    enqueue_after_commit(session, sender, VERIFY_TASK, job.id, queue)
    record(
        session,
        action="artifact.register",
        actor=principal,
        target_type="artifact",
        target_id=artifact.id,
        model=model.name,
        version=version.number,
        job_id=str(job.id),
        uri=redact_uri(data.uri),
        **variant,
    )
    return Outcome(artifact=artifact, job=job)


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
    artifact = await _load(session, artifact_id)
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
    await session.delete(artifact)
    await session.flush()
    delete_after_commit(session, storages, artifact.storage, artifact.storage_prefix)


def artifact_size(artifact: Artifact) -> int:
    return sum(f.size for f in artifact.files)


# ---------------------------------------------------------------------------------------------
# Worker side
