"""ETags of revisioned resources, the If-Match check (optimistic concurrency) and the
If-None-Match check (conditional reads: 304)."""

from __future__ import annotations

from tensor_registry_server.core.errors import PreconditionFailed


def etag_for(revision: int) -> str:
    return f'"{revision}"'


def check_if_match(if_match: str | None, revision: int | None) -> None:
    """412 unless If-Match names the current revision (``*``: the resource must exist)."""
    if if_match is None:
        return
    candidates = {c.strip() for c in if_match.split(",")}
    if "*" in candidates and revision is not None:
        return
    if revision is None or not ({etag_for(revision), "W/" + etag_for(revision)} & candidates):
        raise PreconditionFailed(
            "If-Match does not match the current ETag; re-read the resource and retry.",
            code="etag_mismatch",
            current_etag=etag_for(revision) if revision is not None else None,
        )


def none_match(if_none_match: str | None, revision: int) -> bool:
    """True when If-None-Match names the current revision (or ``*``): answer 304."""
    if if_none_match is None:
        return False
    candidates = {c.strip() for c in if_none_match.split(",")}
    current = etag_for(revision)
    return bool({"*", current, "W/" + current} & candidates)
