"""Running one job in a worker process: claim, progress and cancel checks, final status,
and the split between permanent failures and transient ones (retried after a backoff).

A handler (tensorize, verify) gets a ``JobContext``; it reports progress, raises
``JobFailure`` for a clear, permanent error (bad input), and lets transient errors (storage
or database unreachable) escape. It must leave nothing half-published whatever it raises.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from tensor_registry_server.jobs import events, holds
from tensor_registry_server.jobs.lifecycle import (
    Ownership,
    claim_job,
    finish_job,
    release_for_retry,
    set_progress,
)
from tensor_registry_server.jobs.problems import problem
from tensor_registry_server.jobs.runtime import Runtime
from tensor_registry_server.rows.jobs import Job, JobStatus
from tensor_registry_server.storage.base import ObjectNotFound, StorageError

log = logging.getLogger("tensor_registry.worker")

# Identity of this worker's main process, '<hostname>:<pid>'; set before the pool forks.
NODE_ID: str | None = None


def node_id() -> str:
    import socket

    return NODE_ID or f"{socket.gethostname()}:{os.getpid()}"


def process_name() -> str:
    """What goes into ``jobs.worker``: the node, and the pool process running the job."""
    return f"{node_id()}/{os.getpid()}"


class JobFailure(Exception):
    """A permanent failure with a stable code; the job fails with this problem."""

    def __init__(self, code: str, detail: str, *, status: int = 422, title: str | None = None):
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.status = status
        self.title = title


class JobCancelled(Exception):
    """cancel_requested was seen: stop, clean up, end as cancelled."""


class JobLost(Exception):
    """Another worker owns the job now (we were presumed dead): stop without touching it."""


class RetryLater(Exception):
    """A transient failure; the task re-sends itself after ``countdown`` seconds."""

    def __init__(self, countdown: float, reason: str) -> None:
        super().__init__(reason)
        self.countdown = countdown


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, ObjectNotFound):
        return False
    if isinstance(exc, StorageError | OperationalError | InterfaceError | ConnectionError):
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, TimeoutError):
        return True
    if _is_transient_s3(exc) or _is_transient_redis(exc):
        return True
    return isinstance(exc, OSError) and exc.errno in {
        errno.ENOSPC,
        errno.EIO,
        errno.EROFS,
        errno.EDQUOT,
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ETIMEDOUT,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ESTALE,
    }


def _is_transient_redis(exc: BaseException) -> bool:
    try:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError
    except ImportError:
        return False
    return isinstance(exc, RedisConnectionError | RedisTimeoutError)


def _is_transient_s3(exc: BaseException) -> bool:
    """botocore's connection errors and S3's own "try again" answers."""
    try:
        from botocore.exceptions import ClientError, HTTPClientError
        from botocore.exceptions import ConnectionError as BotoConnectionError
    except ImportError:
        return False
    if isinstance(exc, BotoConnectionError | HTTPClientError):
        return True
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        code = exc.response.get("Error", {}).get("Code", "")
        return status >= 500 or code in {"SlowDown", "ServiceUnavailable", "RequestTimeout"}
    return False


@dataclass
class JobContext:
    runtime: Runtime
    job: Job
    worker: str
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _pending: Future[Ownership] | None = None
    _last: float = 0.0
    stage: str = "starting"

    @property
    def settings(self) -> Any:
        return self.runtime.settings

    @property
    def job_id(self) -> uuid.UUID:
        return self.job.id

    def _raise_for(self, ownership: Ownership) -> None:
        if ownership is Ownership.CANCEL:
            raise JobCancelled()
        if ownership is Ownership.LOST:
            raise JobLost()

    def _update(self, stage: str, done: int, total: int | None) -> Future[Ownership]:
        async def write() -> Ownership:
            async with self.runtime.task_session() as session:
                result = await set_progress(
                    session,
                    self.job.id,
                    worker=self.worker,
                    stage=stage,
                    bytes_done=done,
                    bytes_total=total,
                )
            await nudge(
                self.runtime, self.job.id, status=JobStatus.RUNNING, stage=stage, bytes_done=done
            )
            return result

        return self.runtime.submit(write())

    def progress(self, stage: str, done: int, total: int | None) -> None:
        """Cheap, thread-safe, rate-limited; raises JobCancelled/JobLost once the database
        says so. Called from tensorizer's writer threads, so it never waits on the database."""
        if done > 0:
            holds.hold(self.settings.worker.hold_dir, stage)
        with self._lock:
            if self._pending is not None and self._pending.done():
                pending, self._pending = self._pending, None
                try:
                    self._raise_for(pending.result())
                except (JobCancelled, JobLost):
                    raise
                except Exception:
                    log.warning("progress update failed", exc_info=True)
            now = time.monotonic()
            interval = self.settings.worker.progress_interval_seconds
            if self._pending is None and (now - self._last >= interval or stage != self.stage):
                self._last = now
                self.stage = stage
                self._pending = self._update(stage, done, total)

    def checkpoint(self, stage: str, done: int = 0, total: int | None = None) -> None:
        """A stage boundary: write it and wait; raises JobCancelled/JobLost."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            try:
                pending.result(timeout=60)
            except Exception:
                log.debug("earlier progress update failed", exc_info=True)
        self.stage = stage
        self._last = time.monotonic()
        self._raise_for(self._update(stage, done, total).result(timeout=60))


async def nudge(runtime: Runtime, job_id: uuid.UUID, **state: Any) -> None:
    """Tell SSE listeners (scaled mode) that the row changed; best effort."""
    try:
        redis = await runtime.redis()
        if redis is not None:
            await events.publish(
                redis,
                job_id,
                {"id": str(job_id), **state},
                key_prefix=runtime.settings.broker.key_prefix,
            )
    except Exception:
        log.debug("job event publish failed", exc_info=True)


async def _abandoned_check(runtime: Runtime, holder: str | None) -> bool:
    """Is the process that holds this running job gone?"""
    from tensor_registry_server.jobs.pool.service import live_worker_ids

    if not holder:
        return True
    node, _, pid = holder.rpartition("/")
    if node == node_id() and pid.isdigit():
        # Our own pool: the parent lives, so look at the child itself.
        return not _pid_alive(int(pid)) or int(pid) == os.getpid()
    async with runtime.task_session() as session:
        live = await live_worker_ids(session, runtime.settings.worker.live_after_seconds)
    return node not in live


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def execute(runtime: Runtime, job_id: uuid.UUID, handler: Callable[[JobContext], None]) -> None:
    """Claim ``job_id`` and run ``handler``; every outcome ends in a row update.

    Raises RetryLater for transient failures with attempts left (the task re-sends itself);
    database errors while claiming escape as they are (the task retries them too).
    """
    worker = process_name()
    job = runtime.run(_claim(runtime, job_id, worker))
    if job is None:
        log.info("job %s: not ours to run (finished, cancelled or running elsewhere)", job_id)
        runtime.run(nudge(runtime, job_id, status="unchanged"))
        return
    log.info("job %s (%s): attempt %d on %s", job.id, job.kind, job.attempts, worker)
    ctx = JobContext(runtime=runtime, job=job, worker=worker)
    runtime.run(nudge(runtime, job.id, status=JobStatus.RUNNING, stage="starting"))

    def end(status: str, error: dict[str, Any] | None) -> None:
        runtime.run(_finish(runtime, job, worker, status, error))

    try:
        handler(ctx)
    except JobCancelled:
        log.info("job %s cancelled while running", job.id)
        end(
            JobStatus.CANCELLED,
            problem(
                "cancelled",
                "The job was cancelled while running; everything it wrote was removed.",
                status=409,
            ),
        )
    except JobLost:
        log.warning("job %s was taken over by another worker; stopped", job.id)
    except JobFailure as exc:
        log.info("job %s failed: %s: %s", job.id, exc.code, exc.detail)
        end(JobStatus.FAILED, problem(exc.code, exc.detail, status=exc.status, title=exc.title))
    except Exception as exc:
        if not is_transient(exc):
            log.exception("job %s failed with an unexpected error", job.id)
            end(
                JobStatus.FAILED,
                problem(
                    "internal_error",
                    f"Unexpected {type(exc).__name__} in the worker: {exc}"[:2000],
                    status=500,
                ),
            )
            return
        _retry_or_give_up(runtime, job, worker, exc)


async def _claim(runtime: Runtime, job_id: uuid.UUID, worker: str) -> Job | None:
    """The job, now running on ``worker``; None when it is not ours to run."""
    async with runtime.task_session() as session:
        return await claim_job(
            session,
            job_id,
            worker=worker,
            abandoned=lambda holder: _abandoned_check(runtime, holder),
            max_attempts=runtime.settings.worker.max_attempts,
        )


async def _finish(
    runtime: Runtime, job: Job, worker: str, status: str, error: dict[str, Any] | None
) -> None:
    """The job's final status (lifecycle.finish_job), then the event for its listeners."""
    async with runtime.task_session() as session:
        await finish_job(session, job, worker=worker, status=status, error=error)
    await nudge(runtime, job.id, status=status)


def _retry_or_give_up(runtime: Runtime, job: Job, worker: str, exc: Exception) -> None:
    """A transient failure: fail the job once its attempts are spent, else release it for a
    retry after an exponential backoff and raise RetryLater (the task re-sends itself)."""
    settings = runtime.settings
    reason = f"{type(exc).__name__}: {exc}"[:2000]
    database = isinstance(exc, OperationalError | InterfaceError | DBAPIError)
    code = "database_unavailable" if database else "storage_unavailable"
    if job.attempts >= settings.worker.max_attempts:
        gave_up = problem(code, f"Gave up after {job.attempts} attempts: {reason}", status=503)
        runtime.run(_finish(runtime, job, worker, JobStatus.FAILED, gave_up))
        return
    countdown = settings.worker.retry_backoff_seconds * (2 ** (job.attempts - 1))

    async def release() -> bool:
        async with runtime.task_session() as session:
            return await release_for_retry(
                session,
                job,
                worker=worker,
                error=problem(code, f"Retrying: {reason}", status=503),
            )

    try:
        released = runtime.run(release())
    except Exception:
        # The database is down too; the job stays 'running' on this live worker, and the
        # re-sent message takes it over (same process is "abandoned" to itself).
        released = True
    if released:
        log.warning("job %s: transient failure (%s); retry in %.1fs", job.id, reason, countdown)
        raise RetryLater(countdown, reason) from exc
