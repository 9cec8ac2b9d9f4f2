"""Sign-in with OpenID Connect (docs/sso.md).

The registry is the provider's client (authorization code with PKCE, state and nonce, towards
the identity provider) and, towards its own clients (the web UI, `tensor-registry login --sso`),
a small authorization server of the same shape: each client sends a PKCE challenge with the
sign-in, gets a one-time code back on its redirect (the UI's own page, or the CLI's loopback
listener on 127.0.0.1/[::1], RFC 8252) and redeems it with its verifier for a registry session
token bound to the person. Nothing the provider issues reaches the client.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode, urlsplit

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry_server import people
from tensor_registry_server.audit.service import record, record_person
from tensor_registry_server.auth import Principal, generate_token, hash_token
from tensor_registry_server.core.db import utcnow
from tensor_registry_server.core.errors import Forbidden, Invalid, NotFound
from tensor_registry_server.core.oidc import SsoError, pkce_pair, s256
from tensor_registry_server.rows.people import Person, SsoLogin
from tensor_registry_server.rows.tokens import ApiToken
from tensor_registry_server.settings import Settings

CHALLENGE_RE = re.compile(r"^[A-Za-z0-9_-]{43,128}$")
LOOPBACK_HOSTS = ("127.0.0.1", "[::1]")


def _sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def require_enabled(settings: Settings) -> None:
    if not settings.sso.enabled:
        raise NotFound("Single sign-on is not configured on this registry.", code="sso_disabled")


def callback_url(settings: Settings) -> str:
    return f"{settings.public_base_url.rstrip('/')}/api/v1/sso/callback"


def client_redirect(settings: Settings, client: str, redirect_uri: str | None) -> str:
    """Where the one-time code goes: the UI, or a loopback listener of the CLI (any port)."""
    if client == "web":
        return f"{settings.public_base_url.rstrip('/')}/"
    parts = urlsplit(redirect_uri or "")
    host = (parts.hostname or "").lower()
    host = f"[{host}]" if ":" in host else host
    if parts.scheme != "http" or host not in LOOPBACK_HOSTS or parts.port is None:
        raise Invalid(
            "redirect_uri must be http://127.0.0.1:<port>/… or http://[::1]:<port>/… "
            "(the CLI's loopback listener).",
            code="sso_redirect_refused",
        )
    if parts.username or parts.password or parts.fragment:
        raise Invalid("redirect_uri carries credentials or a fragment.",
                      code="sso_redirect_refused")  # fmt: skip
    return str(redirect_uri)


async def start(
    session: AsyncSession,
    settings: Settings,
    *,
    client: str,
    code_challenge: str,
    redirect_uri: str | None,
    client_state: str | None,
) -> str:
    """Record a sign-in and answer the provider's authorization URL to send the browser to."""
    require_enabled(settings)
    if not CHALLENGE_RE.match(code_challenge):
        raise Invalid("code_challenge must be an S256 PKCE challenge (43-128 base64url).",
                      code="sso_challenge_invalid")  # fmt: skip
    target = client_redirect(settings, client, redirect_uri)
    now = utcnow()
    await session.execute(delete(SsoLogin).where(SsoLogin.expires_at < now))
    state, nonce = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    expires_at = now + timedelta(seconds=settings.sso.login_seconds)
    verifier, challenge = pkce_pair()
    session.add(
        SsoLogin(
            state_hash=_sha(state), nonce=nonce, verifier=verifier,
            client_challenge=code_challenge, client=client, redirect_uri=target,
            client_state=client_state, expires_at=expires_at,
        )
    )  # fmt: skip
    await session.flush()
    return await people.oidc_client(settings).authorize_url(
        redirect_uri=callback_url(settings), state=state, nonce=nonce, challenge=challenge
    )


def _with_query(url: str, params: dict[str, str]) -> str:
    return f"{url}{'&' if '?' in url else '?'}{urlencode(params)}"


def back_to_client(login: SsoLogin, params: dict[str, str]) -> str:
    if login.client == "web":
        # The fragment never reaches a server log; the UI reads and clears it.
        return f"{login.redirect_uri}#/sso?{urlencode(params)}"
    if login.client_state:
        params = {**params, "state": login.client_state}
    return _with_query(login.redirect_uri, params)


async def finish(
    session: AsyncSession, settings: Settings, *, state: str, code: str | None, error: str | None
) -> str:
    """The provider's redirect: check it, store the person, answer where the client goes."""
    require_enabled(settings)
    login = await session.scalar(select(SsoLogin).where(SsoLogin.state_hash == _sha(state)))
    if login is None or login.code_hash is not None or login.expires_at <= utcnow():
        raise SsoError("This sign-in is unknown, used or expired; start again.",
                       code="sso_state_invalid")  # fmt: skip
    try:
        if error or not code:
            raise SsoError("The identity provider did not sign you in.", code="sso_denied")
        client = people.oidc_client(settings)
        answer = await client.exchange_code(
            code, verifier=login.verifier, redirect_uri=callback_url(settings)
        )
        claims = await client.validate(str(answer["id_token"]), nonce=login.nonce)
        person = await _person(session, settings, claims, answer.get("refresh_token"))
        if not person.grants:
            record_person(session, action="person.sign_in_refused", person=person,
                          groups=person.groups)  # fmt: skip
            raise Forbidden("None of your groups gives a role on this registry.",
                            code="person_without_roles")  # fmt: skip
    except (SsoError, Forbidden) as exc:
        await session.delete(login)
        return back_to_client(login, {"error": exc.code})
    one_time = secrets.token_urlsafe(32)
    login.code_hash, login.person_id = _sha(one_time), person.id
    login.expires_at = min(login.expires_at, utcnow() + timedelta(seconds=120))
    return back_to_client(login, {"code": one_time})


async def _person(
    session: AsyncSession, settings: Settings, claims: dict[str, Any], refresh: str | None
) -> Person:
    issuer = str(settings.sso.issuer)
    person = await session.scalar(
        select(Person).where(Person.issuer == issuer, Person.subject == claims["sub"])
    )
    if person is None:
        person = Person(issuer=issuer, subject=str(claims["sub"])[:255], groups=[], grants={})
        session.add(person)
        await session.flush()
    people.apply_claims(person, claims, settings, refresh)
    await session.flush()
    return person


async def redeem(
    session: AsyncSession, settings: Settings, *, code: str, code_verifier: str
) -> tuple[ApiToken, str, Person]:
    """The client's one-time code and PKCE verifier → a session token of the person."""
    require_enabled(settings)
    login = await session.scalar(select(SsoLogin).where(SsoLogin.code_hash == _sha(code)))
    valid = login is not None and login.person_id is not None and login.expires_at > utcnow()
    if (
        not valid
        or login is None
        or not secrets.compare_digest(s256(code_verifier), login.client_challenge)
    ):
        if login is not None:  # one try per code: a wrong verifier burns it (kept: committed
            await session.delete(login)  # before the 401 rolls the request back)
            await session.commit()
        raise SsoError("This sign-in code is unknown, used, expired or not yours.",
                       code="sso_code_invalid")  # fmt: skip
    person = await session.get(Person, login.person_id)
    await session.delete(login)
    assert person is not None
    scopes = sorted(frozenset().union(*(people.ROLE_SCOPES[r] for r in person.grants.values())))
    namespaces = None if people.EVERY_NAMESPACE in person.grants else sorted(person.grants)
    secret = generate_token()
    token = ApiToken(
        name=f"sso: {people.label(person)}"[:128], token_hash=hash_token(secret),
        prefix=secret[:10], scopes=scopes, namespaces=namespaces, person_id=person.id,
        expires_at=utcnow() + timedelta(seconds=settings.sso.session_seconds),
    )  # fmt: skip
    session.add(token)
    await session.flush()
    actor = Principal(token_id=token.id, name=token.name, scopes=frozenset(scopes),
                      person_id=person.id, person=people.label(person))  # fmt: skip
    record(session, action="person.sign_in", actor=actor, target_type="token",
           target_id=token.id, client=login.client, grants=person.grants)  # fmt: skip
    return token, secret, person
