"""The way out of ``pickle_refused``: a conversion job that publishes safetensors as a new version.

The request finds the pickle-based files of a version (by name and content, as finalize does),
then creates the next version ``importing`` with a ``convert`` job, and queues it after commit.
The worker (versions/convert_job.py) loads them in an isolated child process
(worker/pickle_convert.py) and writes ``*.safetensors`` plus the version's other files into the
new version, which finalize's checks then make ``ready`` (or ``failed``). The source version is
left as it was; delete it once the new one is ready."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry_server.audit.service import record
from tensor_registry_server.auth import Principal
from tensor_registry_server.core.errors import Conflict
from tensor_registry_server.core.queue import CONVERT_TASK, TaskSender, enqueue_after_commit
from tensor_registry_server.jobs import lifecycle
from tensor_registry_server.rows.jobs import Job
from tensor_registry_server.rows.models import Model
from tensor_registry_server.rows.versions import Version, VersionStatus
from tensor_registry_server.storage.registry import StorageRegistry
from tensor_registry_server.versions.service import get_version, pickle_reason


async def request_conversion(
    session: AsyncSession,
    principal: Principal,
    model: Model,
    number: int,
    *,
    storages: StorageRegistry,
    sender: TaskSender,
) -> tuple[Version, Job]:
    source = await get_version(session, model, number)
    if source.status not in (VersionStatus.DRAFT, VersionStatus.READY):
        raise Conflict(
            f"Version {number} is {source.status}; convert a draft or ready version.",
            code="version_not_convertible",
        )
    storage = storages.get(source.storage)
    pickled = [f.path for f in source.files if await pickle_reason(storage, f) is not None]
    if not pickled:
        raise Conflict(
            f"Version {number} holds no pickle-based weights to convert.",
            code="nothing_to_convert",
        )
    target_number = (
        await session.scalar(
            select(func.coalesce(func.max(Version.number), 0)).where(Version.model_id == model.id)
        )
        or 0
    ) + 1
    version = Version(model_id=model.id, number=target_number, storage=source.storage, files=[])
    job = lifecycle.queued_conversion(principal, model, version, source, pickled)
    session.add(job)
    await session.flush()
    version.job_id = job.id
    session.add(version)
    # A concurrent create may take the same number: the unique constraint turns that into 409.
    await session.flush()
    job.version_id = version.id
    enqueue_after_commit(session, sender, CONVERT_TASK, job.id, job.queue)
    record(
        session,
        action="version.convert",
        actor=principal,
        target_type="version",
        target_id=version.id,
        model=model.name,
        version=target_number,
        source_version=number,
        files=pickled,
    )
    return version, job
