"""The ``import`` job: copy a version's files from ``source_uri`` into storage, then freeze it.

``run_import`` does the whole job for one job row; the worker task (``versions.import``) calls it
inside its session and owns the job row's status. Every file streams from the source into the
version's storage with sha256 computed on the way (memory stays at a few MiB per file whatever
the size); declared sizes and checksums are verified; then the version is validated exactly as
``finalize`` does and becomes ``ready``.

On any failure the copied bytes are removed, the version becomes ``failed`` (committed here, on
purpose: whatever the caller does with its transaction afterwards, a failed import must not stay
``importing``), and an ``AppError`` with a stable code is raised for the job's ``error``.
Re-running a job whose version is already ``ready`` is a no-op; one that crashed mid-copy starts
clean (the version's prefix is emptied first: no row points into it before the import ends).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload

from tensor_registry_server.audit.service import record
from tensor_registry_server.core.errors import AppError, NotFound
from tensor_registry_server.core.fetch import FetchPolicy, Resolver
from tensor_registry_server.core.redact import redact_uri
from tensor_registry_server.core.source_uri import FILE, HTTP_SCHEMES, S3, scheme_of
from tensor_registry_server.jobs.lifecycle import fail_import, mark_imported
from tensor_registry_server.rows.jobs import Job
from tensor_registry_server.rows.versions import Version, VersionFile, VersionStatus
from tensor_registry_server.storage.base import ChecksumMismatch, ObjectTooLarge, StorageError
from tensor_registry_server.storage.object_keys import version_prefix
from tensor_registry_server.storage.registry import StorageRegistry
from tensor_registry_server.versions import import_sources
from tensor_registry_server.versions.import_sources import SourceFile
from tensor_registry_server.versions.service import validate_version_files

log = logging.getLogger("tensor_registry.imports")

# Called with (bytes_done, bytes_total or None); may be a plain function or a coroutine function.
Progress = Callable[[int, int | None], Awaitable[None] | None]


class ImportFailed(AppError):
    status, code, title = 422, "import_failed", "Import failed"


async def _load_version(session: AsyncSession, version_id: uuid.UUID) -> Version:
    stmt = (
        select(Version)
        .where(Version.id == version_id)
        .options(selectinload(Version.files))
        .execution_options(populate_existing=True)
    )
    version = (await session.execute(stmt)).scalar_one_or_none()
    if version is None:
        raise NotFound(f"Version {version_id} no longer exists.", code="version_not_found")
    return version


async def run_import(
    session: AsyncSession,
    storages: StorageRegistry,
    job_id: uuid.UUID,
    *,
    progress: Progress | None = None,
    resolver: Resolver | None = None,
) -> None:
    """``resolver`` replaces DNS for the fetcher (tests simulate rebinding with it)."""
    job = await session.get(Job, job_id)
    if job is None or job.version_id is None:
        raise NotFound(f"Import job {job_id} does not exist.", code="job_not_found")
    version = await _load_version(session, job.version_id)
    if version.status == VersionStatus.READY:
        return
    if version.status != VersionStatus.IMPORTING:
        raise ImportFailed(
            f"Version {version.number} is {version.status}, not importing; create a new version "
            "to import again.",
            code="import_not_importing",
        )
    storage = storages.get(version.storage)
    prefix = version_prefix(version.id)
    source_uri = version.source_uri or str(job.params.get("source_uri", ""))
    version_id, number = version.id, version.number
    try:
        await storage.delete_prefix(prefix)
        async with SourceClient(source_uri, storages, resolver=resolver) as client:
            files = await _list(source_uri, storages, client)
            rows = await _copy_all(files, storage, prefix, job_id, storages, progress)
        for row in rows:
            row.version_id = version.id
            session.add(row)
        await session.flush()
        version = await _load_version(session, version.id)
        report = await validate_version_files(version, storages)
        if report.problems:
            raise ImportFailed(
                "The imported files do not make a valid version: "
                f"{len(report.problems)} problem(s).",
                code="invalid_version",
                problems=[p.__dict__ for p in report.problems],
            )
        await mark_imported(session, version, report)
        await session.flush()
        record(
            session,
            action="version.import",
            actor=None,
            target_type="version",
            target_id=version.id,
            version=version.number,
            source_uri=redact_uri(source_uri),
            files=len(rows),
            architecture=report.architecture,
        )
    except BaseException as exc:
        await _fail(session, storages, version_id, prefix, exc)
        if isinstance(exc, AppError):
            raise
        if isinstance(exc, Exception):
            log.exception("import of version %s (%s) failed", number, version_id)
            raise ImportFailed(
                f"The import failed: {type(exc).__name__}: {exc}", code="import_failed"
            ) from exc
        raise


async def _fail(
    session: AsyncSession,
    storages: StorageRegistry,
    version_id: uuid.UUID,
    prefix: str,
    exc: BaseException,
) -> None:
    async def cleanup() -> None:
        await session.rollback()
        version = await session.get(Version, version_id, populate_existing=True)
        if version is None:
            return
        try:
            await storages.get(version.storage).delete_prefix(prefix)
        except StorageError:
            log.warning(
                "could not remove the bytes of failed import %s; left for the sweep", prefix
            )
        await fail_import(session, version_id)
        await session.commit()

    # Shielded: a cancelled job must still leave a failed version and no bytes.
    task = asyncio.ensure_future(cleanup())
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise
    except Exception:
        log.exception("could not mark version %s failed after %r", version_id, exc)


class SourceClient:
    """What an import source needs: aioboto3 for s3://, the guarded fetcher's policy for
    http(s)://."""

    def __init__(
        self, uri: str, storages: StorageRegistry, *, resolver: Resolver | None = None
    ) -> None:
        self.scheme = scheme_of(uri)
        self.storages = storages
        self.resolver = resolver

    async def __aenter__(self) -> Any:
        if self.scheme == S3:
            from tensor_registry_server.storage.s3 import S3Storage

            backend = self.storages.get("s3")
            assert isinstance(backend, S3Storage)
            return await backend.client()
        if self.scheme in HTTP_SCHEMES:
            return FetchPolicy.from_settings(self.storages.settings, resolver=self.resolver)
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


async def _list(uri: str, storages: StorageRegistry, client: Any) -> list[SourceFile]:
    scheme = scheme_of(uri)
    if scheme == FILE:
        return await asyncio.to_thread(import_sources.list_directory, uri, storages.settings)
    if scheme == S3:
        return await import_sources.list_s3(uri, client, storages.settings)
    return await import_sources.list_manifest(uri, client)


async def _copy_all(
    files: list[SourceFile],
    storage: Any,
    prefix: str,
    job_id: uuid.UUID,
    storages: StorageRegistry,
    progress: Progress | None,
) -> list[VersionFile]:
    limit = storages.settings.storage.max_upload_bytes
    known = [f.size for f in files]
    total = sum(s for s in known if s is not None) if all(s is not None for s in known) else None
    if total is not None and any(s is not None and s > limit for s in known):
        raise ImportFailed(
            f"A source file is larger than the limit of {limit} bytes.", code="file_too_large"
        )
    done = 0
    await _report(progress, 0, total)
    rows = []
    base = f"{prefix}i{job_id.hex[:12]}/"
    for source in files:
        key = f"{base}{source.path}"
        max_size = limit if source.size is None else min(source.size, limit)
        try:
            stored = await storage.put_stream(
                key, source.open(), max_size=max_size, expected_sha256=source.sha256
            )
        except ChecksumMismatch as exc:
            raise ImportFailed(
                f"{source.path}: the bytes hash to {exc.actual}, "
                f"not to the declared {exc.expected}.",
                code="import_checksum_mismatch",
                path=source.path,
            ) from exc
        except ObjectTooLarge as exc:
            bound = "its declared size" if source.size is not None else "the limit"
            raise ImportFailed(
                f"{source.path}: longer than {bound}.",
                code="import_size_mismatch" if source.size is not None else "file_too_large",
                path=source.path,
            ) from exc
        if source.size is not None and stored.size != source.size:
            raise ImportFailed(
                f"{source.path}: {stored.size} bytes arrived, {source.size} were declared.",
                code="import_size_mismatch",
                path=source.path,
            )
        rows.append(
            VersionFile(path=source.path, size=stored.size, sha256=stored.sha256, storage_key=key)
        )
        done += stored.size
        await _report(progress, done, total)
    return rows


async def _report(progress: Progress | None, done: int, total: int | None) -> None:
    if progress is not None:
        result = progress(done, total)
        if inspect.isawaitable(result):
            await result
