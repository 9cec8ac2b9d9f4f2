"""Tokens, scopes and namespace limits."""

from __future__ import annotations

import httpx

from tests.conftest import ADMIN_TOKEN
from tests.factories import auth, create_model, create_token


async def test_missing_and_invalid_tokens_are_401(client: httpx.AsyncClient) -> None:
    r = await client.get("/api/v1/models", headers={"Authorization": ""})
    assert r.status_code == 401 and r.json()["code"] == "missing_token"
    assert r.headers["www-authenticate"].startswith("Bearer")
    r = await client.get("/api/v1/models", headers=auth("trg_nope"))
    assert r.status_code == 401 and r.json()["code"] == "invalid_token"
    r = await client.get("/api/v1/models", headers={"Authorization": "Basic abc"})
    assert r.status_code == 401


async def test_secret_is_shown_once_and_stored_only_as_hash(
    client: httpx.AsyncClient, settings
) -> None:
    r = await client.post("/api/v1/tokens", json={"name": "ci", "scopes": ["models:read"]})
    assert r.status_code == 201
    secret = r.json()["token"]
    assert set(r.json()) >= {"id", "name", "scopes", "namespaces", "expires_at", "token"}
    listing = (await client.get("/api/v1/tokens")).json()["items"]
    assert all("token" not in t for t in listing)
    assert secret not in (await client.get("/api/v1/tokens")).text

    from sqlalchemy import text

    from tensor_registry_server.core.db import create_engine

    engine = create_engine(settings.database_url)
    async with engine.connect() as conn:
        rows = (await conn.execute(text("SELECT token_hash, prefix FROM api_tokens"))).all()
    await engine.dispose()
    assert all(secret not in (h + p) or p == secret[:10] for h, p in rows)
    assert any(len(h) == 64 for h, _ in rows)


async def test_scope_is_enforced(client: httpx.AsyncClient) -> None:
    reader = await create_token(client, scopes=["models:read"])
    assert (await client.get("/api/v1/models", headers=auth(reader))).status_code == 200
    r = await client.post("/api/v1/models", json={"name": "acme/x"}, headers=auth(reader))
    assert r.status_code == 403 and r.json()["code"] == "insufficient_scope"
    r = await client.get("/api/v1/audit", headers=auth(reader))
    assert r.status_code == 403


async def test_namespace_limited_token_cannot_touch_another_namespace(
    client: httpx.AsyncClient,
) -> None:
    theirs = await create_model(client, name="other/secret-model")
    acme_writer = await create_token(
        client, scopes=["models:read", "models:write"], namespaces=["acme"]
    )
    h = auth(acme_writer)
    assert (
        await client.post("/api/v1/models", json={"name": "acme/mine"}, headers=h)
    ).status_code == 201
    r = await client.post("/api/v1/models", json={"name": "other/x"}, headers=h)
    assert r.status_code == 403 and r.json()["code"] == "namespace_forbidden"
    # By id, another namespace's model answers as a missing one (tests/api/test_id_oracle.py).
    assert (await client.get(f"/api/v1/models/{theirs['id']}", headers=h)).status_code == 404
    r = await client.patch(f"/api/v1/models/{theirs['id']}", json={"description": "x"}, headers=h)
    assert r.status_code == 404
    assert (
        await client.post(f"/api/v1/models/{theirs['id']}/versions", json={}, headers=h)
    ).status_code == 404
    listed = (await client.get("/api/v1/models", headers=h)).json()["items"]
    assert [m["name"] for m in listed] == ["acme/mine"]


async def test_tokens_cannot_grant_more_than_they_hold(client: httpx.AsyncClient) -> None:
    writer = await create_token(
        client, scopes=["models:read", "models:write", "tokens:write"], namespaces=["acme"]
    )
    r = await client.post(
        "/api/v1/tokens", json={"name": "x", "scopes": ["admin"]}, headers=auth(writer)
    )
    assert r.status_code == 403
    r = await client.post(
        "/api/v1/tokens",
        json={"name": "x", "scopes": ["models:read"], "namespaces": ["other"]},
        headers=auth(writer),
    )
    assert r.status_code == 403 and r.json()["code"] == "namespace_forbidden"
    r = await client.post(
        "/api/v1/tokens",
        json={"name": "x", "scopes": ["models:read"], "namespaces": ["acme"]},
        headers=auth(writer),
    )
    assert r.status_code == 201


async def test_revoked_and_expired_tokens_stop_working(client: httpx.AsyncClient) -> None:
    r = await client.post("/api/v1/tokens", json={"name": "short", "scopes": ["models:read"]})
    token, token_id = r.json()["token"], r.json()["id"]
    assert (await client.get("/api/v1/models", headers=auth(token))).status_code == 200
    assert (await client.delete(f"/api/v1/tokens/{token_id}")).status_code == 204
    assert (await client.get("/api/v1/models", headers=auth(token))).json()[
        "code"
    ] == "invalid_token"
    r = await client.post(
        "/api/v1/tokens",
        json={"name": "old", "scopes": ["models:read"], "expires_at": "2000-01-01T00:00:00Z"},
    )
    assert r.status_code == 422
    r = await client.post("/api/v1/tokens", json={"name": "x", "scopes": ["superuser"]})
    assert r.status_code == 422


async def test_whoami(client: httpx.AsyncClient) -> None:
    me = (await client.get("/api/v1/tokens/self")).json()
    assert me["scopes"] == ["admin"] and me["name"] == "bootstrap-admin"
    assert ADMIN_TOKEN[:10] == me["prefix"]


async def test_audit_records_writes_with_actor(client: httpx.AsyncClient) -> None:
    writer = await create_token(client, scopes=["models:read", "models:write"], name="publisher")
    model = (
        await client.post("/api/v1/models", json={"name": "acme/audited"}, headers=auth(writer))
    ).json()
    events = (await client.get("/api/v1/audit", params={"model": "acme/audited"})).json()["items"]
    assert [(e["action"], e["actor_name"], e["target_id"]) for e in events] == [
        ("model.create", "publisher", model["id"])
    ]
    assert events[0]["request_id"]
    actions = [e["action"] for e in (await client.get("/api/v1/audit")).json()["items"]]
    assert actions[:2] == ["model.create", "token.create"]


async def test_token_names_refuse_bidi_zero_width_and_control_characters(
    client: httpx.AsyncClient,
) -> None:
    """Issue 33 §5: a name with U+202E read as another token's on the Tokens and Audit pages."""
    spoofs = [
        "deploy\u202egnp.exe",  # right-to-left override
        "ci\u2066admin\u2069",  # isolates
        "ad\u200bmin",  # zero-width space
        "ad\u200dmin",  # zero-width joiner
        "\ufeffadmin",  # byte order mark
        "line\nbreak",
        "esc\x1b[31m",
        "para\u2029graph",
    ]
    for name in spoofs:
        r = await client.post("/api/v1/tokens", json={"name": name, "scopes": ["models:read"]})
        assert r.status_code == 422, (name, r.text)
        assert "token names may not hold" in r.text, r.text
    for name in ("ci-runner 2", "Déploiement", "模型 reader", "ci 🚀"):
        r = await client.post("/api/v1/tokens", json={"name": name, "scopes": ["models:read"]})
        assert r.status_code == 201 and r.json()["name"] == name, (name, r.text)
