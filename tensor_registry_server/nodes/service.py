"""Check-ins, the fleet list and rollouts. A node is what its agent, loads and pulls last said;
nodes that stop checking in age out: after ``nodes.stale_after_seconds`` they are listed as
``stale`` and left out of rollouts and the fleet gauges, after ``nodes.forget_after_seconds``
their row is deleted (by the next check-in of any node). An agent that stops says so (a final
check-in with ``stopped``): the node is ``stopped`` and left out of rollouts at once.

A node belongs to whoever first checked it in: the root of that token's chain (the bootstrap or
CLI-minted token it descends from: one person's delegation) together with the token's
namespaces. Another token of the same root whose namespaces cover the owner's may check it in
again (a rotated token, or a second token of the same person); any other token gets 403
``node_not_yours`` and changes nothing. Rows are capped per owner and in all (``nodes.*``: 429
``too_many_nodes``). A reader sees a node only when it owns it or may see one of its watches
or loads (an unrestricted token sees all), and a rollout counts only nodes whose owner may act
in the model's namespace.

A check-in replaces the lists it carries (``watches``, ``cached``: the agent's whole view) and
keeps those it leaves out; ``loaded`` entries are merged into the node's recent loads (newest
first, one per who/artifact/rank, at most ``MAX_LOADS``). A load entry whose ``id`` is new is
observed into the load-seconds histogram once (tensor_registry_server.core.metrics), so a
repeated check-in counts nothing twice."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry_server.auth import Principal
from tensor_registry_server.core import metrics
from tensor_registry_server.core.db import utcnow
from tensor_registry_server.core.errors import AppError, Forbidden, NotFound
from tensor_registry_server.core.events_outbox import namespace_of
from tensor_registry_server.core.pagination import Page, decode_cursor, encode_cursor, paginate
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
EVERY_NAMESPACE = "*"


class TooManyNodes(AppError):
    status, code, title = 429, "too_many_nodes", "Too many nodes"


def owner_scope(principal: Principal) -> str:
    """The namespaces part of an owner, as stored in ``nodes.owner_scope``."""
    if principal.namespaces is None:
        return EVERY_NAMESPACE
    return ",".join(sorted(principal.namespaces))


def _scope_namespaces(scope: str) -> frozenset[str] | None:
    return None if scope == EVERY_NAMESPACE else frozenset(n for n in scope.split(",") if n)


def owns(principal: Principal, node: Node) -> bool:
    """Whether ``principal`` may check ``node`` in: the same root, covering its namespaces."""
    return principal.owner_id == node.owner_id and principal.covers(
        _scope_namespaces(node.owner_scope)
    )


async def _check_room(
    session: AsyncSession, principal: Principal, *, max_per_owner: int, max_total: int
) -> None:
    """429 when one more node would pass the owner's cap or the registry's."""
    mine = await session.scalar(
        select(func.count())
        .select_from(Node)
        .where(Node.owner_id == principal.owner_id, Node.owner_scope == owner_scope(principal))
    )
    if (mine or 0) >= max_per_owner:
        raise TooManyNodes(
            f"This token's owner has {mine} nodes, the most allowed (nodes.max_per_owner); "
            "nodes silent for nodes.forget_after_seconds are forgotten.",
            headers={"Retry-After": "60"},
            limit=max_per_owner,
        )
    total = await session.scalar(select(func.count()).select_from(Node))
    if (total or 0) >= max_total:
        raise TooManyNodes(
            f"The registry holds {total} nodes, the most allowed (nodes.max_total).",
            headers={"Retry-After": "60"},
            limit=max_total,
        )


async def check_in(
    session: AsyncSession,
    principal: Principal,
    body: CheckIn,
    *,
    forget_after_seconds: float,
    max_per_owner: int = 1024,
    max_total: int = 16384,
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
        await _check_room(session, principal, max_per_owner=max_per_owner, max_total=max_total)
        node = Node(
            id=body.node_id,
            owner_id=principal.owner_id,
            owner_scope=owner_scope(principal),
            first_seen_at=now,
            watches=[],
            cached=[],
            loaded=[],
        )
        session.add(node)
    elif not owns(principal, node):
        raise Forbidden(
            f"Node '{body.node_id}' was checked in by another owner; this token may not change "
            "it. Give this node its own id (TENSOR_REGISTRY_NODE_ID), or check in with a token "
            "of the node's owner.",
            code="node_not_yours",
        )
    node.stopped_at = now if body.stopped else None
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
        if load.error is None:
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


def status(node: Node, stale_after_seconds: float) -> Literal["live", "stale", "stopped"]:
    if node.stopped_at is not None:
        return "stopped"
    return "live" if is_live(node, stale_after_seconds) else "stale"


def may_see(node: Node, principal: Principal) -> bool:
    """Whether ``principal`` may see ``node`` at all: an unrestricted token sees every node,
    others only their owner's and those with a watch or load in one of their namespaces."""
    if principal.namespaces is None or owns(principal, node):
        return True
    shown = visible(node, principal)
    return bool(shown["watches"] or shown["loaded"])


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


SCAN_BATCH = 500


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
        stmt = stmt.where(Node.last_seen_at >= since, Node.stopped_at.is_(None))
    if principal.namespaces is None:
        return await paginate(session, stmt, keys=[Node.id], cursor=cursor, limit=limit)
    # Which nodes a restricted token may see depends on their watches and loads (JSON): read
    # on in id order, a batch at a time, until a page is full (the table is capped).
    after = decode_cursor(cursor, [Node.id])[0] if cursor else None
    found: list[Node] = []
    while True:
        batch_stmt = stmt if after is None else stmt.where(Node.id > after)
        batch = list(
            (await session.execute(batch_stmt.order_by(Node.id).limit(SCAN_BATCH))).scalars()
        )
        found.extend(n for n in batch if may_see(n, principal))
        if len(found) > limit:
            return Page(items=found[:limit], next_cursor=encode_cursor([found[limit - 1].id]))
        if len(batch) < SCAN_BATCH:
            return Page(items=found, next_cursor=None)
        after = batch[-1].id


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
        await session.execute(
            select(Node)
            .where(Node.last_seen_at >= since, Node.stopped_at.is_(None))
            .order_by(Node.id)
        )
    ).scalars()
    groups: dict[str, list[RolloutNode]] = {"warm": [], "previous": [], "pending": [], "failed": []}
    unmatched: list[RolloutNode] = []
    for node in nodes:
        owner_namespaces = _scope_namespaces(node.owner_scope)
        if owner_namespaces is not None and model.namespace not in owner_namespaces:
            continue  # its owner may not act here: whatever it says of this model is not counted
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
                # The agent resolved the current target and nothing matched its watch.
                if watch.get("error") and watch.get("version") == alias.version_number:
                    unmatched.append(entry)
            break
    watching = sum(len(g) for g in groups.values())
    return RolloutOut(
        model=model.name,
        alias=alias_name,
        version=alias.version_number,
        watching=watching,
        warm_share=len(groups["warm"]) / watching if watching else 1.0,
        unmatched=unmatched,
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
    rows = await session.execute(
        select(Node.last_seen_at, Node.watches).where(Node.stopped_at.is_(None))
    )
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
