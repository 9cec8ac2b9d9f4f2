from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from tensor_registry.formats.events import EVENT_TYPES
from tensor_registry_server.auth import CurrentToken, still_valid
from tensor_registry_server.core import sse, streams
from tensor_registry_server.core.errors import Invalid, ServiceUnavailable
from tensor_registry_server.deps import SettingsDep
from tensor_registry_server.events import service

router = APIRouter(prefix="/api/v1/events", tags=["events"])


@router.get(
    "",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "Server-sent events: `id:` the event id, `event:` its type, `data:` "
            '`{"id", "type", "timestamp", "namespace", "data"}`. Only events of the token\'s '
            "namespaces. Resume with `Last-Event-ID` (or `?after=`): every event after that "
            "id is replayed first, across server restarts. The stream ends within "
            "`http.stream_token_check_seconds` of the token being revoked or expiring.",
        },
        429: {
            "description": "`too_many_event_streams`: the token holds "
            "`http.max_event_streams_per_token` open event streams (these and job streams "
            "together) on this replica already.",
        },
    },
)
async def events(
    request: Request,
    principal: CurrentToken,
    settings: SettingsDep,
    last_event_id: Annotated[str | None, Header(max_length=32)] = None,
    after: Annotated[
        int | None, Query(ge=0, le=2**63 - 1, description="Start after this event id.")
    ] = None,
    types: Annotated[
        str | None,
        Query(max_length=512, description="Comma-separated event types to keep (default all)."),
    ] = None,
) -> StreamingResponse:
    service.check_access(principal)
    wanted = None
    if types:
        wanted = {t.strip() for t in types.split(",") if t.strip()}
        unknown = wanted - set(EVENT_TYPES)
        if unknown:
            raise Invalid(
                f"Unknown event types: {', '.join(sorted(unknown))}.",
                code="unknown_event_type",
                known=list(EVENT_TYPES),
            )
    hub = request.app.state.event_hub
    if not hub.ready:
        raise ServiceUnavailable(
            "The event stream is waiting for the database.", code="database_unavailable"
        )
    cursor = service.parse_cursor(last_event_id, after, hub.newest)
    state = request.app.state
    release = streams.slots_of(state, settings.http.max_event_streams_per_token).take(
        principal.token_id
    )
    body = streams.guarded(
        service.stream(hub, state.sessionmaker, principal, cursor, types=wanted),
        still_valid=lambda: still_valid(state.sessionmaker, principal),
        every=settings.http.stream_token_check_seconds,
        release=release,
    )
    return StreamingResponse(body, media_type="text/event-stream", headers=sse.HEADERS)
