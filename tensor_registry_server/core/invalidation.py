"""Which models' resolve choices a transaction changed, taken from the session itself.

Tables whose rows decide what resolve picks (models, versions, aliases, artifacts) inherit
``ChangesResolve`` and name the column holding their model's id. After every flush, the rows
of those tables that the unit of work inserted, changed or deleted add their model id to the
session's set; once the boundary has committed (``tensor_registry_server.core.db.after_commit``),
the invalidator bound
to the sessionmaker is called once per model. Writers do nothing: a new writer cannot forget.

Bulk ``update()``/``delete()`` statements bypass the unit of work; a writer that uses one on a
tracked table calls ``mark_changed`` for the rows' model (today: the publish transition).

The invalidator (the resolve cache, scaled mode) is bound by the process that owns it
(``tensor_registry_server.core.choice_cache.bind_cache``); a sessionmaker without one (embedded
mode) collects
nothing. Invalidating more than needed is harmless (one cache miss); less would serve a stale
choice.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from sqlalchemy import event, inspect
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session

from tensor_registry_server.core.db import after_commit

Invalidator = Callable[[uuid.UUID], Awaitable[None]]

INVALIDATOR_KEY = "resolve_invalidator"
_CHANGED_KEY = "resolve_changed_models"


class ChangesResolve:
    """Mixin for a table whose rows change resolve's choice; ``resolve_model_column`` names
    the attribute that holds the model id (``"id"`` for the models table itself)."""

    resolve_model_column: ClassVar[str] = "model_id"


def bind_invalidator(
    sessionmaker: async_sessionmaker[AsyncSession], invalidator: Invalidator | None
) -> None:
    """Every session of ``sessionmaker`` calls ``invalidator`` after commit for what it changed."""
    info = dict(sessionmaker.kw.get("info") or {})
    info[INVALIDATOR_KEY] = invalidator
    sessionmaker.configure(info=info)


def mark_changed(session: AsyncSession | Session, model_id: uuid.UUID | None) -> None:
    """Record a change the unit of work cannot see (a bulk statement on a tracked table)."""
    sync = session.sync_session if isinstance(session, AsyncSession) else session
    _add(sync, model_id)


def _add(session: Session, model_id: Any) -> None:
    invalidator = session.info.get(INVALIDATOR_KEY)
    if invalidator is None or model_id is None:
        return
    changed: set[uuid.UUID] | None = session.info.get(_CHANGED_KEY)
    if changed is None:
        changed = session.info[_CHANGED_KEY] = set()

        async def invalidate() -> None:
            # Read at commit time: flushes after this one add to the same set.
            for changed_id in sorted(session.info.pop(_CHANGED_KEY, set()), key=str):
                await invalidator(changed_id)

        # after_commit keeps its callbacks in session.info, shared by the async facade.
        after_commit(session, invalidate)  # type: ignore[arg-type]
    changed.add(model_id)


@event.listens_for(Session, "after_flush")
def _collect(session: Session, _flush_context: Any) -> None:
    if session.info.get(INVALIDATOR_KEY) is None:
        return
    for obj in (*session.new, *session.dirty, *session.deleted):
        column = getattr(type(obj), "resolve_model_column", None)
        if column is None:
            continue
        if obj in session.dirty and not session.is_modified(obj):
            continue
        # The loaded value, never a lazy load (flush events run inside the sync session).
        _add(session, inspect(obj).dict.get(column))


@event.listens_for(Session, "after_rollback")
def _forget(session: Session) -> None:
    session.info.pop(_CHANGED_KEY, None)
