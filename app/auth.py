"""Bearer tokens, scopes and namespace limits.

A token is ``trg_`` + 43 URL-safe characters; the database keeps only its sha256. ``admin``
implies every scope. A token limited to namespaces may only see and touch models in them.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import select

from app.db import SessionDep, utcnow
from app.errors import Forbidden, Unauthorized
from app.tokens.models import ApiToken

SCOPES = ("models:read", "models:write", "tensorize", "resolve", "keys:read", "admin")
TOKEN_PREFIX = "trg_"  # noqa: S105 - a public prefix, not a secret
# last_used_at is a hint for humans; writing it on every request would make reads write.
_LAST_USED_GRANULARITY = timedelta(minutes=1)


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
    token = (
        await session.execute(
            select(ApiToken).where(ApiToken.token_hash == hash_token(value.strip()))
        )
    ).scalar_one_or_none()
    now = utcnow()
    if token is None or token.revoked_at is not None:
        raise Unauthorized("Unknown or revoked token.", code="invalid_token")
    if token.expires_at is not None and token.expires_at <= now:
        raise Unauthorized("This token has expired.", code="token_expired")
    if token.last_used_at is None or now - token.last_used_at > _LAST_USED_GRANULARITY:
        token.last_used_at = now
    principal = Principal(
        token_id=token.id,
        name=token.name,
        scopes=frozenset(token.scopes),
        namespaces=frozenset(token.namespaces) if token.namespaces is not None else None,
    )
    request.state.principal = principal
    return principal


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
ResolveToken = Annotated[Principal, Depends(require("resolve"))]
AdminToken = Annotated[Principal, Depends(require("admin"))]
