"""Reading an artifact row as the jobs see it: fresh from the database with its files."""

from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload

from tensor_registry_server.rows.artifacts import Artifact


async def artifact_row(session: AsyncSession, artifact_id: uuid.UUID) -> Artifact | None:
    """The artifact row with its files, re-read from the database (not the identity map)."""
    stmt = (
        select(Artifact)
        .where(Artifact.id == artifact_id)
        .options(selectinload(Artifact.files))
        .execution_options(populate_existing=True)
    )
    return (await session.execute(stmt)).scalar_one_or_none()
