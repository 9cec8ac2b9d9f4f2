"""Who a node belongs to, and the bounds on node rows (issue 33 §2, §3, §7.4), on SQLite and
PostgreSQL: another namespace's token cannot take a node over, readers see only the nodes they
may, rows are capped per owner and in all, an agent that stops is not counted, and a rollout
names the nodes that cannot become warm."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from tensor_registry_server.auth import Principal
from tensor_registry_server.core.db import session_scope
from tensor_registry_server.core.errors import Forbidden
from tensor_registry_server.nodes import service
from tensor_registry_server.nodes.schemas import CheckIn
from tensor_registry_server.settings import Settings
from tests.conftest import app_and_client
from tests.factories import auth, create_model, create_token, ready_version


def _checkin(node_id: str, *watches: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"node_id": node_id, "hostname": f"{node_id}.example", "watches": list(watches), **extra}


def _watch(model: str, state: str, version: int | None = None, **extra: Any) -> dict[str, Any]:
    return {"model": model, "ref": "prod", "state": state, "version": version, **extra}


async def _aliased(client: httpx.AsyncClient, name: str) -> str:
    model = await create_model(client, name=name)
    await ready_version(client, model["id"])
    r = await client.put(f"/api/v1/models/{model['id']}/aliases/prod", json={"version": 1})
    assert r.status_code == 201, r.text
    return str(model["id"])


async def test_another_namespace_cannot_take_over_a_node(client: httpx.AsyncClient) -> None:
    """The attack of issue 33 §2: namespace B's resolve token checks in as A's node. It is
    refused (403 node_not_yours) and A's node, its rollout and its watches stay as they were;
    B does not even see A's node listed. A second token of A's owner may check it in."""
    model_id = await _aliased(client, "acme/llama")
    a_node = await create_token(client, scopes=["resolve"], namespaces=["acme"], name="a-node")
    b_node = await create_token(client, scopes=["resolve"], namespaces=["evil"], name="b-node")
    body = _checkin("gpu-node-01", _watch("acme/llama", "pending", 1), gpus=[{"name": "H100"}])
    r = await client.post("/api/v1/nodes/checkin", json=body, headers=auth(a_node))
    assert r.status_code == 200, r.text
    rollout_url = f"/api/v1/models/{model_id}/aliases/prod/rollout"
    before = (await client.get(rollout_url)).json()
    assert (before["watching"], before["warm_share"]) == (1, 0.0)

    takeover = _checkin("gpu-node-01", hostname="evil.example", cached=[], gpus=[])
    r = await client.post("/api/v1/nodes/checkin", json=takeover, headers=auth(b_node))
    assert r.status_code == 403, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["code"] == "node_not_yours"
    after = (await client.get(rollout_url)).json()
    assert (after["watching"], after["warm_share"]) == (1, 0.0)
    [node] = (await client.get("/api/v1/nodes")).json()["items"]
    assert node["hostname"] == "gpu-node-01.example" and [g["name"] for g in node["gpus"]] == [
        "H100"
    ]
    assert [w["model"] for w in node["watches"]] == ["acme/llama"]

    # B's tokens do not see A's node at all (ids, hostnames and GPUs included).
    b_reader = await create_token(client, scopes=["models:read"], namespaces=["evil"])
    for token in (b_node, b_reader):
        listed = (await client.get("/api/v1/nodes", headers=auth(token))).json()["items"]
        assert listed == []
    # B's own node is B's to see; acme's reader sees acme's node only.
    r = await client.post("/api/v1/nodes/checkin", json=_checkin("b-01"), headers=auth(b_node))
    assert r.status_code == 200
    listed = (await client.get("/api/v1/nodes", headers=auth(b_node))).json()["items"]
    assert [n["id"] for n in listed] == ["b-01"]
    a_reader = await create_token(client, scopes=["models:read"], namespaces=["acme"])
    listed = (await client.get("/api/v1/nodes", headers=auth(a_reader))).json()["items"]
    assert [n["id"] for n in listed] == ["gpu-node-01"]

    # The same owner's second token (same root, same namespaces) keeps checking the node in.
    a_again = await create_token(client, scopes=["resolve"], namespaces=["acme"], name="a-new")
    warm = _checkin("gpu-node-01", _watch("acme/llama", "warm", 1))
    r = await client.post("/api/v1/nodes/checkin", json=warm, headers=auth(a_again))
    assert r.status_code == 200, r.text
    assert (await client.get(rollout_url)).json()["warm_share"] == 1.0


async def test_restricted_listing_pages_through_hidden_nodes(client: httpx.AsyncClient) -> None:
    """A restricted reader's pages skip the nodes it may not see and still end."""
    mine = await create_token(client, scopes=["resolve"], namespaces=["acme"])
    other = await create_token(client, scopes=["resolve"], namespaces=["evil"])
    for i in range(5):
        for token, prefix in ((mine, "a"), (other, "b")):
            r = await client.post(
                "/api/v1/nodes/checkin", json=_checkin(f"{prefix}{i}"), headers=auth(token)
            )
            assert r.status_code == 200
    seen, cursor = [], None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = (await client.get("/api/v1/nodes", params=params, headers=auth(mine))).json()
        seen += [n["id"] for n in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == [f"a{i}" for i in range(5)]


async def test_node_rows_are_capped_per_owner_and_in_all(data_dir: Any, database_url: str) -> None:
    settings = Settings(
        data_dir=data_dir,
        database={"url": database_url},  # type: ignore[arg-type]
        public_url="http://testserver",
        nodes={"max_per_owner": 3, "max_total": 5},  # type: ignore[arg-type]
    )
    async with app_and_client(settings) as (_, client):
        a = await create_token(client, scopes=["resolve"], namespaces=["acme"])
        b = await create_token(client, scopes=["resolve"], namespaces=["evil"])
        for i in range(3):
            r = await client.post("/api/v1/nodes/checkin", json=_checkin(f"a{i}"), headers=auth(a))
            assert r.status_code == 200
        r = await client.post("/api/v1/nodes/checkin", json=_checkin("a3"), headers=auth(a))
        assert r.status_code == 429, r.text
        problem = r.json()
        assert problem["code"] == "too_many_nodes" and problem["limit"] == 3
        assert "nodes.max_per_owner" in problem["detail"] and r.headers["retry-after"]
        # A known node keeps checking in at the cap.
        r = await client.post("/api/v1/nodes/checkin", json=_checkin("a0"), headers=auth(a))
        assert r.status_code == 200
        # Another owner has its own share, up to the registry's total.
        for i in range(2):
            r = await client.post("/api/v1/nodes/checkin", json=_checkin(f"b{i}"), headers=auth(b))
            assert r.status_code == 200
        r = await client.post("/api/v1/nodes/checkin", json=_checkin("b2"), headers=auth(b))
        assert r.status_code == 429 and r.json()["limit"] == 5
        listed = (await client.get("/api/v1/nodes")).json()["items"]
        assert len(listed) == 5


async def test_check_in_bodies_are_small(client: httpx.AsyncClient) -> None:
    """Lists a node row keeps are short; a body past nodes.max_checkin_bytes is 413."""
    for field, items in (
        ("cached", [f"00000000-0000-0000-0000-{i:012d}" for i in range(257)]),
        ("gpus", [{"name": "H100"}] * 17),
        ("watches", [_watch(f"acme/m{i}", "warm", 1) for i in range(33)]),
    ):
        r = await client.post("/api/v1/nodes/checkin", json=_checkin("n", **{field: items}))
        assert r.status_code == 422, field
    huge = _checkin("n", hostname="h" * 100, padding="x" * (70 * 1024))
    r = await client.post("/api/v1/nodes/checkin", json=huge)
    assert r.status_code == 413, r.text
    assert r.json()["code"] == "checkin_too_large" and r.json()["limit"] == 64 * 1024


async def test_a_stopped_agent_is_not_counted(client: httpx.AsyncClient) -> None:
    """An agent's final check-in (``stopped``) takes its node out of the rollout at once; it is
    listed as stopped (with include_stale) until it checks in again."""
    model_id = await _aliased(client, "acme/stop")
    rollout_url = f"/api/v1/models/{model_id}/aliases/prod/rollout"
    watching = _checkin("n1", _watch("acme/stop", "pending", 1))
    assert (await client.post("/api/v1/nodes/checkin", json=watching)).status_code == 200
    assert (await client.get(rollout_url)).json()["watching"] == 1
    r = await client.post("/api/v1/nodes/checkin", json={**watching, "stopped": True})
    assert r.status_code == 200 and r.json()["status"] == "stopped"
    assert (await client.get(rollout_url)).json()["watching"] == 0
    assert (await client.get("/api/v1/nodes")).json()["items"] == []
    [node] = (await client.get("/api/v1/nodes?include_stale=true")).json()["items"]
    assert node["status"] == "stopped"
    assert (await client.post("/api/v1/nodes/checkin", json=watching)).json()["status"] == "live"
    assert (await client.get(rollout_url)).json()["watching"] == 1


async def test_rollout_names_nodes_that_cannot_become_warm(client: httpx.AsyncClient) -> None:
    """A node that resolved the current target and found no artifact for its watch is listed
    in ``unmatched`` (still counted as pending); a pending node without that is not."""
    model_id = await _aliased(client, "acme/none")
    error = "Nothing to resolve: version 1 of 'acme/none' has no ready artifact with dtype=fp8"
    for body in (
        _checkin("stuck", _watch("acme/none", "pending", 1, error=error)),
        _checkin("older", _watch("acme/none", "pending", 0, error="from before the move")),
        _checkin("pulling", _watch("acme/none", "pending", None)),
    ):
        assert (await client.post("/api/v1/nodes/checkin", json=body)).status_code == 200
    rollout = (await client.get(f"/api/v1/models/{model_id}/aliases/prod/rollout")).json()
    assert rollout["watching"] == 3 and len(rollout["pending"]) == 3
    assert [(n["id"], n["error"]) for n in rollout["unmatched"]] == [("stuck", error)]


async def test_one_persons_tokens_share_their_nodes(app: Any) -> None:
    """Two tokens of one person (SSO: each minted at its own sign-in, so of different chain
    roots) check the same node in; another person's token of the same namespace may not."""
    alice, bob = uuid.uuid4(), uuid.uuid4()

    def token(person: uuid.UUID) -> Principal:
        own = uuid.uuid4()
        return Principal(
            token_id=own,
            name="t",
            scopes=frozenset({"resolve"}),
            namespaces=frozenset({"acme"}),
            person_id=person,
            root_id=own,
        )

    async def check_in(principal: Principal) -> None:
        async with session_scope(app.state.sessionmaker) as session:
            body = CheckIn.model_validate(_checkin("gpu-node-01"))
            await service.check_in(session, principal, body, forget_after_seconds=3600)

    await check_in(token(alice))
    await check_in(token(alice))  # her second sign-in's token
    with pytest.raises(Forbidden) as refused:
        await check_in(token(bob))
    assert refused.value.code == "node_not_yours"
