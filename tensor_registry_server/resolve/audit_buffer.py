"""Write-behind audit rows for the resolve hot path.

A fleet rollout resolves thousands of times a second; one INSERT + COMMIT per resolve would make
the audit log, not the lookup, the bottleneck (and on SQLite it would serialise every resolve
behind the single writer). Resolve rows are therefore appended to this buffer and written by
one background task a few times a second (PostgreSQL: one COPY per batch), and on shutdown.

What this trades: nothing for a process killed with -9 when ``wal_dir`` is set (the server
always sets it): each row is appended to a local write-ahead file before the answer
(tensor_registry_server/resolve/audit_wal.py) and replayed by the next replica that finds it
orphaned; a host crash loses at most one ``flush_interval``. Without a WAL (unit tests), a
kill -9 loses the rows of the last ``flush_interval``. Rows that grant access to key material
(``key.issue``) do not take this path: they are
written in the request's own transaction, before the key URL is returned. If the database is
down, rows are kept (up to ``max_pending``) and retried; a retried batch never duplicates rows.

Queued rows are flat tuples of strings, numbers and timestamps (the detail already JSON): tens
of thousands of dicts waiting for their batch would keep Python's cycle collector busy and
show up as latency spikes of every request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncEngine

from tensor_registry_server.auth import Principal
from tensor_registry_server.core.context import request_id_var
from tensor_registry_server.core.db import utcnow
from tensor_registry_server.resolve.audit_wal import AuditWal, read_segment
from tensor_registry_server.rows.audit import AuditEvent

log = logging.getLogger("tensor_registry.resolve.audit")

# Row layout: the id is assigned when the batch is written (one urandom call per batch).
_COLUMNS = (
    "id",
    "created_at",
    "action",
    "actor_id",
    "actor_name",
    "target_type",
    "target_id",
    "model",
    "request_id",
    "detail",
)
_encode = json.JSONEncoder(separators=(",", ":"), default=str).encode

Row = tuple[Any, ...]


class AuditBuffer:
    def __init__(
        self,
        engine: AsyncEngine,
        *,
        flush_interval: float = 0.2,
        max_batch: int = 1000,
        max_pending: int = 200_000,
        wal_dir: Path | None = None,
        sweep_seconds: float = 10.0,
    ) -> None:
        self.engine = engine
        self.flush_interval = flush_interval
        self.max_batch = max_batch
        self.max_pending = max_pending
        self._rows: list[Row] = []
        self._wakeup = asyncio.Event()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.dropped = 0
        self.wal = AuditWal(wal_dir) if wal_dir is not None else None
        self.sweep_seconds = sweep_seconds
        self.replayed = 0

    def add(
        self,
        *,
        action: str,
        actor: Principal | None,
        target_type: str,
        target_id: uuid.UUID | str | None = None,
        model: str | None = None,
        **detail: Any,
    ) -> None:
        """Queue one row; same fields as tensor_registry_server.audit.service.record. Never blocks,
        never fails."""
        if len(self._rows) >= self.max_pending:
            self._rows.pop(0)
            self.dropped += 1
            if self.dropped % 1000 == 1:
                log.error("audit buffer full (database down?): %d rows dropped", self.dropped)
        row = (
            uuid.UUID(bytes=os.urandom(16), version=4),
            utcnow(),
            action,
            actor.token_id if actor else None,
            actor.name if actor else None,
            target_type,
            str(target_id) if target_id is not None else None,
            model,
            request_id_var.get(),
            _encode(detail),
        )
        if self.wal is not None:
            try:
                self.wal.append(row)  # before the answer: a kill -9 from here on loses nothing
            except OSError as exc:  # disk full: the row still goes to the database
                log.error("audit wal append failed: %s", exc)
        self._rows.append(row)
        if len(self._rows) >= self.max_batch:
            self._wakeup.set()
        if self._task is None and not self._stopping:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def start(self) -> None:
        """Start the writer now (it replays orphaned WALs at once) instead of at the first row."""
        if self._task is None and not self._stopping:
            self._task = asyncio.get_running_loop().create_task(self._run())

    @property
    def pending(self) -> int:
        return len(self._rows)

    async def _run(self) -> None:
        next_sweep = 0.0
        loop = asyncio.get_running_loop()
        while not self._stopping:
            if self.wal is not None and loop.time() >= next_sweep:
                next_sweep = loop.time() + self.sweep_seconds
                try:
                    await self.replay_orphans()
                except Exception as exc:
                    log.warning("audit wal replay failed, will retry: %s", type(exc).__name__)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), self.flush_interval)
            self._wakeup.clear()
            try:
                await self.flush()
            except Exception as exc:
                log.warning("audit flush failed, will retry: %s", type(exc).__name__)
                if not self._stopping:
                    await asyncio.sleep(min(5.0, self.flush_interval * 10))

    async def flush(self) -> int:
        """Write every queued row now; returns how many. Rows stay queued if the write fails."""
        written = 0
        async with self._lock:
            # Only what is queued now: rows arriving meanwhile wait for the next tick, so a
            # busy route yields a few large writes a second, not a stream of tiny ones.
            todo = len(self._rows)
            segments = 0
            if self.wal is not None and todo:
                # Rotate with the snapshot (no await between): the closed segments hold
                # exactly these rows; fsync bounds a host crash's loss to one interval.
                old_fd = self.wal.rotate()
                segments = self.wal.closed_segments
                await asyncio.to_thread(_sync_close, old_fd)
            while written < todo and self._rows:
                count = min(self.max_batch, todo - written)
                entropy = os.urandom(16 * count)  # one syscall, not one per uuid4()
                for i in range(count):
                    row = self._rows[i]
                    if row[0] is None:
                        new_id = uuid.UUID(bytes=entropy[16 * i : 16 * i + 16], version=4)
                        self._rows[i] = (new_id, *row[1:])
                batch = self._rows[:count]
                if self.engine.dialect.name == "postgresql":
                    await self._copy(batch)
                else:
                    await self._insert(batch, sqlite_insert)
                # Never cancelled mid-write (close() waits for the writer), so a written batch
                # is always dropped from the queue; ids make a retried batch harmless.
                del self._rows[:count]
                written += count
            if self.wal is not None and segments:
                self.wal.committed(segments)
        return written

    async def replay_orphans(self) -> int:
        """Write the rows of replicas that died with rows in their WAL; returns how many."""
        assert self.wal is not None
        total = 0
        for owner, fd, segments in await asyncio.to_thread(self.wal.orphans):
            for path in segments:
                rows = await asyncio.to_thread(read_segment, path)
                for start in range(0, len(rows), self.max_batch):
                    await self._insert(rows[start : start + self.max_batch], _dialect_insert(self))
                total += len(rows)
            self.wal.release_orphan(owner, fd, segments)
            if segments:
                log.warning("audit wal: replayed %d rows of a replica that stopped", total)
        self.replayed += total
        return total

    async def _copy(self, batch: list[Row]) -> None:
        """PostgreSQL: one COPY (asyncpg's binary protocol), a tenth of the cost of INSERTs."""
        async with self.engine.connect() as conn:
            raw = await conn.get_raw_connection()
            driver: Any = raw.driver_connection
            try:
                async with driver.transaction():
                    await driver.copy_records_to_table(
                        AuditEvent.__tablename__, records=batch, columns=list(_COLUMNS)
                    )
            except Exception as exc:
                if type(exc).__name__ != "UniqueViolationError":
                    raise
                # A retry of a batch whose COPY had committed (the connection broke after
                # COMMIT): write what is missing and skip what is there.
                await self._insert(batch, pg_insert)

    async def _insert(self, batch: list[Row], dialect_insert: Any) -> None:
        rows = [dict(zip(_COLUMNS, row, strict=True)) for row in batch]
        for row in rows:
            row["detail"] = json.loads(row["detail"])
        stmt = dialect_insert(AuditEvent).on_conflict_do_nothing(index_elements=["id"])
        async with self.engine.begin() as conn:
            await conn.execute(stmt, rows)

    async def close(self) -> None:
        """Stop the writer after its current batch (never cancel a COPY half-way), then write
        what is left."""
        self._stopping = True
        if self._task is not None:
            self._wakeup.set()
            try:
                await asyncio.wait_for(self._task, 30)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
            self._task = None
        try:
            await self.flush()
        except Exception:
            if self.wal is not None:
                log.exception("audit rows left in the WAL at shutdown: %d", len(self._rows))
                self.wal.close(keep=True)
            else:
                log.exception("audit rows lost at shutdown: %d", len(self._rows))
            return
        if self.wal is not None:
            self.wal.close(keep=False)


def _sync_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _dialect_insert(buffer: AuditBuffer) -> Any:
    return pg_insert if buffer.engine.dialect.name == "postgresql" else sqlite_insert
