from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from app.auth import CurrentToken, ReadToken
from app.core.redact import redact_value
from app.db import SessionDep
from app.deps import SettingsDep
from app.jobs import events, service
from app.jobs.schemas import JobError, JobOut, JobProgress
from app.pagination import Cursor, Limit
from app.rows.jobs import Job
from app.schemas import ListOut

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])


def to_out(job: Job, model_name: str | None = None) -> JobOut:
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
        params={
            k: redact_value(v) if k in ("uri", "source_uri") else v
            for k, v in (job.params or {}).items()
            if k != "fingerprint"
        },
        result=dict(job.result or {}),
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        updated_at=job.updated_at,
    )


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
    return ListOut[JobOut](
        items=[to_out(j, names.get(j.model_id) if j.model_id else None) for j in page.items],
        next_cursor=page.next_cursor,
    )


@router.get("/{job_id}", response_model=JobOut)
async def get_job(job_id: uuid.UUID, session: SessionDep, principal: ReadToken) -> JobOut:
    return to_out(await service.get_job(session, principal, job_id))


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
    await service.get_job(session, principal, job_id)
    state = request.app.state
    if getattr(state, "job_stream_slots", None) is None:
        state.job_stream_slots = events.StreamSlots(settings.http.max_event_streams_per_token)
        state.job_watch = events.JobWatch(state.sessionmaker)
    release = state.job_stream_slots.take(principal.token_id)
    stream = events.job_events(
        state.sessionmaker,
        settings,
        job_id,
        lambda job: to_out(job).model_dump_json(),
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
    return to_out(await service.cancel_job(session, principal, job_id))
