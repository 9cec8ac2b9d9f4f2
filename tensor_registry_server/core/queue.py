"""Task names and enqueue-after-commit.

The API never imports worker code: it sends tasks by name with ids only, after the rows they
refer to are committed, so a worker always finds them.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry_server.core.db import after_commit

log = logging.getLogger("tensor_registry.jobs")

TENSORIZE_TASK = "artifacts.tensorize"
VERIFY_TASK = "artifacts.verify"
IMPORT_TASK = "versions.import"
CONVERT_TASK = "versions.convert"


class TaskSender(Protocol):
    def send_task(self, name: str, args: list[str], queue: str) -> object: ...


class CelerySender:
    """Sends by name through a Celery app built from settings (lazily: the API stays light)."""

    def __init__(self, celery_app: object) -> None:
        self._app = celery_app

    def send_task(self, name: str, args: list[str], queue: str) -> object:
        return self._app.send_task(name, args=args, queue=queue)  # type: ignore[attr-defined]


def enqueue_after_commit(
    session: AsyncSession, sender: TaskSender, task: str, job_id: uuid.UUID, queue: str
) -> None:
    async def send() -> None:
        try:
            await asyncio.to_thread(sender.send_task, task, [str(job_id)], queue)
        except Exception:
            # The job row stays 'queued'; the worker-side sweep re-sends stale queued jobs.
            log.exception("could not enqueue %s for job %s", task, job_id)

    after_commit(session, send)
