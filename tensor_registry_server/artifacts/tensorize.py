"""Requesting a tensorize: a pending artifact and a queued job for a variant of a ready version,
routed to a queue that a live worker able to run it consumes
(tensor_registry_server.jobs.pool.service), sent by name
after commit. The worker's side is tensor_registry_server/artifacts/making/tensorize.py; every state
change after
this one is tensor_registry_server.jobs.lifecycle's.
"""

from __future__ import annotations

from dataclasses import asdict

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry.formats.variant import Variant
from tensor_registry_server.artifacts import variants
from tensor_registry_server.artifacts.schemas import ENCRYPTION_ALGORITHM, TensorizeRequest
from tensor_registry_server.audit.service import record
from tensor_registry_server.auth import Principal
from tensor_registry_server.core.errors import Conflict, Invalid
from tensor_registry_server.core.queue import TENSORIZE_TASK, TaskSender, enqueue_after_commit
from tensor_registry_server.jobs import lifecycle
from tensor_registry_server.jobs.pool.service import Requirement, routable_workers, route
from tensor_registry_server.limits.service import check_job
from tensor_registry_server.rows.jobs import JobKind
from tensor_registry_server.rows.models import Model
from tensor_registry_server.rows.versions import Version, VersionFile
from tensor_registry_server.storage.registry import StorageRegistry


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
) -> variants.Outcome:
    fingerprint = variants.fingerprint("tensorize", model.id, data.model_dump())
    if (
        found := await variants.idempotent(session, principal, idempotency_key, fingerprint)
    ) is not None:
        return found
    if data.format == "hf" and data.tensor_parallel_size != 1:
        raise Invalid(
            "Format 'hf' holds whole tensors and is loaded at any tensor-parallel size; ask "
            "for tensor_parallel_size 1, or format 'vllm' for per-rank files.",
            code="unsupported_variant",
        )
    version = await variants.ready_version(session, model, data.version)
    storage = storages.get(data.storage).name
    variant = Variant(data.dtype, data.format, data.tensor_parallel_size, data.encrypt)
    existing = await variants.live_variant(session, version, variant)
    if existing is not None:
        return await variants.existing_outcome(session, existing)

    settings = storages.settings
    source_bytes = await _source_bytes(session, version)
    # Refused before anything is enqueued: too many jobs, or an artifact (estimated at its
    # source's size) that would pass the namespace's quota.
    await check_job(session, settings, model.namespace, expected_bytes=source_bytes)
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
            "source_bytes": source_bytes,
            "fingerprint": fingerprint,
        },
        encryption_algorithm=ENCRYPTION_ALGORITHM if data.encrypt else None,
    )
    raced = await variants.insert_rows(session, artifact, job)
    if raced:
        # A concurrent request made the same variant (or used the same key) first.
        if (
            found := await variants.idempotent(session, principal, idempotency_key, fingerprint)
        ) is not None:
            return found
        existing = await variants.live_variant(session, version, variant)
        if existing is None:
            raise Conflict("A concurrent request changed this variant; retry.", code="conflict")
        return await variants.existing_outcome(session, existing)
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
        **asdict(variant),
    )
    return variants.Outcome(artifact=artifact, job=job)
