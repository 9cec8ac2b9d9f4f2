"""Aliases: movable names pointing at ready versions; every move is recorded."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry.formats.variant import door_collision
from tensor_registry_server.aliases.schemas import ALIAS_RE, RESERVED
from tensor_registry_server.audit.service import record
from tensor_registry_server.auth import Principal
from tensor_registry_server.core.errors import Conflict, Invalid, NotFound
from tensor_registry_server.core.etags import check_if_match
from tensor_registry_server.core.events_outbox import emit, namespace_of
from tensor_registry_server.rows.aliases import Alias, AliasEvent
from tensor_registry_server.rows.models import Model
from tensor_registry_server.rows.versions import VersionStatus
from tensor_registry_server.versions.service import get_version

# set_alias's default_variant when the request leaves it as it is.
UNCHANGED: Any = object()


def check_alias_name(name: str) -> None:
    if name in RESERVED:
        raise Invalid(f"'{name}' is implicit and cannot be set.", code="alias_reserved")
    if not ALIAS_RE.match(name):
        raise Invalid(
            "Alias names start with a letter and use lower-case letters, digits, '.', '_', '-' "
            "(at most 64 characters).",
            code="invalid_alias",
        )
    collision = door_collision(name)
    if collision is not None:
        raise Invalid(
            f"{collision}: an alias of that name would answer differently in /api/v1/resolve "
            "and the doors. Choose another name.",
            code="alias_reserved",
        )


async def find_alias(session: AsyncSession, model: Model, name: str) -> Alias | None:
    return (
        await session.execute(select(Alias).where(Alias.model_id == model.id, Alias.name == name))
    ).scalar_one_or_none()


async def get_alias(session: AsyncSession, model: Model, name: str) -> Alias:
    alias = await find_alias(session, model, name)
    if alias is None:
        raise NotFound(f"Model '{model.name}' has no alias '{name}'.", code="alias_not_found")
    return alias


async def set_alias(
    session: AsyncSession,
    principal: Principal,
    model: Model,
    name: str,
    number: int,
    *,
    if_match: str | None,
    default_variant: dict[str, Any] | None = UNCHANGED,
) -> tuple[Alias, bool]:
    """Point ``name`` at version ``number`` (and set its default variant unless UNCHANGED);
    returns (alias, created)."""
    check_alias_name(name)
    version = await get_version(session, model, number, with_files=False)
    if version.status != VersionStatus.READY:
        raise Conflict(
            f"Version {number} is {version.status}; aliases point at ready versions only.",
            code="version_not_ready",
        )
    alias = await find_alias(session, model, name)
    check_if_match(if_match, alias.revision if alias else None)
    previous = alias.version_number if alias else None
    created = alias is None
    variant_changes = default_variant is not UNCHANGED and (
        alias is None or alias.default_variant != default_variant
    )
    if alias is None:
        alias = Alias(
            model_id=model.id,
            name=name,
            version_id=version.id,
            version_number=version.number,
            default_variant=None if default_variant is UNCHANGED else default_variant,
        )
        session.add(alias)
    elif alias.version_id != version.id:
        alias.version_id = version.id
        alias.version_number = version.number
        if variant_changes:
            alias.default_variant = default_variant
    elif variant_changes:
        alias.default_variant = default_variant
        await session.flush()
        record(
            session,
            action="alias.default_variant",
            actor=principal,
            target_type="alias",
            target_id=alias.id,
            model=model.name,
            alias=name,
            default_variant=default_variant,
        )
        return alias, False
    else:
        return alias, False
    # The version_id_col turns a concurrent move into StaleDataError (412) at flush.
    await session.flush()
    session.add(
        AliasEvent(
            model_id=model.id,
            alias=name,
            from_version=previous,
            to_version=number,
            actor=principal.name,
        )
    )
    await session.flush()
    record(
        session,
        action="alias.set",
        actor=principal,
        target_type="alias",
        target_id=alias.id,
        model=model.name,
        alias=name,
        from_version=previous,
        to_version=number,
        **({"default_variant": default_variant} if variant_changes else {}),
    )
    emit(
        session,
        "alias.moved",
        namespace=namespace_of(model.name),
        data={
            "model": model.name,
            "model_id": str(model.id),
            "alias": name,
            "from_version": previous,
            "to_version": number,
            "actor": principal.name,
        },
    )
    return alias, created


async def delete_alias(
    session: AsyncSession, principal: Principal, model: Model, name: str, *, if_match: str | None
) -> None:
    alias = await get_alias(session, model, name)
    check_if_match(if_match, alias.revision)
    session.add(
        AliasEvent(
            model_id=model.id,
            alias=name,
            from_version=alias.version_number,
            to_version=None,
            actor=principal.name,
        )
    )
    record(
        session,
        action="alias.delete",
        actor=principal,
        target_type="alias",
        target_id=alias.id,
        model=model.name,
        alias=name,
        from_version=alias.version_number,
    )
    emit(
        session,
        "alias.deleted",
        namespace=namespace_of(model.name),
        data={
            "model": model.name,
            "model_id": str(model.id),
            "alias": name,
            "from_version": alias.version_number,
            "actor": principal.name,
        },
    )
    await session.delete(alias)
    await session.flush()


async def list_aliases(session: AsyncSession, model: Model) -> list[Alias]:
    return list(
        (
            await session.execute(
                select(Alias).where(Alias.model_id == model.id).order_by(Alias.name)
            )
        ).scalars()
    )


async def history(session: AsyncSession, model: Model, name: str | None = None) -> list[AliasEvent]:
    stmt = select(AliasEvent).where(AliasEvent.model_id == model.id)
    if name is not None:
        stmt = stmt.where(AliasEvent.alias == name)
    stmt = stmt.order_by(AliasEvent.created_at.desc(), AliasEvent.id)
    return list((await session.execute(stmt)).scalars())
