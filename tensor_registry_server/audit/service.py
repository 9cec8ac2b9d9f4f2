"""Audit trail: one row per write and per issue of anything that grants access."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry_server import people
from tensor_registry_server.core.context import request_id_var
from tensor_registry_server.rows.audit import AuditEvent
from tensor_registry_server.rows.people import Person

if TYPE_CHECKING:
    from tensor_registry_server.auth import Principal


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
        person=actor.person if actor else None,
        target_type=target_type,
        target_id=str(target_id) if target_id is not None else None,
        model=model,
        request_id=request_id_var.get(),
        detail=detail,
    )
    session.add(event)
    return event


def record_person(session: AsyncSession, *, action: str, person: Person, **detail: Any) -> None:
    """A row about a person with no token in between (sign-in, a re-check at the provider)."""
    session.add(
        AuditEvent(
            action=action,
            actor_id=None,
            actor_name=None,
            person=people.label(person),
            target_type="person",
            target_id=str(person.id),
            request_id=request_id_var.get(),
            detail=detail,
        )
    )
