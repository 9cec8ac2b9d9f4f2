"""The tensorize job: a version's source files in, one published artifact out.

1. Clean start: whatever an earlier attempt of this artifact left under its prefix is removed.
2. Materialize the version's files in a work directory: symlinks into a local storage root
   (zero copy), downloads (size and sha256 checked) from any other backend.
3. Load with transformers in the requested dtype on the job's device (``workers.modeling``:
   meta-device construction, weights streamed from the memory-mapped safetensors).
4. Serialize with tensorizer (``workers.serialize``) straight into a storage sink for
   ``artifacts/<id>/model.tensors``, then config/tokenizer files beside it. Sinks publish
   nothing until ``commit()``: until then the bytes live in the backend's temporary area
   (a temp file for local storage, an unfinished multipart upload on S3).
5. Commit every sink, then in ONE transaction mark the job succeeded and the artifact ready
   with its file rows (size + sha256 from the sinks). A failure at any step aborts the sinks
   and deletes whatever was committed, so no ready artifact ever points at missing bytes, and
   a worker killed mid-way leaves only a non-ready artifact that the next attempt cleans.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from sqlalchemy import select

from app.artifacts.tables import Artifact
from app.crypto import new_key_id, wrap_key
from app.db import utcnow
from app.jobs.lifecycle import PublishedFile, mark_running, publish
from app.jobs.tables import Job
from app.storage.base import Sink, Storage, StoredObject
from app.storage.object_keys import check_relative_path
from app.versions.tables import Version, VersionFile
from workers.jobrun import JobCancelled, JobContext, JobFailure, JobLost, nudge

log = logging.getLogger("tensor_registry.worker")

COPY_CHUNK = 8 * 1024 * 1024
WEIGHTS_FILE = "model.tensors"


@dataclass(frozen=True)
class SourceFile:
    path: str
    size: int
    sha256: str
    storage_key: str


@dataclass
class Rows:
    artifact: Artifact
    version: Version
    files: list[SourceFile]


async def _load_rows(ctx: JobContext) -> Rows:
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


def _needed(path: str) -> bool:
    """Files the model and its tokenizer are built from (top level only, as transformers)."""
    from app.checkpoints.huggingface import (
        COMPANION_NAMES,
        COMPANION_PATTERNS,
        SAFE_WEIGHTS_INDEX_NAME,
    )

    if "/" in path:
        return False
    if path.endswith(".safetensors") or path == SAFE_WEIGHTS_INDEX_NAME:
        return True
    if path in COMPANION_NAMES:
        return True
    return any(Path(path).match(pattern) for pattern in COMPANION_PATTERNS)


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


def materialize(ctx: JobContext, storage: Storage, files: list[SourceFile], dest: Path) -> Path:
    """The version's files as a plain Hugging Face directory at ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    wanted = [f for f in files if _needed(f.path)]
    total = sum(f.size for f in wanted)
    done = 0
    for f in wanted:
        if check_relative_path(f.path):
            raise JobFailure("invalid_source", f"version file {f.path!r} has an unsafe path")
        target = dest / f.path
        local = storage.local_path(f.storage_key)
        if local is not None:
            try:
                size = local.stat().st_size
            except FileNotFoundError:
                raise JobFailure(
                    "source_missing", f"{f.path}: its bytes are missing from storage", status=500
                ) from None
            if size != f.size:
                raise JobFailure(
                    "source_corrupt",
                    f"{f.path}: storage holds {size} bytes, the version recorded {f.size}",
                    status=500,
                )
            target.symlink_to(local)
            done += f.size
            continue

        def advance(n: int) -> None:
            nonlocal done
            done += n
            ctx.progress("download", done, total)

        with storage.open_source(f.storage_key) as src, target.open("wb") as out:
            size, sha = copy_stream(src, out, on_bytes=advance)
        if size != f.size or sha != f.sha256:
            raise JobFailure(
                "source_corrupt",
                f"{f.path}: downloaded {size} bytes hashing to {sha}, the version recorded "
                f"{f.size} bytes and {f.sha256}",
                status=500,
            )
    ctx.progress("download", total, total)
    return dest


def pick_device(queue: str) -> str:
    import torch

    if queue == "gpu" and torch.cuda.is_available():
        return "cuda:0"
    return "cpu"


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


def run_tensorize(ctx: JobContext) -> None:
    from app.checkpoints.huggingface import ModelSourceError, companion_files, validate_source
    from workers.layout import add_layout
    from workers.manifest import publish_manifest
    from workers.modeling import load_model
    from workers.serialize import (
        FormatUnavailable,
        SerializeError,
        new_encryption_key,
        serialize_hf,
        serialize_vllm,
    )

    job = ctx.job
    settings = ctx.settings
    params = job.params
    rows = ctx.runtime.run(_load_rows(ctx))
    artifact = rows.artifact
    storage = ctx.runtime.storages.get(artifact.storage)
    source_storage = ctx.runtime.storages.get(rows.version.storage)
    prefix = artifact.storage_prefix
    # Start clean: bytes a killed earlier attempt committed under this prefix.
    ctx.runtime.run(storage.delete_prefix(prefix))

    started_at = utcnow()
    workdir = fresh_workdir(settings.data_dir, job.id)
    outputs = Outputs(storage, prefix)
    published = lost = False
    timings: dict[str, float] = {}
    try:
        t0 = time.perf_counter()
        ctx.checkpoint("download", 0, sum(f.size for f in rows.files if _needed(f.path)))
        src = materialize(ctx, source_storage, rows.files, workdir / "src")
        timings["download_seconds"] = time.perf_counter() - t0

        ctx.checkpoint("load")
        t0 = time.perf_counter()
        device = pick_device(job.queue)
        try:
            info = validate_source(src, check_architecture=True)
            # vLLM's serializer builds its own model from the directory.
            if params["format"] == "hf":
                model = load_model(src, dtype=params["dtype"], device=device)
        except ModelSourceError as exc:
            raise JobFailure(
                exc.code, exc.message + (f" ({exc.path})" if exc.path else "")
            ) from None
        timings["load_seconds"] = time.perf_counter() - t0

        key = new_encryption_key() if params.get("encrypt") else None
        serialize_started = time.perf_counter()
        if params["format"] == "hf":
            ctx.checkpoint("serialize", 0, None)
            sink = outputs.sink(WEIGHTS_FILE)
            try:
                stats = serialize_hf(
                    model,
                    sink,
                    encryption_key=key,
                    progress=lambda done, total: ctx.progress("serialize", done, total),
                )
            except SerializeError as exc:
                raise JobFailure(exc.code, exc.message) from None
            tensor_bytes = stats.tensor_bytes
            parameter_count = stats.parameter_count
            extra: dict[str, Any] = {"tensor_count": stats.tensor_count}
            versions = {
                "tensorizer_version": stats.tensorizer_version,
                "torch_version": stats.torch_version,
                "transformers_version": stats.transformers_version,
            }
            del model
        else:
            ctx.checkpoint("serialize", 0, None)
            try:
                written = serialize_vllm(
                    src,
                    workdir / "vllm",
                    dtype=params["dtype"],
                    tensor_parallel_size=int(params["tensor_parallel_size"]),
                    encryption_key=key,
                    progress=lambda done, _total: ctx.progress("serialize", done, None),
                )
            except FormatUnavailable as exc:
                raise JobFailure(exc.code, exc.message, status=409) from None
            except SerializeError as exc:
                raise JobFailure(exc.code, exc.message) from None
            from workers.tensorfile import TensorFileError, inspect_tensors

            tensor_bytes = tensor_count = 0
            for path in written:
                # vLLM's layout must carry its marker; the index is read without the key.
                try:
                    written_info = inspect_tensors(path)
                except TensorFileError as exc:
                    raise JobFailure(exc.code, f"{path.name}: {exc.message}") from None
                if not written_info.has_vllm_marker:
                    raise JobFailure(
                        "missing_vllm_marker",
                        f"vLLM's serializer wrote {path.name} without its marker",
                    )
                tensor_count += written_info.count
                outputs.add_file(path.name, path)
                tensor_bytes += path.stat().st_size
            parameter_count = info.parameter_count
            extra = {"tensor_count": tensor_count}
            versions = _library_versions()
        gc.collect()
        _release_device_memory(device)

        ctx.checkpoint("upload", 0, None)
        companions = companion_files(src)
        for path in companions:
            outputs.add_file(path.name, path)

        ctx.checkpoint("publish", tensor_bytes, tensor_bytes)
        files = add_layout(outputs, outputs.commit_all())
        seconds = time.perf_counter() - serialize_started
        stats_out = {
            **extra,
            "tensor_bytes": tensor_bytes,
            "seconds": round(seconds, 4),
            "bytes_per_second": round(tensor_bytes / seconds) if seconds > 0 else None,
            "device": device,
            "source_dtypes": info.dtypes,
            "source_bytes": info.weight_bytes,
            "architecture": info.architecture,
            "attempt": job.attempts,
            "worker": ctx.worker,
            **{k: round(v, 4) for k, v in timings.items()},
        }
        fields: dict[str, Any] = {
            **versions,
            "parameter_count": parameter_count,
            "stats": stats_out,
        }
        if key is not None:
            fields["wrapped_key"] = wrap_key(
                settings.master_key_bytes(), key, artifact_id=artifact.id
            )
            fields["key_id"] = new_key_id()
            artifact.key_id = fields["key_id"]
        # Signed last: the manifest covers every committed file, the layout included.
        files, signed_stats = publish_manifest(
            ctx,
            outputs,
            files,
            artifact=artifact,
            version=rows.version,
            version_files=rows.files,
            started_at=started_at,
            device=device,
        )
        stats_out.update(signed_stats)
        result = {
            "artifact_id": str(artifact.id),
            "files": len(files),
            "bytes": sum(f.size for f in files),
            "tensor_bytes": tensor_bytes,
            "seconds": stats_out["seconds"],
            "bytes_per_second": stats_out["bytes_per_second"],
        }
        published = _publish(ctx, job, files, fields, result)
        key = None
    except JobLost:
        # Another worker owns the job and cleans the prefix when it starts: leave it alone.
        lost = True
        raise
    finally:
        if not published:
            outputs.abort()
            if outputs.committed and not lost:
                clean_prefix(ctx, storage, prefix)
        shutil.rmtree(workdir, ignore_errors=True)


def _publish(
    ctx: JobContext,
    job: Job,
    files: list[PublishedFile],
    fields: dict[str, Any],
    result: dict[str, Any],
) -> bool:
    async def write() -> bool:
        async with ctx.runtime.task_session() as session:
            done = await publish(
                session, job, worker=ctx.worker, files=files, fields=fields, result=result
            )
            if done:
                return True
            cancelled = await session.scalar(select(Job.cancel_requested).where(Job.id == job.id))
        if cancelled:
            raise JobCancelled()
        raise JobLost()

    ok = ctx.runtime.run(write())
    ctx.runtime.run(nudge(ctx.runtime, job.id, status="succeeded"))
    return ok


def _library_versions() -> dict[str, str | None]:
    import importlib.metadata

    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "tensorizer_version": version("tensorizer"),
        "torch_version": version("torch"),
        "transformers_version": version("transformers"),
    }


def _release_device_memory(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()
