"""The worker heartbeat runs the orphan sweep on its schedule, against the real database."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tensor_registry_server.jobs import runtime as runtime_module
from tensor_registry_server.jobs.worker.heartbeat import Heartbeat
from tensor_registry_server.settings import Settings


class _NoSender:
    def send_task(self, name: str, args: list[str], queue: str) -> object:
        raise AssertionError("the orphan sweep sends no task")


@pytest.fixture
def sweep_settings(settings: Settings) -> Iterator[Settings]:
    configured = settings.model_copy(
        update={
            "worker": settings.worker.model_copy(
                update={"orphan_sweep_seconds": 3600.0, "orphan_grace_seconds": 60.0}
            )
        }
    )
    runtime_module.use_settings(configured)
    yield configured
    runtime_module.close_runtime()
    runtime_module.use_settings(None)


def _old_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"left by a crash")
    two_hours_ago = time.time() - 7200
    os.utime(path, (two_hours_ago, two_hours_ago))
    return path


def test_orphans_are_swept_when_due_and_not_before(sweep_settings: Settings) -> None:
    root = sweep_settings.local_storage_root
    beat = Heartbeat(
        sweep_settings, worker_id="w-test", queues=["cpu"], concurrency=1, sender=_NoSender()
    )
    first = _old_file(root / "artifacts" / str(uuid.uuid4()) / "model.tensors")
    # Not due yet: the first sweep runs one period after start.
    assert beat.maybe_sweep_orphans() is None
    assert first.exists()

    beat._next_orphan_sweep = time.monotonic() - 1
    assert beat.maybe_sweep_orphans() == 1
    assert not first.exists()

    # The next one waits a whole period again.
    second = _old_file(root / "artifacts" / str(uuid.uuid4()) / "model.tensors")
    assert beat.maybe_sweep_orphans() is None
    assert second.exists()


def test_each_heartbeat_touches_the_alive_file_for_health_checks(
    sweep_settings: Settings, tmp_path: Path
) -> None:
    alive = tmp_path / "run" / "worker.alive"
    configured = sweep_settings.model_copy(
        update={"worker": sweep_settings.worker.model_copy(update={"alive_file": alive})}
    )
    beat = Heartbeat(
        configured, worker_id="w-alive", queues=["cpu"], concurrency=1, sender=_NoSender()
    )
    beat.pulse()
    assert alive.exists() and beat.beats == 1
    long_ago = time.time() - 600
    os.utime(alive, (long_ago, long_ago))
    beat.pulse()
    assert time.time() - alive.stat().st_mtime < 60


def test_retention_gc_runs_when_due_and_never_when_off(sweep_settings: Settings) -> None:
    from tensor_registry_server.core.db import session_scope
    from tensor_registry_server.rows.models import Model
    from tensor_registry_server.rows.retention import RetentionPolicy
    from tensor_registry_server.rows.versions import Version, VersionStatus
    from tests.conftest import reset_database

    runtime = runtime_module.get_runtime()
    runtime.run(reset_database(sweep_settings.database_url), timeout=60)

    async def seed() -> None:
        async with session_scope(runtime.sessionmaker) as session:
            model = Model(name="acme/beat", namespace="acme")
            session.add(model)
            await session.flush()
            for number in (1, 2):
                session.add(Version(model_id=model.id, number=number, storage="local",
                                    status=VersionStatus.READY))  # fmt: skip
            session.add(RetentionPolicy(namespace="acme", keep_last=1, keep_days=0))

    async def numbers() -> list[int]:
        from sqlalchemy import select

        async with runtime.sessionmaker() as session:
            return list((await session.execute(select(Version.number))).scalars())

    runtime.run(seed(), timeout=60)
    off = sweep_settings.model_copy(
        update={"retention": sweep_settings.retention.model_copy(update={"gc_interval_seconds": 0})}
    )
    idle = Heartbeat(off, worker_id="w-off", queues=["cpu"], concurrency=1, sender=_NoSender())
    idle._next_gc = time.monotonic() - 1
    assert idle.maybe_collect_garbage() is None

    beat = Heartbeat(
        sweep_settings, worker_id="w-gc", queues=["cpu"], concurrency=1, sender=_NoSender()
    )
    # Not due yet: the first run comes one period after start.
    assert beat.maybe_collect_garbage() is None
    beat._next_gc = time.monotonic() - 1
    assert beat.maybe_collect_garbage() == 1
    assert runtime.run(numbers(), timeout=60) == [2]
