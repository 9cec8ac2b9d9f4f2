from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy import select

from tensor_registry_server.audit.schemas import AuditEventOut
from tensor_registry_server.auth import AdminToken
from tensor_registry_server.core.db import SessionDep
from tensor_registry_server.core.pagination import Cursor, Limit, paginate
from tensor_registry_server.core.schemas import ListOut
from tensor_registry_server.rows.audit import AuditEvent

router = APIRouter(prefix="/api/v1/audit", tags=["audit"])


@router.get("", response_model=ListOut[AuditEventOut])
async def list_audit(
    session: SessionDep,
    principal: AdminToken,
    action: Annotated[str | None, Query(max_length=64, description="e.g. alias.set")] = None,
    model: Annotated[str | None, Query(max_length=128)] = None,
    cursor: Cursor = None,
    limit: Limit = 50,
) -> ListOut[AuditEventOut]:
    stmt = select(AuditEvent)
    if action:
        stmt = stmt.where(AuditEvent.action == action)
    if model:
        stmt = stmt.where(AuditEvent.model == model)
    page = await paginate(
        session,
        stmt,
        keys=[AuditEvent.created_at, AuditEvent.id],
        cursor=cursor,
        limit=limit,
        descending=True,
    )
    return ListOut[AuditEventOut](
        items=[AuditEventOut.model_validate(e) for e in page.items], next_cursor=page.next_cursor
    )
