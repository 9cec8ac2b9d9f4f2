"""Bearer tokens, scopes and namespace limits.

A token is ``trg_`` + 43 URL-safe characters; the database keeps only its sha256. ``admin``
implies every scope. A token limited to namespaces may only see and touch models in them.

A token minted by another (``parent_id``) works only while every token up its chain is neither
revoked nor expired: one recursive query reads the chain at authentication, so revoking a parent
stops its descendants at once even where the cascade at revocation
(tensor_registry_server.tokens.service) raced
with a mint.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import logging
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import Depends, Request
from sqlalchemy import literal, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from tensor_registry_server import people
from tensor_registry_server.core.db import SessionDep, utcnow
from tensor_registry_server.core.errors import Forbidden, Unauthorized
from tensor_registry_server.rows.people import Person
from tensor_registry_server.rows.tokens import ApiToken
from tensor_registry_server.settings import Settings, get_settings

SCOPES = (
    "models:read",
    "models:write",
    "tensorize",
    "resolve",
    "keys:read",
    "tokens:write",
    "admin",
)
log = logging.getLogger("tensor_registry.auth")
TOKEN_PREFIX = "trg_"  # noqa: S105 - a public prefix, not a secret
# last_used_at is a hint for humans; writing it on every request would make reads write.
_LAST_USED_GRANULARITY = timedelta(minutes=1)
# Far deeper than any real delegation; bounds the recursive query against a corrupted table.
MAX_CHAIN_DEPTH = 32
# The scopes this request asked of a person's token so far (require_scope adds to it): a
# person's roles differ per namespace, so the namespace check asks for them there.
_demanded: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "demanded_scopes", default=frozenset()
)


def generate_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    token_id: uuid.UUID
    name: str
    scopes: frozenset[str]
    namespaces: frozenset[str] | None = field(default=None)
    # The earliest expiry along the token's chain (its own or an ancestor's); None: never.
    expires_at: datetime | None = field(default=None)
    # How many ancestors the token has (0: bootstrap or CLI-minted).
    depth: int = 0
    # The person (SSO) behind the token: id and label (e-mail); None for a token of no person.
    person_id: uuid.UUID | None = None
    person: str | None = None
    # A person's token: namespace ("*": every one) -> the scopes it holds there now (the
    # token's own scopes cut to the person's roles, .people); None: ``scopes`` everywhere.
    grants: Mapping[str, frozenset[str]] | None = None
    # The root of the token's chain (the bootstrap or CLI-minted token every token it minted,
    # directly or not, descends from): whose delegation this is. None: the token itself.
    root_id: uuid.UUID | None = field(default=None)

    @property
    def owner_id(self) -> uuid.UUID:
        """Who owns what this token creates (node records): the person behind it (SSO), else
        its chain's root."""
        return self.person_id or self.root_id or self.token_id

    def covers(self, namespaces: frozenset[str] | None) -> bool:
        """Whether this token may act in every namespace of ``namespaces`` (None: all)."""
        if self.namespaces is None:
            return True
        return namespaces is not None and namespaces <= self.namespaces

    @property
    def is_admin(self) -> bool:
        return "admin" in self.scopes

    def has_scope(self, scope: str) -> bool:
        return self.is_admin or scope in self.scopes

    def scopes_in(self, namespace: str) -> frozenset[str]:
        if self.grants is None:
            return self.scopes
        return self.grants.get(namespace, frozenset()) | self.grants.get("*", frozenset())

    def can_access_namespace(self, namespace: str) -> bool:
        if self.namespaces is not None and namespace not in self.namespaces:
            return False
        if self.grants is None:
            return True
        held = self.scopes_in(namespace)
        return "admin" in held or (bool(held) and _demanded.get() <= held)

    def require_scope(self, scope: str) -> None:
        if not self.has_scope(scope):
            raise Forbidden(
                f"This token lacks the '{scope}' scope.", code="insufficient_scope", scope=scope
            )
        if self.grants is not None:
            _demanded.set(_demanded.get() | {scope})

    def require_namespace(self, namespace: str) -> None:
        if not self.can_access_namespace(namespace):
            raise Forbidden(
                f"This token is not allowed in namespace '{namespace}'.",
                code="namespace_forbidden",
            )


async def authenticate(request: Request, session: SessionDep) -> Principal:
    header = request.headers.get("authorization")
    if not header:
        raise Unauthorized("Missing Authorization: Bearer <token> header.", code="missing_token")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise Unauthorized("Authorization must be 'Bearer <token>'.", code="invalid_token")
    settings = getattr(request.app.state, "settings", None)
    principal = await authenticate_secret(session, value.strip(), settings)
    request.state.principal = principal
    return principal


async def authenticate_secret(
    session: AsyncSession, secret: str, settings: Settings | None = None
) -> Principal:
    """The principal of an API token's secret (however it arrived: a Bearer header, the
    password of Basic auth at the OCI door); 401 when unknown, revoked or expired."""
    chain = await token_chain(session, hash_token(secret))
    return await _with_person(session, chain, _principal_of(chain), settings)


async def authenticate_token_id(
    session: AsyncSession, token_id: uuid.UUID, settings: Settings | None = None
) -> Principal:
    """The principal of the API token with this id, checked as at authentication (revoked or
    expired along its chain: 401): what a short-lived credential minted from it relies on."""
    chain = await _chain(session, ApiToken.id == token_id)
    return await _with_person(session, chain, _principal_of(chain), settings)


async def _with_person(
    session: AsyncSession, chain: list[ApiToken], principal: Principal, settings: Settings | None
) -> Principal:
    """A person's token cut to the person's roles now (.people); others unchanged."""
    _demanded.set(frozenset())
    person_id = chain[0].person_id
    if person_id is None:
        return principal
    person = await session.get(Person, person_id)
    if person is None:
        raise Unauthorized("Unknown or revoked token.", code="invalid_token")
    grants = await people.current_grants(session, person, settings or get_settings())
    held: dict[str, frozenset[str]] = {}
    for namespace in grants:
        if principal.namespaces is not None and namespace not in ("*", *principal.namespaces):
            continue
        own = people.scopes_in(grants, namespace)
        if principal.is_admin:  # an admin-scoped person token: whatever the person holds
            kept = own
        elif "admin" in own:
            kept = principal.scopes
        else:
            kept = principal.scopes & own
        if kept:
            held[namespace] = kept
    if not held:
        raise Unauthorized(
            f"The person behind this token ({people.label(person)}) holds no role here now.",
            code="person_without_roles",
        )
    union = frozenset().union(*held.values())
    namespaces = principal.namespaces
    if "*" not in held:
        namespaces = frozenset(held) & namespaces if namespaces is not None else frozenset(held)
    return Principal(
        token_id=principal.token_id, name=principal.name, scopes=union, namespaces=namespaces,
        expires_at=principal.expires_at, depth=principal.depth, person_id=person.id,
        person=people.label(person), grants=held, root_id=principal.root_id,
    )  # fmt: skip


async def still_valid(sessionmaker: Callable[[], Any], principal: Principal) -> bool:
    """Whether ``principal``'s token (and every token up its chain) is still neither revoked
    nor expired: what an open stream asks again and again. A database that cannot answer
    leaves the stream be (it said yes at the start; the next check asks again)."""
    if principal.expires_at is not None and principal.expires_at <= utcnow():
        return False
    try:
        async with sessionmaker() as session:
            chain = await _chain(session, ApiToken.id == principal.token_id)
    except Exception:
        log.warning("could not check a stream's token again", exc_info=True)
        return True
    if not chain or any(t.revoked_at is not None for t in chain):
        return False
    now = utcnow()
    return not any(t.expires_at is not None and t.expires_at <= now for t in chain)


def _principal_of(chain: list[ApiToken]) -> Principal:
    now = utcnow()
    # A chain cut off by the depth bound cannot be checked to its root: refuse it.
    truncated = len(chain) > MAX_CHAIN_DEPTH and chain[-1].parent_id is not None
    if not chain or truncated or any(t.revoked_at is not None for t in chain):
        raise Unauthorized("Unknown or revoked token.", code="invalid_token")
    expiries = [t.expires_at for t in chain if t.expires_at is not None]
    expires_at = min(expiries) if expiries else None
    if expires_at is not None and expires_at <= now:
        raise Unauthorized("This token has expired.", code="token_expired")
    token = chain[0]
    if token.last_used_at is None or now - token.last_used_at > _LAST_USED_GRANULARITY:
        token.last_used_at = now
    return Principal(
        token_id=token.id,
        name=token.name,
        scopes=frozenset(token.scopes),
        namespaces=frozenset(token.namespaces) if token.namespaces is not None else None,
        expires_at=expires_at,
        depth=len(chain) - 1,
        root_id=chain[-1].id,
    )


async def token_chain(session: AsyncSession, token_hash: str) -> list[ApiToken]:
    """The token with this hash followed by its ancestors, parent first; [] when unknown."""
    return await _chain(session, ApiToken.token_hash == token_hash)


async def _chain(session: AsyncSession, which: Any) -> list[ApiToken]:
    start = select(ApiToken.id, ApiToken.parent_id, literal(0).label("depth")).where(which)
    chain = start.cte("token_chain", recursive=True)
    parent = aliased(ApiToken)
    chain = chain.union_all(
        select(parent.id, parent.parent_id, chain.c.depth + 1)
        .join(chain, parent.id == chain.c.parent_id)
        .where(chain.c.depth < MAX_CHAIN_DEPTH)
    )
    rows = await session.execute(
        select(ApiToken).join(chain, ApiToken.id == chain.c.id).order_by(chain.c.depth)
    )
    return list(rows.scalars())


CurrentToken = Annotated[Principal, Depends(authenticate)]


def require(scope: str) -> Callable[[Principal], Awaitable[Principal]]:
    """Dependency: the current token, which must carry ``scope``."""

    async def dependency(principal: CurrentToken) -> Principal:
        principal.require_scope(scope)
        return principal

    return dependency


ReadToken = Annotated[Principal, Depends(require("models:read"))]
WriteToken = Annotated[Principal, Depends(require("models:write"))]
TensorizeToken = Annotated[Principal, Depends(require("tensorize"))]
AdminToken = Annotated[Principal, Depends(require("admin"))]


class PrincipalCache:
    """Authenticated tokens, kept in process for a few seconds (the resolve route uses it).

    Resolve is the one route a whole fleet calls at once; looking the token up in the database
    each time would cost more than the rest of the request. An entry lives ``ttl`` seconds and
    never past the token's own expiry (the earliest along its chain of parents), so a revoked
    token — or one whose parent or grand-parent was revoked — keeps resolving for at most ``ttl``
    seconds on a replica that saw it just before — less than the lifetime of the signed URLs it
    may already hold. Keyed by the sha256 of the header: the secret itself is not kept.
    """

    def __init__(
        self,
        *,
        ttl: float = 5.0,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        # Seconds, monotonic; tests inject their own to step past ``ttl`` without sleeping.
        self.clock = clock
        self._entries: dict[str, tuple[float, Any]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    @staticmethod
    def digest(authorization: str) -> str:
        return hashlib.sha256(authorization.encode()).hexdigest()

    def get(self, digest: str, now: float) -> Any | None:
        entry = self._entries.get(digest)
        if entry is None:
            return None
        if entry[0] <= now:
            self._entries.pop(digest, None)
            return None
        return entry[1]

    def lock(self, digest: str) -> asyncio.Lock:
        found = self._locks.get(digest)
        if found is None:
            if len(self._locks) >= self.max_entries:
                self._locks = {k: v for k, v in self._locks.items() if v.locked()}
            found = self._locks[digest] = asyncio.Lock()
        return found

    def put(self, digest: str, principal: Any, now: float, expires_in: float | None) -> None:
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        lifetime = self.ttl if expires_in is None else min(self.ttl, expires_in)
        if lifetime > 0:
            self._entries[digest] = (now + lifetime, principal)


async def authenticate_cached(
    request: Request,
    cache: PrincipalCache,
    open_session: Callable[[], Awaitable[AsyncSession]],
) -> Principal:
    """``authenticate`` with ``cache`` in front of it: the session is opened only on a miss."""
    _demanded.set(frozenset())
    header = request.headers.get("authorization")
    if not header:
        raise Unauthorized("Missing Authorization: Bearer <token> header.", code="missing_token")
    digest = cache.digest(header)
    principal = cache.get(digest, cache.clock())
    if principal is None:
        # One lookup per token at a time: when an entry expires under load, the requests
        # holding the same token wait for it instead of all querying the database.
        async with cache.lock(digest):
            principal = cache.get(digest, cache.clock())
            if principal is None:
                principal = await authenticate(request, await open_session())
                expires_in = (
                    (principal.expires_at - utcnow()).total_seconds()
                    if principal.expires_at is not None
                    else None
                )
                cache.put(digest, principal, cache.clock(), expires_in)
    request.state.principal = principal
    return principal


def principal_cache(request: Request) -> PrincipalCache:
    """The process's one principal cache (resolve and the standard doors), made with the app
    (tensor_registry_server.main); a test replaces it to inject a clock."""
    cache: PrincipalCache = request.app.state.principal_cache
    return cache
