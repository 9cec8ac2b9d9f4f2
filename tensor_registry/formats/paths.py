"""The one rule for a relative file path inside a version, an artifact or a destination.

Both sides apply it: the server to every path a client uploads, imports or registers (and to
storage keys), the node to every path that reaches it from a server, a manifest or a bundle
before anything is written or read under a destination (``tensor_registry/beneath.py``). A
path that passes is relative, has no '.', '..' or empty segment, no NUL, at most ``MAX_DEPTH``
segments of ``[A-Za-z0-9][A-Za-z0-9._-]*`` (no '%' ever reaches a URL, no hidden file is named)
and at most ``MAX_PATH_LENGTH`` characters.
"""

from __future__ import annotations

import re

# One path segment of a file path inside a version or artifact.
_SEGMENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")
MAX_PATH_LENGTH = 512
MAX_DEPTH = 8


class UnsafePath(ValueError):
    """A path from a server, manifest or bundle that the rule refuses; ``code`` is stable."""

    code = "unsafe_path"

    def __init__(self, path: object, problem: str, *, what: str = "a path") -> None:
        super().__init__(f"{what} {str(path)[:200]!r} is refused: {problem} ({self.code})")
        self.path = path
        self.problem = problem


def check_relative_path(path: str) -> str | None:
    """Return why ``path`` is not an acceptable relative file path, or None if it is.

    Refuses absolute paths, '..' and '.', empty segments, NUL and any character outside
    [A-Za-z0-9._-] (which also keeps percent signs out of signed URLs).
    """
    if not isinstance(path, str):
        return "the path is not a string"
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


def require_relative_path(path: object, *, what: str = "a path") -> str:
    """``path`` itself when the rule accepts it; else ``UnsafePath``."""
    problem = check_relative_path(path)  # type: ignore[arg-type]
    if problem is not None:
        raise UnsafePath(path, problem, what=what)
    return str(path)


def require_relative_paths(paths: list[str], *, what: str = "a path") -> list[str]:
    """Every path accepted, and no two the same (a second would overwrite the first)."""
    seen: set[str] = set()
    for path in paths:
        require_relative_path(path, what=what)
        if path in seen:
            raise UnsafePath(path, "it is listed twice", what=what)
        seen.add(path)
    return paths
