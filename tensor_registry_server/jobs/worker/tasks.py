"""Celery tasks: thin. Parse the job id, run the job through
``tensor_registry_server.jobs.runner.execute``.

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

from tensor_registry_server.core.queue import (
    CONVERT_TASK,
    IMPORT_TASK,
    TENSORIZE_TASK,
    VERIFY_TASK,
)
from tensor_registry_server.jobs.runner import JobContext, RetryLater, execute
from tensor_registry_server.jobs.runtime import WARM, get_runtime

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
    from tensor_registry_server.artifacts.making.tensorize import run_tensorize

    _run(self, job_id, run_tensorize)


@shared_task(name=VERIFY_TASK, **TASK_OPTIONS)
def verify(self: Task, job_id: str) -> None:
    from tensor_registry_server.artifacts.making.verify import run_verify

    _run(self, job_id, run_verify)


@shared_task(name=IMPORT_TASK, **TASK_OPTIONS)
def import_version(self: Task, job_id: str) -> None:
    from tensor_registry_server.versions.import_job import run_import_job

    _run(self, job_id, run_import_job)


@shared_task(name=CONVERT_TASK, **TASK_OPTIONS)
def convert_version(self: Task, job_id: str) -> None:
    from tensor_registry_server.versions.convert_job import run_convert

    _run(self, job_id, run_convert)
