"""Issue 36 §5: kill -9 of a real `serve` under resolve load loses no audit row of an answer.

The replica's write-behind flush is set to 60 s, so at the kill every resolve row it answered
is still only in memory and in its write-ahead file: without the WAL all of them are lost. The
next replica started on the same data dir replays the dead one's WAL.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import httpx
from sqlalchemy import func, select

from bench.common import ready_versions
from bench.engine.load import Registry, register_artifact
from harness.serve_process import ServeProcess, free_port
from tensor_registry_server.core.db import create_engine
from tensor_registry_server.rows.audit import AuditEvent
from tensor_registry_server.settings import Settings
from tests.conftest import ADMIN_TOKEN, _reset

MODEL = "crash/audit"
THREADS = 4


async def _count(database_url: str) -> int:
    engine = create_engine(database_url)
    try:
        async with engine.connect() as conn:
            query = select(func.count()).where(AuditEvent.action == "resolve")
            return int(await conn.scalar(query) or 0)
    finally:
        await engine.dispose()


def _env(settings: Settings, flush_seconds: str) -> dict[str, str]:
    return {
        "TENSOR_REGISTRY_DATABASE__URL": settings.database_url,
        "TENSOR_REGISTRY_ADMIN_TOKEN": ADMIN_TOKEN,
        "TENSOR_REGISTRY_LOG_LEVEL": "WARNING",
        "TENSOR_REGISTRY_AUDIT__FLUSH_SECONDS": flush_seconds,
    }


def test_kill_9_under_resolve_load_loses_no_answered_audit_row(
    settings: Settings, tmp_path: Path
) -> None:
    asyncio.run(_reset(settings.database_url))
    data_dir = settings.data_dir
    first = ServeProcess(data_dir=data_dir, port=free_port(), env=_env(settings, "60")).start()
    try:
        model = ready_versions(first.url, ADMIN_TOKEN, MODEL)
        files = {}
        for name in ("model.tensors", "config.json", "tokenizer.json", "tokenizer_config.json"):
            (tmp_path / name).write_bytes(b"{}")
            files[name] = tmp_path / name
        reg = Registry(url=first.url, data_dir=data_dir, env=_env(settings, "60"))
        register_artifact(reg, MODEL, 1, files)
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        httpx.put(
            f"{first.url}/api/v1/models/{model['id']}/aliases/prod",
            json={"version": 1},
            headers=headers,
        ).raise_for_status()

        answered = [0] * THREADS
        stop = threading.Event()

        def load(slot: int) -> None:
            with httpx.Client(base_url=first.url, headers=headers, timeout=10) as client:
                while not stop.is_set():
                    try:
                        response = client.get(
                            "/api/v1/resolve", params={"model": MODEL, "ref": "prod"}
                        )
                    except httpx.HTTPError:
                        return  # the replica is gone
                    assert response.status_code == 200, response.text
                    answered[slot] += 1

        threads = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(THREADS)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 120
        while sum(answered) < 300 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first.proc is not None
        first.proc.kill()  # SIGKILL, mid-load
        first.proc.wait()
        first.proc = None
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        total = sum(answered)
        assert total >= 300
        # Nothing was flushed (60 s interval): every row must come from the replay.
        written_before = asyncio.run(_count(settings.database_url))
        assert written_before < total
    finally:
        first.stop()

    second = ServeProcess(data_dir=data_dir, port=free_port(), env=_env(settings, "0.2")).start()
    try:
        deadline = time.monotonic() + 60
        rows = asyncio.run(_count(settings.database_url))
        while rows < total and time.monotonic() < deadline:
            time.sleep(0.2)
            rows = asyncio.run(_count(settings.database_url))
        # Every answered resolve has its row; at most the requests in flight at the kill (one
        # per thread: row queued, answer not yet read) add one each.
        assert total <= rows <= total + THREADS, (total, rows)
        # The dead replica's WAL is gone; only the running one's lock is left.
        assert len(list((data_dir / "audit-wal").glob("*.lock"))) == 1
    finally:
        second.stop()
