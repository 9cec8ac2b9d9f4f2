"""One event loop, one database engine and one set of storage clients per worker process.

Celery tasks are synchronous (torch and tensorizer are), the registry's services and storage
clients are async. Each process therefore runs one event loop in a background thread and
submits coroutines to it: a task calls ``runtime.run(coro)``, and tensorizer's writer threads
can do the same for progress updates. Engine, session factory and storage clients are bound to
that loop, created once, and reused by every task the process runs.

A forked child (Celery's prefork pool) must not touch the loop thread, sockets or pool it
inherited from its parent: the inherited runtime is dropped (kept referenced, never closed, so
no finalizer talks to the parent's connections) and the child builds its own on first use.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import AsyncIterator, Coroutine
from concurrent.futures import Future
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry_server.core.choice_cache import bind_cache, build_cache
from tensor_registry_server.core.db import create_engine, make_sessionmaker, session_scope
from tensor_registry_server.core.event_hub import events_channel, redis_publisher
from tensor_registry_server.core.events_outbox import bind_event_notifier
from tensor_registry_server.settings import Settings, get_settings
from tensor_registry_server.storage.registry import StorageRegistry

log = logging.getLogger("tensor_registry.worker")

T = TypeVar("T")

# Set once the pool process has imported the heavy libraries; jobs wait for it, because
# importing transformers from two threads at once can break its lazy module. Cleared and set
# by tensor_registry_server.jobs.worker.main's pool-process signals, waited on by
# tensor_registry_server.jobs.worker.tasks.
WARM = threading.Event()
WARM.set()


class Runtime:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._serve, name="tensor-registry-runtime", daemon=True
        )
        self._thread.start()
        self.engine = create_engine(settings.database_url, echo=settings.database.echo, pool_size=2)
        self.sessionmaker = make_sessionmaker(self.engine)
        # Publishing an artifact must drop the API's cached resolve choices (scaled mode).
        self.resolve_cache = build_cache(
            settings.broker.redis_url,
            ttl_seconds=settings.broker.resolve_cache_ttl_seconds,
            key_prefix=settings.broker.key_prefix,
        )
        bind_cache(self.sessionmaker, self.resolve_cache)
        # Events this worker commits (artifact.ready, job.failed) wake every API's hub at once.
        if settings.broker.redis_url:
            bind_event_notifier(
                self.sessionmaker,
                redis_publisher(settings.broker.redis_url, events_channel(settings)),
            )
        self.storages = StorageRegistry(settings)
        self._redis: Any = None
        self._closed = False

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Schedule ``coro`` on the runtime loop from any thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the runtime loop and wait for its result (never from that loop)."""
        return self.submit(coro).result(timeout)

    @asynccontextmanager
    async def task_session(self) -> AsyncIterator[AsyncSession]:
        """The worker's transaction boundary: commit on success, roll back on error, then
        run the after-commit callbacks (enqueue, deletes)."""
        async with session_scope(self.sessionmaker) as session:
            yield session

    async def redis(self) -> Any:
        """Redis for job-event nudges (scaled mode), or None in the embedded default."""
        url = self.settings.broker.redis_url
        if not url:
            return None
        if self._redis is None:
            from redis.asyncio import Redis

            self._redis = Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        return self._redis

    def close(self) -> None:
        if self._closed or os.getpid() != self.pid:
            return
        self._closed = True

        async def shutdown() -> None:
            await self.storages.close()
            if self.resolve_cache is not None:
                await self.resolve_cache.close()
            if self._redis is not None:
                await self._redis.aclose()
            await self.engine.dispose()

        try:
            self.run(shutdown(), timeout=15)
        except Exception:
            log.warning("runtime shutdown did not finish cleanly", exc_info=True)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)


_runtime: Runtime | None = None
_settings: Settings | None = None
_runtime_lock = threading.Lock()
# Runtimes inherited across fork: referenced forever so nothing closes the parent's sockets.
_inherited: list[Runtime] = []


def use_settings(settings: Settings | None) -> None:
    """The settings every runtime of this process (and of its forked children) is built from."""
    global _settings
    _settings = settings


def get_runtime() -> Runtime:
    global _runtime
    with _runtime_lock:
        if _runtime is None or _runtime.pid != os.getpid():
            if _runtime is not None:
                _inherited.append(_runtime)
            _runtime = Runtime(_settings or get_settings())
        return _runtime


def close_runtime() -> None:
    global _runtime
    with _runtime_lock:
        if _runtime is not None and _runtime.pid == os.getpid():
            _runtime.close()
            _runtime = None


def task_session() -> Any:
    """``async with task_session() as session:`` inside a coroutine run by the runtime."""
    return get_runtime().task_session()


def _after_fork_in_child() -> None:
    global _runtime, _runtime_lock
    # The lock may have been held by another thread at fork time.
    _runtime_lock = threading.Lock()
    if _runtime is not None:
        _inherited.append(_runtime)
        _runtime = None


os.register_at_fork(after_in_child=_after_fork_in_child)
