"""Retention policies: set, read and remove, per namespace or per model (the model's wins).

Setting one is an admin's act (``admin`` scope, on a namespace the token may reach): a policy
decides what garbage collection deletes. Reading needs ``models:read``."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry_server.audit.service import record
from tensor_registry_server.auth import Principal
from tensor_registry_server.core.errors import Invalid, NotFound
from tensor_registry_server.retention.schemas import (
    NAMESPACE_RE,
    RetentionOut,
    RetentionPolicyOut,
    RetentionSet,
)
from tensor_registry_server.rows.models import Model
from tensor_registry_server.rows.retention import RetentionPolicy
from tensor_registry_server.settings import RetentionSettings


def check_namespace(principal: Principal, namespace: str) -> None:
    if not NAMESPACE_RE.match(namespace) or namespace in {".", ".."}:
        raise Invalid(f"{namespace!r} is not a namespace.", code="invalid_namespace")
    principal.require_namespace(namespace)


async def _own(
    session: AsyncSession, namespace: str, model: Model | None
) -> RetentionPolicy | None:
    stmt = select(RetentionPolicy)
    if model is not None:
        stmt = stmt.where(RetentionPolicy.model_id == model.id)
    else:
        stmt = stmt.where(
            RetentionPolicy.namespace == namespace, RetentionPolicy.model_id.is_(None)
        )
    return (await session.execute(stmt)).scalar_one_or_none()


def _out(row: RetentionPolicy | None, source: str) -> RetentionPolicyOut | None:
    if row is None:
        return None
    return RetentionPolicyOut(
        keep_last=row.keep_last,
        keep_days=row.keep_days,
        source=source,  # type: ignore[arg-type]
        updated_by=row.updated_by,
        updated_at=row.updated_at,
    )


async def read(
    session: AsyncSession, settings: RetentionSettings, namespace: str, model: Model | None
) -> RetentionOut:
    own = await _own(session, namespace, model)
    effective = _out(own, "model" if model is not None else "namespace")
    if effective is None and model is not None:
        effective = _out(await _own(session, namespace, None), "namespace")
    if effective is None and settings.default_keep_last is not None:
        effective = RetentionPolicyOut(
            keep_last=settings.default_keep_last,
            keep_days=settings.default_keep_days,
            source="settings",
        )
    return RetentionOut(
        namespace=namespace,
        model_id=model.id if model is not None else None,
        model=model.name if model is not None else None,
        policy=_out(own, "model" if model is not None else "namespace"),
        effective=effective,
    )


async def put(
    session: AsyncSession,
    principal: Principal,
    namespace: str,
    model: Model | None,
    body: RetentionSet,
) -> None:
    principal.require_scope("admin")
    row = await _own(session, namespace, model)
    if row is None:
        row = RetentionPolicy(namespace=namespace, model_id=model.id if model else None)
        session.add(row)
    row.keep_last = body.keep_last
    row.keep_days = body.keep_days
    row.updated_by = principal.name
    await session.flush()
    record(
        session,
        action="retention.set",
        actor=principal,
        target_type="model" if model else "namespace",
        target_id=model.id if model else namespace,
        model=model.name if model else None,
        namespace=namespace,
        keep_last=body.keep_last,
        keep_days=body.keep_days,
    )


async def remove(
    session: AsyncSession, principal: Principal, namespace: str, model: Model | None
) -> None:
    principal.require_scope("admin")
    row = await _own(session, namespace, model)
    if row is None:
        raise NotFound("No retention policy is set here.", code="retention_policy_not_found")
    await session.delete(row)
    await session.flush()
    record(
        session,
        action="retention.delete",
        actor=principal,
        target_type="model" if model else "namespace",
        target_id=model.id if model else namespace,
        model=model.name if model else None,
        namespace=namespace,
    )
