"""The worker heartbeat runs the orphan sweep on its schedule, against the real database."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tensor_registry_server.settings import Settings
from tensor_registry_server.worker import runtime as runtime_module
from tensor_registry_server.worker.heartbeat import Heartbeat


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
