"""Opening files under an allow-listed root (file:// imports and registrations) without escaping it.

The one home for this rule (docs/threat-model.md rule 2), used by every reader of a
client-named path: version imports (``tensor_registry_server/versions/import_sources.py``)
and artifact registration (``tensor_registry_server/artifacts/making/registered_sources.py``).
It lives beside settings rather than in ``tensor_registry_server/storage/``: storage holds the
registry's own
objects under keys it generates, while these paths come from clients and point outside it.

1. ``contained`` resolves the path (links inside the root are followed, as a Hugging Face cache
   needs: ``snapshots/<rev>/x -> ../../blobs/<sha>``) and checks that the result lies in a root.
2. ``open_contained`` opens that *resolved* path from a descriptor of the root, one component at
   a time with ``O_NOFOLLOW``: a directory or file swapped for a link after the check cannot be
   followed out of the root. The file must be a regular file (no FIFO, device or socket).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO planted in the root must not hang the reader; it is refused below.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class OutsideRoot(Exception):
    """The path lies (or, at open time, leads) outside every allowed root."""


class NotRegularFile(Exception):
    """The path is missing or is not a regular file."""


def contained(path: Path, roots: Iterable[Path]) -> tuple[Path, Path]:
    """``(root, resolved path)`` for the allowed root holding ``path`` after resolving links."""
    resolved = path.resolve()
    for root in roots:
        root = root.resolve()
        if resolved == root or root in resolved.parents:
            return root, resolved
    raise OutsideRoot(f"{path} is not under an allowed root")


def open_contained(path: Path, roots: Iterable[Path]) -> BinaryIO:
    """The regular file at ``path`` opened for reading, refusing anything outside ``roots``.

    Raises ``OutsideRoot`` when the path resolves outside every root or a component was replaced
    by a link since it was resolved, ``NotRegularFile`` when it is missing or not a plain file.
    """
    root, resolved = contained(path, roots)
    parts = resolved.relative_to(root).parts
    if not parts:
        raise NotRegularFile(f"{path} is a directory")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            child = _open_at(fd, part, _FILE_FLAGS if last else _DIR_FLAGS, path)
            os.close(fd)
            fd = child
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(f"{path} is not a regular file")
        os.set_blocking(fd, True)
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    return handle


def _open_at(dir_fd: int, name: str, flags: int, path: Path) -> int:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        if _is_link(dir_fd, name):
            # It was resolved to a real file or directory; a link here was put in since.
            raise OutsideRoot(f"{path} leads through a link that changed after checking") from None
        raise NotRegularFile(f"{path} is missing or not a regular file") from None


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False
