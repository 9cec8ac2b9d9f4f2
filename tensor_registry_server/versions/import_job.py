"""The ``versions.import`` handler: the versions domain's importer copies the files (through
the guarded fetcher) and validates them in the job's transaction; the lifecycle ends the job."""

from __future__ import annotations

from tensor_registry_server.core.errors import AppError
from tensor_registry_server.jobs.lifecycle import finish_job
from tensor_registry_server.jobs.runner import JobCancelled, JobContext, JobFailure, JobLost
from tensor_registry_server.rows.jobs import JobStatus
from tensor_registry_server.versions.importer import run_import


def run_import_job(ctx: JobContext) -> None:
    """``versions.import``: the versions domain's importer does the work in our transaction."""

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
