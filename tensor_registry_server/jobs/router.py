from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry.formats.variant import Variant
from tensor_registry_server.auth import CurrentToken, ReadToken
from tensor_registry_server.core.db import SessionDep
from tensor_registry_server.core.pagination import Cursor, Limit
from tensor_registry_server.core.redact import redact_value
from tensor_registry_server.core.schemas import ListOut, VariantOut
from tensor_registry_server.deps import SettingsDep
from tensor_registry_server.jobs import events, service
from tensor_registry_server.jobs.schemas import JobError, JobOut, JobProgress
from tensor_registry_server.rows.artifacts import Artifact
from tensor_registry_server.rows.jobs import Job, JobKind

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])


# What a job's params carried a copy of before the variant had one home (issue 27): still
# answered for older clients, derived from the artifact row, never stored again.
_DEPRECATED_PARAMS = (
    "version",
    "dtype",
    "format",
    "tensor_parallel_size",
    "storage",
    "encrypt",
    "encrypted",
)


def variant_of(job: Job, artifact: Artifact | None) -> VariantOut | None:
    """What ``job`` makes: its artifact row's typed variant. A job from before issue 27 whose
    artifact is gone answers with the copy its params kept; any other job without one, None."""
    if artifact is not None:
        return VariantOut.of(
            artifact.variant, version=artifact.version_number, storage=artifact.storage
        )
    return _stored_copy(job.params or {})


def _stored_copy(params: dict[str, Any]) -> VariantOut | None:
    try:
        variant = Variant(
            params["dtype"],
            params["format"],
            int(params.get("tensor_parallel_size", 1)),
            bool(params.get("encrypt") or params.get("encrypted")),
        )
        return VariantOut.of(variant, version=int(params["version"]), storage=params["storage"])
    except (KeyError, TypeError, ValueError):
        return None


def _params(job: Job, variant: VariantOut | None) -> dict[str, Any]:
    shown = {
        k: redact_value(v) if k in ("uri", "source_uri") else v
        for k, v in (job.params or {}).items()
        if k != "fingerprint" and k not in _DEPRECATED_PARAMS
    }
    if variant is not None:
        shown.update(variant.model_dump(exclude={"encrypted"}))
        shown["encrypt" if job.kind == JobKind.TENSORIZE else "encrypted"] = variant.encrypted
    return shown


def to_out(job: Job, variant: VariantOut | None, model_name: str | None = None) -> JobOut:
    return JobOut(
        id=job.id,
        kind=job.kind,
        status=job.status,
        progress=JobProgress(
            stage=job.stage, bytes_done=job.bytes_done, bytes_total=job.bytes_total
        ),
        attempts=job.attempts,
        error=JobError.model_validate(job.error) if job.error else None,
        artifact_id=job.artifact_id,
        model_id=job.model_id,
        model_name=model_name,
        version_id=job.version_id,
        queue=job.queue,
        worker=job.worker,
        cancel_requested=job.cancel_requested,
        variant=variant,
        params=_params(job, variant),
        result=dict(job.result or {}),
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        updated_at=job.updated_at,
    )


async def _job_variant(session: AsyncSession, job: Job) -> VariantOut | None:
    artifacts = await service.job_artifacts(session, [job])
    return variant_of(job, artifacts.get(job.artifact_id) if job.artifact_id else None)


@router.get("", response_model=ListOut[JobOut])
async def list_jobs(
    session: SessionDep,
    principal: ReadToken,
    model_id: uuid.UUID | None = None,
    status: Annotated[
        str | None, Query(pattern="^(queued|running|succeeded|failed|cancelled)$")
    ] = None,
    kind: Annotated[str | None, Query(pattern="^(tensorize|import|verify)$")] = None,
    cursor: Cursor = None,
    limit: Limit = 50,
) -> ListOut[JobOut]:
    page = await service.list_jobs(
        session, principal, model_id=model_id, status=status, kind=kind, cursor=cursor, limit=limit
    )
    names = await service.model_names(session, page.items)
    artifacts = await service.job_artifacts(session, page.items)
    return ListOut[JobOut](
        items=[
            to_out(
                j,
                variant_of(j, artifacts.get(j.artifact_id) if j.artifact_id else None),
                names.get(j.model_id) if j.model_id else None,
            )
            for j in page.items
        ],
        next_cursor=page.next_cursor,
    )


@router.get("/{job_id}", response_model=JobOut)
async def get_job(job_id: uuid.UUID, session: SessionDep, principal: ReadToken) -> JobOut:
    job = await service.get_job(session, principal, job_id)
    return to_out(job, await _job_variant(session, job))


@router.get(
    "/{job_id}/events",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "`event: job` with the job's JSON on every change of status or "
            "progress; the stream ends after a final status.",
        },
        429: {
            "description": "`too_many_event_streams`: the token holds "
            "`http.max_event_streams_per_token` open streams on this replica already.",
        },
    },
)
async def job_events(
    job_id: uuid.UUID,
    request: Request,
    session: SessionDep,
    principal: ReadToken,
    settings: SettingsDep,
) -> StreamingResponse:
    # What the job makes is fixed when it is queued: read once, sent with every change.
    variant = await _job_variant(session, await service.get_job(session, principal, job_id))
    state = request.app.state
    if getattr(state, "job_stream_slots", None) is None:
        state.job_stream_slots = events.StreamSlots(settings.http.max_event_streams_per_token)
        state.job_watch = events.JobWatch(state.sessionmaker)
    release = state.job_stream_slots.take(principal.token_id)
    stream = events.job_events(
        state.sessionmaker,
        settings,
        job_id,
        lambda job: to_out(job, variant).model_dump_json(),
        watch=state.job_watch,
        release=release,
    )
    return StreamingResponse(
        stream,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.post("/{job_id}/cancel", response_model=JobOut)
async def cancel_job(job_id: uuid.UUID, session: SessionDep, principal: CurrentToken) -> JobOut:
    job = await service.cancel_job(session, principal, job_id)
    return to_out(job, await _job_variant(session, job))
