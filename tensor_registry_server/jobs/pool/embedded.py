"""The worker process that ``serve`` runs beside the API, supervised.

``serve`` starts one worker (``tensor-registry worker``) in its own process group and keeps it
running: when it dies (killed, out of memory, a crash) the supervisor kills what is left of
its group (orphaned pool children), removes its heartbeat row so the next recovery sweep hands
its ``running`` jobs to the new worker at once (instead of after ``live_after_seconds``), and
starts it again after a backoff that doubles while restarts keep failing fast.

There is at most one supervised worker per API process, so the supervisor registers itself
here (``current()``); ``/readyz`` reports it and job routing counts it as a capable worker
before its first heartbeat (``stand_in``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from functools import lru_cache

from tensor_registry_server.core.db import utcnow
from tensor_registry_server.rows.worker_pool import WorkerRecord
from tensor_registry_server.settings import Settings

log = logging.getLogger("tensor_registry.serve")

# A worker that ran at least this long before dying restarts after the initial backoff again.
STABLE_AFTER_SECONDS = 60.0

_current: EmbeddedWorker | None = None


def current() -> EmbeddedWorker | None:
    """The worker this process supervises, or None (``--no-worker``, a scaled API replica)."""
    return _current


class EmbeddedWorker:
    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str],
        settings: Settings,
        initial_backoff: float = 1.0,
        max_backoff: float = 60.0,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.env = env
        self.settings = settings
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.on_lost = on_lost if on_lost is not None else self._forget_heartbeat
        self.hostname = socket.gethostname()
        self.restarts = 0
        self.last_exit: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._supervise, name="tensor-registry-worker-supervisor", daemon=True
        )

    # -- state read by /readyz and routing ---------------------------------------------------

    @property
    def pid(self) -> int | None:
        with self._lock:
            return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        with self._lock:
            return self._proc is not None and self._proc.poll() is None

    @property
    def node_id(self) -> str | None:
        """The id the worker heartbeats under (tensor_registry_server.jobs.worker.main:
        hostname:pid)."""
        pid = self.pid
        return f"{self.hostname}:{pid}" if pid is not None else None

    def describe(self) -> str:
        if self.alive:
            return "ok"
        code = self.last_exit
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit {code}"
        return f"down: the embedded worker died ({how}); restarting"

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> EmbeddedWorker:
        global _current
        self._spawn()
        _current = self
        self._thread.start()
        return self

    def _spawn(self) -> None:
        with self._lock:
            # Checked under the lock that stop() takes: a restart racing a stop never leaves
            # a worker behind.
            if self._stopping.is_set():
                return
            # Own process group: when the main worker process dies, its pool children are
            # killed with the group instead of finishing a job nobody owns any more.
            proc = subprocess.Popen(
                self.argv, env=self.env, start_new_session=True, preexec_fn=_die_with_parent
            )
            self._proc = proc
        log.info("embedded worker started (pid %d)", proc.pid)

    def _supervise(self) -> None:
        backoff = self.initial_backoff
        while not self._stopping.is_set():
            with self._lock:
                proc = self._proc
            if proc is None:
                return
            started = time.monotonic()
            code = proc.wait()
            if self._stopping.is_set():
                return
            self.last_exit = code
            node = f"{self.hostname}:{proc.pid}"
            _kill_group(proc.pid)
            if time.monotonic() - started >= STABLE_AFTER_SECONDS:
                backoff = self.initial_backoff
            log.warning(
                "embedded worker (pid %d) exited with %s; restarting in %.0fs",
                proc.pid,
                code,
                backoff,
            )
            try:
                self.on_lost(node)
            except Exception:
                log.warning("could not remove the lost worker's heartbeat", exc_info=True)
            if self._stopping.wait(backoff):
                return
            backoff = min(self.max_backoff, backoff * 2)
            self.restarts += 1
            self._spawn()

    def _forget_heartbeat(self, node: str) -> None:
        from tensor_registry_server.core.db import create_engine, make_sessionmaker, session_scope
        from tensor_registry_server.jobs.pool.service import remove_worker

        async def forget() -> None:
            engine = create_engine(self.settings.database_url)
            try:
                async with session_scope(make_sessionmaker(engine)) as session:
                    await remove_worker(session, node)
            finally:
                await engine.dispose()

        asyncio.run(forget())

    def stop(self, timeout: float = 15) -> None:
        global _current
        with self._lock:
            self._stopping.set()
            proc = self._proc
        if _current is self:
            _current = None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.wait()

    # -- routing before the first heartbeat --------------------------------------------------

    def stand_in(self) -> WorkerRecord:
        """A worker row for the embedded worker while it has not heartbeated (starting or
        restarting): its capabilities are this machine's CPU and memory, no GPU and no vLLM
        (those are only known from its heartbeat), encryption when libsodium is installed."""
        now = utcnow()
        return WorkerRecord(
            id=self.node_id or f"{self.hostname}:embedded",
            hostname=self.hostname,
            queues=list(self.settings.worker.queues),
            capabilities={
                "cpu": {"memory_total": _memory_total()},
                "cuda": {"available": False, "device_count": 0, "devices": []},
                "encryption": _libsodium_installed(),
                "versions": {},
                "stand_in": True,
            },
            started_at=now,
            last_seen_at=now,
        )


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when serve dies, even by SIGKILL, since the
    worker's own process group no longer receives the signals sent to serve's."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _memory_total() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        return 0


@lru_cache
def _libsodium_installed() -> bool:
    return ctypes.util.find_library("sodium") is not None
