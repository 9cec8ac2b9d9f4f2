from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from tensor_registry_server.auth import CurrentToken, ReadToken, still_valid
from tensor_registry_server.core import streams
from tensor_registry_server.core.db import SessionDep
from tensor_registry_server.core.pagination import Cursor, Limit
from tensor_registry_server.core.schemas import ListOut
from tensor_registry_server.deps import SettingsDep
from tensor_registry_server.jobs import events, service
from tensor_registry_server.jobs.answers import job_variant, to_out, variant_of
from tensor_registry_server.jobs.schemas import JobOut

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])


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
    return to_out(job, await job_variant(session, job))


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
            "`http.max_event_streams_per_token` open event streams (job streams and "
            "`/api/v1/events` together) on this replica already.",
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
    variant = await job_variant(session, await service.get_job(session, principal, job_id))
    state = request.app.state
    if getattr(state, "job_watch", None) is None:
        state.job_watch = events.JobWatch(state.sessionmaker)
    slots = streams.slots_of(state, settings.http.max_event_streams_per_token)
    release = slots.take(principal.token_id)
    stream = events.job_events(
        state.sessionmaker,
        settings,
        job_id,
        lambda job: to_out(job, variant).model_dump_json(),
        watch=state.job_watch,
    )
    return StreamingResponse(
        streams.guarded(
            stream,
            still_valid=lambda: still_valid(state.sessionmaker, principal),
            every=settings.http.stream_token_check_seconds,
            release=release,
        ),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.post("/{job_id}/cancel", response_model=JobOut)
async def cancel_job(job_id: uuid.UUID, session: SessionDep, principal: CurrentToken) -> JobOut:
    job = await service.cancel_job(session, principal, job_id)
    return to_out(job, await job_variant(session, job))
