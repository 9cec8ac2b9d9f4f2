"""API tokens: created with scopes and namespace limits; the secret is shown once."""

from __future__ import annotations

import uuid
from datetime import timedelta

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.audit.service import record
from app.auth import Principal, generate_token, hash_token
from app.db import utcnow
from app.errors import Forbidden, Invalid, NotFound
from app.pagination import Page, paginate
from app.tokens.models import ApiToken
from app.tokens.schemas import TokenCreate


async def create_token(
    session: AsyncSession, principal: Principal, data: TokenCreate
) -> tuple[ApiToken, str]:
    # Nobody hands out more than they hold: scopes and namespaces must be a subset.
    if not principal.is_admin:
        missing = [s for s in data.scopes if not principal.has_scope(s)]
        if missing:
            raise Forbidden(
                f"Cannot grant scope(s) this token does not hold: {missing}.",
                code="insufficient_scope",
            )
        if principal.namespaces is not None and (
            data.namespaces is None or not set(data.namespaces) <= principal.namespaces
        ):
            raise Forbidden(
                "A namespace-limited token can only create tokens within its namespaces.",
                code="namespace_forbidden",
            )
    expires_at = data.expires_at
    if data.ttl_seconds is not None:
        expires_at = utcnow() + timedelta(seconds=data.ttl_seconds)
    if expires_at is not None and expires_at <= utcnow():
        raise Invalid("expires_at lies in the past.", code="invalid_expiry")
    secret = generate_token()
    token = ApiToken(
        name=data.name,
        token_hash=hash_token(secret),
        prefix=secret[:10],
        scopes=data.scopes,
        namespaces=data.namespaces,
        created_by=principal.token_id,
        expires_at=expires_at,
    )
    session.add(token)
    await session.flush()
    record(
        session,
        action="token.create",
        actor=principal,
        target_type="token",
        target_id=token.id,
        name=data.name,
        scopes=data.scopes,
        namespaces=data.namespaces,
    )
    return token, secret


async def list_tokens(
    session: AsyncSession, principal: Principal, *, cursor: str | None, limit: int
) -> Page[ApiToken]:
    stmt = select(ApiToken)
    if not principal.is_admin:
        stmt = stmt.where(
            (ApiToken.created_by == principal.token_id) | (ApiToken.id == principal.token_id)
        )
    return await paginate(
        session, stmt, keys=[ApiToken.created_at, ApiToken.id], cursor=cursor, limit=limit
    )


async def revoke_token(session: AsyncSession, principal: Principal, token_id: uuid.UUID) -> None:
    token = await session.get(ApiToken, token_id)
    visible = token is not None and (
        principal.is_admin
        or token.created_by == principal.token_id
        or token.id == principal.token_id
    )
    if token is None or not visible:
        raise NotFound(f"No token with id {token_id}.", code="token_not_found")
    if token.revoked_at is None:
        token.revoked_at = utcnow()
        await session.flush()
        record(
            session, action="token.revoke", actor=principal, target_type="token", target_id=token.id
        )


async def ensure_bootstrap_admin(session: AsyncSession, configured: str | None) -> str | None:
    """First start: make the configured admin token, or generate one; return it if generated.

    Returns the secret only when it was generated here (the caller prints it once). Later
    starts find tokens and do nothing.
    """
    if await session.scalar(select(func.count()).select_from(ApiToken)):
        return None
    secret = configured or generate_token()
    session.add(
        ApiToken(
            name="bootstrap-admin",
            token_hash=hash_token(secret),
            prefix=secret[:10],
            scopes=["admin"],
            namespaces=None,
        )
    )
    record(session, action="token.bootstrap", actor=None, target_type="token")
    await session.flush()
    return None if configured else secret
