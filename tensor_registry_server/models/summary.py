"""What the models list shows beside each name: latest version, aliases, variants, size.

Four grouped queries per page whatever its length (never one per model), each bounded by the
page's model ids.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import and_, case, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry_server.models.schemas import ModelSummary
from tensor_registry_server.rows.aliases import Alias
from tensor_registry_server.rows.artifacts import Artifact, ArtifactStatus
from tensor_registry_server.rows.versions import Version, VersionFile, VersionStatus


async def summarize(
    session: AsyncSession, model_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, ModelSummary]:
    ids = list(model_ids)
    out = {model_id: ModelSummary() for model_id in ids}
    if not ids:
        return out
    is_ready = Version.status == VersionStatus.READY
    versions = await session.execute(
        select(
            Version.model_id,
            func.count(),
            func.max(case((is_ready, Version.number))),
        )
        .where(Version.model_id.in_(ids))
        .group_by(Version.model_id)
    )
    for model_id, count, latest in versions:
        out[model_id].version_count = int(count)
        out[model_id].latest_version = None if latest is None else int(latest)

    latest_ready = (
        select(Version.model_id, func.max(Version.number).label("number"))
        .where(Version.model_id.in_(ids), is_ready)
        .group_by(Version.model_id)
        .subquery()
    )
    sizes = await session.execute(
        select(Version.model_id, func.coalesce(func.sum(VersionFile.size), 0))
        .join(
            latest_ready,
            and_(
                Version.model_id == latest_ready.c.model_id,
                Version.number == latest_ready.c.number,
            ),
        )
        .outerjoin(VersionFile, VersionFile.version_id == Version.id)
        .group_by(Version.model_id)
    )
    for model_id, size in sizes:
        out[model_id].latest_size = int(size)

    aliases = await session.execute(
        select(Alias.model_id, Alias.name, Alias.version_number)
        .where(Alias.model_id.in_(ids))
        .order_by(Alias.name)
    )
    for model_id, name, number in aliases:
        out[model_id].aliases[name] = int(number)

    variants = await session.execute(
        select(Artifact.model_id, func.count())
        .where(Artifact.model_id.in_(ids), Artifact.status == ArtifactStatus.READY)
        .group_by(Artifact.model_id)
    )
    for model_id, count in variants:
        out[model_id].variant_count = int(count)
    return out
