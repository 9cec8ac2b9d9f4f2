"""The warm bundles a resolve answer lists (docs/warm-state.md): read when the artifact is chosen
(so they are cached with the choice, and a new bundle invalidates it like a new artifact)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry_server.rows.warm_bundles import BundleStatus, WarmBundle

# Bundles listed per answer: one per set of serve arguments an artifact was warmed with.
MAX_LISTED_BUNDLES = 8


async def ready_bundles(session: AsyncSession, artifact_id: Any) -> tuple[dict[str, Any], ...]:
    """The chosen artifact's ready warm bundles, newest first (one indexed read)."""
    stmt = (
        select(WarmBundle)
        .where(WarmBundle.artifact_id == artifact_id, WarmBundle.status == BundleStatus.READY)
        .order_by(WarmBundle.created_at.desc())
        .limit(MAX_LISTED_BUNDLES)
    )
    return tuple(
        {
            "id": str(b.id),
            "storage": b.storage,
            "storage_key": b.storage_key,
            "size": b.size,
            "sha256": b.sha256,
            "key": dict(b.key or {}),
            "cache": dict(b.cache or {}),
            "statement": b.statement,
            "created_at": b.created_at.isoformat().replace("+00:00", "Z") if b.created_at else None,
        }
        for b in (await session.execute(stmt)).scalars()
    )
