"""Reading a registered artifact's source (``POST …/artifacts`` ``uri``) for the verify job:
the files the uri names, each with an opener that reads its bytes, by scheme.

- ``file://``: regular files under an import root (``tensor_registry_server.core.paths``:
contained, and opened again
  with ``O_NOFOLLOW`` at every component when read);
- ``s3://``: an object, or the objects directly under a prefix, of an allow-listed bucket;
- ``https://`` (``http://`` where allowed): the ``.tensors`` file itself, or one url per rank
  from a ``%03d`` template, through the guarded fetcher (``tensor_registry_server.core.fetch``:
  SSRF rules, size
  and time caps, redaction).

Sync, in the worker; the accepted schemes and the API's checks are
``tensor_registry_server.core.source_uri``
(the version import reads its sources with ``tensor_registry_server/versions/import_sources.py``,
async).
Refusals become the job's ``JobFailure`` with the check's own code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote, urlparse

from tensor_registry_server.core import source_uri
from tensor_registry_server.core.errors import Invalid
from tensor_registry_server.core.fetch import FetchError, FetchPolicy, check_s3_source, fetch_sync
from tensor_registry_server.core.paths import NotRegularFile, OutsideRoot, contained, open_contained
from tensor_registry_server.core.redact import redact_uri
from tensor_registry_server.jobs.runner import JobContext, JobFailure

# The artifact's tensor file names, which an https:// source is listed under.
RANK_NAME = "model-rank-{:03d}.tensors"
SINGLE_NAME = "model.tensors"


@dataclass(frozen=True)
class RemoteFile:
    """One file of the source: its name there, and how to read it (opened only when read)."""

    name: str
    opener: Callable[[], Any]  # a readable binary file object, used as a context manager


def list_source(ctx: JobContext, uri: str, tensor_parallel_size: int) -> list[RemoteFile]:
    """The files a registered uri names, by its scheme (tensor_registry_server.core.source_uri: the
    one list)."""
    try:
        scheme = source_uri.scheme_of(uri)
    except Invalid as exc:
        raise JobFailure(exc.code, exc.detail) from None
    if scheme == source_uri.FILE:
        return _file_source(uri, ctx)
    if scheme == source_uri.S3:
        return _s3_source(uri, ctx)
    return _https_source(uri, tensor_parallel_size, ctx)


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
