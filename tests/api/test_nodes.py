"""Node check-ins, the fleet list and an alias's rollout, on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import update

from app.db import session_scope, utcnow
from app.rows.nodes import Node
from tests.factories import auth, create_model, create_token, ready_version


def _checkin(node_id: str, *watches: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"node_id": node_id, "hostname": f"{node_id}.example", "watches": list(watches), **extra}


def _watch(model: str, state: str, version: int | None = None, **extra: Any) -> dict[str, Any]:
    return {"model": model, "ref": "prod", "state": state, "version": version, **extra}


async def test_check_in_upserts_and_lists(client: httpx.AsyncClient) -> None:
    node = await create_token(client, scopes=["resolve"], name="node-token")
    artifact = str(uuid.uuid4())
    body = _checkin(
        "gpu-01",
        _watch("acme/llama", "warm", 2, artifact_id=artifact),
        cached=[artifact],
        gpus=[{"name": "NVIDIA H100 80GB HBM3"}],
        loaded=[
            {
                "artifact_id": artifact,
                "model": "acme/llama",
                "version": 2,
                "path": "engine",
                "seconds": 4.2,
                "gbps": 11.5,
                "verified": True,
            }
        ],
    )
    r = await client.post("/api/v1/nodes/checkin", json=body, headers=auth(node))
    assert r.status_code == 200, r.text
    first = r.json()
    assert first["status"] == "live" and first["cached"] == [artifact]
    r = await client.post(
        "/api/v1/nodes/checkin",
        json=_checkin("gpu-01", _watch("acme/llama", "pending", 2)),
        headers=auth(node),
    )
    assert r.status_code == 200
    [listed] = (await client.get("/api/v1/nodes")).json()["items"]
    assert listed["id"] == "gpu-01" and listed["watches"][0]["state"] == "pending"
    assert listed["first_seen_at"] == first["first_seen_at"]
    assert listed["last_seen_at"] >= first["last_seen_at"]


async def test_check_ins_are_bounded_and_namespaced(client: httpx.AsyncClient) -> None:
    acme_node = await create_token(client, scopes=["resolve"], namespaces=["acme"])
    r = await client.post(
        "/api/v1/nodes/checkin",
        json=_checkin("n1", _watch("other/model", "warm", 1)),
        headers=auth(acme_node),
    )
    assert r.status_code == 403 and r.json()["code"] == "namespace_forbidden"
    reader = await create_token(client, scopes=["models:read"])
    r = await client.post("/api/v1/nodes/checkin", json=_checkin("n1"), headers=auth(reader))
    assert r.status_code == 403 and r.json()["code"] == "insufficient_scope"
    bad_id = await client.post("/api/v1/nodes/checkin", json=_checkin("../etc"))
    assert bad_id.status_code == 422
    too_many = _checkin("n1", *[_watch(f"acme/m{i}", "warm", 1) for i in range(65)])
    assert (await client.post("/api/v1/nodes/checkin", json=too_many)).status_code == 422

    # A token limited to acme sees only acme's watches of a node that watches both.
    await client.post(
        "/api/v1/nodes/checkin",
        json=_checkin("n2", _watch("acme/a", "warm", 1), _watch("other/b", "warm", 1)),
    )
    acme_reader = await create_token(client, scopes=["models:read"], namespaces=["acme"])
    [seen] = (await client.get("/api/v1/nodes", headers=auth(acme_reader))).json()["items"]
    assert [w["model"] for w in seen["watches"]] == ["acme/a"]


async def test_rollout_of_an_alias(client: httpx.AsyncClient, app: Any) -> None:
    model = await create_model(client, name="acme/roll")
    for _ in range(2):
        await ready_version(client, model["id"])
    r = await client.put(f"/api/v1/models/{model['id']}/aliases/prod", json={"version": 2})
    assert r.status_code == 201
    for body in (
        _checkin("a", _watch("acme/roll", "warm", 2)),
        _checkin("b", _watch("acme/roll", "warm", 1)),
        _checkin("c", _watch("acme/roll", "failed", 1, error="cache_budget_exceeded")),
        _checkin("d", _watch("acme/roll", "pending", None)),
        _checkin("e", {**_watch("acme/roll", "warm", 2), "ref": "staging"}),  # another alias
        _checkin("gone", _watch("acme/roll", "warm", 1)),
    ):
        assert (await client.post("/api/v1/nodes/checkin", json=body)).status_code == 200
    # "gone" stopped checking in: it ages out of the rollout and is listed as stale.
    async with session_scope(app.state.sessionmaker) as session:
        await session.execute(
            update(Node).where(Node.id == "gone").values(last_seen_at=utcnow() - timedelta(hours=1))
        )
    rollout = (await client.get(f"/api/v1/models/{model['id']}/aliases/prod/rollout")).json()
    assert rollout["version"] == 2 and rollout["watching"] == 4
    assert [n["id"] for n in rollout["warm"]] == ["a"]
    assert [n["id"] for n in rollout["previous"]] == ["b"]
    assert [(n["id"], n["error"]) for n in rollout["failed"]] == [("c", "cache_budget_exceeded")]
    assert [n["id"] for n in rollout["pending"]] == ["d"]
    assert rollout["warm_share"] == 0.25
    live = {n["id"] for n in (await client.get("/api/v1/nodes")).json()["items"]}
    assert "gone" not in live and {"a", "b", "c", "d", "e"} <= live
    everything = (await client.get("/api/v1/nodes?include_stale=true")).json()["items"]
    assert {n["id"]: n["status"] for n in everything}["gone"] == "stale"

    missing = await client.get(f"/api/v1/models/{model['id']}/aliases/nope/rollout")
    assert missing.status_code == 404 and missing.json()["code"] == "alias_not_found"
    outsider = await create_token(client, scopes=["models:read"], namespaces=["other"])
    hidden = await client.get(
        f"/api/v1/models/{model['id']}/aliases/prod/rollout", headers=auth(outsider)
    )
    assert hidden.status_code == 404
