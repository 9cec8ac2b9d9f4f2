"""The ``source_uri`` schemes the registry reads from, and the checks the API runs on one before
any job is created. The one list, for both places a source is named:

- a version import (``VersionCreate.source_uri``): the import job lists and reads the source
  with tensor_registry_server/versions/import_sources.py (async);
- an artifact registration (``ArtifactRegister.uri``): the verify job reads it with
  tensor_registry_server/artifacts/making/registered_sources.py (sync).

What a uri names differs by use (a checkpoint's directory, prefix or manifest for an import;
the tensorizer files for a registration: tensor_registry_server/artifacts/register.py adds those
rules); the
schemes, what each needs (a bucket, a host, a path under an import root) and the network rules
(tensor_registry_server.core.fetch) are the same. Both readers dispatch on ``scheme_of``.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from tensor_registry_server.core.addresses import AllowList
from tensor_registry_server.core.errors import Invalid
from tensor_registry_server.core.fetch import check_literal, check_s3_source
from tensor_registry_server.core.paths import OutsideRoot, contained
from tensor_registry_server.settings import Settings

S3 = "s3"
HTTPS = "https"
HTTP = "http"
FILE = "file"
SCHEMES = (S3, HTTPS, HTTP, FILE)
HTTP_SCHEMES = frozenset({HTTP, HTTPS})


def scheme_of(uri: str) -> str:
    """The uri's scheme when the registry reads it, else 422 ``invalid_source_uri``."""
    scheme = urlparse(uri).scheme
    if scheme not in SCHEMES:
        raise Invalid(
            f"source_uri must start with one of {', '.join(s + '://' for s in SCHEMES)}.",
            code="invalid_source_uri",
        )
    return scheme


def check_source_uri(uri: str, settings: Settings) -> None:
    """Request-time checks: a known scheme and what it needs; literal internal addresses, s3
    buckets outside ``fetch.s3_allow`` and paths outside the import roots are refused."""
    scheme = scheme_of(uri)
    parsed = urlparse(uri)
    if scheme == S3 and not parsed.netloc:
        raise Invalid("An s3:// source_uri needs a bucket.", code="invalid_source_uri")
    if scheme == S3:
        check_s3_source(uri, settings)
    if scheme in HTTP_SCHEMES and not parsed.netloc:
        raise Invalid("An http(s):// source_uri needs a host.", code="invalid_source_uri")
    if scheme in HTTP_SCHEMES:
        # Literal internal addresses now; the real guard is at connect time (DNS can change).
        check_literal(uri, AllowList.parse(settings.fetch.allow))
    if scheme == FILE:
        if parsed.netloc not in {"", "localhost"}:
            raise Invalid(
                "file:// source_uri must be file:///absolute/path.", code="invalid_source_uri"
            )
        allowed_root(Path(parsed.path), settings)


def allowed_root(path: Path, settings: Settings) -> Path:
    """The allow-listed root that holds ``path`` (after resolving links), or 422."""
    try:
        return contained(path, settings.storage.import_roots)[0]
    except OutsideRoot:
        pass
    raise Invalid(
        "file:// imports are allowed only under the configured import roots "
        "(TENSOR_REGISTRY_STORAGE__IMPORT_ROOTS).",
        code="import_root_forbidden",
    )
