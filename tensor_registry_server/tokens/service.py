"""API tokens: created with scopes and namespace limits; the secret is shown once."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from sqlalchemy import func, literal, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from tensor_registry_server.audit.service import record
from tensor_registry_server.auth import MAX_CHAIN_DEPTH, Principal, generate_token, hash_token
from tensor_registry_server.core.db import utcnow
from tensor_registry_server.core.errors import Forbidden, Invalid, NotFound
from tensor_registry_server.core.pagination import Page, paginate
from tensor_registry_server.rows.tokens import ApiToken
from tensor_registry_server.tokens.schemas import TokenCreate


async def create_token(
    session: AsyncSession, principal: Principal, data: TokenCreate
) -> tuple[ApiToken, str]:
    # Minting is a privilege of its own: 'tokens:write' (or 'admin').
    principal.require_scope("tokens:write")
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
    if principal.depth + 1 >= MAX_CHAIN_DEPTH:
        raise Invalid(
            f"Tokens can be minted at most {MAX_CHAIN_DEPTH - 1} levels below a root token.",
            code="token_chain_too_deep",
        )
    now = utcnow()
    expires_at = data.expires_at
    if data.ttl_seconds is not None:
        expires_at = now + timedelta(seconds=data.ttl_seconds)
    if expires_at is not None and expires_at <= now:
        raise Invalid("expires_at lies in the past.", code="invalid_expiry")
    # A child never outlives its parent: no expiry asked for means the parent's; a later one
    # is refused rather than shortened behind the caller's back.
    parent_expiry = principal.expires_at
    if parent_expiry is not None:
        if expires_at is None:
            expires_at = parent_expiry
        elif expires_at > parent_expiry:
            raise Invalid(
                f"expires_at lies after this token's own expiry ({parent_expiry.isoformat()}); "
                "a token cannot outlive the token that mints it.",
                code="expiry_exceeds_parent",
                parent_expires_at=parent_expiry.isoformat(),
            )
    secret = generate_token()
    token = ApiToken(
        name=data.name,
        token_hash=hash_token(secret),
        prefix=secret[:10],
        scopes=data.scopes,
        namespaces=data.namespaces,
        parent_id=principal.token_id,
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
            (ApiToken.parent_id == principal.token_id) | (ApiToken.id == principal.token_id)
        )
    return await paginate(
        session, stmt, keys=[ApiToken.created_at, ApiToken.id], cursor=cursor, limit=limit
    )


async def revoke_token(session: AsyncSession, principal: Principal, token_id: uuid.UUID) -> None:
    token = await session.get(ApiToken, token_id)
    visible = token is not None and (
        principal.is_admin
        or token.parent_id == principal.token_id
        or token.id == principal.token_id
    )
    if token is None or not visible:
        raise NotFound(f"No token with id {token_id}.", code="token_not_found")
    now = utcnow()
    descendants = await _descendant_ids(session, token.id)
    if token.revoked_at is None:
        token.revoked_at = now
    # The whole subtree in the same transaction; authentication also checks the ancestors, so
    # a child minted while this commits is refused all the same.
    revoked = await _revoke_ids(session, descendants, now)
    await session.flush()
    record(
        session,
        action="token.revoke",
        actor=principal,
        target_type="token",
        target_id=token.id,
        descendants_revoked=revoked,
    )


async def _descendant_ids(session: AsyncSession, token_id: uuid.UUID) -> list[uuid.UUID]:
    start = select(ApiToken.id, literal(1).label("depth")).where(ApiToken.parent_id == token_id)
    tree = start.cte("token_tree", recursive=True)
    child = aliased(ApiToken)
    tree = tree.union_all(
        select(child.id, tree.c.depth + 1)
        .join(tree, child.parent_id == tree.c.id)
        .where(tree.c.depth < MAX_CHAIN_DEPTH)
    )
    return list((await session.execute(select(tree.c.id))).scalars())


async def _revoke_ids(session: AsyncSession, ids: list[uuid.UUID], now: datetime) -> int:
    if not ids:
        return 0
    result = await session.execute(
        update(ApiToken)
        .where(ApiToken.id.in_(ids), ApiToken.revoked_at.is_(None))
        .values(revoked_at=now)
        .execution_options(synchronize_session="fetch")
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


async def mint_root_admin(session: AsyncSession, *, name: str, expires_in: int | None) -> str:
    """A new admin token with no parent (``tensor-registry admin-token``); returns the secret."""
    secret = generate_token()
    token = ApiToken(
        name=name,
        token_hash=hash_token(secret),
        prefix=secret[:10],
        scopes=["admin"],
        namespaces=None,
        expires_at=utcnow() + timedelta(seconds=expires_in) if expires_in else None,
    )
    session.add(token)
    await session.flush()
    record(
        session,
        action="token.create",
        actor=None,
        target_type="token",
        target_id=token.id,
        name=name,
        scopes=["admin"],
        namespaces=None,
        via="admin-token command",
    )
    return secret


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
