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
import hashlib
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import Depends, Request
from sqlalchemy import literal, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from tensor_registry_server.core.db import SessionDep, utcnow
from tensor_registry_server.core.errors import Forbidden, Unauthorized
from tensor_registry_server.rows.tokens import ApiToken

SCOPES = (
    "models:read",
    "models:write",
    "tensorize",
    "resolve",
    "keys:read",
    "tokens:write",
    "admin",
)
TOKEN_PREFIX = "trg_"  # noqa: S105 - a public prefix, not a secret
# last_used_at is a hint for humans; writing it on every request would make reads write.
_LAST_USED_GRANULARITY = timedelta(minutes=1)
# Far deeper than any real delegation; bounds the recursive query against a corrupted table.
MAX_CHAIN_DEPTH = 32


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

    @property
    def is_admin(self) -> bool:
        return "admin" in self.scopes

    def has_scope(self, scope: str) -> bool:
        return self.is_admin or scope in self.scopes

    def can_access_namespace(self, namespace: str) -> bool:
        return self.namespaces is None or namespace in self.namespaces

    def require_scope(self, scope: str) -> None:
        if not self.has_scope(scope):
            raise Forbidden(
                f"This token lacks the '{scope}' scope.", code="insufficient_scope", scope=scope
            )

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
    principal = await authenticate_secret(session, value.strip())
    request.state.principal = principal
    return principal


async def authenticate_secret(session: AsyncSession, secret: str) -> Principal:
    """The principal of an API token's secret (however it arrived: a Bearer header, the
    password of Basic auth at the OCI door); 401 when unknown, revoked or expired."""
    return _principal_of(await token_chain(session, hash_token(secret)))


async def authenticate_token_id(session: AsyncSession, token_id: uuid.UUID) -> Principal:
    """The principal of the API token with this id, checked as at authentication (revoked or
    expired along its chain: 401): what a short-lived credential minted from it relies on."""
    return _principal_of(await _chain(session, ApiToken.id == token_id))


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
