"""Check-ins, the fleet list and rollouts. A node is what its agent last said; nodes that stop
checking in age out (``nodes.stale_after_seconds``): listed as ``stale``, left out of rollouts."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth import Principal
from app.core.events_outbox import namespace_of
from app.db import utcnow
from app.errors import Forbidden, NotFound
from app.nodes.schemas import CheckIn, RolloutNode, RolloutOut
from app.pagination import Page, paginate
from app.rows.aliases import Alias
from app.rows.models import Model
from app.rows.nodes import Node


def require_fleet_scope(principal: Principal) -> None:
    if not (principal.has_scope("resolve") or principal.has_scope("models:read")):
        raise Forbidden(
            "Nodes need the 'resolve' or 'models:read' scope.",
            code="insufficient_scope",
            scope="resolve",
        )


async def check_in(session: AsyncSession, principal: Principal, body: CheckIn) -> Node:
    principal.require_scope("resolve")
    for model in [w.model for w in body.watches] + [x.model for x in body.loaded if x.model]:
        principal.require_namespace(namespace_of(model))
    node = await session.get(Node, body.node_id)
    now = utcnow()
    if node is None:
        node = Node(id=body.node_id, first_seen_at=now)
        session.add(node)
    node.hostname = body.hostname
    node.agent_version = body.agent_version
    node.token_name = principal.name
    node.gpus = [g.model_dump() for g in body.gpus]
    node.watches = [w.model_dump(mode="json") for w in body.watches]
    node.cached = [str(a) for a in body.cached]
    node.loaded = [x.model_dump(mode="json") for x in body.loaded]
    node.last_seen_at = now
    await session.flush()
    return node


def is_live(node: Node, stale_after_seconds: float) -> bool:
    return node.last_seen_at >= utcnow() - timedelta(seconds=stale_after_seconds)


def visible(node: Node, principal: Principal) -> dict[str, Any]:
    """The node as this token may see it: watches and loads of its namespaces only."""

    def ok(model: Any) -> bool:
        return isinstance(model, str) and principal.can_access_namespace(namespace_of(model))

    return {
        "watches": [w for w in node.watches if ok(w.get("model"))],
        "loaded": [x for x in node.loaded if ok(x.get("model"))],
        # Artifact ids say nothing of their namespace: only an unrestricted token sees them.
        "cached": list(node.cached) if principal.namespaces is None else [],
    }


async def list_nodes(
    session: AsyncSession,
    principal: Principal,
    *,
    include_stale: bool,
    stale_after_seconds: float,
    cursor: str | None,
    limit: int,
) -> Page[Node]:
    require_fleet_scope(principal)
    stmt = select(Node)
    if not include_stale:
        stmt = stmt.where(Node.last_seen_at >= utcnow() - timedelta(seconds=stale_after_seconds))
    return await paginate(session, stmt, keys=[Node.id], cursor=cursor, limit=limit)


async def rollout(
    session: AsyncSession,
    principal: Principal,
    model_id: uuid.UUID,
    alias_name: str,
    *,
    stale_after_seconds: float,
) -> RolloutOut:
    require_fleet_scope(principal)
    model = await session.get(Model, model_id)
    if model is None or not principal.can_access_namespace(model.namespace):
        raise NotFound(f"No model with id {model_id}.", code="model_not_found")
    alias = (
        await session.execute(
            select(Alias).where(Alias.model_id == model.id, Alias.name == alias_name)
        )
    ).scalar_one_or_none()
    if alias is None:
        raise NotFound(f"Model '{model.name}' has no alias '{alias_name}'.", code="alias_not_found")
    since = utcnow() - timedelta(seconds=stale_after_seconds)
    nodes = (
        await session.execute(select(Node).where(Node.last_seen_at >= since).order_by(Node.id))
    ).scalars()
    groups: dict[str, list[RolloutNode]] = {"warm": [], "previous": [], "pending": [], "failed": []}
    for node in nodes:
        for watch in node.watches:
            if watch.get("model") != model.name or watch.get("ref") != alias_name:
                continue
            entry = RolloutNode(
                id=node.id,
                hostname=node.hostname,
                version=watch.get("version"),
                artifact_id=watch.get("artifact_id"),
                error=watch.get("error"),
                last_seen_at=node.last_seen_at,
            )
            state = watch.get("state")
            if state == "failed":
                groups["failed"].append(entry)
            elif state == "warm" and watch.get("version") == alias.version_number:
                groups["warm"].append(entry)
            elif state == "warm":
                groups["previous"].append(entry)
            else:
                groups["pending"].append(entry)
            break
    watching = sum(len(g) for g in groups.values())
    return RolloutOut(
        model=model.name,
        alias=alias_name,
        version=alias.version_number,
        watching=watching,
        warm_share=len(groups["warm"]) / watching if watching else 1.0,
        **groups,
    )
