"""The worker's heartbeat: capabilities into the registry, and the recovery sweep.

Runs as a thread in the worker's main process (never in a pool child), every
``settings.worker.heartbeat_seconds``: upsert this worker's row (queues, capabilities, memory),
then ``recover_jobs``: jobs left ``running`` by a worker that stopped heartbeating go back to
the queue, and ``queued`` jobs whose message was lost are sent again. Every
``orphan_sweep_seconds`` it also removes bytes no row points at
(``tensor_registry_server.jobs.sweep``), and every ``retention.gc_interval_seconds`` it applies
the retention policies (``tensor_registry_server.retention.gc``). On a
clean stop the row is removed, so the API stops counting this worker at once.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from datetime import timedelta
from typing import Any

from tensor_registry_server.core.db import utcnow
from tensor_registry_server.core.queue import TaskSender
from tensor_registry_server.jobs.capabilities import memory, probe_in_subprocess
from tensor_registry_server.jobs.lifecycle import recover_jobs
from tensor_registry_server.jobs.pool.service import heartbeat, remove_worker
from tensor_registry_server.jobs.runtime import get_runtime
from tensor_registry_server.jobs.sweep import sweep_orphans
from tensor_registry_server.retention.gc import collect
from tensor_registry_server.settings import Settings

log = logging.getLogger("tensor_registry.worker")


class Heartbeat:
    def __init__(
        self,
        settings: Settings,
        *,
        worker_id: str,
        queues: list[str],
        concurrency: int,
        sender: TaskSender,
    ) -> None:
        self.settings = settings
        self.worker_id = worker_id
        self.queues = queues
        self.concurrency = concurrency
        self.sender = sender
        self.started_at = utcnow()
        self.capabilities: dict[str, Any] | None = None
        self.beats = 0
        # The first orphan sweep runs one period after start: a fleet restarting together
        # does not sweep all at once.
        self._next_orphan_sweep = time.monotonic() + settings.worker.orphan_sweep_seconds
        self._next_gc = time.monotonic() + settings.retention.gc_interval_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name="tensor-registry-heartbeat", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        self.capabilities = probe_in_subprocess()
        log.info("worker %s capabilities: %s", self.worker_id, self.capabilities)
        runtime = get_runtime()
        while not self._stop.is_set():
            try:
                self.pulse()
            except Exception:
                log.warning("heartbeat failed; retrying", exc_info=True)
            try:
                runtime.run(self.sweep(), timeout=60)
            except Exception:
                log.warning("recovery sweep failed", exc_info=True)
            self.maybe_sweep_orphans()
            self.maybe_collect_garbage()
            self._stop.wait(self.settings.worker.heartbeat_seconds)

    def pulse(self) -> None:
        """One heartbeat; then the alive file (if set) is touched, so a container health
        check can tell a worker that reaches its database from a hung or cut-off one."""
        get_runtime().run(self.beat(), timeout=60)
        self.beats += 1
        alive = self.settings.worker.alive_file
        if alive is not None:
            alive.parent.mkdir(parents=True, exist_ok=True)
            alive.touch()

    async def beat(self) -> None:
        runtime = get_runtime()
        capabilities = {
            **(self.capabilities or {}),
            "cpu": memory(),
            "concurrency": self.concurrency,
        }
        async with runtime.task_session() as session:
            await heartbeat(
                session,
                worker_id=self.worker_id,
                hostname=socket.gethostname(),
                queues=self.queues,
                capabilities=capabilities,
                started_at=self.started_at,
            )

    async def sweep(self) -> None:
        runtime = get_runtime()
        async with runtime.task_session() as session:
            await recover_jobs(
                session,
                self.sender,
                live_after_seconds=self.settings.worker.live_after_seconds,
                resend_queued_after_seconds=self.settings.worker.resend_queued_after_seconds,
            )

    def maybe_sweep_orphans(self) -> int | None:
        """Run the orphan sweep if its period has passed; returns what it removed, or None."""
        if time.monotonic() < self._next_orphan_sweep:
            return None
        self._next_orphan_sweep = time.monotonic() + self.settings.worker.orphan_sweep_seconds
        try:
            removed = get_runtime().run(self.sweep_orphans(), timeout=600)
        except Exception:
            log.warning("orphan sweep failed", exc_info=True)
            return None
        log.info("orphan sweep removed %d object(s)", removed)
        return removed

    async def sweep_orphans(self) -> int:
        runtime = get_runtime()
        return await sweep_orphans(
            runtime.sessionmaker,
            runtime.storages,
            older_than=timedelta(seconds=self.settings.worker.orphan_grace_seconds),
        )

    def maybe_collect_garbage(self) -> int | None:
        """Apply the retention policies if their period has passed (never when the interval is
        0); returns how many versions went, or None. Without a policy this reads the policy
        table and removes nothing."""
        interval = self.settings.retention.gc_interval_seconds
        if interval <= 0 or time.monotonic() < self._next_gc:
            return None
        self._next_gc = time.monotonic() + interval
        try:
            removed = get_runtime().run(self.collect_garbage(), timeout=600)
        except Exception:
            log.warning("retention gc failed", exc_info=True)
            return None
        if removed:
            log.info("retention gc removed %d version(s)", removed)
        return removed

    async def collect_garbage(self) -> int:
        runtime = get_runtime()
        report = await collect(
            runtime.sessionmaker,
            runtime.storages,
            self.settings.retention,
            dry_run=False,
            orphan_grace=timedelta(seconds=self.settings.worker.orphan_grace_seconds),
            # Orphans have their own period (maybe_sweep_orphans).
            sweep=False,
        )
        return len(report.removed)

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=10)

        async def unregister() -> None:
            async with get_runtime().task_session() as session:
                await remove_worker(session, self.worker_id)

        try:
            get_runtime().run(unregister(), timeout=10)
        except Exception:
            log.warning("could not remove worker %s from the registry", self.worker_id)
