"""Import sources: listing and reading what a version's ``source_uri`` names, in the import job.
The schemes and the checks the API runs before the job exists are
tensor_registry_server.core.source_uri's.

Three kinds of ``source_uri`` (documented on ``VersionCreate.source_uri``):

- ``s3://bucket/prefix/``: every object under the prefix, read with the registry's configured
  S3 endpoint and credentials; paths are the keys relative to the prefix. Only buckets/prefixes
  in ``fetch.s3_allow`` (never the registry's own bucket).
- ``https://host/…/manifest.json`` (or ``http://``): HTTP has no directory listing, so the URI
  names a JSON manifest ``{"files": [{"path": "config.json", "url": "…", "sha256": "…",
  "size": 123}, …]}``. ``url`` is optional (default: ``path`` relative to the manifest's URL)
  and may be relative; ``sha256`` and ``size``, when given, are verified. The manifest and
  every entry are read through the guarded fetcher (``tensor_registry_server.core.fetch``).
- ``file:///dir``: every regular file under a directory inside one of the allow-listed
  ``storage.import_roots`` (symbolic links that lead outside the root are refused).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlparse

from tensor_registry_server.core.errors import Invalid
from tensor_registry_server.core.fetch import FetchError, FetchPolicy, check_s3_source, fetch_async
from tensor_registry_server.core.paths import NotRegularFile, OutsideRoot, contained, open_contained
from tensor_registry_server.core.redact import redact_uri
from tensor_registry_server.core.source_uri import HTTP_SCHEMES, allowed_root
from tensor_registry_server.settings import Settings
from tensor_registry_server.storage.object_keys import check_relative_path

log = logging.getLogger("tensor_registry.imports")

MAX_FILES = 10_000
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
READ_CHUNK = 4 * 1024 * 1024


class ImportSourceError(Invalid):
    """An import source that cannot be used; ``code`` says why."""

    code = "import_failed"
    title = "Import failed"


def _fetch_failed(exc: FetchError) -> ImportSourceError:
    """The fetcher's refusal as an import error: same detail, ``import_source_<reason>``."""
    return ImportSourceError(exc.detail, code=f"import_source_{exc.reason}")


@dataclass(frozen=True)
class SourceFile:
    path: str
    size: int | None
    sha256: str | None
    open: Callable[[], AsyncIterator[bytes]]


def _checked_path(path: str) -> str:
    problem = check_relative_path(path)
    if problem:
        raise ImportSourceError(
            f"Source file {path!r} cannot be imported: {problem}.", code="import_invalid_path"
        )
    return path


def _check_count(files: list[SourceFile]) -> list[SourceFile]:
    if not files:
        raise ImportSourceError("The import source holds no files.", code="import_source_empty")
    if len(files) > MAX_FILES:
        raise ImportSourceError(
            f"The import source holds more than {MAX_FILES} files.", code="import_too_many_files"
        )
    paths = [f.path for f in files]
    if len(set(paths)) != len(paths):
        raise ImportSourceError(
            "The import source names a file twice.", code="import_duplicate_path"
        )
    return sorted(files, key=lambda f: f.path)


# -- file:// ---------------------------------------------------------------------------------
def list_directory(uri: str, settings: Settings) -> list[SourceFile]:
    """Blocking (call in a thread): the regular files under an allow-listed directory."""
    base = Path(urlparse(uri).path)
    root = allowed_root(base, settings)
    base = base.resolve()
    if not base.is_dir():
        raise ImportSourceError(f"{uri} is not a directory.", code="import_source_not_found")
    files = []
    for current, dirs, names in os.walk(base):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if name.startswith("."):
                continue  # .git, .cache, editor files: never model files
            full = Path(current) / name
            try:
                real = contained(full, [root])[1]
            except OutsideRoot:
                raise ImportSourceError(
                    f"{full} links outside the import root.", code="import_root_forbidden"
                ) from None
            if not real.is_file():
                continue
            rel = full.relative_to(base).as_posix()
            files.append(
                SourceFile(_checked_path(rel), real.stat().st_size, None, _file_reader(real, root))
            )
    return _check_count(files)


def _file_reader(path: Path, root: Path) -> Callable[[], AsyncIterator[bytes]]:
    """Opens at read time through ``open_contained``: a file swapped for a link (or a directory
    above it swapped) after listing is refused, not followed."""

    async def read() -> AsyncIterator[bytes]:
        import asyncio

        try:
            handle = await asyncio.to_thread(open_contained, path, [root])
        except OutsideRoot:
            raise ImportSourceError(
                f"{path} links outside the import root.", code="import_root_forbidden"
            ) from None
        except NotRegularFile:
            raise ImportSourceError(
                f"{path} is no longer a regular file.", code="import_source_not_found"
            ) from None
        with handle:
            fd = handle.fileno()
            offset = 0
            while chunk := await asyncio.to_thread(os.pread, fd, READ_CHUNK, offset):
                offset += len(chunk)
                yield chunk

    return read


# -- s3:// -----------------------------------------------------------------------------------
async def list_s3(uri: str, client: Any, settings: Settings) -> list[SourceFile]:
    try:
        check_s3_source(uri, settings)
    except FetchError as exc:
        raise _fetch_failed(exc) from None
    parsed = urlparse(uri)
    bucket = parsed.netloc
    prefix = parsed.path.lstrip("/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    files = []
    try:
        paginator = client.get_paginator("list_objects_v2")
        async for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []) or []:
                rel = item["Key"][len(prefix) :]
                if not rel or rel.endswith("/"):
                    continue  # "folder" markers
                if any(part.startswith(".") for part in rel.split("/")):
                    continue
                files.append(
                    SourceFile(
                        _checked_path(rel),
                        int(item["Size"]),
                        None,
                        _s3_reader(client, bucket, item["Key"]),
                    )
                )
    except ImportSourceError:
        raise
    except Exception as exc:
        log.warning("listing %s failed: %s", redact_uri(uri), exc)
        raise ImportSourceError(
            f"Could not list {redact_uri(uri)}.", code="import_source_unreachable"
        ) from exc
    return _check_count(files)


def _s3_reader(client: Any, bucket: str, key: str) -> Callable[[], AsyncIterator[bytes]]:
    async def read() -> AsyncIterator[bytes]:
        response = await client.get_object(Bucket=bucket, Key=key)
        body = response["Body"]
        try:
            async for chunk in body.iter_chunks(READ_CHUNK):
                yield chunk
        finally:
            body.close()

    return read


# -- http(s):// manifest ---------------------------------------------------------------------
async def list_manifest(uri: str, policy: FetchPolicy) -> list[SourceFile]:
    raw = bytearray()
    try:
        async for chunk in fetch_async(uri, policy, max_bytes=MAX_MANIFEST_BYTES, expect="json"):
            raw += chunk
    except FetchError as exc:
        if exc.reason == "too_large":
            raise ImportSourceError(
                "The manifest is larger than 4 MiB.", code="import_invalid_manifest"
            ) from None
        if exc.reason == "unexpected_content":
            raise ImportSourceError(exc.detail, code="import_invalid_manifest") from None
        raise _fetch_failed(exc) from None
    try:
        manifest = json.loads(raw)
        entries = manifest["files"]
        if not isinstance(entries, list):
            raise TypeError("files is not a list")
    except (ValueError, KeyError, TypeError) as exc:
        raise ImportSourceError(
            "The manifest must be JSON: "
            '{"files": [{"path": …, "url"?: …, "sha256"?: …, "size"?: …}]}.',
            code="import_invalid_manifest",
        ) from exc
    files = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise ImportSourceError(
                "Every manifest entry needs a string 'path'.", code="import_invalid_manifest"
            )
        path = _checked_path(entry["path"])
        url = urljoin(uri, entry.get("url") or path)
        if urlparse(url).scheme not in HTTP_SCHEMES:
            raise ImportSourceError(
                f"Manifest entry {path!r} has a non-HTTP url.", code="import_invalid_manifest"
            )
        sha = entry.get("sha256")
        if sha is not None and (
            not isinstance(sha, str)
            or len(sha) != 64
            or any(c not in "0123456789abcdef" for c in sha.lower())
        ):
            raise ImportSourceError(
                f"Manifest entry {path!r} has a malformed sha256.", code="import_invalid_manifest"
            )
        size = entry.get("size")
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
            raise ImportSourceError(
                f"Manifest entry {path!r} has a malformed size.", code="import_invalid_manifest"
            )
        files.append(
            SourceFile(path, size, sha.lower() if sha else None, _http_reader(policy, url))
        )
    return _check_count(files)


def _http_reader(policy: FetchPolicy, url: str) -> Callable[[], AsyncIterator[bytes]]:
    async def read() -> AsyncIterator[bytes]:
        try:
            async for chunk in fetch_async(url, policy):
                yield chunk
        except FetchError as exc:
            raise _fetch_failed(exc) from None

    return read
