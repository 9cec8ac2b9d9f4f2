"""Node check-ins, the fleet list and an alias's rollout, on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import update

from tensor_registry_server.auth import Principal
from tensor_registry_server.core.db import session_scope, utcnow
from tensor_registry_server.nodes import service
from tensor_registry_server.nodes.schemas import CheckIn
from tensor_registry_server.rows.nodes import Node
from tensor_registry_server.settings import Settings
from tests.conftest import app_and_client
from tests.factories import auth, create_model, create_token, ready_version
from tests.metrics_traffic import scrape


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


def _load(artifact: str, *, load_id: str, seconds: float = 3.5, **extra: Any) -> dict[str, Any]:
    return {
        "id": load_id,
        "by": "load",
        "artifact_id": artifact,
        "model": "acme/llama",
        "ref": "prod",
        "version": 2,
        "path": "engine",
        "seconds": seconds,
        "gbps": 9.5,
        "verified": True,
        **extra,
    }


async def test_a_load_check_in_keeps_what_the_agent_said_and_counts_each_load_once(
    client: httpx.AsyncClient, anon: httpx.AsyncClient
) -> None:
    """The agent and `load` check in the same node: neither erases the other's lists, a load
    is merged into the node's recent loads, and a check-in repeated with the same load id is
    observed into the load-seconds histogram once."""
    artifact = str(uuid.uuid4())
    agent = _checkin("shared", _watch("acme/llama", "warm", 2, artifact_id=artifact))
    assert (
        await client.post("/api/v1/nodes/checkin", json={**agent, "cached": [artifact]})
    ).status_code == 200
    hist = "tensor_registry_node_load_seconds_count"
    before = await scrape(anon)
    load = {
        "node_id": "shared",
        "hostname": "shared.example",
        "loaded": [_load(artifact, load_id="l1")],
    }
    for _ in range(2):  # the same load told twice
        r = await client.post("/api/v1/nodes/checkin", json=load)
        assert r.status_code == 200, r.text
    node = r.json()
    assert node["watches"][0]["state"] == "warm" and node["cached"] == [artifact]
    [entry] = node["loaded"]
    assert (entry["id"], entry["path"], entry["seconds"], entry["verified"]) == (
        "l1",
        "engine",
        3.5,
        True,
    )
    assert entry["ref"] == "prod" and entry["reported_at"]
    middle = await scrape(anon)
    assert middle.value(hist, path="engine") == before.value(hist, path="engine") + 1

    # A new load of the same artifact replaces the entry; a failed one is kept but not timed.
    again = {**load, "loaded": [_load(artifact, load_id="l2", seconds=1.0)]}
    failed = {
        **load,
        "loaded": [_load("", load_id="l3", artifact_id=None, path="none", error="model_not_found")],
    }
    failed["loaded"][0]["ref"] = "canary"
    for body in (again, failed):
        assert (await client.post("/api/v1/nodes/checkin", json=body)).status_code == 200
    # The agent's next check-in (no `loaded`) leaves the loads alone.
    assert (await client.post("/api/v1/nodes/checkin", json=agent)).status_code == 200
    [listed] = (await client.get("/api/v1/nodes")).json()["items"]
    assert [(x["id"], x["error"]) for x in listed["loaded"]] == [
        ("l3", "model_not_found"),
        ("l2", None),
    ]
    after = await scrape(anon)
    assert after.value(hist, path="engine") == before.value(hist, path="engine") + 2
    assert after.value("tensor_registry_node_load_seconds_sum", path="engine") == (
        before.value("tensor_registry_node_load_seconds_sum", path="engine") + 4.5
    )

    # Bounded like every input: an odd path is counted as "other", a huge one refused.
    odd = {**load, "loaded": [_load(artifact, load_id="l4", path="my-own-loader")]}
    assert (await client.post("/api/v1/nodes/checkin", json=odd)).status_code == 200
    assert (await scrape(anon)).value(hist, path="other") >= 1
    assert "my-own-loader" not in (await scrape(anon)).text
    for bad in (
        {"id": "../x"},
        {"seconds": -1},
        {"path": "p" * 65},
        {"rank": 5000},
        {"error": "e" * 501},
    ):
        body = {**load, "loaded": [{**_load(artifact, load_id="l5"), **bad}]}
        assert (await client.post("/api/v1/nodes/checkin", json=body)).status_code == 422, bad


async def test_silent_nodes_go_stale_then_are_forgotten(app: Any) -> None:
    """Ageing with the clock given to the service, no sleeps: live until stale_after, listed
    as stale after it (left out by default), deleted once silent past forget_after."""
    admin = Principal(token_id=uuid.uuid4(), name="admin", scopes=frozenset({"admin"}))
    t0 = utcnow()
    stale, forget = 180.0, 3600.0

    async def check_in(node: str, at: Any) -> None:
        async with session_scope(app.state.sessionmaker) as session:
            body = CheckIn.model_validate(_checkin(node))
            await service.check_in(session, admin, body, forget_after_seconds=forget, now=at)

    async def listed(at: Any, *, include_stale: bool) -> dict[str, bool]:
        async with session_scope(app.state.sessionmaker) as session:
            page = await service.list_nodes(
                session,
                admin,
                include_stale=include_stale,
                stale_after_seconds=stale,
                cursor=None,
                limit=50,
                now=at,
            )
            return {n.id: service.is_live(n, stale, now=at) for n in page.items}

    await check_in("quiet", t0)
    await check_in("chatty", t0)
    assert await listed(t0 + timedelta(seconds=179), include_stale=False) == {
        "quiet": True,
        "chatty": True,
    }
    await check_in("chatty", t0 + timedelta(seconds=200))
    at = t0 + timedelta(seconds=201)
    assert await listed(at, include_stale=False) == {"chatty": True}
    assert await listed(at, include_stale=True) == {"quiet": False, "chatty": True}
    # Past forget_after, the next check-in of any node deletes the silent one's row.
    later = t0 + timedelta(seconds=forget + 1)
    await check_in("chatty", later)
    assert await listed(later, include_stale=True) == {"chatty": True}


async def test_fleet_gauges_after_real_check_ins(data_dir: Any, database_url: str) -> None:
    """/metrics after check-ins: nodes live and stale, and per alias the live nodes watching
    it and those warm on its current version — named only when the operator opts in."""
    for named in (False, True):
        settings = Settings(
            data_dir=data_dir,
            database={"url": database_url},  # type: ignore[arg-type]
            public_url="http://testserver",
            metrics={"model_labels": named},  # type: ignore[arg-type]
        )
        async with app_and_client(settings) as (application, client):
            model = await create_model(client, name="acme/fleet")
            for _ in range(2):
                await ready_version(client, model["id"])
            r = await client.put(f"/api/v1/models/{model['id']}/aliases/prod", json={"version": 2})
            assert r.status_code == 201
            for body in (
                _checkin("w1", _watch("acme/fleet", "warm", 2)),
                _checkin("w2", _watch("acme/fleet", "warm", 2)),
                _checkin("old", _watch("acme/fleet", "warm", 1)),
                _checkin("p", _watch("acme/fleet", "pending")),
                _checkin("latest", {**_watch("acme/fleet", "warm", 2), "ref": "latest"}),
                _checkin("silent", _watch("acme/fleet", "warm", 2)),
            ):
                assert (await client.post("/api/v1/nodes/checkin", json=body)).status_code == 200
            async with session_scope(application.state.sessionmaker) as session:  # type: ignore[attr-defined]
                await session.execute(
                    update(Node)
                    .where(Node.id == "silent")
                    .values(last_seen_at=utcnow() - timedelta(hours=1))
                )
            seen = await scrape(client)
        assert seen.value("tensor_registry_nodes", state="live") == 5
        assert seen.value("tensor_registry_nodes", state="stale") == 1
        labels = (
            {"model": "acme/fleet", "alias": "prod"} if named else {"model": "all", "alias": "all"}
        )
        # "latest" is not an alias: not counted; "silent" is stale: not counted.
        assert seen.value("tensor_registry_alias_nodes_watching", **labels) == 4
        assert seen.value("tensor_registry_alias_nodes_warm", **labels) == 2
        assert ("acme/fleet" in seen.text) is named
