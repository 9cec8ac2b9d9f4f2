"""The write-behind audit buffer of the resolve route: every row lands, once."""

from __future__ import annotations

import uuid

from sqlalchemy import select

from tensor_registry_server.auth import Principal
from tensor_registry_server.core.db import create_engine
from tensor_registry_server.resolve.audit_buffer import AuditBuffer
from tensor_registry_server.rows.audit import AuditEvent
from tensor_registry_server.settings import Settings
from tests.conftest import _reset


async def _rows(engine: object, action: str) -> list[AuditEvent]:
    async with engine.connect() as conn:  # type: ignore[attr-defined]
        result = await conn.execute(select(AuditEvent).where(AuditEvent.action == action))
        return list(result.all())


async def test_rows_are_written_in_batches_once_and_on_close(settings: Settings) -> None:
    await _reset(settings.database_url)
    engine = create_engine(settings.database_url)
    buffer = AuditBuffer(engine, flush_interval=60, max_batch=7)
    actor = Principal(token_id=uuid.uuid4(), name="node", scopes=frozenset({"resolve"}))
    try:
        for i in range(20):
            buffer.add(
                action="resolve",
                actor=actor,
                target_type="artifact",
                target_id=f"a-{i}",
                model="acme/llama",
                ref="prod",
                node="n1",
            )
        # Seven rows wake the writer (max_batch); whatever it has not written yet, flush does.
        await buffer.flush()
        assert buffer.pending == 0
        rows = await _rows(engine, "resolve")
        assert sorted(r.target_id for r in rows) == sorted(f"a-{i}" for i in range(20))
        assert {r.actor_name for r in rows} == {"node"}
        assert rows[0].detail == {"ref": "prod", "node": "n1"}

        # A batch whose write committed but looked failed is retried: no error, no duplicate.
        replay = [
            (r.id, r.created_at, "resolve", None, None, "artifact", r.target_id, None, None, "{}")
            for r in rows[:3]
        ]
        buffer._rows.extend(replay)
        assert await buffer.flush() == 3
        assert len(await _rows(engine, "resolve")) == 20

        buffer.add(action="resolve.late", actor=None, target_type="artifact")
    finally:
        await buffer.close()
    assert len(await _rows(engine, "resolve.late")) == 1
    await engine.dispose()
