from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from tensor_registry_server.auth import CurrentToken
from tensor_registry_server.core import sse
from tensor_registry_server.core.errors import Invalid, ServiceUnavailable
from tensor_registry_server.core.events_outbox import EVENT_TYPES
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
            "id is replayed first, across server restarts.",
        }
    },
)
async def events(
    request: Request,
    principal: CurrentToken,
    last_event_id: Annotated[str | None, Header(max_length=32)] = None,
    after: Annotated[int | None, Query(ge=0, description="Start after this event id.")] = None,
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
    body = service.stream(hub, request.app.state.sessionmaker, principal, cursor, types=wanted)
    return StreamingResponse(body, media_type="text/event-stream", headers=sse.HEADERS)
