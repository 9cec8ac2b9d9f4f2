"""Requesting a warm bundle: a pending bundle and a queued warm job for a ready artifact,
routed to a live worker with vLLM (409 ``no_capable_worker`` when there is none), sent by name
after commit. The making is artifacts/making/warm_steps.py (run by artifacts/making/warm_job.py);
every
state change after this one is jobs/warm_bundles.py's (all under tensor_registry_server/).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry.formats.variant import Variant
from tensor_registry.formats.warm import WarmFormatError, normalize_serve_args
from tensor_registry_server.artifacts import variants
from tensor_registry_server.artifacts.warm_schemas import WarmBundleOut, WarmRequest
from tensor_registry_server.audit.service import record
from tensor_registry_server.auth import Principal
from tensor_registry_server.core.errors import Conflict, Invalid, NotFound
from tensor_registry_server.core.pagination import Page, paginate
from tensor_registry_server.core.queue import WARM_TASK, TaskSender, enqueue_after_commit
from tensor_registry_server.jobs import warm_bundles
from tensor_registry_server.jobs.pool.service import Requirement, routable_workers, route
from tensor_registry_server.jobs.service import find_idempotent_job
from tensor_registry_server.rows.artifacts import Artifact, ArtifactStatus
from tensor_registry_server.rows.jobs import Job
from tensor_registry_server.rows.models import Model
from tensor_registry_server.rows.warm_bundles import BundleStatus, WarmBundle
from tensor_registry_server.settings import Settings

# Live (pending, running, ready) bundles one artifact may hold: one per set of serve arguments.
MAX_LIVE_BUNDLES = 8


@dataclass
class WarmOutcome:
    bundle: WarmBundle
    job: Job | None


def to_out(bundle: WarmBundle) -> WarmBundleOut:
    return WarmBundleOut(
        id=bundle.id,
        artifact_id=bundle.artifact_id,
        model_id=bundle.model_id,
        status=bundle.status,
        serve_args=list(bundle.serve_args or []),
        key=dict(bundle.key or {}),
        cache=dict(bundle.cache or {}),
        size=bundle.size,
        sha256=bundle.sha256,
        job_id=bundle.job_id,
        error=bundle.error,
        created_at=bundle.created_at,
        ready_at=bundle.ready_at,
    )


async def _existing(session: AsyncSession, bundle: WarmBundle) -> WarmOutcome:
    if bundle.status == BundleStatus.READY or bundle.job_id is None:
        return WarmOutcome(bundle, None)
    return WarmOutcome(bundle, await session.get(Job, bundle.job_id))


async def _live(session: AsyncSession, artifact_id: uuid.UUID, print_: str) -> WarmBundle | None:
    stmt = select(WarmBundle).where(
        WarmBundle.artifact_id == artifact_id,
        WarmBundle.fingerprint == print_,
        WarmBundle.status.in_(BundleStatus.LIVE),
    )
    return (await session.execute(stmt)).scalar_one_or_none()


async def _idempotent(
    session: AsyncSession, principal: Principal, key: str | None, request_print: str
) -> WarmOutcome | None:
    if not key:
        return None
    job = await find_idempotent_job(session, principal, key)
    if job is None:
        return None
    if job.params.get("fingerprint") != request_print:
        raise Invalid(
            "This Idempotency-Key was already used with a different request.",
            code="idempotency_key_reused",
            job_id=str(job.id),
        )
    bundle = await session.get(WarmBundle, warm_bundles.bundle_id_of(job))
    return WarmOutcome(bundle, job) if bundle is not None else None


async def _ready_artifact(session: AsyncSession, model: Model, data: WarmRequest) -> Artifact:
    version = await variants.ready_version(session, model, data.version)
    variant = Variant(data.dtype, data.format, data.tensor_parallel_size, data.encrypted)
    artifact = await variants.live_variant(session, version, variant)
    if artifact is None or artifact.status != ArtifactStatus.READY:
        raise NotFound(
            f"Version {version.number} of '{model.name}' has no ready artifact "
            f"{variant.dtype}/{variant.format}/tp{variant.tensor_parallel_size}"
            f"{'/encrypted' if variant.encrypted else ''} to warm; tensorize it first.",
            code="no_matching_artifact",
        )
    return artifact


async def _check_room(session: AsyncSession, artifact: Artifact) -> None:
    live = await session.scalar(
        select(func.count())
        .select_from(WarmBundle)
        .where(WarmBundle.artifact_id == artifact.id, WarmBundle.status.in_(BundleStatus.LIVE))
    )
    if (live or 0) >= MAX_LIVE_BUNDLES:
        raise Conflict(
            f"Artifact {artifact.id} holds {live} warm bundles, the most one artifact may; "
            "delete the artifact's older variants or reuse the serve arguments of one.",
            code="too_many_warm_bundles",
            limit=MAX_LIVE_BUNDLES,
        )


async def request_warm(
    session: AsyncSession,
    principal: Principal,
    model: Model,
    data: WarmRequest,
    *,
    idempotency_key: str | None,
    settings: Settings,
    sender: TaskSender,
) -> WarmOutcome:
    try:
        serve_args = normalize_serve_args(data.serve_args)
    except WarmFormatError as exc:
        raise Invalid(str(exc), code=exc.code) from None
    request_print = variants.fingerprint("warm", model.id, data.model_dump())
    found = await _idempotent(session, principal, idempotency_key, request_print)
    if found is not None:
        return found
    artifact = await _ready_artifact(session, model, data)
    bundle_print = hashlib.sha256(json.dumps(serve_args).encode()).hexdigest()
    existing = await _live(session, artifact.id, bundle_print)
    if existing is not None:
        return await _existing(session, existing)
    await _check_room(session, artifact)
    queue = route(
        await routable_workers(session, settings),
        Requirement(
            kind="warm",
            format=artifact.format,
            tensor_parallel_size=artifact.tensor_parallel_size,
            encrypted=False,  # warming loads no weights (docs/warm-state.md): no key needed
            source_bytes=0,
        ),
        settings,
    )
    bundle, job = warm_bundles.pending_bundle_and_job(
        principal,
        artifact,
        queue=queue,
        fingerprint=bundle_print,
        serve_args=serve_args,
        idempotency_key=idempotency_key,
        params={"fingerprint": request_print},
    )
    try:
        async with session.begin_nested():
            session.add(job)
            await session.flush()
            session.add(bundle)
            await session.flush()
    except IntegrityError:
        raced = await _live(session, artifact.id, bundle_print)
        if raced is None:
            raise Conflict(
                "A concurrent request changed this bundle; retry.", code="conflict"
            ) from None
        return await _existing(session, raced)
    enqueue_after_commit(session, sender, WARM_TASK, job.id, queue)
    record(
        session,
        action="warm.request",
        actor=principal,
        target_type="artifact",
        target_id=artifact.id,
        model=model.name,
        version=artifact.version_number,
        job_id=str(job.id),
        bundle_id=str(bundle.id),
        queue=queue,
        serve_args=serve_args,
    )
    return WarmOutcome(bundle, job)


async def list_bundles(
    session: AsyncSession,
    model: Model,
    *,
    artifact_id: uuid.UUID | None,
    status: str | None,
    cursor: str | None,
    limit: int,
) -> Page[WarmBundle]:
    stmt = select(WarmBundle).where(WarmBundle.model_id == model.id)
    if artifact_id is not None:
        stmt = stmt.where(WarmBundle.artifact_id == artifact_id)
    if status:
        stmt = stmt.where(WarmBundle.status == status)
    return await paginate(
        session,
        stmt,
        keys=[WarmBundle.created_at, WarmBundle.id],
        cursor=cursor,
        limit=limit,
        descending=True,
    )
