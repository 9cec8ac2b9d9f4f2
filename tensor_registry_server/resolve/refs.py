"""A ref (``latest``, a version number, an alias) and the ready version it names: one
definition for resolve and both standard doors (HF, OCI), so one name means one version in
every door.

``version_named`` is the condition on ``Version`` that picks the version: the number given,
the version the alias points to, or the highest ready version for ``latest``. Callers add
``Version.status == READY`` and their model; resolve's choice statement joins the alias
instead (it needs the alias's revision for the signed binding) but picks the same version.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from tensor_registry_server.aliases.schemas import ALIAS_RE
from tensor_registry_server.core.errors import Invalid
from tensor_registry_server.rows.aliases import Alias
from tensor_registry_server.rows.versions import Version, VersionStatus

_MAX_VERSION = 2**31 - 1


@dataclass(frozen=True)
class Ref:
    kind: str  # "latest" | "version" | "alias"
    number: int | None = None
    alias: str | None = None


def parse_ref(ref: str) -> Ref:
    if ref == "latest":
        return Ref("latest")
    if ref.isdigit():
        number = int(ref)
        if 1 <= number <= _MAX_VERSION:
            return Ref("version", number=number)
    elif ALIAS_RE.match(ref):
        return Ref("alias", alias=ref)
    raise Invalid(
        f"ref {ref!r} is not 'latest', a version number or an alias name.", code="invalid_ref"
    )


def version_named(ref: Ref, model_id: Any) -> ColumnElement[bool]:
    """The condition on ``Version`` for the version ``ref`` names in the model ``model_id``
    (a value or a column)."""
    if ref.kind == "version":
        return Version.number == ref.number
    if ref.kind == "alias":
        return (
            Version.id
            == select(Alias.version_id)
            .where(Alias.model_id == model_id, Alias.name == ref.alias)
            .scalar_subquery()
        )
    highest = aliased(Version)
    return (
        Version.number
        == select(func.max(highest.number))
        .where(highest.model_id == model_id, highest.status == VersionStatus.READY)
        .scalar_subquery()
    )


async def ready_version(session: AsyncSession, model_id: uuid.UUID, ref: Ref) -> Version | None:
    """The ready version ``ref`` names in the model, or None."""
    stmt = select(Version).where(
        Version.model_id == model_id,
        Version.status == VersionStatus.READY,
        version_named(ref, model_id),
    )
    return (await session.execute(stmt)).scalars().first()
