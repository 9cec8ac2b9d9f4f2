"""The verify job: register an artifact tensorized elsewhere (``POST …/artifacts``).

The bytes are fetched from the given uri (file:// under the import roots, s3://, https://),
checked, and only then copied into storage and published:

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote, urlparse

from app.checkpoints.huggingface import is_model_file
from app.client.manifest import MANIFEST_FILE, MAX_MANIFEST_BYTES, ManifestError
from app.core import source_uri
from app.core.fetch import FetchError, FetchPolicy, check_s3_source, fetch_sync
from app.core.redact import redact_uri
from app.errors import Invalid
from app.key_wrapping import unwrap_key
from app.paths import NotRegularFile, OutsideRoot, contained, open_contained
from app.storage.base import Storage
from workers.handlers.attempt import SourceFile, artifact_attempt, copy_stream
from workers.jobrun import JobContext, JobFailure
from workers.layout import add_layout
from workers.manifest import check_foreign_manifest, public_uri, publish_manifest

log = logging.getLogger("tensor_registry.worker")

RANK_NAME = "model-rank-{:03d}.tensors"
SINGLE_NAME = "model.tensors"
# Names of non-persistent buffers some checkpoints carry and no module state_dict has.
_IGNORED_CHECKPOINT_SUFFIXES = (".inv_freq", ".masked_bias")


@dataclass(frozen=True)
class RemoteFile:
    name: str
    opener: Callable[[], Any]  # a readable binary file object, used as a context manager


def _file_source(uri: str, ctx: JobContext) -> list[RemoteFile]:
    """The regular files of a file:// uri under an import root, each opened with
    ``open_contained`` when read (a link swapped in after this listing is refused, not followed).
    Like a download, the bytes are copied into the work dir first: what is verified is exactly
    what is stored, whatever happens to the source file afterwards."""
    roots = ctx.settings.storage.import_roots
    try:
        _, path = contained(Path(unquote(urlparse(uri).path)), roots)
    except OutsideRoot:
        raise JobFailure("import_root_forbidden", "the uri is not under an import root") from None
    if path.is_dir():
        entries = []
        for entry in sorted(path.iterdir()):
            try:
                _, real = contained(entry, roots)
            except OutsideRoot:
                raise JobFailure(
                    "import_root_forbidden", f"{entry.name} links outside the import root"
                ) from None
            if real.is_file():
                entries.append(entry)
    elif path.is_file():
        entries = [path]
    else:
        raise JobFailure("source_not_found", f"{uri} does not exist", status=404)
    return [RemoteFile(p.name, _contained_opener(p, roots)) for p in entries]


def _contained_opener(path: Path, roots: list[Path]) -> Callable[[], BinaryIO]:
    def opener() -> BinaryIO:
        try:
            return open_contained(path, roots)
        except OutsideRoot:
            raise JobFailure(
                "import_root_forbidden", f"{path.name} links outside the import root"
            ) from None
        except NotRegularFile:
            raise JobFailure(
                "source_not_found", f"{path.name} is no longer a regular file", status=404
            ) from None

    return opener


def _s3_client(ctx: JobContext) -> Any:
    import boto3

    s3 = ctx.settings.storage.s3
    return boto3.client(
        "s3",
        endpoint_url=s3.endpoint_url,
        region_name=s3.region,
        aws_access_key_id=s3.access_key_id.get_secret_value() if s3.access_key_id else None,
        aws_secret_access_key=(
            s3.secret_access_key.get_secret_value() if s3.secret_access_key else None
        ),
    )


def _s3_source(uri: str, ctx: JobContext) -> list[RemoteFile]:
    try:
        check_s3_source(uri, ctx.settings)
    except FetchError as exc:
        raise JobFailure(exc.code, exc.detail, status=exc.status) from None
    parsed = urlparse(uri)
    bucket, key = parsed.netloc, parsed.path.lstrip("/")
    client = _s3_client(ctx)

    def opener(object_key: str) -> Callable[[], BinaryIO]:
        return lambda: client.get_object(Bucket=bucket, Key=object_key)["Body"]

    if key and not key.endswith("/"):
        return [RemoteFile(key.rsplit("/", 1)[-1], opener(key))]
    names = []
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=key, Delimiter="/"
    ):
        for obj in page.get("Contents", []):
            name = obj["Key"][len(key) :]
            if name:
                names.append(RemoteFile(name, opener(obj["Key"])))
    if not names:
        raise JobFailure("source_not_found", f"{redact_uri(uri)} holds no objects", status=404)
    return names


def _https_source(uri: str, tensor_parallel_size: int, ctx: JobContext) -> list[RemoteFile]:
    policy = FetchPolicy.from_settings(ctx.settings)

    def opener(url: str) -> Callable[[], _HttpReader]:
        return lambda: _HttpReader(fetch_sync(url, policy, expect="tensorizer"))

    if tensor_parallel_size > 1:
        return [
            RemoteFile(RANK_NAME.format(rank), opener(uri.replace("%03d", f"{rank:03d}")))
            for rank in range(tensor_parallel_size)
        ]
    return [RemoteFile(SINGLE_NAME, opener(uri))]


class _HttpReader:
    """``read(n)`` over the guarded fetcher's chunks (context manager); its refusals and caps
    become the job's error (``source_refused``, ``source_unreachable``, ``source_too_large``,
    ``source_timeout``, ``source_unexpected_content``)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""
        # Connect now: a refused or unreachable source fails before the target file exists.
        self._buffer = self._next() or b""

    def _next(self) -> bytes | None:
        try:
            return next(self._chunks, None)
        except FetchError as exc:
            raise JobFailure(exc.code, exc.detail, status=exc.status) from None

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self._buffer) < n:
            chunk = self._next()
            if chunk is None:
                break
            self._buffer += chunk
        if n < 0:
            data, self._buffer = self._buffer, b""
        else:
            data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def __enter__(self) -> _HttpReader:
        return self

    def __exit__(self, *exc: object) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()


def list_source(ctx: JobContext, uri: str, tensor_parallel_size: int) -> list[RemoteFile]:
    """The files a registered uri names, by its scheme (app.core.source_uri: the one list)."""
    try:
        scheme = source_uri.scheme_of(uri)
    except Invalid as exc:
        raise JobFailure(exc.code, exc.detail) from None
    if scheme == source_uri.FILE:
        return _file_source(uri, ctx)
    if scheme == source_uri.S3:
        return _s3_source(uri, ctx)
    return _https_source(uri, tensor_parallel_size, ctx)


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
    from workers.tensorfile import VLLM_MARKER, TensorFileError, inspect_tensors, verify_tensors

    try:
        info = inspect_tensors(path, encryption_key=key)
    except TensorFileError as exc:
        raise JobFailure(exc.code, f"{name}: {exc.message}") from None
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


def run_verify(ctx: JobContext) -> None:
    job = ctx.job
    params = job.params
    settings = ctx.settings
    tp = int(params["tensor_parallel_size"])
    with artifact_attempt(ctx) as attempt:
        artifact, outputs, workdir = attempt.artifact, attempt.outputs, attempt.workdir
        source_storage = attempt.source_storage
        key = (
            unwrap_key(settings.master_key_bytes(), artifact.wrapped_key, artifact_id=artifact.id)
            if artifact.wrapped_key
            else None
        )
        started = time.perf_counter()
        ctx.checkpoint("fetch")
        # The artifact row keeps the raw uri (credentials included); params hold it redacted.
        found = list_source(ctx, artifact.source_uri or params["uri"], tp)
        tensor_files = _tensor_files(found, tp)
        local: dict[str, Path] = {}
        fetched = 0
        limit = settings.worker.verify_max_bytes or settings.storage.max_upload_bytes
        for name, remote in tensor_files.items():
            target = workdir / name

            def advance(n: int) -> None:
                nonlocal fetched
                fetched += n
                ctx.progress("fetch", fetched, None)

            with remote.opener() as src, target.open("wb") as out:
                copy_stream(src, out, on_bytes=advance, max_bytes=limit - fetched)
            local[name] = target

        ctx.checkpoint("verify")
        checkpoint = (
            _checkpoint_names(source_storage, attempt.version_files)
            if params["format"] == "hf"
            else None
        )
        per_file: dict[str, Any] = {}
        for name, path in local.items():
            per_file[name] = check_file(
                path,
                name=name,
                fmt=params["format"],
                dtype=params["dtype"],
                key=key,
                checkpoint=checkpoint,
            )

        ctx.checkpoint("upload")
        tensor_bytes = 0
        for name, path in local.items():
            outputs.add_file(name, path)
            tensor_bytes += path.stat().st_size
        have = set()
        for remote in found:
            if remote.name not in tensor_files and _companion(remote.name):
                with remote.opener() as src:
                    size, _ = copy_stream(
                        src, outputs.sink(remote.name), max_bytes=limit - fetched
                    )
                fetched += size
                have.add(remote.name)
        for f in attempt.version_files:
            if f.path not in have and "/" not in f.path and _companion(f.path):
                with source_storage.open_source(f.storage_key) as src:
                    copy_stream(src, outputs.sink(f.path))

        ctx.checkpoint("publish")
        files = add_layout(outputs, outputs.commit_all())
        # A source that carries its own signed manifest (an exported bundle) is imported only
        # when that manifest verifies and signs these very weights (docs/trust.md).
        foreign = next((r for r in found if r.name == MANIFEST_FILE), None)
        imported_from = None
        if foreign is not None:
            with foreign.opener() as src:
                data = src.read(MAX_MANIFEST_BYTES + 1)
            try:
                imported_from = check_foreign_manifest(
                    settings,
                    data,
                    files,
                    variant={
                        "dtype": params["dtype"],
                        "format": params["format"],
                        "tensor_parallel_size": tp,
                    },
                )
            except ManifestError as exc:
                raise JobFailure(exc.code, f"the source's signed manifest: {exc.message}") from None
        seconds = time.perf_counter() - started
        first = next(iter(per_file.values()))
        fields: dict[str, Any] = {
            "tensorizer_version": None,
            "stats": {
                "tensor_count": sum(v["tensor_count"] for v in per_file.values()),
                "tensor_bytes": sum(v["tensor_bytes"] for v in per_file.values()),
                "has_vllm_marker": first["has_vllm_marker"],
                "header_version": first["header_version"],
                "verified": True,
                "seconds": round(seconds, 4),
                "files": per_file,
                "attempt": job.attempts,
                "worker": ctx.worker,
            },
        }
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


def _companion(name: str) -> bool:
    return (
        is_model_file(name)
        and not name.endswith(".safetensors")
        and name != ("model.safetensors.index.json")
    )
