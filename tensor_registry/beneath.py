"""Writing files under a destination directory without ever leaving it (threat model rules 2, 8;
docs/threat-model.md).

Every path a node writes under a destination (``pull --dest``, ``export --to``) came from a
server, a manifest or a bundle: it passes the shared relative-path rule
(``tensor_registry/formats/paths.py``) first, then is walked from a descriptor of the
destination one component at a time. Directories are created and opened with ``O_NOFOLLOW``
relative to their parent's descriptor, so a directory inside the destination that is (or
becomes) a symlink is refused instead of followed; the file itself is written under a fresh
name in its parent and renamed over the final name inside that same directory (a rename
replaces a link planted there, it never writes through it). The destination directory itself
is the caller's choice and may be a link.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tensor_registry.formats.paths import UnsafePath, require_relative_path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@contextmanager
def parent_beneath(
    root: Path, path: str, *, what: str = "a path", own: bool = False
) -> Iterator[tuple[int, str]]:
    """(descriptor of the directory that holds ``path`` under ``root``, the file's name),
    creating the directories in between; refuses ``UnsafePath`` for a path the rule refuses or
    one that leads through a link or a non-directory. ``own``: a path this package chose
    itself (``.cache/tensor-registry/pull.json``), exempt from the rule's character set (its
    segments may be hidden), never with an empty, '.' or '..' segment."""
    if own:
        parts = path.split("/")
        if "\x00" in path or any(part in ("", ".", "..") for part in parts):
            raise UnsafePath(path, "not a path of this package's own", what=what)
    else:
        parts = require_relative_path(path, what=what).split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fd)
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                raise UnsafePath(
                    path, f"{part!r} under {root} is a link or not a directory", what=what
                ) from None
            os.close(fd)
            fd = child
        yield fd, parts[-1]
    finally:
        os.close(fd)


def _staging(name: str) -> str:
    return f".{name}.{uuid.uuid4().hex[:12]}.tmp"


def _install(dir_fd: int, staging: str, name: str, root: Path, path: str) -> None:
    """Rename ``staging`` over ``name`` in the same directory; a directory there is refused."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.lstat(name, dir_fd=dir_fd).st_mode):
            raise UnsafePath(path, f"a directory holds its place under {root}")
    os.replace(staging, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def link_beneath(source: Path, root: Path, path: str, *, mode: int = 0o444) -> None:
    """Put ``source`` at ``root``/``path``: a hard link (same file system), else a copy with
    ``mode``; whatever was at that name is replaced, never written through."""
    with parent_beneath(root, path) as (dir_fd, name):
        staging = _staging(name)
        try:
            try:
                os.link(source, staging, dst_dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                out = os.open(staging, flags, 0o600, dir_fd=dir_fd)
                with open(source, "rb") as src, os.fdopen(out, "wb") as dst:
                    shutil.copyfileobj(src, dst, 8 << 20)
                    os.fchmod(dst.fileno(), mode)
            _install(dir_fd, staging, name, root, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staging, dir_fd=dir_fd)


def write_beneath(
    root: Path, path: str, data: bytes, *, mode: int = 0o644, own: bool = False
) -> Path:
    """Write ``data`` at ``root``/``path`` with ``mode`` from the first byte (atomic rename);
    returns the path written. ``own``: see ``parent_beneath``."""
    with parent_beneath(root, path, own=own) as (dir_fd, name):
        staging = _staging(name)
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            out = os.open(staging, flags, mode, dir_fd=dir_fd)
            with os.fdopen(out, "wb") as fh:
                os.fchmod(fh.fileno(), mode)
                fh.write(data)
            _install(dir_fd, staging, name, root, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staging, dir_fd=dir_fd)
    return root / path
