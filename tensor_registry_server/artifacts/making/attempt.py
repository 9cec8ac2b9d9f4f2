"""One attempt at an artifact job (tensorize, verify): what both handlers do around their work.

``artifact_attempt`` is the shared prologue and epilogue:

1. Mark the artifact running and read the rows the job needs (the artifact, its version and
   the version's files) in one transaction (``tensor_registry_server.jobs.lifecycle.mark_running``).
2. Start clean: whatever an earlier attempt committed under the artifact's prefix is removed,
   and a fresh work directory replaces a killed attempt's.
3. Hand the handler an ``Attempt``: the storages, the work directory, and ``Outputs``, sinks
   under the prefix that publish nothing until ``commit_all()``.
4. On the way out, unless the attempt published: abort the open sinks and remove what was
   committed, so no ready artifact ever points at missing bytes. Not when the job was lost:
   the worker that owns it now cleans the prefix when it starts, and may already be writing.
   The work directory is always removed.

``Attempt.publish`` is the last step: job succeeded and artifact ready with its files, in one
transaction (``tensor_registry_server.jobs.lifecycle.publish``).
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

from sqlalchemy import select

from tensor_registry_server.core.db import utcnow
from tensor_registry_server.jobs.lifecycle import PublishedFile, mark_running, publish
from tensor_registry_server.jobs.runner import (
    JobCancelled,
    JobContext,
    JobFailure,
    JobLost,
    nudge,
)
from tensor_registry_server.limits.service import quota_left
from tensor_registry_server.rows.artifacts import Artifact
from tensor_registry_server.rows.jobs import Job
from tensor_registry_server.rows.models import Model
from tensor_registry_server.rows.versions import Version, VersionFile
from tensor_registry_server.storage.base import Sink, Storage, StoredObject

log = logging.getLogger("tensor_registry.worker")

COPY_CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True)
class SourceFile:
    """A file of the job's version, as its row records it."""

    path: str
    size: int
    sha256: str
    storage_key: str


@dataclass
class Rows:
    artifact: Artifact
    version: Version
    files: list[SourceFile]


async def load_rows(ctx: JobContext) -> Rows:
    job = ctx.job
    async with ctx.runtime.task_session() as session:
        artifact = await mark_running(session, job.artifact_id) if job.artifact_id else None
        version = await session.get(Version, job.version_id) if job.version_id else None
        if artifact is None or version is None:
            raise JobFailure(
                "artifact_not_found", "The artifact or version of this job was deleted.", status=404
            )
        files = [
            SourceFile(f.path, f.size, f.sha256, f.storage_key)
            for f in (
                await session.execute(
                    select(VersionFile).where(VersionFile.version_id == version.id)
                )
            ).scalars()
        ]
    return Rows(artifact=artifact, version=version, files=files)


def copy_stream(
    source: BinaryIO,
    target: Any,
    *,
    on_bytes: Any = None,
    max_bytes: int | None = None,
) -> tuple[int, str]:
    """Copy all of ``source`` into ``target``; returns (size, sha256).

    Past ``max_bytes`` the copy stops with ``source_too_large`` before writing more: a source
    that never ends must not fill the disk.
    """
    digest = hashlib.sha256()
    size = 0
    while chunk := source.read(COPY_CHUNK):
        if max_bytes is not None and size + len(chunk) > max_bytes:
            raise JobFailure(
                "source_too_large", f"the source holds more than the {max_bytes}-byte limit"
            )
        digest.update(chunk)
        target.write(chunk)
        size += len(chunk)
        if on_bytes is not None:
            on_bytes(len(chunk))
    return size, digest.hexdigest()


class Outputs:
    """Sinks of one attempt: committed together at the end, aborted together on failure."""

    def __init__(self, storage: Storage, prefix: str) -> None:
        self.storage = storage
        self.prefix = prefix
        self.open: list[tuple[str, Sink]] = []
        self.committed: list[tuple[str, StoredObject]] = []

    def sink(self, path: str) -> Sink:
        sink = self.storage.open_sink(self.prefix + path)
        self.open.append((path, sink))
        return sink

    def add_file(self, path: str, source: Path) -> None:
        sink = self.sink(path)
        with source.open("rb") as src:
            copy_stream(src, sink)

    def commit_all(self) -> list[PublishedFile]:
        while self.open:
            path, sink = self.open.pop(0)
            self.committed.append((path, sink.commit()))
        return [
            PublishedFile(path=path, size=obj.size, sha256=obj.sha256, storage_key=obj.key)
            for path, obj in sorted(self.committed)
        ]

    def abort(self) -> None:
        for _, sink in self.open:
            try:
                sink.abort()
            except Exception:
                log.warning("could not abort a sink", exc_info=True)
        self.open.clear()


def fresh_workdir(data_dir: Path, job_id: object) -> Path:
    """A new work directory for this attempt; an earlier attempt's (killed, so never cleaned)
    is removed first: downloaded sources can be as large as the model."""
    work_root = data_dir.resolve() / "work"
    work_root.mkdir(parents=True, exist_ok=True)
    for leftover in work_root.glob(f"job-{job_id}-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"job-{job_id}-", dir=work_root))


def clean_prefix(ctx: JobContext, storage: Storage, prefix: str) -> None:
    try:
        removed = ctx.runtime.run(storage.delete_prefix(prefix))
        if removed:
            log.info("removed %d leftover object(s) under %s", removed, prefix)
    except Exception:
        log.warning("could not remove %s; left for the storage sweep", prefix, exc_info=True)


@dataclass
class Attempt:
    """What a handler works with: the job's rows, where the bytes come from and go, a work
    directory of its own, and the sinks it writes the artifact's files into."""

    ctx: JobContext
    artifact: Artifact
    version: Version
    version_files: list[SourceFile]
    storage: Storage  # the artifact's
    source_storage: Storage  # the version's
    workdir: Path
    outputs: Outputs
    started_at: datetime
    published: bool = False

    def publish(
        self, files: list[PublishedFile], fields: dict[str, Any], result: dict[str, Any]
    ) -> None:
        """Job succeeded and artifact ready with ``files`` and ``fields``, in one transaction.

        Raises ``JobCancelled`` when a cancel came first, ``JobLost`` when another worker owns
        the job now: then nothing was published.
        """
        ctx, job = self.ctx, self.ctx.job

        async def write() -> bool:
            async with ctx.runtime.task_session() as session:
                # The namespace may have filled up while the job ran: fail cleanly (the
                # attempt's epilogue deletes what was written) rather than pass the quota.
                namespace = await session.scalar(
                    select(Model.namespace).where(Model.id == job.model_id)
                )
                adding = sum(f.size for f in files)
                refusal = (
                    await quota_left(session, ctx.settings, namespace, adding)
                    if namespace is not None
                    else None
                )
                if refusal is not None:
                    raise JobFailure(refusal.code, refusal.detail, status=refusal.status)
                done = await publish(
                    session, job, worker=ctx.worker, files=files, fields=fields, result=result
                )
                if done:
                    return True
                cancelled = await session.scalar(
                    select(Job.cancel_requested).where(Job.id == job.id)
                )
            if cancelled:
                raise JobCancelled()
            raise JobLost()

        self.published = ctx.runtime.run(write())
        ctx.runtime.run(nudge(ctx.runtime, job.id, status="succeeded"))


@contextmanager
def artifact_attempt(ctx: JobContext) -> Iterator[Attempt]:
    """The prologue and epilogue of an artifact job (the module docstring lists the steps)."""
    rows = ctx.runtime.run(load_rows(ctx))
    storage = ctx.runtime.storages.get(rows.artifact.storage)
    prefix = rows.artifact.storage_prefix
    # Start clean: bytes a killed earlier attempt committed under this prefix.
    ctx.runtime.run(storage.delete_prefix(prefix))
    attempt = Attempt(
        ctx=ctx,
        artifact=rows.artifact,
        version=rows.version,
        version_files=rows.files,
        storage=storage,
        source_storage=ctx.runtime.storages.get(rows.version.storage),
        started_at=utcnow(),
        workdir=fresh_workdir(ctx.settings.data_dir, ctx.job.id),
        outputs=Outputs(storage, prefix),
    )
    lost = False
    try:
        yield attempt
    except JobLost:
        lost = True
        raise
    finally:
        if not attempt.published:
            attempt.outputs.abort()
            if attempt.outputs.committed and not lost:
                clean_prefix(ctx, storage, prefix)
        shutil.rmtree(attempt.workdir, ignore_errors=True)
