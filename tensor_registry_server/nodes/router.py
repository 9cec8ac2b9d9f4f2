from __future__ import annotations

import uuid
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.routing import APIRoute

from tensor_registry_server.auth import CurrentToken, Principal
from tensor_registry_server.core.db import SessionDep
from tensor_registry_server.core.errors import PayloadTooLarge
from tensor_registry_server.core.pagination import Cursor, Limit
from tensor_registry_server.core.schemas import ListOut
from tensor_registry_server.deps import SettingsDep
from tensor_registry_server.nodes import service
from tensor_registry_server.nodes.schemas import CheckIn, NodeOut, RolloutOut
from tensor_registry_server.rows.nodes import Node


class CheckInTooLarge(PayloadTooLarge):
    code, title = "checkin_too_large", "Check-in too large"


class BoundedBodyRoute(APIRoute):
    """A route whose JSON body is read only up to ``nodes.max_checkin_bytes`` (413 past it),
    before FastAPI parses it: a check-in is small, and every node sends one each minute."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def bounded(request: Request) -> Response:
            if request.method == "POST":
                limit = request.app.state.settings.nodes.max_checkin_bytes
                declared = request.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > limit:
                    raise _too_large(limit)
                body = bytearray()
                async for chunk in request.stream():
                    body += chunk
                    if len(body) > limit:
                        raise _too_large(limit)
                request._body = bytes(body)  # what FastAPI's request.body() returns
            return await handler(request)

        return bounded


def _too_large(limit: int) -> CheckInTooLarge:
    return CheckInTooLarge(
        f"A check-in is at most {limit} bytes (nodes.max_checkin_bytes).", limit=limit
    )


router = APIRouter(prefix="/api/v1", tags=["nodes"], route_class=BoundedBodyRoute)


def to_out(node: Node, principal: Principal, stale_after_seconds: float) -> NodeOut:
    shown = service.visible(node, principal)
    return NodeOut(
        id=node.id,
        hostname=node.hostname,
        agent_version=node.agent_version,
        status=service.status(node, stale_after_seconds),
        gpus=list(node.gpus),
        first_seen_at=node.first_seen_at,
        last_seen_at=node.last_seen_at,
        **shown,
    )


@router.post(
    "/nodes/checkin",
    response_model=NodeOut,
    responses={
        403: {"description": "`node_not_yours`: another owner registered this node id."},
        413: {"description": "`checkin_too_large`: past `nodes.max_checkin_bytes`."},
        429: {
            "description": "`too_many_nodes`: a new node would pass `nodes.max_per_owner` or "
            "`nodes.max_total`."
        },
    },
)
async def check_in(
    body: CheckIn, session: SessionDep, principal: CurrentToken, settings: SettingsDep
) -> NodeOut:
    node = await service.check_in(
        session,
        principal,
        body,
        forget_after_seconds=settings.nodes.forget_after_seconds,
        max_per_owner=settings.nodes.max_per_owner,
        max_total=settings.nodes.max_total,
    )
    return to_out(node, principal, settings.nodes.stale_after_seconds)


@router.get("/nodes", response_model=ListOut[NodeOut])
async def list_nodes(
    session: SessionDep,
    principal: CurrentToken,
    settings: SettingsDep,
    include_stale: Annotated[
        bool, Query(description="also nodes that stopped checking in")
    ] = False,
    cursor: Cursor = None,
    limit: Limit = 50,
) -> ListOut[NodeOut]:
    stale = settings.nodes.stale_after_seconds
    page = await service.list_nodes(
        session,
        principal,
        include_stale=include_stale,
        stale_after_seconds=stale,
        cursor=cursor,
        limit=limit,
    )
    return ListOut[NodeOut](
        items=[to_out(n, principal, stale) for n in page.items], next_cursor=page.next_cursor
    )


@router.get("/models/{model_id}/aliases/{alias}/rollout", response_model=RolloutOut)
async def rollout(
    model_id: uuid.UUID,
    alias: str,
    session: SessionDep,
    principal: CurrentToken,
    settings: SettingsDep,
) -> RolloutOut:
    return await service.rollout(
        session, principal, model_id, alias, stale_after_seconds=settings.nodes.stale_after_seconds
    )
