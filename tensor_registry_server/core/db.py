"""Database plumbing: declarative base, portable types, engine factory, session boundaries.

The boundary owns the transaction: ``get_session`` (a request dependency) and
``session_scope`` (workers, CLI) commit on success and roll back on error; services only flush.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Depends, Request
from sqlalchemy import DateTime, MetaData, event
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.pool import NullPool
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTCDateTime column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id() -> uuid.UUID:
    return uuid.uuid4()


def create_engine(url: str, *, echo: bool = False, pool_size: int = 10) -> AsyncEngine:
    if url.startswith("sqlite"):
        engine = create_async_engine(
            url,
            echo=echo,
            connect_args={"timeout": 30},
            # One connection per checkout keeps SQLite's writer lock short and avoids sharing a
            # connection across the API and the embedded worker.
            poolclass=NullPool,
        )
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    return create_async_engine(
        url, echo=echo, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True
    )


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    # WAL: readers never wait for the writer and the writer never waits for readers, so the API,
    # the embedded worker and downloads share one file without blocking each other's reads.
    cur.execute("PRAGMA journal_mode=WAL")
    # SQLite ignores FOREIGN KEY clauses unless asked per connection; ON DELETE CASCADE relies
    # on it (deleting a model removes its versions, files and aliases).
    cur.execute("PRAGMA foreign_keys=ON")
    # A writer that finds the write lock taken waits up to 30 s (the same bound as the driver's
    # connect timeout) instead of failing at once with "database is locked".
    cur.execute("PRAGMA busy_timeout=30000")
    # With WAL, NORMAL syncs at checkpoints, not at every commit: a power cut may lose the last
    # commits but never corrupts the file; an OS or process crash loses nothing.
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


async def lock_for_write(session: AsyncSession) -> None:
    """On SQLite, take the database's write lock now and hold it until the transaction ends.

    The pysqlite driver (under aiosqlite) opens a transaction only at the first
    INSERT/UPDATE/DELETE: the SELECTs before it each see whatever was committed at that moment,
    and ``SELECT ... FOR UPDATE`` locks nothing. So "read the status, then write" races another
    writer. ``BEGIN IMMEDIATE`` takes the write lock first: every read after it sees the latest
    commit and no other writer commits until this transaction ends (others wait up to
    ``busy_timeout``). Call it right before the reads a write depends on and keep what follows
    short. PostgreSQL needs nothing here: callers lock the rows they read with FOR UPDATE.
    Other transactions keep the driver's default, so plain reads take no lock at all.
    """
    if session.get_bind().dialect.name != "sqlite":
        return
    conn = await session.connection()
    raw = await conn.get_raw_connection()
    # A transaction already open has written (the driver begins one only for a write), so it
    # holds the write lock already.
    if not raw.driver_connection.in_transaction:  # type: ignore[union-attr]
        await conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False, autoflush=False)


AfterCommit = Callable[[], Awaitable[None]]


def after_commit(session: AsyncSession, callback: AfterCommit) -> None:
    """Run ``callback`` once the boundary has committed (enqueue work, delete bytes)."""
    session.info.setdefault("after_commit", []).append(callback)


@asynccontextmanager
async def session_scope(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> AsyncIterator[AsyncSession]:
    async with sessionmaker() as session:
        try:
            yield session
            await session.commit()
        except BaseException:
            await session.rollback()
            session.info.pop("after_commit", None)
            raise
        for callback in session.info.pop("after_commit", []):
            await callback()


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    async with session_scope(request.app.state.sessionmaker) as session:
        yield session


# scope="function": commit before the response is sent, so a 2xx means the data is durable
# and a failing commit still becomes a proper error response.
SessionDep = Annotated[AsyncSession, Depends(get_session, scope="function")]


class LazySession:
    """A request-scoped session that is opened (session_scope) only when first asked for."""

    def __init__(self, sessionmaker: async_sessionmaker[AsyncSession], stack: AsyncExitStack):
        self._sessionmaker = sessionmaker
        self._stack = stack
        self._session: AsyncSession | None = None

    async def get(self) -> AsyncSession:
        if self._session is None:
            self._session = await self._stack.enter_async_context(session_scope(self._sessionmaker))
        return self._session
