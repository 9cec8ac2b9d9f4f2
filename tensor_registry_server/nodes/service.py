"""Check-ins, the fleet list and rollouts. A node is what its agent, loads and pulls last said;
nodes that stop checking in age out: after ``nodes.stale_after_seconds`` they are listed as
``stale`` and left out of rollouts and the fleet gauges, after ``nodes.forget_after_seconds``
their row is deleted (by the next check-in of any node).

A check-in replaces the lists it carries (``watches``, ``cached``: the agent's whole view) and
keeps those it leaves out; ``loaded`` entries are merged into the node's recent loads (newest
first, one per who/artifact/rank, at most ``MAX_LOADS``). A load entry whose ``id`` is new is
observed into the load-seconds histogram once (tensor_registry_server.core.metrics), so a repeated
check-in counts
nothing twice."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry_server.auth import Principal
from tensor_registry_server.core import metrics
from tensor_registry_server.core.db import utcnow
from tensor_registry_server.core.errors import Forbidden, NotFound
from tensor_registry_server.core.events_outbox import namespace_of
from tensor_registry_server.core.pagination import Page, paginate
from tensor_registry_server.nodes.schemas import CheckIn, LoadIn, RolloutNode, RolloutOut
from tensor_registry_server.rows.aliases import Alias
from tensor_registry_server.rows.models import Model
from tensor_registry_server.rows.nodes import Node


def require_fleet_scope(principal: Principal) -> None:
    if not (principal.has_scope("resolve") or principal.has_scope("models:read")):
        raise Forbidden(
            "Nodes need the 'resolve' or 'models:read' scope.",
            code="insufficient_scope",
            scope="resolve",
        )


MAX_LOADS = 32


async def check_in(
    session: AsyncSession,
    principal: Principal,
    body: CheckIn,
    *,
    forget_after_seconds: float,
    now: datetime | None = None,
) -> Node:
    principal.require_scope("resolve")
    watches = body.watches or []
    loads = body.loaded or []
    for model in [w.model for w in watches] + [x.model for x in loads if x.model]:
        principal.require_namespace(namespace_of(model))
    now = now or utcnow()
    await forget_silent(session, before=now - timedelta(seconds=forget_after_seconds))
    node = await session.get(Node, body.node_id)
    if node is None:
        node = Node(id=body.node_id, first_seen_at=now, watches=[], cached=[], loaded=[])
        session.add(node)
    node.hostname = body.hostname
    node.agent_version = body.agent_version
    node.token_name = principal.name
    node.gpus = [g.model_dump() for g in body.gpus]
    if body.watches is not None:
        node.watches = [w.model_dump(mode="json") for w in body.watches]
    if body.cached is not None:
        node.cached = [str(a) for a in body.cached]
    if body.loaded is not None:
        node.loaded = merge_loads(list(node.loaded or []), body.loaded, now)
    node.last_seen_at = now
    await session.flush()
    return node


def merge_loads(
    known: list[dict[str, Any]], reported: list[LoadIn], now: datetime
) -> list[dict[str, Any]]:
    """``reported`` in front of ``known``: one entry per (who, artifact or model:ref, rank),
    the newest; each load seen for the first time (by its id) is observed into the histogram."""
    seen_ids = {x.get("id") for x in known if x.get("id")}
    fresh = []
    for load in reported:
        entry = {**load.model_dump(mode="json"), "reported_at": now.isoformat()}
        if load.id is not None and load.id in seen_ids:
            continue  # the same load told again: already here, already counted
        if load.id is not None:
            seen_ids.add(load.id)
        if load.error is None and load.warm is None:
            metrics.LOAD_SECONDS.labels(metrics.load_path_label(load.path)).observe(load.seconds)
        fresh.append(entry)

    def slot(entry: dict[str, Any]) -> tuple[Any, ...]:
        what = entry.get("artifact_id") or f"{entry.get('model')}:{entry.get('ref')}"
        return (entry.get("by"), what, entry.get("rank"))

    merged: list[dict[str, Any]] = []
    taken: set[tuple[Any, ...]] = set()
    for entry in [*fresh, *known]:
        if slot(entry) not in taken:
            taken.add(slot(entry))
            merged.append(entry)
    return merged[:MAX_LOADS]


async def forget_silent(session: AsyncSession, *, before: datetime) -> None:
    """Delete nodes silent since ``before`` (indexed on last_seen_at)."""
    await session.execute(delete(Node).where(Node.last_seen_at < before))


def is_live(node: Node, stale_after_seconds: float, now: datetime | None = None) -> bool:
    return node.last_seen_at >= (now or utcnow()) - timedelta(seconds=stale_after_seconds)


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
    now: datetime | None = None,
) -> Page[Node]:
    require_fleet_scope(principal)
    stmt = select(Node)
    if not include_stale:
        since = (now or utcnow()) - timedelta(seconds=stale_after_seconds)
        stmt = stmt.where(Node.last_seen_at >= since)
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


async def fleet_figures(
    session: AsyncSession, *, stale_after_seconds: float, now: datetime | None = None
) -> tuple[dict[str, int], dict[tuple[str, str], tuple[int, int]]]:
    """For /metrics: nodes by state (live, stale), and per (model, alias) watched by a live
    node, (live nodes watching it, those warm on its current version). Refs that are not
    aliases (a version number, ``latest``) are left out."""
    since = (now or utcnow()) - timedelta(seconds=stale_after_seconds)
    states = {"live": 0, "stale": 0}
    watched: dict[tuple[str, str], list[Any]] = {}
    rows = await session.execute(select(Node.last_seen_at, Node.watches))
    for last_seen_at, watches in rows:
        live = last_seen_at >= since
        states["live" if live else "stale"] += 1
        if not live:
            continue
        for watch in watches or []:
            key = (str(watch.get("model")), str(watch.get("ref")))
            watched.setdefault(key, []).append(
                watch.get("version") if watch.get("state") == "warm" else None
            )
    if not watched:
        return states, {}
    names = {model for model, _ in watched}
    targets = {
        (model, alias): version
        for model, alias, version in await session.execute(
            select(Model.name, Alias.name, Alias.version_number)
            .join(Alias, Alias.model_id == Model.id)
            .where(Model.name.in_(names))
        )
    }
    per_alias = {
        key: (len(versions), sum(1 for v in versions if v is not None and v == targets[key]))
        for key, versions in watched.items()
        if key in targets
    }
    return states, per_alias
