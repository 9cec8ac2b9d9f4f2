"""The verify job: register an artifact tensorized elsewhere (``POST …/artifacts``).

The bytes are fetched from the given uri (file:// under the import roots, s3://, https://;
``tensor_registry_server.artifacts.making.registered_sources`` reads them), checked, and only then
copied into storage
and published:

- the header and index are read lazily (no tensor data): the ``.vllm_tensorized_marker``
  entry must be there for format ``vllm`` and absent for ``hf``; every floating-point tensor
  must have the registered dtype; an ``hf`` file must hold every tensor of the version's
  checkpoint; encrypted iff a key was given;
- then every tensor is read once to check tensorizer's stored per-tensor hashes (and, when
  encrypted, that the key decrypts it);
- files are stored with their size and sha256; config and tokenizer files come from the uri's
  directory when present there, otherwise from the version.
"""

from __future__ import annotations

import json
import logging
import struct
import time
from pathlib import Path
from typing import Any

from tensor_registry.formats.signed_manifest import MANIFEST_FILE, MAX_MANIFEST_BYTES, ManifestError
from tensor_registry.formats.variant import Variant
from tensor_registry_server.artifacts.making.attempt import (
    Attempt,
    SourceFile,
    artifact_attempt,
    copy_stream,
)
from tensor_registry_server.artifacts.making.layout_writer import add_layout
from tensor_registry_server.artifacts.making.registered_sources import (
    RANK_NAME,
    SINGLE_NAME,
    RemoteFile,
    list_source,
)
from tensor_registry_server.artifacts.making.signatures import (
    check_foreign_manifest,
    public_uri,
    publish_manifest,
)
from tensor_registry_server.artifacts.making.tensorfile import (
    VLLM_MARKER,
    TensorFileError,
    TensorFileInfo,
    inspect_tensors,
    verify_tensors,
)
from tensor_registry_server.checkpoints.huggingface import is_model_file
from tensor_registry_server.core.key_wrapping import unwrap_key
from tensor_registry_server.jobs.lifecycle import PublishedFile
from tensor_registry_server.jobs.runner import JobContext, JobFailure
from tensor_registry_server.rows.artifacts import Artifact
from tensor_registry_server.storage.base import Storage

log = logging.getLogger("tensor_registry.worker")

# Names of non-persistent buffers some checkpoints carry and no module state_dict has.
_IGNORED_CHECKPOINT_SUFFIXES = (".inv_freq", ".masked_bias")


def _tensor_files(found: list[RemoteFile], tensor_parallel_size: int) -> dict[str, RemoteFile]:
    """Artifact file name -> source: model.tensors, or model-rank-NNN.tensors per rank."""
    by_name = {f.name: f for f in found}
    if tensor_parallel_size == 1:
        if SINGLE_NAME in by_name:
            return {SINGLE_NAME: by_name[SINGLE_NAME]}
        candidates = [f for f in found if f.name.endswith(".tensors")]
        if len(candidates) != 1:
            raise JobFailure(
                "source_not_found",
                f"expected one .tensors file, found {len(candidates)}",
                status=404,
            )
        return {SINGLE_NAME: candidates[0]}
    names = [RANK_NAME.format(rank) for rank in range(tensor_parallel_size)]
    missing = [n for n in names if n not in by_name]
    if missing:
        raise JobFailure(
            "source_not_found", f"missing rank file(s): {', '.join(missing)}", status=404
        )
    return {n: by_name[n] for n in names}


def _checkpoint_names(storage: Storage, files: list[SourceFile]) -> set[str]:
    names: set[str] = set()
    for f in files:
        if not f.path.endswith(".safetensors") or "/" in f.path:
            continue
        with storage.open_source(f.storage_key) as src:
            (length,) = struct.unpack("<Q", src.read(8))
            header = json.loads(src.read(length))
        names.update(k for k in header if k != "__metadata__")
    return names


def _header_version(path: Path) -> int | None:
    with path.open("rb") as f:
        head = f.read(9)
    return struct.unpack("<I", head[5:9])[0] if len(head) == 9 else None


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def check_file(
    path: Path,
    *,
    name: str,
    fmt: str,
    dtype: str,
    key: bytes | None,
    checkpoint: set[str] | None,
) -> dict[str, Any]:
    """Every check of one fetched tensor file (the module docstring lists them); the index
    first, then the data, so a file of the wrong kind fails before its every byte is read.
    Returns the facts its stats record."""
    try:
        info = inspect_tensors(path, encryption_key=key)
    except TensorFileError as exc:
        raise JobFailure(exc.code, f"{name}: {exc.message}") from None
    _check_kind(info, name=name, fmt=fmt, key=key)
    _check_contents(info, name=name, dtype=dtype, checkpoint=checkpoint)
    try:
        verify_tensors(path, encryption_key=key)
    except TensorFileError as exc:
        raise JobFailure(exc.code, f"{name}: {exc.message}") from None
    return {
        "tensor_count": info.count,
        "tensor_bytes": info.total_bytes,
        "has_vllm_marker": info.has_vllm_marker,
        "header_version": _header_version(path),
    }


def _check_kind(info: TensorFileInfo, *, name: str, fmt: str, key: bytes | None) -> None:
    """Encrypted iff a key was given; vLLM's marker iff the format is ``vllm``."""
    if info.encrypted and key is None:
        raise JobFailure(
            "encryption_key_required",
            f"{name} is encrypted; register it with its encryption_key_b64",
        )
    if key is not None and not info.encrypted:
        raise JobFailure("not_encrypted", f"a key was given but {name} is not encrypted")
    if fmt == "vllm" and not info.has_vllm_marker:
        raise JobFailure(
            "missing_vllm_marker",
            f"{name} has no {VLLM_MARKER} entry: it was not written by vLLM's serializer "
            "(register it as format 'hf' if it holds Hugging Face names)",
        )
    if fmt == "hf" and info.has_vllm_marker:
        raise JobFailure(
            "unexpected_vllm_marker",
            f"{name} carries {VLLM_MARKER}: it is vLLM's layout, register it as format 'vllm'",
        )


def _check_contents(
    info: TensorFileInfo, *, name: str, dtype: str, checkpoint: set[str] | None
) -> None:
    """Every parameter in the registered dtype; for ``hf``, every tensor of the checkpoint."""
    # Parameters carry the dtype; buffers may legitimately stay float32 (rotary inv_freq).
    floats = {
        t.dtype
        for t in info.tensors
        if t.name != VLLM_MARKER and t.kind != "buffer" and _is_float(t.dtype)
    }
    if floats and floats != {dtype}:
        raise JobFailure(
            "dtype_mismatch",
            f"{name} holds {', '.join(sorted(floats))} tensors, not {dtype}",
        )
    if checkpoint is not None:
        wanted = {n for n in checkpoint if not n.endswith(_IGNORED_CHECKPOINT_SUFFIXES)}
        missing = sorted(wanted - set(info.names))
        if missing:
            raise JobFailure(
                "names_mismatch",
                f"{name} lacks {len(missing)} tensor(s) of the version's checkpoint, e.g. "
                f"{missing[0]!r}",
            )


def run_verify(ctx: JobContext) -> None:
    """Fetch, check, store, publish (the module docstring lists the checks), inside the
    shared attempt: whatever fails leaves nothing published."""
    params = ctx.job.params
    with artifact_attempt(ctx) as attempt:
        artifact, outputs = attempt.artifact, attempt.outputs
        tp = artifact.variant.tensor_parallel_size
        key = _artifact_key(ctx, artifact)
        started = time.perf_counter()
        ctx.checkpoint("fetch")
        # The artifact row keeps the raw uri (credentials included); params hold it redacted.
        found = list_source(ctx, artifact.source_uri or params["uri"], tp)
        tensor_files = _tensor_files(found, tp)
        limit = ctx.settings.worker.verify_max_bytes or ctx.settings.storage.max_upload_bytes
        local, fetched = _fetch_tensors(ctx, tensor_files, attempt.workdir, limit)

        ctx.checkpoint("verify")
        per_file = _check_all(ctx, attempt, local, key)

        ctx.checkpoint("upload")
        for name, path in local.items():
            outputs.add_file(name, path)
        _store_companions(attempt, found, tensor_files, budget=limit - fetched)

        ctx.checkpoint("publish")
        files = add_layout(outputs, outputs.commit_all())
        imported_from = _foreign_manifest(ctx, found, files, artifact.variant)
        fields = _artifact_fields(ctx, per_file, seconds=time.perf_counter() - started)
        files, signed_stats = publish_manifest(
            ctx,
            outputs,
            files,
            artifact=artifact,
            version=attempt.version,
            version_files=attempt.version_files,
            started_at=attempt.started_at,
            device=None,
            extra={"source_uri": public_uri(params["uri"]), "imported_from": imported_from},
        )
        fields["stats"].update(signed_stats)
        result = {
            "artifact_id": str(artifact.id),
            "files": len(files),
            "bytes": sum(f.size for f in files),
            "verified": True,
        }
        attempt.publish(files, fields, result)


def _artifact_key(ctx: JobContext, artifact: Artifact) -> bytes | None:
    """The key the registration gave, unwrapped: the checks need it to decrypt every tensor."""
    if not artifact.wrapped_key:
        return None
    return unwrap_key(
        ctx.settings.master_key_bytes(), artifact.wrapped_key, artifact_id=artifact.id
    )


def _fetch_tensors(
    ctx: JobContext, tensor_files: dict[str, RemoteFile], workdir: Path, limit: int
) -> tuple[dict[str, Path], int]:
    """Stage ``fetch``: each tensor file into the work directory, before any check, so what is
    verified is exactly what is stored. ``limit`` caps the bytes of all of them together (a
    source that never ends must not fill the disk); returns the local paths and the bytes read.
    """
    local: dict[str, Path] = {}
    fetched = 0
    for name, remote in tensor_files.items():
        target = workdir / name

        def advance(n: int) -> None:
            nonlocal fetched
            fetched += n
            ctx.progress("fetch", fetched, None)

        with remote.opener() as src, target.open("wb") as out:
            copy_stream(src, out, on_bytes=advance, max_bytes=limit - fetched)
        local[name] = target
    return local, fetched


def _check_all(
    ctx: JobContext, attempt: Attempt, local: dict[str, Path], key: bytes | None
) -> dict[str, dict[str, Any]]:
    """Stage ``verify``: ``check_file`` on every fetched tensor file; an ``hf`` file is checked
    against the tensor names of the version's own checkpoint. Returns each file's facts."""
    variant = attempt.artifact.variant
    checkpoint = (
        _checkpoint_names(attempt.source_storage, attempt.version_files)
        if variant.format == "hf"
        else None
    )
    return {
        name: check_file(
            path,
            name=name,
            fmt=variant.format,
            dtype=variant.dtype,
            key=key,
            checkpoint=checkpoint,
        )
        for name, path in local.items()
    }


def _store_companions(
    attempt: Attempt, found: list[RemoteFile], tensor_files: dict[str, RemoteFile], *, budget: int
) -> None:
    """Config and tokenizer files beside the tensors: the source's own where it has them (read
    within what is left of the fetch ``budget``), the rest from the version."""
    have = set()
    for remote in found:
        if remote.name not in tensor_files and _companion(remote.name):
            with remote.opener() as src:
                size, _ = copy_stream(src, attempt.outputs.sink(remote.name), max_bytes=budget)
            budget -= size
            have.add(remote.name)
    for f in attempt.version_files:
        if f.path not in have and "/" not in f.path and _companion(f.path):
            with attempt.source_storage.open_source(f.storage_key) as src:
                copy_stream(src, attempt.outputs.sink(f.path))


def _foreign_manifest(
    ctx: JobContext, found: list[RemoteFile], files: list[PublishedFile], variant: Variant
) -> dict[str, Any] | None:
    """A source that carries its own signed manifest (an exported bundle) is imported only
    when that manifest verifies and signs these very weights (docs/trust.md); what provenance
    records of it, or None for a source without one."""
    foreign = next((r for r in found if r.name == MANIFEST_FILE), None)
    if foreign is None:
        return None
    with foreign.opener() as src:
        data = src.read(MAX_MANIFEST_BYTES + 1)
    try:
        return check_foreign_manifest(
            ctx.settings,
            data,
            files,
            variant={
                "dtype": variant.dtype,
                "format": variant.format,
                "tensor_parallel_size": variant.tensor_parallel_size,
            },
        )
    except ManifestError as exc:
        raise JobFailure(exc.code, f"the source's signed manifest: {exc.message}") from None


def _artifact_fields(
    ctx: JobContext, per_file: dict[str, dict[str, Any]], *, seconds: float
) -> dict[str, Any]:
    """The columns publish sets: no tensorizer version (the files were written elsewhere), and
    stats summed over the files, the header facts of the first, each file's own."""
    first = next(iter(per_file.values()))
    return {
        "tensorizer_version": None,
        "stats": {
            "tensor_count": sum(v["tensor_count"] for v in per_file.values()),
            "tensor_bytes": sum(v["tensor_bytes"] for v in per_file.values()),
            "has_vllm_marker": first["has_vllm_marker"],
            "header_version": first["header_version"],
            "verified": True,
            "seconds": round(seconds, 4),
            "files": per_file,
            "attempt": ctx.job.attempts,
            "worker": ctx.worker,
        },
    }


def _companion(name: str) -> bool:
    return (
        is_model_file(name)
        and not name.endswith(".safetensors")
        and name != ("model.safetensors.index.json")
    )
