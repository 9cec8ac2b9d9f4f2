"""Celery tasks: thin. Parse the job id, run the job through ``workers.jobrun.execute``.

Named (the API sends by name, never imports this), ``acks_late`` with
``reject_on_worker_lost`` (a pool process killed mid-job puts the message back), retried with
backoff only for transient failures. Heavy imports (torch, transformers) happen inside the job.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from celery import Task, shared_task
from sqlalchemy.exc import InterfaceError, OperationalError

from app.core.queue import IMPORT_TASK, TENSORIZE_TASK, VERIFY_TASK
from workers.jobrun import JobCancelled, JobContext, JobFailure, JobLost, RetryLater, execute
from workers.runtime import WARM, get_runtime

log = logging.getLogger("tensor_registry.worker")

TASK_OPTIONS: dict[str, Any] = {
    "bind": True,
    "acks_late": True,
    "reject_on_worker_lost": True,
    "max_retries": None,
    "ignore_result": True,
}


def _run(task: Task, job_id: str, handler: Callable[[JobContext], None]) -> None:
    try:
        parsed = uuid.UUID(str(job_id))
    except ValueError:
        log.error("task %s got a malformed job id %r; dropped", task.name, job_id)
        return
    WARM.wait(timeout=300)
    runtime = get_runtime()
    try:
        execute(runtime, parsed, handler)
    except RetryLater as exc:
        raise task.retry(countdown=exc.countdown) from None
    except (OperationalError, InterfaceError, ConnectionError) as exc:
        # The database is unreachable: the job row cannot even be read. Try again later.
        backoff = runtime.settings.worker.retry_backoff_seconds
        countdown = min(300.0, backoff * 2 ** min(task.request.retries, 8))
        log.warning("job %s: database unavailable (%s); retry in %.0fs", job_id, exc, countdown)
        raise task.retry(countdown=countdown) from None


@shared_task(name=TENSORIZE_TASK, **TASK_OPTIONS)
def tensorize(self: Task, job_id: str) -> None:
    from workers.handlers.tensorize import run_tensorize

    _run(self, job_id, run_tensorize)


@shared_task(name=VERIFY_TASK, **TASK_OPTIONS)
def verify(self: Task, job_id: str) -> None:
    from workers.handlers.verify import run_verify

    _run(self, job_id, run_verify)


@shared_task(name=IMPORT_TASK, **TASK_OPTIONS)
def import_version(self: Task, job_id: str) -> None:
    _run(self, job_id, run_import_job)


def run_import_job(ctx: JobContext) -> None:
    """``versions.import``: the versions domain's importer does the work in our transaction."""
    try:
        from app.versions.importer import run_import
    except ImportError:
        raise JobFailure(
            "import_unavailable",
            "This server cannot import versions from a source_uri yet.",
            status=501,
        ) from None
    from app.errors import AppError
    from app.jobs.lifecycle import finish_job
    from app.jobs.models import JobStatus

    def progress(done: int, total: int | None) -> None:
        ctx.progress("import", done, total)

    async def work() -> None:
        async with ctx.runtime.task_session() as session:
            await run_import(session, ctx.runtime.storages, ctx.job.id, progress=progress)
        async with ctx.runtime.task_session() as session:
            await finish_job(session, ctx.job, worker=ctx.worker, status=JobStatus.SUCCEEDED)

    try:
        ctx.runtime.run(work())
    except AppError as exc:
        # The importer wraps what escapes its copy loop; a cancel seen by our progress
        # callback must still end the job as cancelled, not as a failed import.
        if isinstance(exc.__cause__, JobCancelled | JobLost):
            raise exc.__cause__ from None
        raise JobFailure(exc.code, exc.detail, status=exc.status) from None
