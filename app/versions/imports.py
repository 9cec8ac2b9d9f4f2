"""Checks on import sources, done in the API before a job is created."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from app.errors import Invalid
from app.settings import Settings

SCHEMES = ("s3", "https", "http", "file")


def check_source_uri(uri: str, settings: Settings) -> None:
    parsed = urlparse(uri)
    if parsed.scheme not in SCHEMES:
        raise Invalid(
            f"source_uri must start with one of {', '.join(s + '://' for s in SCHEMES)}.",
            code="invalid_source_uri",
        )
    if parsed.scheme == "s3" and not parsed.netloc:
        raise Invalid("An s3:// source_uri needs a bucket.", code="invalid_source_uri")
    if parsed.scheme == "file":
        path = Path(parsed.path).resolve()
        roots = [r.resolve() for r in settings.storage.import_roots]
        if not any(path == root or root in path.parents for root in roots):
            raise Invalid(
                "file:// imports are allowed only under the configured import roots "
                "(TENSOR_REGISTRY_STORAGE__IMPORT_ROOTS).",
                code="import_root_forbidden",
            )
