"""The tensorize job: a version's source files in, one published artifact out.

1. Clean start (``workers.handlers.attempt``, shared with the verify job): the artifact is marked
   running, whatever an earlier attempt left under its prefix is removed.
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
   and deletes whatever was committed (``workers.handlers.attempt`` again), so no ready
   artifact ever points at missing bytes, and a worker killed mid-way leaves only a non-ready
   artifact that the next attempt cleans.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

from app.checkpoints.huggingface import is_model_file
from app.key_wrapping import new_key_id, wrap_key
from app.storage.base import Storage
from app.storage.object_keys import check_relative_path
from workers.handlers.attempt import SourceFile, artifact_attempt, copy_stream
from workers.jobrun import JobContext, JobFailure

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
    with artifact_attempt(ctx) as attempt:
        artifact, outputs, workdir = attempt.artifact, attempt.outputs, attempt.workdir
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        ctx.checkpoint(
            "download", 0, sum(f.size for f in attempt.version_files if is_model_file(f.path))
        )
        src = materialize(ctx, attempt.source_storage, attempt.version_files, workdir / "src")
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
            version=attempt.version,
            version_files=attempt.version_files,
            started_at=attempt.started_at,
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
        attempt.publish(files, fields, result)
        key = None


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
