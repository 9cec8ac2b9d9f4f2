"""The tensorize job: a version's source files in, one published artifact out.

1. Clean start (``tensor_registry_server.artifacts.making.attempt``, shared with the verify job):
the artifact is marked
   running, whatever an earlier attempt left under its prefix is removed.
2. Materialize the version's files in a work directory: symlinks into a local storage root
   (zero copy), downloads (size and sha256 checked) from any other backend.
3. Load with transformers in the requested dtype on the job's device
(``tensor_registry_server.artifacts.making.modeling``:
   meta-device construction, weights streamed from the memory-mapped safetensors).
4. Serialize with tensorizer (``tensor_registry_server.artifacts.making.serialize``) straight into
a storage
sink for
   ``artifacts/<id>/model.tensors``, then config/tokenizer files beside it. Sinks publish
   nothing until ``commit()``: until then the bytes live in the backend's temporary area
   (a temp file for local storage, an unfinished multipart upload on S3).
5. Commit every sink, then in ONE transaction mark the job succeeded and the artifact ready
   with its file rows (size + sha256 from the sinks). A failure at any step aborts the sinks
   and deletes whatever was committed (``tensor_registry_server.artifacts.making.attempt`` again),
   so no ready
   artifact ever points at missing bytes, and a worker killed mid-way leaves only a non-ready
   artifact that the next attempt cleans.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensor_registry.formats.variant import Variant
from tensor_registry_server.artifacts.making.attempt import (
    Attempt,
    Outputs,
    SourceFile,
    artifact_attempt,
    copy_stream,
)
from tensor_registry_server.checkpoints.huggingface import SourceInfo, is_model_file
from tensor_registry_server.core.key_wrapping import new_key_id, wrap_key
from tensor_registry_server.jobs.lifecycle import PublishedFile
from tensor_registry_server.jobs.runner import JobContext, JobFailure
from tensor_registry_server.rows.artifacts import Artifact
from tensor_registry_server.storage.base import Storage
from tensor_registry_server.storage.object_keys import check_relative_path

if TYPE_CHECKING:
    import torch

WEIGHTS_FILE = "model.tensors"


def materialize(ctx: JobContext, storage: Storage, files: list[SourceFile], dest: Path) -> Path:
    """The version's files as a plain Hugging Face directory at ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    wanted = [f for f in files if is_model_file(f.path)]
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


@dataclass(frozen=True)
class Written:
    """What serializing put into the attempt's sinks, in either format: the figures the
    artifact row and its stats record."""

    tensor_bytes: int
    tensor_count: int
    parameter_count: int | None
    versions: dict[str, str | None]  # tensorizer, torch and transformers that wrote the files


def run_tensorize(ctx: JobContext) -> None:
    """Steps 2-5 of the module docstring, inside the shared attempt (step 1 and the cleanup)."""
    from tensor_registry_server.artifacts.making.layout_writer import add_layout
    from tensor_registry_server.artifacts.making.serialize import new_encryption_key
    from tensor_registry_server.checkpoints.huggingface import companion_files

    job = ctx.job
    with artifact_attempt(ctx) as attempt:
        artifact, outputs = attempt.artifact, attempt.outputs
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        src = _download(ctx, attempt)
        timings["download_seconds"] = time.perf_counter() - t0

        ctx.checkpoint("load")
        t0 = time.perf_counter()
        device = pick_device(job.queue)
        variant = artifact.variant
        info, model = _validate_and_load(src, variant, device)
        timings["load_seconds"] = time.perf_counter() - t0

        key = new_encryption_key() if variant.encrypted else None
        serialize_started = time.perf_counter()
        ctx.checkpoint("serialize", 0, None)
        if model is not None:
            written = _write_hf(ctx, model, outputs, key)
            del model  # before the collection below: its weights are the largest thing held
        else:
            written = _write_vllm(ctx, src, attempt, key, info)
        gc.collect()
        _release_device_memory(device)

        ctx.checkpoint("upload", 0, None)
        for path in companion_files(src):
            outputs.add_file(path.name, path)

        ctx.checkpoint("publish", written.tensor_bytes, written.tensor_bytes)
        files = add_layout(outputs, outputs.commit_all())
        stats = _stats(ctx, written, info, device, time.perf_counter() - serialize_started)
        stats.update({k: round(v, 4) for k, v in timings.items()})
        fields = _artifact_fields(ctx, artifact, written, stats, key)
        _sign_and_publish(ctx, attempt, files, fields, device=device)
        key = None


def _download(ctx: JobContext, attempt: Attempt) -> Path:
    """Stage ``download``: the version's model files into the work directory (its total is
    the stage's size, so progress reads against the bytes that will actually move)."""
    ctx.checkpoint(
        "download", 0, sum(f.size for f in attempt.version_files if is_model_file(f.path))
    )
    return materialize(ctx, attempt.source_storage, attempt.version_files, attempt.workdir / "src")


def _validate_and_load(
    src: Path, variant: Variant, device: str
) -> tuple[SourceInfo, torch.nn.Module | None]:
    """Check the materialized source, and for format ``hf`` load it in the requested dtype.

    ``None`` for format ``vllm``: vLLM's serializer builds its own model from the directory.
    A source that does not hold up fails the job with the check's own code.
    """
    from tensor_registry_server.artifacts.making.modeling import load_model
    from tensor_registry_server.checkpoints.huggingface import ModelSourceError, validate_source

    try:
        info = validate_source(src, check_architecture=True)
        if variant.format == "hf":
            return info, load_model(src, dtype=variant.dtype, device=device)
    except ModelSourceError as exc:
        raise JobFailure(exc.code, exc.message + (f" ({exc.path})" if exc.path else "")) from None
    return info, None


def _write_hf(
    ctx: JobContext, model: torch.nn.Module, outputs: Outputs, key: bytes | None
) -> Written:
    """Format ``hf``: tensorizer writes the loaded model straight into the weights sink."""
    from tensor_registry_server.artifacts.making.serialize import SerializeError, serialize_hf

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
    return Written(
        tensor_bytes=stats.tensor_bytes,
        tensor_count=stats.tensor_count,
        parameter_count=stats.parameter_count,
        versions={
            "tensorizer_version": stats.tensorizer_version,
            "torch_version": stats.torch_version,
            "transformers_version": stats.transformers_version,
        },
    )


def _write_vllm(
    ctx: JobContext, src: Path, attempt: Attempt, key: bytes | None, info: SourceInfo
) -> Written:
    """Format ``vllm``: vLLM's serializer (a child process) writes the rank files into the work
    directory; each must carry vLLM's marker before it goes into a sink."""
    from tensor_registry_server.artifacts.making.serialize import (
        FormatUnavailable,
        SerializeError,
        serialize_vllm,
    )
    from tensor_registry_server.artifacts.making.tensorfile import TensorFileError, inspect_tensors

    variant = attempt.artifact.variant
    try:
        paths = serialize_vllm(
            src,
            attempt.workdir / "vllm",
            dtype=variant.dtype,
            tensor_parallel_size=variant.tensor_parallel_size,
            encryption_key=key,
            progress=lambda done, _total: ctx.progress("serialize", done, None),
        )
    except FormatUnavailable as exc:
        raise JobFailure(exc.code, exc.message, status=409) from None
    except SerializeError as exc:
        raise JobFailure(exc.code, exc.message) from None
    tensor_bytes = tensor_count = 0
    for path in paths:
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
        attempt.outputs.add_file(path.name, path)
        tensor_bytes += path.stat().st_size
    return Written(
        tensor_bytes=tensor_bytes,
        tensor_count=tensor_count,
        parameter_count=info.parameter_count,
        versions=_library_versions(),
    )


def _stats(
    ctx: JobContext, written: Written, info: SourceInfo, device: str, seconds: float
) -> dict[str, Any]:
    """The artifact's ``stats``: throughput of serialize-to-published (``seconds``), the source
    it came from and the attempt that made it; the caller adds the stage timings."""
    return {
        "tensor_count": written.tensor_count,
        "tensor_bytes": written.tensor_bytes,
        "seconds": round(seconds, 4),
        "bytes_per_second": round(written.tensor_bytes / seconds) if seconds > 0 else None,
        "device": device,
        "source_dtypes": info.dtypes,
        "source_bytes": info.weight_bytes,
        "architecture": info.architecture,
        "attempt": ctx.job.attempts,
        "worker": ctx.worker,
    }


def _artifact_fields(
    ctx: JobContext,
    artifact: Artifact,
    written: Written,
    stats: dict[str, Any],
    key: bytes | None,
) -> dict[str, Any]:
    """The columns publish sets on the artifact row. An encrypted artifact's key is kept only
    wrapped under the master key; its new key id goes on the row object too, where the
    signed manifest reads it."""
    fields: dict[str, Any] = {
        **written.versions,
        "parameter_count": written.parameter_count,
        "stats": stats,
    }
    if key is not None:
        fields["wrapped_key"] = wrap_key(
            ctx.settings.master_key_bytes(), key, artifact_id=artifact.id
        )
        fields["key_id"] = new_key_id()
        artifact.key_id = fields["key_id"]
    return fields


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


def _sign_and_publish(
    ctx: JobContext,
    attempt: Attempt,
    files: list[PublishedFile],
    fields: dict[str, Any],
    *,
    device: str,
) -> None:
    """Signed last: the manifest covers every committed file, the layout included. Then the
    job succeeds and the artifact is ready with its files in one transaction."""
    from tensor_registry_server.artifacts.making.signatures import publish_manifest

    files, signed_stats = publish_manifest(
        ctx,
        attempt.outputs,
        files,
        artifact=attempt.artifact,
        version=attempt.version,
        version_files=attempt.version_files,
        started_at=attempt.started_at,
        device=device,
    )
    stats = fields["stats"]
    stats.update(signed_stats)
    result = {
        "artifact_id": str(attempt.artifact.id),
        "files": len(files),
        "bytes": sum(f.size for f in files),
        "tensor_bytes": stats["tensor_bytes"],
        "seconds": stats["seconds"],
        "bytes_per_second": stats["bytes_per_second"],
    }
    attempt.publish(files, fields, result)
