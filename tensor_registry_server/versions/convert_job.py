"""The ``versions.convert`` handler: pickle-based weights → safetensors, as a new version.

Reads the source version's files into a private temp dir, converts the pickle-based ones in the
isolated child (worker/pickle_convert.py: ``weights_only`` load, no network, empty environment),
then writes the safetensors and the other files (config, tokenizer, …) under the new version's
prefix and makes it ready through finalize's checks, in one transaction. A failure fails the
job and the version (lifecycle); bytes already written are orphans for the sweep."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

from sqlalchemy.orm import selectinload

from tensor_registry_server.artifacts.making.attempt import copy_stream
from tensor_registry_server.audit.service import record
from tensor_registry_server.jobs.lifecycle import finish_job, mark_imported
from tensor_registry_server.jobs.runner import JobContext, JobFailure
from tensor_registry_server.rows.jobs import JobStatus
from tensor_registry_server.rows.versions import Version, VersionFile, VersionStatus
from tensor_registry_server.storage.object_keys import check_relative_path, version_prefix
from tensor_registry_server.versions.pickle_convert import (
    ConversionError,
    convert,
    safetensors_name,
)
from tensor_registry_server.versions.service import validate_version_files


def run_convert(ctx: JobContext) -> None:
    runtime = ctx.runtime
    job = ctx.job
    if job.version_id is None:
        raise JobFailure("job_not_found", "The convert job names no target version.")
    source_id = uuid.UUID(str(job.params.get("source_version_id")))
    pickled = set(job.params.get("files") or [])

    async def load(version_id: uuid.UUID) -> Version | None:
        async with runtime.task_session() as session:
            return await session.get(Version, version_id, options=[selectinload(Version.files)])

    source = runtime.run(load(source_id))
    target = runtime.run(load(job.version_id))
    if target is None or source is None:
        raise JobFailure("version_not_found", "The source or the target version is gone.")
    if target.status != VersionStatus.READY:
        rows = _convert_and_store(ctx, source, target, pickled)
        runtime.run(_publish(ctx, target.id, rows))
    runtime.run(_finish(ctx, JobStatus.SUCCEEDED))


def _convert_and_store(
    ctx: JobContext, source: Version, target: Version, pickled: set[str]
) -> list[VersionFile]:
    """Source files into a temp dir, the pickles converted there, the results stored under
    the target version's prefix; returns the rows to add (not yet in any session)."""
    storage = ctx.runtime.storages.get(source.storage)
    base = f"{version_prefix(target.id)}c{ctx.job.id.hex[:12]}/"
    rows: list[VersionFile] = []
    with tempfile.TemporaryDirectory(prefix="tr-convert-") as tmp:
        work = Path(tmp)
        total = sum(f.size for f in source.files)
        done = 0
        for f in source.files:
            check_relative_path(f.path)
            local = work / f.path
            local.parent.mkdir(parents=True, exist_ok=True)
            with storage.open_source(f.storage_key) as src, local.open("wb") as out:
                copy_stream(src, out)
            done += f.size
            ctx.progress("download", done, total)
        pairs = [(p, safetensors_name(p)) for p in sorted(pickled)]
        ctx.progress("convert", 0, None)
        try:
            convert(work, pairs)
        except ConversionError as exc:
            raise JobFailure("conversion_failed", str(exc)) from None
        outputs = [f.path for f in source.files if f.path not in pickled]
        outputs += [target_name for _, target_name in pairs]
        for path in sorted(set(outputs)):
            sink = storage.open_sink(base + path)
            try:
                with (work / path).open("rb") as src:
                    copy_stream(src, sink)
                stored = sink.commit()
            except BaseException:
                sink.abort()
                raise
            rows.append(
                VersionFile(
                    path=path, size=stored.size, sha256=stored.sha256, storage_key=stored.key
                )
            )
    return rows


async def _publish(ctx: JobContext, version_id: uuid.UUID, rows: list[VersionFile]) -> None:
    """The rows in, finalize's checks over them, the version ready: one transaction."""
    async with ctx.runtime.task_session() as session:
        version = await session.get(
            Version, version_id, options=[selectinload(Version.files)], with_for_update=True
        )
        if version is None or version.status != VersionStatus.IMPORTING:
            raise JobFailure("version_not_importing", "The target version changed meanwhile.")
        for row in rows:
            row.version_id = version.id
            session.add(row)
        await session.flush()
        await session.refresh(version, ["files"])
        report = await validate_version_files(version, ctx.runtime.storages)
        if report.problems:
            raise JobFailure(
                "invalid_version",
                "The converted files do not make a valid version: "
                + "; ".join(f"{p.path}: {p.message}" for p in report.problems),
            )
        await mark_imported(session, version, report)
        record(
            session,
            action="version.convert.done",
            actor=None,
            target_type="version",
            target_id=version.id,
            version=version.number,
            source_version=ctx.job.params.get("source_version"),
            files=[r.path for r in rows],
        )


async def _finish(ctx: JobContext, status: str) -> None:
    async with ctx.runtime.task_session() as session:
        await finish_job(session, ctx.job, worker=ctx.worker, status=status)
