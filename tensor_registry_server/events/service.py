"""The SSE stream of ``GET /api/v1/events``: replay from the cursor, then follow the hub."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Collection

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tensor_registry_server.auth import Principal
from tensor_registry_server.core import sse
from tensor_registry_server.core.errors import BadRequest, Forbidden
from tensor_registry_server.core.event_hub import EventHub
from tensor_registry_server.core.events_outbox import EventRecord, read_after

KEEPALIVE_SECONDS = 15.0
# Tells EventSource clients how long to wait before reconnecting (milliseconds).
RETRY_MS = 2000


def parse_cursor(last_event_id: str | None, after: int | None, newest: int) -> int:
    """Where the stream starts: ``Last-Event-ID`` (a reconnect), else ``?after=``, else now."""
    if last_event_id is not None and last_event_id.strip():
        value = last_event_id.strip()
        if not value.isdigit() or len(value) > 19:
            raise BadRequest("Last-Event-ID must be an event id.", code="invalid_event_id")
        return int(value)
    if after is not None:
        return after
    return newest


def check_access(principal: Principal) -> None:
    if not (principal.has_scope("models:read") or principal.has_scope("resolve")):
        raise Forbidden(
            "Following events needs the 'models:read' or 'resolve' scope.",
            code="insufficient_scope",
            scope="models:read",
        )


def _visible(event: EventRecord, principal: Principal, types: Collection[str] | None) -> bool:
    if types and event.type not in types:
        return False
    return principal.can_access_namespace(event.namespace)


async def stream(
    hub: EventHub,
    sessionmaker: async_sessionmaker[AsyncSession],
    principal: Principal,
    cursor: int,
    *,
    types: Collection[str] | None = None,
    keepalive_seconds: float = KEEPALIVE_SECONDS,
) -> AsyncIterator[str]:
    """Every event after ``cursor`` the token may see, in id order, then each new one."""
    # The starting point first (an id without data: EventSource clients keep it as their
    # Last-Event-ID, so a reconnect resumes here even before the first event).
    yield f"retry: {RETRY_MS}\nid: {cursor}\n\n"
    while True:
        batch = hub.after(cursor)
        if batch is None:
            # Older than the hub's window: this stream reads the gap itself, page by page.
            async with sessionmaker() as session:
                batch = await read_after(session, cursor)
            if not batch:
                cursor = max(cursor, hub.floor)
                continue
        if batch:
            for event in batch:
                cursor = event.id
                if _visible(event, principal, types):
                    data = json.dumps(event.payload(), separators=(",", ":"), default=str)
                    yield sse.frame(event.type, data, event.id)
            continue
        if not await hub.wait(cursor, keepalive_seconds, drains=True):
            if hub.draining:
                return  # the server shuts down: the client resumes from its Last-Event-ID
            yield sse.KEEPALIVE
