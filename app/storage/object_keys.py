"""Where things live in storage. Keys use only [A-Za-z0-9._/-]: no '%' ever reaches a URL."""

from __future__ import annotations

import re
import uuid

# One path segment of a user-supplied file path inside a version or artifact.
_SEGMENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")
MAX_PATH_LENGTH = 512
MAX_DEPTH = 8


def version_prefix(version_id: uuid.UUID) -> str:
    return f"versions/{version_id}/"


def artifact_prefix(artifact_id: uuid.UUID) -> str:
    return f"artifacts/{artifact_id}/"


def check_relative_path(path: str) -> str | None:
    """Return why ``path`` is not an acceptable relative file path, or None if it is.

    Refuses absolute paths, '..' and '.', empty segments, NUL and any character outside
    [A-Za-z0-9._-] (which also keeps percent signs out of signed URLs).
    """
    if not path:
        return "the path is empty"
    if len(path) > MAX_PATH_LENGTH:
        return f"the path is longer than {MAX_PATH_LENGTH} characters"
    if "\x00" in path:
        return "the path contains a NUL byte"
    if path.startswith("/") or path.startswith("\\"):
        return "the path is absolute"
    segments = path.split("/")
    if len(segments) > MAX_DEPTH:
        return f"the path is deeper than {MAX_DEPTH} levels"
    for segment in segments:
        if segment in {"", ".", ".."}:
            return "the path has an empty, '.' or '..' segment"
        if not _SEGMENT_RE.match(segment):
            return (
                f"segment {segment!r} must start with a letter or digit and use only "
                "letters, digits, '.', '_', '-'"
            )
    return None
