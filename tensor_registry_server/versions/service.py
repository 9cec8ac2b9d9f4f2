"""Versions: immutable snapshots of a model's source files (Hugging Face layout)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterable
from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload

from tensor_registry_server.audit.service import record
from tensor_registry_server.auth import Principal
from tensor_registry_server.checkpoints import finalize as validation
from tensor_registry_server.checkpoints import pickles, safetensors
from tensor_registry_server.core.db import lock_for_write, utcnow
from tensor_registry_server.core.errors import Conflict, Invalid, NotFound, PayloadTooLarge
from tensor_registry_server.core.invalidation import mark_changed
from tensor_registry_server.core.pagination import Page, paginate
from tensor_registry_server.core.queue import IMPORT_TASK, TaskSender, enqueue_after_commit
from tensor_registry_server.core.redact import redact_uri
from tensor_registry_server.core.source_uri import check_source_uri
from tensor_registry_server.jobs import lifecycle, transition_events
from tensor_registry_server.limits.service import check_job, check_upload
from tensor_registry_server.rows.aliases import Alias
from tensor_registry_server.rows.artifacts import Artifact
from tensor_registry_server.rows.jobs import Job
from tensor_registry_server.rows.models import Model
from tensor_registry_server.rows.versions import Version, VersionFile, VersionStatus
from tensor_registry_server.storage.base import (
    ChecksumMismatch,
    ObjectNotFound,
    ObjectTooLarge,
    Storage,
    StoredObject,
)
from tensor_registry_server.storage.deferred_delete import delete_after_commit
from tensor_registry_server.storage.object_keys import check_relative_path, version_prefix
from tensor_registry_server.storage.registry import StorageRegistry
from tensor_registry_server.versions.schemas import VersionCreate

WEIGHT_SUFFIX = ".safetensors"
CONFIG_PATH = "config.json"


async def get_version(
    session: AsyncSession, model: Model, number: int, *, with_files: bool = True
) -> Version:
    stmt = select(Version).where(Version.model_id == model.id, Version.number == number)
    if with_files:
        stmt = stmt.options(selectinload(Version.files))
    version = (await session.execute(stmt)).scalar_one_or_none()
    if version is None:
        raise NotFound(f"Model '{model.name}' has no version {number}.", code="version_not_found")
    return version


async def list_versions(
    session: AsyncSession, model: Model, *, cursor: str | None, limit: int
) -> Page[Version]:
    stmt = select(Version).where(Version.model_id == model.id).options(selectinload(Version.files))
    return await paginate(session, stmt, keys=[Version.number], cursor=cursor, limit=limit)


async def create_version(
    session: AsyncSession,
    principal: Principal,
    model: Model,
    data: VersionCreate,
    *,
    storages: StorageRegistry,
    sender: TaskSender,
) -> tuple[Version, Job | None]:
    storage = storages.get(data.storage).name
    number = (
        await session.scalar(
            select(func.coalesce(func.max(Version.number), 0)).where(Version.model_id == model.id)
        )
        or 0
    ) + 1
    version = Version(model_id=model.id, number=number, storage=storage, files=[])
    job = None
    if data.source_uri:
        check_source_uri(data.source_uri, storages.settings)
        # The import's size is unknown here: refused when the quota is already passed.
        await check_job(session, storages.settings, model.namespace, expected_bytes=0)
        job = lifecycle.queued_import(principal, model, version, data.source_uri)
        session.add(job)
        await session.flush()
        version.job_id = job.id
    session.add(version)
    # A concurrent create may take the same number: the unique constraint turns that into 409.
    await session.flush()
    if job is not None:
        job.version_id = version.id
        enqueue_after_commit(session, sender, IMPORT_TASK, job.id, job.queue)
    record(
        session,
        action="version.create",
        actor=principal,
        target_type="version",
        target_id=version.id,
        model=model.name,
        version=number,
        source_uri=redact_uri(data.source_uri) if data.source_uri else None,
    )
    return version, job


async def _lock_version(session: AsyncSession, version_id: uuid.UUID) -> Version:
    stmt = (
        select(Version)
        .where(Version.id == version_id)
        .with_for_update()
        .options(selectinload(Version.files))
        .execution_options(populate_existing=True)
    )
    return (await session.execute(stmt)).scalar_one()


def _require_draft(model: Model, version: Version) -> None:
    if version.status != VersionStatus.DRAFT:
        raise Conflict(
            f"Version {version.number} of '{model.name}' is {version.status}; "
            "only draft versions accept changes.",
            code="version_frozen",
        )


@dataclass(frozen=True)
class UploadTarget:
    """Where an upload's bytes go, checked before the body is read."""

    version_id: uuid.UUID
    number: int
    storage: str
    path: str
    key: str
    content_length: int
    expected_sha256: str | None


async def start_upload(
    session: AsyncSession,
    model: Model,
    number: int,
    path: str,
    *,
    content_length: int,
    expected_sha256: str | None,
    storages: StorageRegistry,
) -> UploadTarget:
    """Check an upload before its body is read: path, checksum syntax, size, a draft version."""
    problem = check_relative_path(path)
    if problem:
        raise Invalid(f"File path {path!r} is not allowed: {problem}.", code="invalid_path")
    if expected_sha256 is not None and (
        len(expected_sha256) != 64
        or any(c not in "0123456789abcdef" for c in expected_sha256.lower())
    ):
        raise Invalid("X-Content-SHA256 must be 64 hex digits.", code="invalid_checksum")
    limit = storages.settings.storage.max_upload_bytes
    if content_length > limit:
        raise PayloadTooLarge(
            f"The file is {content_length} bytes; the limit is {limit}.", code="file_too_large"
        )
    version = await get_version(session, model, number, with_files=False)
    _require_draft(model, version)
    storages.get(version.storage)
    # Before a byte is read: the namespace's largest upload and storage quota (a file that
    # replaces one at the same path counts only the difference).
    replacing = await session.scalar(
        select(VersionFile.size).where(
            VersionFile.version_id == version.id, VersionFile.path == path
        )
    )
    await check_upload(
        session, storages.settings, model.namespace, content_length, replacing=replacing or 0
    )
    # Every upload gets its own key, so a failed or concurrent upload never touches bytes that
    # a row already points at; the row is switched only after the bytes are complete and checked.
    return UploadTarget(
        version_id=version.id,
        number=number,
        storage=version.storage,
        path=path,
        key=f"{version_prefix(version.id)}u{uuid.uuid4().hex[:12]}/{path}",
        content_length=content_length,
        expected_sha256=expected_sha256,
    )


async def receive_upload(
    target: UploadTarget, body: AsyncIterable[bytes], *, storages: StorageRegistry
) -> StoredObject:
    """Stream the body into storage under the upload's own key. Needs no database session."""
    storage = storages.get(target.storage)
    limit = storages.settings.storage.max_upload_bytes
    try:
        stored = await storage.put_stream(
            target.key,
            body,
            max_size=min(target.content_length, limit),
            expected_sha256=target.expected_sha256,
        )
    except ObjectTooLarge as exc:
        raise PayloadTooLarge(
            "The body is longer than its Content-Length.", code="length_mismatch"
        ) from exc
    except ChecksumMismatch as exc:
        raise Invalid(
            f"The bytes hash to {exc.actual}, not to X-Content-SHA256 {exc.expected}; "
            "nothing was stored.",
            code="checksum_mismatch",
            expected=exc.expected,
            actual=exc.actual,
        ) from exc
    if stored.size != target.content_length:
        await storage.delete(target.key)
        raise Invalid(
            f"Received {stored.size} bytes but Content-Length said {target.content_length}.",
            code="length_mismatch",
        )
    return stored


async def record_upload(
    session: AsyncSession,
    principal: Principal,
    model: Model,
    target: UploadTarget,
    stored: StoredObject,
    *,
    storages: StorageRegistry,
) -> VersionFile:
    """Point the version's row for the path at the stored bytes, or delete them if refused.

    Under the version's write lock, so this and finalize's freeze happen one after the other:
    an upload that lands after the freeze is refused (409 version_frozen) and its bytes removed.
    """
    storage = storages.get(target.storage)
    try:
        await lock_for_write(session)
        version = await _lock_version(session, target.version_id)
        _require_draft(model, version)
        existing = (
            await session.execute(
                select(VersionFile)
                .where(VersionFile.version_id == version.id, VersionFile.path == target.path)
                .execution_options(populate_existing=True)
            )
        ).scalar_one_or_none()
        # Again under the lock: uploads racing each other cannot all slip under the quota.
        await check_upload(
            session,
            storages.settings,
            model.namespace,
            stored.size,
            replacing=existing.size if existing is not None else 0,
        )
        if existing is not None:
            # Read under the lock: a concurrent upload of the same path that committed first is
            # seen here, and its bytes are the ones replaced (and deleted after commit).
            old_key = existing.storage_key
            existing.size, existing.sha256 = stored.size, stored.sha256
            existing.storage_key, existing.created_at = target.key, utcnow()
            row = existing
            delete_after_commit(session, storages, version.storage, old_key)
        else:
            row = VersionFile(
                version_id=version.id,
                path=target.path,
                size=stored.size,
                sha256=stored.sha256,
                storage_key=target.key,
            )
            session.add(row)
        await session.flush()
    except BaseException:
        await storage.delete(target.key)
        raise
    record(
        session,
        action="version.file.upload",
        actor=principal,
        target_type="version",
        target_id=version.id,
        model=model.name,
        version=target.number,
        path=target.path,
        size=stored.size,
        sha256=stored.sha256,
    )
    return row


async def get_file(
    session: AsyncSession, model: Model, number: int, path: str
) -> tuple[Version, VersionFile]:
    version = await get_version(session, model, number, with_files=False)
    row = (
        await session.execute(
            select(VersionFile).where(
                VersionFile.version_id == version.id, VersionFile.path == path
            )
        )
    ).scalar_one_or_none()
    if row is None:
        raise NotFound(f"Version {number} has no file {path!r}.", code="file_not_found")
    return version, row


async def delete_file(
    session: AsyncSession,
    principal: Principal,
    model: Model,
    number: int,
    path: str,
    *,
    storages: StorageRegistry,
) -> None:
    version = await get_version(session, model, number, with_files=False)
    await lock_for_write(session)
    version = await _lock_version(session, version.id)
    _require_draft(model, version)
    row = next((f for f in version.files if f.path == path), None)
    if row is None:
        raise NotFound(f"Version {number} has no file {path!r}.", code="file_not_found")
    version.files.remove(row)
    await session.flush()
    delete_after_commit(session, storages, version.storage, row.storage_key)
    record(
        session,
        action="version.file.delete",
        actor=principal,
        target_type="version",
        target_id=version.id,
        model=model.name,
        version=number,
        path=path,
    )


async def validate_version_files(
    version: Version, storages: StorageRegistry
) -> validation.ValidationReport:
    """Read config.json and every safetensors header, and sniff the other files for pickles;
    collect problems per file."""
    report = validation.ValidationReport()
    storage = storages.get(version.storage)
    for file in version.files:
        reason = await pickle_reason(storage, file)
        if reason is not None:
            report.problems.append(validation.Problem(file.path, PICKLE_PROBLEM, reason))
    files = {f.path: f for f in version.files}
    config_file = files.get(CONFIG_PATH)
    if config_file is None:
        report.problems.append(
            validation.Problem(CONFIG_PATH, "missing_config", "config.json is required")
        )
    else:
        raw = await storage.read_bytes(config_file.storage_key, length=16 * 1024 * 1024)
        # Parsing a large document takes the CPU for a while: off the event loop.
        config, problem = await asyncio.to_thread(validation.check_config, CONFIG_PATH, raw)
        if problem:
            report.problems.append(problem)
        elif config is not None:
            arch = config.get("architectures") or [config.get("model_type")]
            report.architecture = str(arch[0])
        report.remote_code = pickles.remote_code(config, [f.path for f in version.files])
    weights = [f for f in version.files if f.path.endswith(WEIGHT_SUFFIX)]
    if not weights:
        report.problems.append(
            validation.Problem(None, "missing_weights", "no *.safetensors weights were uploaded")
        )
    max_header = storages.settings.storage.max_safetensors_header_bytes
    for weight in weights:
        try:
            prefix = await storage.read_bytes(weight.storage_key, length=8)
            length = safetensors.header_length(prefix, file_size=weight.size, max_bytes=max_header)
            header = await storage.read_bytes(weight.storage_key, offset=8, length=length)
            parsed = await asyncio.to_thread(
                safetensors.parse_header,
                header,
                file_size=weight.size,
                dtypes=validation.ACCEPTED_DTYPES,
            )
        except safetensors.HeaderError as exc:
            report.problems.append(validation.Problem(weight.path, "corrupt_weights", str(exc)))
            continue
        report.add_weights(parsed)
    return report


PICKLE_PROBLEM = "pickle_weights"


async def pickle_reason(storage: Storage, file: VersionFile) -> str | None:
    """Why this file is pickle-based (by its name, else by its first and last bytes), or None."""
    reason = pickles.by_name(file.path)
    if reason is not None or not pickles.needs_sniffing(file.path) or file.size < 2:
        return reason
    head = await storage.read_bytes(file.storage_key, length=pickles.HEAD_BYTES)
    if pickles.is_zip(head):
        length = min(file.size, pickles.ZIP_TAIL_BYTES)
        tail = await storage.read_bytes(file.storage_key, offset=file.size - length, length=length)
        inside = pickles.zip_pickles(tail)
        return f"a zip archive holding pickles ({', '.join(inside[:3])})" if inside else None
    return pickles.by_head(head)


def _file_set(version: Version) -> set[tuple[str, str, int, str]]:
    return {(f.path, f.storage_key, f.size, f.sha256) for f in version.files}


async def finalize_version(
    session: AsyncSession,
    principal: Principal,
    model: Model,
    number: int,
    *,
    storages: StorageRegistry,
) -> Version:
    version = await get_version(session, model, number)
    if version.status == VersionStatus.READY:
        return version
    _require_draft(model, version)
    # Validate without a lock (reading headers takes a while), then freeze under the version's
    # write lock only if the files are still exactly the ones validated.
    validated = _file_set(version)
    report: validation.ValidationReport | None
    try:
        report = await validate_version_files(version, storages)
    except ObjectNotFound:
        # A concurrent replace or delete removed bytes while they were read: validate again
        # under the lock, where the file set holds still.
        report = None
    if report is not None:
        _raise_problems(model, number, report)
    await lock_for_write(session)
    locked = await _lock_version(session, version.id)
    if locked.status == VersionStatus.READY:
        return locked
    _require_draft(model, locked)
    # (``locked`` is ``version`` reloaded in place: compare with the set captured before.)
    if report is None or _file_set(locked) != validated:
        # An upload or delete committed while we validated: validate what is being frozen.
        report = await validate_version_files(locked, storages)
        _raise_problems(model, number, report)
    frozen = await session.execute(
        update(Version)
        .where(Version.id == locked.id, Version.status == VersionStatus.DRAFT)
        .values(
            status=VersionStatus.READY,
            finalized_at=utcnow(),
            architecture=report.architecture,
            parameter_count=report.parameter_count,
            dtype_breakdown=report.dtype_breakdown,
            remote_code=report.remote_code,
        )
    )
    if frozen.rowcount != 1:  # type: ignore[attr-defined]
        # Unreachable under the lock; the condition keeps the freeze atomic regardless.
        raise Conflict(f"Version {number} changed while finalizing.", code="version_frozen")
    # A bulk statement: the flush events that invalidate resolve choices cannot see it.
    mark_changed(session, model.id)
    record(
        session,
        action="version.finalize",
        actor=principal,
        target_type="version",
        target_id=locked.id,
        model=model.name,
        version=number,
        architecture=report.architecture,
        parameter_count=report.parameter_count,
    )
    transition_events.version_ready_event(session, model.name, locked, source="finalize")
    return locked


def _raise_problems(model: Model, number: int, report: validation.ValidationReport) -> None:
    pickled = [p for p in report.problems if p.code == PICKLE_PROBLEM]
    if pickled:
        convert = f"/api/v1/models/{model.id}/versions/{number}/convert"
        raise Invalid(
            f"Version {number} holds pickle-based weights, which the registry does not store "
            f"(loading them can run code): {', '.join(p.path or '' for p in pickled)}. Upload "
            f"safetensors instead, or POST {convert} to convert them on a worker (no code from "
            "the files runs there) into a new version.",
            code="pickle_refused",
            files=[{"path": p.path, "reason": p.message} for p in pickled],
            convert=convert,
            problems=[p.__dict__ for p in report.problems],
        )
    if report.problems:
        raise Invalid(
            f"Version {number} cannot be finalized: {len(report.problems)} problem(s).",
            code="invalid_version",
            problems=[p.__dict__ for p in report.problems],
        )


async def delete_version(
    session: AsyncSession,
    principal: Principal,
    model: Model,
    number: int,
    *,
    storages: StorageRegistry,
) -> None:

    version = await get_version(session, model, number, with_files=False)
    aliases = list(
        (await session.execute(select(Alias.name).where(Alias.version_id == version.id))).scalars()
    )
    if aliases:
        raise Conflict(
            f"Version {number} is the target of alias(es) {', '.join(sorted(aliases))}; "
            "move or delete them first.",
            code="version_in_use",
        )
    artifacts = await transition_events.announce_artifacts_deleted(
        session, model.name, Artifact.version_id == version.id
    )
    artifact_prefixes = [(artifact.storage, artifact.storage_prefix) for artifact in artifacts]
    await session.delete(version)
    await session.flush()
    for storage_name, prefix in [(version.storage, version_prefix(version.id)), *artifact_prefixes]:
        delete_after_commit(session, storages, storage_name, prefix)
    record(
        session,
        action="version.delete",
        actor=principal,
        target_type="version",
        target_id=version.id,
        model=model.name,
        version=number,
    )


def version_size(version: Version) -> int:
    return sum(f.size for f in version.files)
