"""Audit trail: one row per write and per issue of anything that grants access."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry_server.auth import Principal
from tensor_registry_server.core.context import request_id_var
from tensor_registry_server.rows.audit import AuditEvent


def record(
    session: AsyncSession,
    *,
    action: str,
    actor: Principal | None,
    target_type: str,
    target_id: uuid.UUID | str | None = None,
    model: str | None = None,
    **detail: Any,
) -> AuditEvent:
    event = AuditEvent(
        action=action,
        actor_id=actor.token_id if actor else None,
        actor_name=actor.name if actor else None,
        target_type=target_type,
        target_id=str(target_id) if target_id is not None else None,
        model=model,
        request_id=request_id_var.get(),
        detail=detail,
    )
    session.add(event)
    return event
