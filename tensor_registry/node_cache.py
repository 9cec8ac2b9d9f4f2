"""The node cache: downloaded files kept by sha256, so nothing is fetched twice.

Layout under the cache root (``TENSOR_REGISTRY_CACHE_DIR``, else ``$XDG_CACHE_HOME/
tensor-registry``, else ``~/.cache/tensor-registry``)::

    objects/sha256/ab/ab12…   one file per content hash, read-only (mode 0444)
    compat/ab/ab12…           the compatibility keys the object was fetched for, one a line
    tmp/                      downloads in flight; renamed into objects/ once verified

(``kernels/`` beside them, by default, holds the load engine's compiled digest kernels:
tensor_registry/engine/kernels.py; the node cache never touches it.)

Reuse is fail-closed on two identities (docs/trust.md): an object serves a request only when
its sha256 AND the resolve answer's compatibility key match what was recorded when it was
fetched; otherwise it is fetched (and verified) again, then recorded for that key too.

A file enters ``objects/`` only after its bytes hashed to the sha256 the registry recorded, so
a second pull of the same artifact — or of another artifact sharing files (the same config,
the same tokenizer, the same weights under a new alias) — downloads nothing. Files are placed
into a destination by hard link (same file system) or copy, never by symlink: vLLM and
tensorizer open plain paths. Objects are read-only because a hard link shares them.

Keys are never cached: they are secrets of one artifact, written only where the caller asks.

An object's mtime records its last use (set when it is downloaded and again whenever a pull
reuses it), so ``prune(max_size)`` removes the least recently used first. Removing an object
leaves the files already placed in destinations intact (they are their own links or copies);
``links`` in ``entries()`` says how many such places still share the object's disk space.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from tensor_registry.api.client import (
    ChecksumMismatch,
    ConnectionFailed,
    RegistryClient,
    RegistryError,
    Resolution,
    SignatureExpired,
    error_from_response,
)

CHUNK = 4 * 1024 * 1024
# Below this size one GET is faster than splitting (and hashing happens on the fly).
PARALLEL_MIN_BYTES = 64 * 1024 * 1024
DEFAULT_READERS = 8

Progress = Callable[[int], None]


def default_cache_dir() -> Path:
    # The client reads its environment itself (it runs without the server's settings).
    configured = os.environ.get("TENSOR_REGISTRY_CACHE_DIR")
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "tensor-registry"


def _check_range_response(response: httpx.Response, start: int, end: int, size: int) -> None:
    if response.status_code >= 400:
        response.read()
        raise error_from_response(response)
    whole = start == 0 and end == size - 1
    if response.status_code == 200 and whole:
        return
    expected = f"bytes {start}-{end}/{size}"
    if response.status_code != 206 or response.headers.get("content-range") != expected:
        raise RegistryError(
            f"the server answered Range {start}-{end} with HTTP {response.status_code} "
            f"({response.headers.get('content-range')!r}), not {expected!r}",
            code="range_not_honoured",
            status=response.status_code,
        )


def download(
    client: httpx.Client,
    url: str,
    target: Path,
    *,
    size: int,
    readers: int = DEFAULT_READERS,
    progress: Progress | None = None,
    parallel_min_bytes: int = PARALLEL_MIN_BYTES,
) -> str:
    """Write ``url`` (``size`` bytes) to ``target``; returns its sha256.

    Large files are read with ``readers`` parallel single-range GETs written in place with
    pwrite, then hashed in one pass (from the page cache); small ones with one streamed GET
    hashed on the fly.
    """
    readers = max(1, readers)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if size < parallel_min_bytes or readers == 1:
            digest = hashlib.sha256()
            written = 0
            try:
                with client.stream("GET", url) as response:
                    if response.status_code >= 400:
                        response.read()
                        raise error_from_response(response)
                    for chunk in response.iter_bytes(CHUNK):
                        os.write(fd, chunk)
                        digest.update(chunk)
                        written += len(chunk)
                        if progress:
                            progress(len(chunk))
            except httpx.TransportError as exc:
                raise ConnectionFailed(f"download of {target.name} failed: {exc}") from exc
            if written != size:
                raise ChecksumMismatch(
                    f"{target.name}: received {written} bytes, expected {size}", status=None
                )
            return digest.hexdigest()
        os.ftruncate(fd, size)
        bounds = [(size * i // readers, size * (i + 1) // readers - 1) for i in range(readers)]
        failed = threading.Event()

        def fetch(start: int, end: int) -> None:
            offset = start
            try:
                with client.stream(
                    "GET", url, headers={"Range": f"bytes={start}-{end}"}
                ) as response:
                    _check_range_response(response, start, end, size)
                    for chunk in response.iter_bytes(CHUNK):
                        if failed.is_set():
                            return
                        os.pwrite(fd, chunk, offset)
                        offset += len(chunk)
                        if progress:
                            progress(len(chunk))
            except httpx.TransportError as exc:
                failed.set()
                raise ConnectionFailed(f"download of {target.name} failed: {exc}") from exc
            except BaseException:
                failed.set()
                raise
            if offset != end + 1:
                failed.set()
                raise ChecksumMismatch(
                    f"{target.name}: range {start}-{end} ended at byte {offset}", status=None
                )

        with ThreadPoolExecutor(max_workers=readers, thread_name_prefix="pull") as pool:
            futures = [pool.submit(fetch, start, end) for start, end in bounds if end >= start]
            for future in futures:
                future.result()
    finally:
        os.close(fd)
    return sha256_file(target)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class CacheEntry:
    sha256: str
    size: int
    last_used: float  # seconds since the epoch
    links: int  # hard links beside the cache's own: destinations sharing the bytes
    path: Path


class NodeCache:
    def __init__(
        self, root: Path | str | None = None, *, parallel_min_bytes: int = PARALLEL_MIN_BYTES
    ) -> None:
        self.root = Path(root) if root is not None else default_cache_dir()
        self.parallel_min_bytes = parallel_min_bytes
        self.objects = self.root / "objects" / "sha256"
        self.tmp = self.root / "tmp"

    def path(self, sha256: str) -> Path:
        sha256 = sha256.lower()
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise ValueError(f"not a sha256: {sha256!r}")
        return self.objects / sha256[:2] / sha256

    def _compat_path(self, sha256: str) -> Path:
        obj = self.path(sha256)
        return self.root / "compat" / obj.parent.name / obj.name

    def compatibility_keys(self, sha256: str) -> set[str]:
        try:
            return set(self._compat_path(sha256).read_text().split())
        except FileNotFoundError:
            return set()

    def record_compatibility(self, sha256: str, key: str) -> None:
        if not key or any(c.isspace() for c in key) or len(key) > 256:
            raise ValueError(f"not a compatibility key: {key!r}")
        keys = self.compatibility_keys(sha256)
        if key in keys:
            return
        target = self._compat_path(sha256)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
        staging.write_text("".join(f"{k}\n" for k in sorted(keys | {key})))
        os.replace(staging, target)

    def contains(self, sha256: str, size: int, *, compatibility_key: str | None = None) -> bool:
        """The object is here with ``size`` bytes and, when a key is given, was fetched for
        that compatibility key."""
        try:
            if self.path(sha256).stat().st_size != size:
                return False
        except FileNotFoundError:
            return False
        return compatibility_key is None or compatibility_key in self.compatibility_keys(sha256)

    def fetch(
        self,
        client: httpx.Client,
        url: str,
        *,
        sha256: str,
        size: int,
        readers: int = DEFAULT_READERS,
        progress: Progress | None = None,
        compatibility_key: str | None = None,
    ) -> tuple[Path, bool]:
        """The cached object for ``sha256``, downloading it first if needed: (path, downloaded).
        With ``compatibility_key`` an object recorded for another key is fetched again."""
        final = self.path(sha256)
        if self.contains(sha256, size, compatibility_key=compatibility_key):
            with contextlib.suppress(OSError):
                os.utime(final)  # last use, for prune
            return final, False
        self.tmp.mkdir(parents=True, exist_ok=True)
        partial = self.tmp / f"{sha256[:16]}-{uuid.uuid4().hex}"
        try:
            actual = download(
                client,
                url,
                partial,
                size=size,
                readers=readers,
                progress=progress,
                parallel_min_bytes=self.parallel_min_bytes,
            )
            if actual != sha256.lower():
                raise ChecksumMismatch(
                    f"downloaded bytes hash to {actual}, the registry recorded {sha256}; "
                    "nothing was kept",
                    status=None,
                )
            os.chmod(partial, 0o444)
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(partial, final)
        finally:
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
        if compatibility_key is not None:
            self.record_compatibility(sha256, compatibility_key)
        return final, True

    @contextlib.contextmanager
    def lock(self, name: str) -> Iterator[None]:
        """An exclusive lock named ``name`` shared by every process on this node (flock on a
        file under locks/): pulls of one artifact take turns, so its bytes download once."""
        if not name or any(c not in "0123456789abcdefABCDEF-" for c in name) or len(name) > 64:
            raise ValueError(f"not a lock name: {name!r}")
        folder = self.root / "locks"
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # blocks (no CPU) until the holder is done
            yield
        finally:
            os.close(fd)  # releases the lock

    def fetch_resolution(
        self,
        client: RegistryClient,
        resolution: Resolution,
        *,
        paths: Collection[str] | None = None,
        readers: int = DEFAULT_READERS,
        progress: Progress | None = None,
    ) -> tuple[Resolution, int, int]:
        """Every file of ``resolution`` (or those in ``paths``) in the cache, sha256-checked and
        recorded for its compatibility key; a resolve answer whose signed URLs expired meanwhile
        is refreshed once. Returns (the answer last used, bytes downloaded, bytes reused)."""
        compatibility = resolution.data.get("compatibility_key")
        wanted = [f.path for f in resolution.files if paths is None or f.path in paths]
        downloaded = reused = 0
        refreshed = False
        for path in wanted:
            while True:
                entry = next(f for f in resolution.files if f.path == path)
                try:
                    _, fetched = self.fetch(
                        client.anonymous,
                        entry.url,
                        sha256=entry.sha256,
                        size=entry.size,
                        readers=readers,
                        progress=progress,
                        compatibility_key=compatibility,
                    )
                    break
                except SignatureExpired:
                    if refreshed:
                        raise
                    resolution = client.reresolve(resolution)
                    refreshed = True
            if fetched:
                downloaded += entry.size
            else:
                reused += entry.size
                if progress:
                    progress(entry.size)
        return resolution, downloaded, reused

    def place(self, sha256: str, dest: Path) -> None:
        """Put the cached object at ``dest`` (hard link, else copy), replacing what is there."""
        source = self.path(sha256)
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            try:
                os.link(source, staging)
            except OSError:
                shutil.copyfile(source, staging)
                os.chmod(staging, 0o444)
            os.replace(staging, dest)
        finally:
            with contextlib.suppress(FileNotFoundError):
                staging.unlink()

    def size(self) -> int:
        if not self.objects.exists():
            return 0
        return sum(p.stat().st_size for p in self.objects.rglob("*") if p.is_file())

    def entries(self) -> list[CacheEntry]:
        """Every cached object, most recently used first."""
        found = []
        if self.objects.exists():
            for path in self.objects.glob("??/*"):
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                found.append(CacheEntry(path.name, st.st_size, st.st_mtime, st.st_nlink - 1, path))
        return sorted(found, key=lambda e: (-e.last_used, e.sha256))

    def remove(self, sha256: str) -> CacheEntry:
        """Remove one object, named by its sha256 or a unique prefix of at least 8 hex digits."""
        prefix = sha256.lower()
        if len(prefix) < 8 or any(c not in "0123456789abcdef" for c in prefix):
            raise ValueError(f"{sha256!r} is not a sha256 or a prefix of at least 8 hex digits")
        matches = [e for e in self.entries() if e.sha256.startswith(prefix)]
        if not matches:
            raise FileNotFoundError(f"no cached object {sha256}")
        if len(matches) > 1:
            raise ValueError(f"{sha256!r} names {len(matches)} cached objects; give more digits")
        matches[0].path.unlink()
        return matches[0]

    def prune(
        self,
        max_size: int,
        *,
        stale_tmp_seconds: float = 24 * 3600,
        keep: Collection[str] = (),
        keep_linked: bool = False,
    ) -> list[CacheEntry]:
        """Remove least recently used objects until the cache holds at most ``max_size`` bytes.

        Objects named in ``keep`` (sha256s) stay whatever the size, and with ``keep_linked``
        so do objects placed somewhere by hard link (a directory a server loads from: removing
        them would free no space anyway). Also drops downloads in tmp/ abandoned for more than
        ``stale_tmp_seconds`` (a pull that is running now keeps its partial file).
        """
        if max_size < 0:
            raise ValueError("max_size must be >= 0")
        removed: list[CacheEntry] = []
        entries = self.entries()
        total = sum(e.size for e in entries)
        kept = {k.lower() for k in keep}
        for entry in reversed(entries):  # oldest use first
            if total <= max_size:
                break
            if entry.sha256 in kept or (keep_linked and entry.links > 0):
                continue
            with contextlib.suppress(FileNotFoundError):
                entry.path.unlink()
                removed.append(entry)
            total -= entry.size
        if self.tmp.exists():
            cutoff = time.time() - stale_tmp_seconds
            for partial in self.tmp.iterdir():
                with contextlib.suppress(FileNotFoundError):
                    if partial.stat().st_mtime < cutoff:
                        partial.unlink()
        return removed
