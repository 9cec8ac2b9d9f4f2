"""Tokens minted by tokens: minting needs a scope, a child never outlives or survives its parent.

- POST /api/v1/tokens needs ``tokens:write`` (or ``admin``) and grants at most what the minter
  holds, within its namespaces;
- a child's expiry is at most its parent's: omitted means the parent's, a later one is a 422
  ``expiry_exceeds_parent``;
- revoking a token revokes its whole subtree, and authentication checks every ancestor too, so a
  descendant stops working even where the cascade missed it (a legacy or racing row);
- the resolve route's principal cache keeps a revoked descendant for at most its TTL, measured
  here with an injected clock.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy import text

from harness.artifacts import make_artifact
from tensor_registry_server.auth import PrincipalCache
from tensor_registry_server.core.db import create_engine
from tensor_registry_server.settings import Settings
from tests.factories import auth, create_model, ready_version


async def _mint(
    client: httpx.AsyncClient, minter: str | None = None, **body: Any
) -> httpx.Response:
    headers = auth(minter) if minter else {}
    return await client.post("/api/v1/tokens", json={"name": "t", **body}, headers=headers)


async def _minted(client: httpx.AsyncClient, minter: str | None = None, **body: Any) -> dict:
    r = await _mint(client, minter, **body)
    assert r.status_code == 201, r.text
    return dict(r.json())


async def _sql(settings: Settings, statement: str, **params: Any) -> None:
    engine = create_engine(settings.database_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(statement), params)
    finally:
        await engine.dispose()


async def _status(client: httpx.AsyncClient, token: str) -> tuple[int, str | None]:
    r = await client.get("/api/v1/models", headers=auth(token))
    return r.status_code, (r.json().get("code") if r.status_code != 200 else None)


async def test_minting_needs_tokens_write_and_grants_no_more_than_held(
    client: httpx.AsyncClient,
) -> None:
    reader = (await _minted(client, scopes=["models:read"]))["token"]
    r = await _mint(client, reader, scopes=["models:read"])
    assert (r.status_code, r.json()["code"]) == (403, "insufficient_scope")

    minter = await _minted(client, scopes=["models:read", "tokens:write"], namespaces=["acme"])
    child = await _minted(client, minter["token"], scopes=["models:read"], namespaces=["acme"])
    assert child["parent_id"] == minter["id"] and child["scopes"] == ["models:read"]
    r = await _mint(client, minter["token"], scopes=["models:write"], namespaces=["acme"])
    assert (r.status_code, r.json()["code"]) == (403, "insufficient_scope")
    r = await _mint(client, minter["token"], scopes=["models:read"])
    assert (r.status_code, r.json()["code"]) == (403, "namespace_forbidden")
    # A namespace-limited admin stays within its namespaces too.
    ns_admin = (await _minted(client, scopes=["admin"], namespaces=["acme"]))["token"]
    r = await _mint(client, ns_admin, scopes=["models:read"], namespaces=["other"])
    assert (r.status_code, r.json()["code"]) == (403, "namespace_forbidden")
    assert (await _mint(client, ns_admin, scopes=["admin"], namespaces=["acme"])).status_code == 201
    listed = (await client.get("/api/v1/tokens", headers=auth(minter["token"]))).json()["items"]
    assert {t["id"] for t in listed} == {minter["id"], child["id"]}


async def test_a_child_never_expires_after_its_parent(client: httpx.AsyncClient) -> None:
    parent = await _minted(client, scopes=["models:read", "tokens:write"], ttl_seconds=60)
    parent_expiry = datetime.fromisoformat(parent["expires_at"])
    # No expiry asked for: the parent's.
    inherited = await _minted(client, parent["token"], scopes=["models:read"])
    assert datetime.fromisoformat(inherited["expires_at"]) == parent_expiry
    explicit_null = await _minted(client, parent["token"], scopes=["models:read"], expires_at=None)
    assert datetime.fromisoformat(explicit_null["expires_at"]) == parent_expiry
    # Later than the parent: refused, not shortened.
    later = (parent_expiry + timedelta(hours=1)).isoformat()
    for body in ({"expires_at": later}, {"ttl_seconds": 3600}):
        r = await _mint(client, parent["token"], scopes=["models:read"], **body)
        assert (r.status_code, r.json()["code"]) == (422, "expiry_exceeds_parent"), r.text
        assert datetime.fromisoformat(r.json()["parent_expires_at"]) == parent_expiry
    earlier = (parent_expiry - timedelta(seconds=30)).isoformat()
    shorter = await _minted(client, parent["token"], scopes=["models:read"], expires_at=earlier)
    assert datetime.fromisoformat(shorter["expires_at"]) == datetime.fromisoformat(earlier)
    # A grand-child of the admin's never-expiring chain may still choose no expiry.
    forever = await _minted(client, scopes=["models:read", "tokens:write"])
    assert (await _minted(client, forever["token"], scopes=["models:read"]))["expires_at"] is None


async def test_revoking_a_parent_revokes_children_and_grandchildren(
    client: httpx.AsyncClient,
) -> None:
    scopes = ["models:read", "tokens:write"]
    parent = await _minted(client, scopes=scopes)
    child = await _minted(client, parent["token"], scopes=scopes)
    grandchild = await _minted(client, child["token"], scopes=["models:read"])
    sibling = await _minted(client, scopes=["models:read"])
    for t in (parent, child, grandchild):
        assert await _status(client, t["token"]) == (200, None)
    assert (await client.delete(f"/api/v1/tokens/{parent['id']}")).status_code == 204
    for t in (parent, child, grandchild):
        assert await _status(client, t["token"]) == (401, "invalid_token"), t["name"]
    assert await _status(client, sibling["token"]) == (200, None)
    listed = (await client.get("/api/v1/tokens")).json()["items"]
    revoked = {t["id"]: t["revoked_at"] for t in listed}
    assert revoked[child["id"]] and revoked[grandchild["id"]] and not revoked[sibling["id"]]
    audit = (await client.get("/api/v1/audit")).json()["items"]
    revoke = next(e for e in audit if e["action"] == "token.revoke")
    assert revoke["target_id"] == parent["id"]


async def test_descendants_of_a_revoked_or_expired_ancestor_fail_even_without_the_cascade(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    """Rows the cascade never touched (minted while the revocation committed, or before this
    release): authentication walks the ancestors itself."""
    scopes = ["models:read", "tokens:write"]
    parent = await _minted(client, scopes=scopes)
    child = await _minted(client, parent["token"], scopes=scopes)
    grandchild = await _minted(client, child["token"], scopes=["models:read"])
    past = datetime.now(UTC) - timedelta(seconds=1)
    await _sql(
        settings,
        "UPDATE api_tokens SET revoked_at = CURRENT_TIMESTAMP WHERE prefix = :p",
        p=parent["token"][:10],
    )
    assert await _status(client, child["token"]) == (401, "invalid_token")
    assert await _status(client, grandchild["token"]) == (401, "invalid_token")

    other = await _minted(client, scopes=scopes, ttl_seconds=3600)
    other_child = await _minted(client, other["token"], scopes=["models:read"])
    # A legacy child with no expiry under a parent that has now expired.
    await _sql(
        settings, "UPDATE api_tokens SET expires_at = NULL WHERE prefix = :p",
        p=other_child["token"][:10],
    )  # fmt: skip
    assert await _status(client, other_child["token"]) == (200, None)
    await _sql(
        settings, "UPDATE api_tokens SET expires_at = :t WHERE prefix = :p",
        t=past, p=other["token"][:10],
    )  # fmt: skip
    assert await _status(client, other_child["token"]) == (401, "token_expired")


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_resolve_refuses_revoked_descendants_once_the_principal_ttl_passes(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings
) -> None:
    model = await create_model(client, name="acme/llama")
    await ready_version(client, model["id"])
    await make_artifact(settings, model="acme/llama", version=1)
    clock = _Clock()
    app.state.principal_cache = PrincipalCache(ttl=5.0, clock=clock)
    parent = await _minted(client, scopes=["resolve", "tokens:write"])
    child = await _minted(client, parent["token"], scopes=["resolve", "tokens:write"])
    grandchild = await _minted(client, child["token"], scopes=["resolve"])
    params = {"model": "acme/llama"}

    async def resolve(token: str) -> tuple[int, str | None]:
        r = await client.get("/api/v1/resolve", params=params, headers=auth(token))
        return r.status_code, (r.json().get("code") if r.status_code != 200 else None)

    for t in (child, grandchild):
        assert await resolve(t["token"]) == (200, None)
    assert (await client.delete(f"/api/v1/tokens/{parent['id']}")).status_code == 204
    # Within the documented window a replica may still answer from its cache ...
    clock.now += 4.9
    assert await resolve(grandchild["token"]) == (200, None)
    # ... and not a moment past it.
    clock.now += 0.2
    for t in (child, grandchild):
        assert await resolve(t["token"]) == (401, "invalid_token"), t["name"]
