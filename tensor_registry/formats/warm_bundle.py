"""A warm bundle's tar and what both sides read of vLLM's cache root the same way: made from
vLLM's cache root (the warm job), restored into one (a node); the hash directories there, the
factors vLLM recorded, the directories its log names, and the versions and GPU that go into a
key (so the worker and the node compute a key part alike).

``pack`` writes ``torch_compile_cache/`` of a cache root as an uncompressed tar (compiled
kernels compress poorly and a node restores it at disk speed), regular files and directories
only, owner 0, modes 0644/0755, names checked by the shared member rule
(tensor_registry/formats/warm.py), within ``max_bytes``. It also reads what vLLM recorded of its
key in each rank directory (``cache_key_factors.json``).

``restore`` is the node's side and distrusts the tar (SECURITY.md rules 2, 3, 8): the caller
has checked its size and sha256 against the signed statement; then every member must pass the
member rule and be a regular file or a directory (no symlink, hard link, device, FIFO), the
members' total size and count are bounded, and everything is written under a fresh staging
directory inside the cache root, walked from directory descriptors with ``O_NOFOLLOW`` and
files created with ``O_EXCL``. Only when the whole tar passed are the hash directories moved
into place (a hash directory already there is kept: vLLM made it for the same key). A refusal
leaves the cache root as it was.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import stat
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO

from tensor_registry.formats.warm import (
    AOT_DIR,
    CACHE_DIR,
    FACTORS_FILE,
    MAX_MEMBERS,
    check_member_name,
    hash_dir_of,
)

MAX_FACTORS_BYTES = 1 << 20
CHUNK = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class WarmBundleError(Exception):
    """A bundle refused or not made; ``code`` is stable (docs/warm-state.md)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{message} ({code})")
        self.code = code
        self.message = message


@dataclass
class Packed:
    size: int
    sha256: str
    members: int
    # Hash directories (torch_compile_cache/<hash>, torch_compile_cache/torch_aot_compile/<hash>).
    dirs: list[str]
    # What vLLM wrote in cache_key_factors.json, by hash directory (the first rank's).
    factors: dict[str, dict[str, Any]] = field(default_factory=dict)


def hash_dirs(cache_root: Path) -> set[str]:
    """The hash directories under ``cache_root`` now (what vLLM made or a restore put there)."""
    base = cache_root / CACHE_DIR
    found: set[str] = set()
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(base):
            if not entry.is_dir(follow_symlinks=False):
                continue
            if entry.name == AOT_DIR:
                with contextlib.suppress(OSError):
                    for aot in os.scandir(entry.path):
                        if aot.is_dir(follow_symlinks=False):
                            found.add(f"{CACHE_DIR}/{AOT_DIR}/{aot.name}")
            else:
                found.add(f"{CACHE_DIR}/{entry.name}")
    return found


def read_factors(cache_root: Path, hash_dir: str) -> dict[str, Any] | None:
    """vLLM's ``cache_key_factors.json`` in the first rank directory of ``hash_dir``."""
    root = cache_root / hash_dir
    with contextlib.suppress(OSError):
        for path in sorted(root.rglob(FACTORS_FILE)):
            if path.is_symlink() or path.stat().st_size > MAX_FACTORS_BYTES:
                continue
            with contextlib.suppress(ValueError):
                data = json.loads(path.read_bytes())
                if isinstance(data, dict):
                    return data
    return None


class _HashingWriter:
    def __init__(self, target: BinaryIO, limit: int) -> None:
        self.target, self.limit = target, limit
        self.size = 0
        self.digest = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.size += len(data)
        if self.size > self.limit:
            raise WarmBundleError(
                "bundle_too_large", f"the compile cache is larger than {self.limit} bytes"
            )
        self.digest.update(data)
        return self.target.write(data)


def _walk(base: Path) -> Iterator[tuple[str, os.stat_result]]:
    for top, dirs, files in os.walk(base, followlinks=False):
        dirs.sort()
        for name in [*dirs, *sorted(files)]:
            path = Path(top) / name
            yield path.relative_to(base.parent).as_posix(), path.lstat()


def pack(cache_root: Path, target: BinaryIO, *, max_bytes: int) -> Packed:
    """Write ``cache_root/torch_compile_cache`` as a tar into ``target``; what it holds."""
    base = cache_root / CACHE_DIR
    if not base.is_dir() or base.is_symlink():
        raise WarmBundleError("nothing_compiled", f"vLLM wrote no {CACHE_DIR} under {cache_root}")
    out = _HashingWriter(target, max_bytes)
    members = 0
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        for name, info in _walk(base):
            problem = check_member_name(name)
            if problem is not None:
                raise WarmBundleError("unsafe_member", f"cache entry {name[:200]!r}: {problem}")
            entry = tarfile.TarInfo(name)
            entry.uid = entry.gid = 0
            entry.uname = entry.gname = ""
            entry.mtime = int(info.st_mtime)
            if stat.S_ISDIR(info.st_mode):
                entry.type, entry.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(entry)
            elif stat.S_ISREG(info.st_mode):
                entry.type, entry.mode, entry.size = tarfile.REGTYPE, 0o644, info.st_size
                with open(cache_root / name, "rb") as fh:
                    tar.addfile(entry, fh)
            else:
                continue  # links and special files are never bundled
            members += 1
            if members > MAX_MEMBERS:
                raise WarmBundleError("bundle_too_large", f"more than {MAX_MEMBERS} entries")
    dirs = sorted(hash_dirs(cache_root))
    factors = {d: f for d in dirs if (f := read_factors(cache_root, d)) is not None}
    return Packed(out.size, out.digest.hexdigest(), members, dirs, factors)


def file_digest(path: Path) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _open_dir(fd: int, name: str, *, create: bool) -> int:
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=fd)
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=fd)
    except OSError:
        raise WarmBundleError(
            "unsafe_member", f"{name!r} is a link or not a directory where the bundle goes"
        ) from None


def _write_member(staging: Path, name: str, source: IO[bytes] | None, size: int) -> None:
    parts = name.rstrip("/").split("/")
    fd = os.open(staging, _DIR_FLAGS)
    try:
        leaf = parts if source is None else parts[:-1]
        for part in leaf:
            child = _open_dir(fd, part, create=True)
            os.close(fd)
            fd = child
        if source is None:
            return
        try:
            out = os.open(parts[-1], _FILE_FLAGS, 0o644, dir_fd=fd)
        except FileExistsError:
            raise WarmBundleError(
                "unsafe_member", f"{name!r} appears twice in the bundle"
            ) from None
        with os.fdopen(out, "wb") as fh:
            left = size
            while left > 0:
                chunk = source.read(min(CHUNK, left))
                if not chunk:
                    raise WarmBundleError("bad_bundle", f"{name!r} ends early")
                fh.write(chunk)
                left -= len(chunk)
    finally:
        os.close(fd)


def _member_problem(member: tarfile.TarInfo) -> str | None:
    problem = check_member_name(member.name)
    if problem is not None:
        return problem
    if member.issym() or member.islnk():
        return "a link (symbolic or hard)"
    if member.isdev() or member.isfifo() or member.ischr() or member.isblk():
        return "a device or FIFO"
    if not (member.isreg() or member.isdir()):
        return f"an entry of type {member.type!r}"
    return None


def restore(bundle: Path, cache_root: Path, *, max_bytes: int) -> list[str]:
    """Extract ``bundle`` (already checked against its signed size and sha256) into
    ``cache_root``; the hash directories it holds. Raises WarmBundleError and leaves the cache
    root as it was when any member is refused."""
    cache_root.mkdir(parents=True, exist_ok=True)
    staging = cache_root / f".warm-restore-{uuid.uuid4().hex}"
    staging.mkdir(mode=0o700)
    try:
        total = members = 0
        dirs: set[str] = set()
        try:
            with tarfile.open(bundle, mode="r:") as tar:
                for member in tar:
                    members += 1
                    if members > MAX_MEMBERS:
                        raise WarmBundleError(
                            "bundle_too_large", f"more than {MAX_MEMBERS} entries"
                        )
                    problem = _member_problem(member)
                    if problem is not None:
                        raise WarmBundleError(
                            "unsafe_member", f"bundle entry {member.name[:200]!r}: {problem}"
                        )
                    total += member.size if member.isreg() else 0
                    if total > max_bytes:
                        raise WarmBundleError(
                            "bundle_too_large", f"the bundle unpacks to more than {max_bytes} bytes"
                        )
                    hash_dir = hash_dir_of(member.name.rstrip("/"))
                    if hash_dir is None:
                        if member.isdir():
                            continue  # torch_compile_cache/ or torch_aot_compile/ itself
                        raise WarmBundleError(
                            "unsafe_member", f"bundle entry {member.name!r} is in no hash directory"
                        )
                    dirs.add(hash_dir)
                    source = tar.extractfile(member) if member.isreg() else None
                    _write_member(staging, member.name, source, member.size)
        except tarfile.TarError as exc:
            raise WarmBundleError(
                "bad_bundle", f"the bundle is not a readable tar: {exc}"
            ) from None
        for hash_dir in sorted(dirs):
            _place(staging, cache_root, hash_dir)
        return sorted(dirs)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _place(staging: Path, cache_root: Path, hash_dir: str) -> None:
    """Move one hash directory from staging into the cache root, through descriptors."""
    parts = hash_dir.split("/")
    fd = os.open(cache_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            child = _open_dir(fd, part, create=True)
            os.close(fd)
            fd = child
        try:
            os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
            return  # vLLM (or an earlier restore) made this hash directory: same key, keep it
        except FileNotFoundError:
            pass
        src_fd = os.open(staging / "/".join(parts[:-1]), _DIR_FLAGS)
        try:
            os.rename(parts[-1], parts[-1], src_dir_fd=src_fd, dst_dir_fd=fd)
        finally:
            os.close(src_fd)
    finally:
        os.close(fd)


USING_RE = re.compile(r"Using cache directory: (\S+) for vLLM's torch\.compile")
DISABLED_RE = re.compile(r"vLLM's torch\.compile cache is disabled")


def logged_dirs(cache_root: Path, log_text: str) -> list[str] | None:
    """Hash directories named by vLLM's "Using cache directory" lines; None: no such line."""
    found: list[str] = []
    root = cache_root.resolve()
    for match in USING_RE.finditer(log_text):
        path = Path(match.group(1))
        try:
            relative = path.resolve().relative_to(root).as_posix()
        except (ValueError, OSError):
            found.append(f"(outside the cache root) {path}")
            continue
        found.append(hash_dir_of(relative) or relative)
    return sorted(set(found)) if found else None


def installed_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def gpu_capability() -> str:
    """The first GPU's compute capability (``"9.0"``) as the NVIDIA driver reports it (no CUDA
    context is made: a worker's pool process must not hold one); ``"cpu"`` without a GPU."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "cpu"
    first = done.stdout.strip().splitlines()[:1]
    return first[0].strip() if first and first[0].strip() else "cpu"
