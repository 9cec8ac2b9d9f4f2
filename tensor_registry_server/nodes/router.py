from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query

from tensor_registry_server.auth import CurrentToken, Principal
from tensor_registry_server.core.db import SessionDep
from tensor_registry_server.core.pagination import Cursor, Limit
from tensor_registry_server.core.schemas import ListOut
from tensor_registry_server.deps import SettingsDep
from tensor_registry_server.nodes import service
from tensor_registry_server.nodes.schemas import CheckIn, NodeOut, RolloutOut
from tensor_registry_server.rows.nodes import Node

router = APIRouter(prefix="/api/v1", tags=["nodes"])


def to_out(node: Node, principal: Principal, stale_after_seconds: float) -> NodeOut:
    shown = service.visible(node, principal)
    return NodeOut(
        id=node.id,
        hostname=node.hostname,
        agent_version=node.agent_version,
        status="live" if service.is_live(node, stale_after_seconds) else "stale",
        gpus=list(node.gpus),
        first_seen_at=node.first_seen_at,
        last_seen_at=node.last_seen_at,
        **shown,
    )


@router.post("/nodes/checkin", response_model=NodeOut)
async def check_in(
    body: CheckIn, session: SessionDep, principal: CurrentToken, settings: SettingsDep
) -> NodeOut:
    node = await service.check_in(
        session, principal, body, forget_after_seconds=settings.nodes.forget_after_seconds
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
