"""Sign-in with OpenID Connect against a real provider (tests/sso/idp.mjs), on SQLite and
PostgreSQL: the web flow's codes and PKCE, roles per namespace, tokens a person mints, the
audit naming the person, and access going once the provider stops granting it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import select, update

from tensor_registry_server.core.db import create_engine, make_sessionmaker, session_scope, utcnow
from tensor_registry_server.core.oidc import pkce_pair
from tensor_registry_server.rows.audit import AuditEvent
from tensor_registry_server.rows.people import Person, SsoLogin
from tensor_registry_server.settings import Settings, SsoSettings
from tests.conftest import app_and_client
from tests.sso.conftest import Idp, fragment_query, sign_in_at_idp, sso_settings

pytestmark = pytest.mark.asyncio
SERVER = "http://testserver"


def with_sso(settings: Settings, issuer: str, **extra: Any) -> Settings:
    return settings.model_copy(
        update={
            "sso": SsoSettings(**sso_settings(issuer, **extra)),
            "fetch": settings.fetch.model_copy(update={"allow": ["127.0.0.1"]}),
        }
    )


@pytest.fixture
async def sso(settings: Settings, idp: Idp) -> AsyncIterator[tuple[httpx.AsyncClient, Settings]]:
    configured = with_sso(settings, idp.issuer)
    async with app_and_client(configured) as (_, client):
        yield client, configured


async def sign_in(client: httpx.AsyncClient, user: str) -> dict[str, Any]:
    """The web flow: /login → the provider's login page → /callback → redeem with PKCE."""
    verifier, challenge = pkce_pair()
    r = await client.get("/api/v1/sso/login", params={"code_challenge": challenge})
    assert r.status_code == 302, r.text
    back = sign_in_at_idp(r.headers["location"], user, stop_at=SERVER)
    r = await client.get(back.removeprefix(SERVER))
    assert r.status_code == 302 and r.headers["location"].startswith(f"{SERVER}/#/sso?")
    answer = fragment_query(r.headers["location"])
    assert "code" in answer, answer
    redeem = {"code": answer["code"], "code_verifier": verifier}
    r = await client.post("/api/v1/sso/token", json=redeem)
    assert r.status_code == 200, r.text
    return dict(r.json())


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def db_execute(settings: Settings, statement: Any) -> list[Any]:
    engine = create_engine(settings.database_url)
    try:
        async with session_scope(make_sessionmaker(engine)) as session:
            result = await session.execute(statement)
            return list(result.scalars()) if statement.is_select else []
    finally:
        await engine.dispose()


async def test_a_person_signs_in_and_holds_their_role_in_each_namespace(
    sso: tuple[httpx.AsyncClient, Settings],
) -> None:
    client, settings = sso
    for name in ("ml/base", "shared/base", "other/base"):
        assert (await client.post("/api/v1/models", json={"name": name})).status_code == 201
    signed = await sign_in(client, "alice")
    assert signed["person"]["email"] == "alice@example.test"
    assert signed["person"]["grants"] == {"ml": "publisher", "shared": "reader"}
    me = bearer(signed["token"])
    whoami = (await client.get("/api/v1/tokens/self", headers=me)).json()
    assert whoami["person_id"] == signed["person"]["id"]
    # publisher in ml, reader in shared, nothing elsewhere
    r = await client.post("/api/v1/models", json={"name": "ml/new"}, headers=me)
    assert r.status_code == 201
    r = await client.post("/api/v1/models", json={"name": "shared/new"}, headers=me)
    assert r.status_code == 403 and r.json()["code"] == "namespace_forbidden"
    r = await client.post("/api/v1/models", json={"name": "other/new"}, headers=me)
    assert r.status_code == 403
    listed = (await client.get("/api/v1/models", headers=me)).json()["items"]
    assert sorted(m["name"] for m in listed) == ["ml/base", "ml/new", "shared/base"]
    assert (await client.get("/api/v1/audit", headers=me)).status_code == 403
    # The audit log names the person behind the action.
    events = await db_execute(settings, select(AuditEvent).where(AuditEvent.model == "ml/new"))
    assert [(e.action, e.person) for e in events] == [("model.create", "alice@example.test")]
    audit = (await client.get("/api/v1/audit", params={"action": "person.sign_in"})).json()
    assert audit["items"][0]["person"] == "alice@example.test"


async def test_tokens_a_person_mints_hold_at_most_their_roles_and_go_with_their_group(
    sso: tuple[httpx.AsyncClient, Settings], idp: Idp
) -> None:
    client, settings = sso
    me = bearer((await sign_in(client, "alice"))["token"])
    write = {"name": "ci", "scopes": ["models:read", "models:write"]}
    for body, code in [
        ({**write, "namespaces": ["shared"]}, "insufficient_scope"),  # reader there
        (write, "namespace_forbidden"),  # every namespace: not hers
        ({**write, "scopes": ["admin"], "namespaces": ["ml"]}, "insufficient_scope"),
    ]:
        r = await client.post("/api/v1/tokens", json=body, headers=me)
        assert r.status_code == 403 and r.json()["code"] == code, (body, r.text)
    r = await client.post("/api/v1/tokens", json={**write, "namespaces": ["ml"]}, headers=me)
    assert r.status_code == 201, r.text
    machine = r.json()
    # Bound to the person, not to the sign-in session: no parent, no inherited expiry.
    assert machine["parent_id"] is None and machine["expires_at"] is None
    assert machine["person_id"] is not None
    ci = bearer(machine["token"])
    r = await client.post("/api/v1/models", json={"name": "ml/by-ci"}, headers=ci)
    assert r.status_code == 201
    events = await db_execute(settings, select(AuditEvent).where(AuditEvent.model == "ml/by-ci"))
    assert [(e.actor_name, e.person) for e in events] == [("ci", "alice@example.test")]

    # An admin takes alice out of her group at the provider. Until her groups are older than
    # sso.recheck_seconds nothing changes; then the next use asks the provider, and both her
    # session and the token she minted stop.
    idp.set_groups("alice", [])
    assert (await client.get("/api/v1/models", headers=ci)).status_code == 200
    stale = utcnow() - timedelta(seconds=settings.sso.recheck_seconds + 1)
    await db_execute(settings, update(Person).values(checked_at=stale))
    r = await client.get("/api/v1/models", headers=ci)
    assert r.status_code == 401 and r.json()["code"] == "person_without_roles"
    assert (await client.get("/api/v1/models", headers=me)).status_code == 401
    changed = await db_execute(
        settings, select(AuditEvent).where(AuditEvent.action == "person.roles_changed")
    )
    assert [(e.person, e.detail["after"]) for e in changed] == [("alice@example.test", {})]
    # Given back at the provider: the next re-check restores the token.
    idp.set_groups("alice", ["ml-publishers"])
    await db_execute(settings, update(Person).values(checked_at=stale))
    assert (await client.get("/api/v1/models", headers=ci)).status_code == 200


async def test_a_person_deleted_at_the_provider_loses_access_at_the_next_check(
    sso: tuple[httpx.AsyncClient, Settings], idp: Idp
) -> None:
    client, settings = sso
    idp.set_groups("bob", ["readers"])
    me = bearer((await sign_in(client, "bob"))["token"])
    assert (await client.get("/api/v1/models", headers=me)).status_code == 200
    idp.remove_user("bob")
    try:
        stale = utcnow() - timedelta(seconds=settings.sso.recheck_seconds + 1)
        await db_execute(settings, update(Person).values(checked_at=stale))
        r = await client.get("/api/v1/models", headers=me)
        assert r.status_code == 401 and r.json()["code"] == "person_without_roles"
    finally:
        idp.set_groups("bob", ["readers"])
        from tests.sso.conftest import PASSWORD

        httpx.post(f"{idp.issuer}/test/users/bob",
                   json={"password": PASSWORD, "email": "bob@example.test"})  # fmt: skip


async def test_someone_no_group_maps_to_a_role_is_not_signed_in(
    sso: tuple[httpx.AsyncClient, Settings],
) -> None:
    client, _ = sso
    _, challenge = pkce_pair()
    r = await client.get("/api/v1/sso/login", params={"code_challenge": challenge})
    back = sign_in_at_idp(r.headers["location"], "carol", stop_at=SERVER)
    r = await client.get(back.removeprefix(SERVER))
    assert fragment_query(r.headers["location"]) == {"error": "person_without_roles"}


async def test_codes_states_and_verifiers_are_single_use_and_bound(
    sso: tuple[httpx.AsyncClient, Settings],
) -> None:
    client, settings = sso
    verifier, challenge = pkce_pair()
    r = await client.get("/api/v1/sso/login", params={"code_challenge": challenge})
    back = sign_in_at_idp(r.headers["location"], "alice", stop_at=SERVER)
    first = await client.get(back.removeprefix(SERVER))
    code = fragment_query(first.headers["location"])["code"]
    # The provider's redirect replayed: the state is used.
    again = await client.get(back.removeprefix(SERVER))
    assert again.status_code == 401 and again.json()["code"] == "sso_state_invalid"
    # A stolen code without the verifier burns it; the verifier after that is too late.
    other, _ = pkce_pair()
    r = await client.post("/api/v1/sso/token", json={"code": code, "code_verifier": other})
    assert r.status_code == 401 and r.json()["code"] == "sso_code_invalid"
    r = await client.post("/api/v1/sso/token", json={"code": code, "code_verifier": verifier})
    assert r.status_code == 401
    assert await db_execute(settings, select(SsoLogin)) == []


async def test_the_cli_redirect_must_be_a_loopback_listener(
    sso: tuple[httpx.AsyncClient, Settings],
) -> None:
    client, _ = sso
    _, challenge = pkce_pair()
    for uri in ("http://evil.example:8080/cb", "https://127.0.0.1:9/cb", "http://127.0.0.1/cb",
                "http://user@127.0.0.1:9/cb", "http://localhost.evil.example:9/"):  # fmt: skip
        r = await client.get(
            "/api/v1/sso/login",
            params={"client": "cli", "code_challenge": challenge, "redirect_uri": uri},
        )
        assert r.status_code == 422 and r.json()["code"] == "sso_redirect_refused", uri
    r = await client.get(
        "/api/v1/sso/login",
        params={"client": "cli", "code_challenge": challenge, "state": "s1",
                "redirect_uri": "http://127.0.0.1:45678/callback"},
    )  # fmt: skip
    assert r.status_code == 302
    back = sign_in_at_idp(r.headers["location"], "alice", stop_at=SERVER)
    r = await client.get(back.removeprefix(SERVER))
    location = r.headers["location"]
    assert location.startswith("http://127.0.0.1:45678/callback?code=") and "state=s1" in location


async def test_a_tampered_nonce_or_a_clock_past_expiry_refuses_the_live_id_token(
    sso: tuple[httpx.AsyncClient, Settings],
) -> None:
    from tensor_registry_server import people

    client, settings = sso
    _, challenge = pkce_pair()
    r = await client.get("/api/v1/sso/login", params={"code_challenge": challenge})
    back = sign_in_at_idp(r.headers["location"], "alice", stop_at=SERVER)
    await db_execute(settings, update(SsoLogin).values(nonce="not-the-nonce-sent"))
    r = await client.get(back.removeprefix(SERVER))
    assert fragment_query(r.headers["location"]) == {"error": "sso_id_token_invalid"}
    # Two hours on: the provider's one-hour ID token has expired.
    oidc = people.oidc_client(settings)
    real = oidc.clock
    oidc.clock = lambda: real() + 7200
    try:
        r = await client.get("/api/v1/sso/login", params={"code_challenge": challenge})
        back = sign_in_at_idp(r.headers["location"], "alice", stop_at=SERVER)
        r = await client.get(back.removeprefix(SERVER))
        assert fragment_query(r.headers["location"]) == {"error": "sso_id_token_invalid"}
    finally:
        oidc.clock = real


async def test_a_provider_naming_another_issuer_is_refused(settings: Settings, idp: Idp) -> None:
    configured = with_sso(settings, idp.issuer + "/")
    async with app_and_client(configured) as (_, client):
        _, challenge = pkce_pair()
        r = await client.get("/api/v1/sso/login", params={"code_challenge": challenge})
        assert r.status_code == 401 and r.json()["code"] == "sso_provider_unavailable"


async def test_sso_off_answers_404_and_config_says_so(client: httpx.AsyncClient) -> None:
    assert (await client.get("/api/v1/sso/config")).json() == {"enabled": False, "issuer": None}
    _, challenge = pkce_pair()
    r = await client.get("/api/v1/sso/login", params={"code_challenge": challenge})
    assert r.status_code == 404 and r.json()["code"] == "sso_disabled"
