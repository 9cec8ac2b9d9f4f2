"""People (OpenID Connect sign-in): their roles per namespace, and the re-check that takes
access away once the identity provider stops granting it (docs/sso.md).

A role is a set of scopes. A person's *grants* map namespaces (``*``: every one) to the highest
role any of their groups gives there (``sso.roles``). A token bound to a person (their sign-in
session, or one they minted) works with the intersection of its own scopes and namespaces and
the person's grants *now*: a person who lost a group loses it for every token they made.

"Now" means: confirmed by the provider within ``sso.recheck_seconds``. When the person's groups
are older, the next use of any of their tokens asks the provider again (refresh grant with the
refresh token kept, wrapped, from sign-in) and stores the answer. A provider that refuses the
grant (person disabled, consent revoked) or a person without a refresh token leaves no grants;
a provider that cannot be reached keeps the last grants until the next re-check (an outage does
not lock everyone out; it is logged).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import os
import time
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry_server.audit import service as audit
from tensor_registry_server.core.db import utcnow
from tensor_registry_server.core.fetch import FetchPolicy
from tensor_registry_server.core.oidc import OidcClient, SsoError
from tensor_registry_server.rows.people import Person

if TYPE_CHECKING:
    from tensor_registry_server.settings import Settings, SsoRoleRule

log = logging.getLogger("tensor_registry.people")

_READER = frozenset({"models:read", "resolve", "keys:read", "tokens:write"})
_PUBLISHER = _READER | {"models:write"}
_OPERATOR = _PUBLISHER | {"tensorize"}
ROLE_SCOPES: dict[str, frozenset[str]] = {
    "reader": _READER,
    "publisher": _PUBLISHER,
    "operator": _OPERATOR,
    "admin": frozenset({"admin"}),
}
ROLE_ORDER = ("reader", "publisher", "operator", "admin")
EVERY_NAMESPACE = "*"


def grants_for(groups: Iterable[str], rules: Iterable[SsoRoleRule]) -> dict[str, str]:
    """namespace → the highest role the groups give there."""
    held = set(groups)
    grants: dict[str, str] = {}
    for rule in rules:
        if rule.group not in held:
            continue
        for namespace in rule.namespaces:
            current = grants.get(namespace)
            if current is None or ROLE_ORDER.index(rule.role) > ROLE_ORDER.index(current):
                grants[namespace] = rule.role
    return grants


def scopes_in(grants: Mapping[str, str], namespace: str) -> frozenset[str]:
    """The scopes the grants give in ``namespace`` (its own role and the ``*`` one)."""
    found: frozenset[str] = frozenset()
    for key in (namespace, EVERY_NAMESPACE):
        role = grants.get(key)
        if role is not None:
            found |= ROLE_SCOPES[role]
    return found


def groups_of(claims: Mapping[str, Any], claim: str) -> list[str]:
    value = claims.get(claim)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return sorted({v for v in value if isinstance(v, str)})
    return []


def label(person: Person) -> str:
    """How the audit log and token lists name a person."""
    return person.email or f"{person.subject}@{person.issuer}"


_clients: dict[int, tuple[object, OidcClient]] = {}


def oidc_client(settings: Settings) -> OidcClient:
    """One client (and its metadata/JWKS cache) per settings object."""
    entry = _clients.get(id(settings))
    if entry is None or entry[0] is not settings:
        client = OidcClient(settings.sso, FetchPolicy.from_settings(settings))
        _clients[id(settings)] = entry = (settings, client)
    return entry[1]


def _cipher(settings: Settings) -> AESGCM:
    # Its own key derived from the master key (not the artifact-key KEK of core.key_wrapping).
    key = hashlib.sha256(b"tensor-registry refresh-token v1\x00" + settings.master_key_bytes())
    return AESGCM(key.digest())


def _wrap(settings: Settings, person: Person, refresh_token: str | None) -> str | None:
    """AES-256-GCM under a key derived from the master key, the person's id as associated data."""
    if not refresh_token:
        return None
    nonce = os.urandom(12)
    sealed = _cipher(settings).encrypt(nonce, refresh_token.encode(), person.id.bytes)
    return base64.b64encode(nonce + sealed).decode("ascii")


def _unwrap(settings: Settings, person: Person) -> str | None:
    if not person.refresh_token:
        return None
    try:
        raw = base64.b64decode(person.refresh_token)
        return _cipher(settings).decrypt(raw[:12], raw[12:], person.id.bytes).decode()
    except (ValueError, InvalidTag):
        return None


def apply_claims(
    person: Person, claims: Mapping[str, Any], settings: Settings, refresh_token: str | None
) -> None:
    """Store what the provider just confirmed: profile, groups, grants, refresh token."""
    if isinstance(claims.get("email"), str):
        person.email = claims["email"][:320]
    if isinstance(claims.get("name"), str):
        person.name = claims["name"][:255]
    person.groups = groups_of(claims, settings.sso.groups_claim)
    person.grants = grants_for(person.groups, settings.sso.roles)
    person.checked_at = utcnow()
    if refresh_token:
        person.refresh_token = _wrap(settings, person, refresh_token)


_locks: dict[Any, asyncio.Lock] = {}


async def current_grants(
    session: AsyncSession, person: Person, settings: Settings
) -> dict[str, str]:
    """The person's grants, re-checked at the provider when older than sso.recheck_seconds."""
    max_age = timedelta(seconds=settings.sso.recheck_seconds)
    if utcnow() - person.checked_at < max_age:
        return dict(person.grants)
    if not settings.sso.enabled:  # SSO switched off: nobody can confirm them any more
        return {}
    lock = _locks.setdefault(person.id, asyncio.Lock())
    if len(_locks) > 10_000:
        _locks.clear()
    async with lock:
        await session.refresh(person)
        if utcnow() - person.checked_at < max_age:
            return dict(person.grants)
        await _recheck(session, person, settings)
        # Kept whatever the request does next (a 401 for lost roles rolls its session back):
        # authentication runs first, so nothing else of the request is in this commit.
        await session.commit()
    return dict(person.grants)


async def _recheck(session: AsyncSession, person: Person, settings: Settings) -> None:
    before = dict(person.grants)
    refresh_token = _unwrap(settings, person)
    started = time.monotonic()
    if refresh_token is None:
        person.grants, person.checked_at = {}, utcnow()
        why = "no refresh token"
    else:
        client = oidc_client(settings)
        try:
            answer = await client.refresh(refresh_token)
            claims = await client.validate(str(answer["id_token"]), nonce=None)
            if claims["sub"] != person.subject:
                raise SsoError("subject changed", code="sso_id_token_invalid")
            apply_claims(person, claims, settings, answer.get("refresh_token"))
            why = "refreshed"
        except SsoError as exc:
            if exc.code == "sso_provider_unavailable":
                log.warning("re-check of %s: the identity provider is unreachable", label(person))
                person.checked_at = utcnow()
                return
            person.grants, person.checked_at, person.refresh_token = {}, utcnow(), None
            why = exc.code
    log.info("re-checked %s at the provider in %.3fs: %s", label(person),
             time.monotonic() - started, why)  # fmt: skip
    if person.grants != before:
        audit.record_person(session, action="person.roles_changed", person=person,
                      before=before, after=dict(person.grants), why=why)  # fmt: skip
    await session.flush()
