"""The events outbox: every change worth reacting to, written in the change's own transaction.

Writers call ``emit(session, type, namespace=…, data=…)`` beside the change. Nothing is written
then: the events wait in the session and are inserted by a ``before_commit`` hook, as the last
statements of the transaction that makes the change. So

- a change that rolls back leaves no event (the insert never happens, or rolls back with it);
- a change that commits carries its event (same transaction), so a process that dies right
  after the commit loses nothing: readers find the row whatever happened to the writer;
- ids are handed out in commit order. PostgreSQL draws sequence values at insert time, so two
  transactions could commit 8 before 7 and a reader that has moved past 8 would never see 7;
  the insert therefore takes a transaction-scoped advisory lock, held until the commit, so the
  next writer draws its id only after this one is visible. The lock is taken last thing before
  the commit (never before row locks the transaction still needs: no deadlock) and held for
  the commit only. SQLite has one writer at a time already.

With ids in commit order a reader needs only ``id > last_seen`` (gaps from rolled-back
sequence draws are harmless). After the commit the session's boundary calls the notifier bound
to its sessionmaker (``bind_event_notifier``: the API's hub, a Redis publish) with the newest
id; a lost notification costs latency, never an event, since readers also poll slowly.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Index,
    Integer,
    String,
    delete,
    event,
    func,
    insert,
    select,
    text,
)
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Mapped, Session, mapped_column
from sqlalchemy.types import JSON

from tensor_registry.formats.events import EVENT_TYPES
from tensor_registry_server.core.db import Base, UTCDateTime, after_commit, utcnow

# Any constant works; it names "the outbox's insert order" among advisory locks.
_ADVISORY_LOCK_KEY = 0x7472_6576_656E_7473  # "trevents"
_PENDING_KEY = "events_outbox_pending"
NOTIFIER_KEY = "events_notifier"

Notifier = Callable[[int], Awaitable[None]]

# SQLite makes only INTEGER PRIMARY KEY an alias of the rowid (autoincrement).
_EventId = BigInteger().with_variant(Integer, "sqlite")


class Event(Base):
    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_namespace_id", "namespace", "id"),
        # AUTOINCREMENT: SQLite never reuses an id, even after the newest rows are pruned.
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(_EventId, primary_key=True, autoincrement=True)
    type: Mapped[str] = mapped_column(String(64))
    namespace: Mapped[str] = mapped_column(String(128))
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)


@dataclass(frozen=True)
class EventRecord:
    """One committed event, as readers pass it around (detached from any session)."""

    id: int
    type: str
    namespace: str
    data: dict[str, Any]
    created_at: datetime

    def payload(self) -> dict[str, Any]:
        """The JSON every consumer sees (SSE ``data:`` and the webhook body)."""
        return {
            "id": str(self.id),
            "type": self.type,
            "timestamp": self.created_at.isoformat().replace("+00:00", "Z"),
            "namespace": self.namespace,
            "data": self.data,
        }


def emit(
    session: AsyncSession | Session, type: str, *, namespace: str, data: dict[str, Any]
) -> None:
    """Record event ``type`` with the session's transaction (inserted right before commit)."""
    if type not in EVENT_TYPES:
        raise ValueError(f"unknown event type {type!r}")
    sync = session.sync_session if isinstance(session, AsyncSession) else session
    sync.info.setdefault(_PENDING_KEY, []).append(
        {"type": type, "namespace": namespace, "data": data, "created_at": utcnow()}
    )


def namespace_of(model_name: str) -> str:
    return model_name.split("/", 1)[0]


def bind_event_notifier(
    sessionmaker: async_sessionmaker[AsyncSession], notifier: Notifier | None
) -> None:
    """Sessions of ``sessionmaker`` call ``notifier(newest id)`` after committing events."""
    info = dict(sessionmaker.kw.get("info") or {})
    info[NOTIFIER_KEY] = notifier
    sessionmaker.configure(info=info)


@event.listens_for(Session, "before_commit")
def _write_pending(session: Session) -> None:
    pending = session.info.pop(_PENDING_KEY, None)
    if not pending:
        return
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _ADVISORY_LOCK_KEY})
    session.execute(insert(Event), pending)
    newest = session.execute(select(func.max(Event.id))).scalar_one()
    notifier: Notifier | None = session.info.get(NOTIFIER_KEY)
    if notifier is not None and newest is not None:

        async def notify() -> None:
            await notifier(int(newest))

        after_commit(session, notify)  # type: ignore[arg-type]


@event.listens_for(Session, "after_rollback")
def _forget(session: Session) -> None:
    session.info.pop(_PENDING_KEY, None)


def to_record(row: Event) -> EventRecord:
    return EventRecord(
        id=row.id, type=row.type, namespace=row.namespace, data=row.data, created_at=row.created_at
    )


async def read_after(
    session: AsyncSession, after_id: int, *, limit: int = 500
) -> list[EventRecord]:
    """Committed events with ``id > after_id``, oldest first."""
    rows = await session.execute(
        select(Event).where(Event.id > after_id).order_by(Event.id).limit(limit)
    )
    return [to_record(r) for r in rows.scalars()]


async def prune(session: AsyncSession, older_than: datetime) -> int:
    """Delete events created before ``older_than``; returns how many."""
    result = await session.execute(delete(Event).where(Event.created_at < older_than))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


async def newest_id(session: AsyncSession) -> int:
    return int(await session.scalar(select(func.coalesce(func.max(Event.id), 0))) or 0)
