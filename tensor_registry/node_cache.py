"""The node cache: downloaded files kept by sha256, so nothing is fetched twice.

Layout under the cache root (``TENSOR_REGISTRY_CACHE_DIR``, else ``$XDG_CACHE_HOME/
tensor-registry``, else ``~/.cache/tensor-registry``)::

    objects/sha256/ab/ab12…   one file per content hash, read-only (mode 0444)
    compat/ab/ab12…           the compatibility keys the object was fetched for, one a line
    verified/ab/ab12…         the object's inode, size, mtime and ctime when its bytes last
                              hashed to its sha256; the file's own mtime is its last use
    tmp/                      downloads in flight; renamed into objects/ once verified
    artifacts/<id>            the files (sha256, size) of an artifact fetched whole, for the
                              check-ins' ``cached`` (tensor_registry/checkins.py)

(``kernels/`` beside them holds the load engine's compiled digest kernels, unless
``TENSOR_REGISTRY_KERNEL_CACHE`` names another folder: tensor_registry/engine/kernels.py; the
node cache never touches it.)

Reuse is fail-closed on two identities (docs/trust.md): an object serves a request only when
its sha256 AND the resolve answer's compatibility key match what was recorded when it was
fetched; otherwise it is fetched (and verified) again, then recorded for that key too.

A file enters ``objects/`` only after its bytes hashed to the sha256 the registry recorded, so
a second pull of the same artifact — or of another artifact sharing files (the same config,
the same tokenizer, the same weights under a new alias) — downloads nothing. Files are placed
into a destination by hard link (same file system) or copy, never by symlink: vLLM and
tensorizer open plain paths. Objects are read-only because a hard link shares them.

Keys are never cached: they are secrets of one artifact, written only where the caller asks.

Reuse checks content (docs/node-cache.md): a placed file is a hard link, so an in-place edit
of it edits the object; any such write moves the object's ctime, so an object whose stamp no
longer matches is hashed again, and removed (then downloaded again) when its bytes changed.

Downloads stop at the signed size, have an idle timeout and a deadline from their size, and
resume with Range after a dropped connection (tensor_registry/api/download.py); placing
writes under the destination without following links (tensor_registry/beneath.py).

The stamp's mtime records an object's last use (set when it is downloaded and again whenever
a pull reuses it), so ``prune(max_size)`` removes the least recently used first. Removing an object
leaves the files already placed in destinations intact (they are their own links or copies);
``links`` in ``entries()`` says how many such places still share the object's disk space.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import threading
import time
import uuid
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

from tensor_registry.api.client import (
    ChecksumMismatch,
    RegistryClient,
    SignatureExpired,
)
from tensor_registry.api.download import (
    DEFAULT_READERS,
    PARALLEL_MIN_BYTES,
    Progress,
    download,
)
from tensor_registry.api.resolution import Resolution
from tensor_registry.api.transfer import DEFAULT_LIMITS, TransferLimits
from tensor_registry.beneath import link_beneath
from tensor_registry.formats.digests import sha256_file
from tensor_registry.node_dirs import default_cache_dir


@dataclass(frozen=True)
class CacheEntry:
    sha256: str
    size: int
    last_used: float  # seconds since the epoch
    links: int  # hard links beside the cache's own: destinations sharing the bytes
    path: Path


class NodeCache:
    def __init__(
        self,
        root: Path | str | None = None,
        *,
        parallel_min_bytes: int = PARALLEL_MIN_BYTES,
        limits: TransferLimits = DEFAULT_LIMITS,
    ) -> None:
        self.root = Path(root) if root is not None else default_cache_dir()
        self.parallel_min_bytes = parallel_min_bytes
        self.limits = limits
        self.objects = self.root / "objects" / "sha256"
        self.tmp = self.root / "tmp"
        self.stamps = self.root / "verified"

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

    def _stamp_path(self, sha256: str) -> Path:
        obj = self.path(sha256)
        return self.stamps / obj.parent.name / obj.name

    @staticmethod
    def _fingerprint(info: os.stat_result) -> str:
        return f"{info.st_ino} {info.st_size} {info.st_mtime_ns} {info.st_ctime_ns}\n"

    def _stamp(self, sha256: str, info: os.stat_result) -> None:
        """Record the object's inode, size, mtime and ctime as they were when its bytes were
        last hashed to ``sha256``: any write or mode change since moves its ctime (which no
        one can set back), so a matching stamp means untouched bytes."""
        target = self._stamp_path(sha256)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
        staging.write_text(self._fingerprint(info))
        os.replace(staging, target)

    def _intact(self, sha256: str, size: int) -> bool:
        """The object is here with ``size`` bytes that still hash to ``sha256``: checked by its
        stamp, else hashed again (and stamped). An object whose bytes changed is removed."""
        final = self.path(sha256)
        try:
            info = os.stat(final, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if not stat.S_ISREG(info.st_mode) or info.st_size != size:
            return False
        try:
            stamped = self._stamp_path(sha256).read_text()
        except FileNotFoundError:
            stamped = ""
        if stamped == self._fingerprint(info):
            return True
        if sha256_file(final) != sha256.lower():
            with contextlib.suppress(FileNotFoundError):
                final.unlink()
            self._forget(sha256)
            return False
        self._stamp(sha256, info)
        return True

    def contains(self, sha256: str, size: int, *, compatibility_key: str | None = None) -> bool:
        """The object is here with ``size`` bytes that still hash to ``sha256`` (its stamp,
        else a fresh hash: docs/trust.md) and, when a key is given, was fetched for that
        compatibility key."""
        if not self._intact(sha256, size):
            return False
        return compatibility_key is None or compatibility_key in self.compatibility_keys(sha256)

    def _forget(self, sha256: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._stamp_path(sha256).unlink()

    def _touch(self, sha256: str) -> None:
        """Last use, for prune: the stamp's mtime (touching the object would move its ctime)."""
        with contextlib.suppress(OSError):
            os.utime(self._stamp_path(sha256))

    def fetch(
        self,
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
            self._touch(sha256)
            return final, False
        self.tmp.mkdir(parents=True, exist_ok=True)
        partial = self.tmp / f"{sha256[:16]}-{uuid.uuid4().hex}"
        try:
            actual = download(
                url,
                partial,
                size=size,
                readers=readers,
                progress=progress,
                parallel_min_bytes=self.parallel_min_bytes,
                limits=self.limits,
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
            self._stamp(sha256, os.stat(final))
        finally:
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
        if compatibility_key is not None:
            self.record_compatibility(sha256, compatibility_key)
        return final, True

    def place(self, sha256: str, dest: Path, path: str | None = None) -> None:
        """Put the cached object at ``dest``/``path`` (hard link, else a read-only copy),
        replacing what is there. ``path`` (from a server, a manifest or a bundle) passes the
        shared relative-path rule and is written without following any link under ``dest``
        (tensor_registry/beneath.py); without it ``dest`` names the file itself."""
        root, relative = (dest, path) if path is not None else (dest.parent, dest.name)
        root.mkdir(parents=True, exist_ok=True)
        source = self.path(sha256)
        before = os.stat(source)
        link_beneath(source, root, relative)
        # A new link moves the object's ctime: stamp it again when nothing else changed.
        after = os.stat(source)
        with contextlib.suppress(FileNotFoundError):
            if self._stamp_path(sha256).read_text() == self._fingerprint(before) and (
                before.st_ino,
                before.st_size,
                before.st_mtime_ns,
            ) == (after.st_ino, after.st_size, after.st_mtime_ns):
                self._stamp(sha256, after)

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
        if len(wanted) == len(resolution.files):
            self.record_artifact(
                resolution.artifact_id, [(f.sha256, f.size) for f in resolution.files]
            )
        return resolution, downloaded, reused

    def record_artifact(self, artifact_id: str, files: Collection[tuple[str, int]]) -> None:
        """Remember that ``artifact_id``'s ``files`` (sha256, size) are all here: what a node
        reports as cached is an artifact, and objects are content only."""
        name = str(uuid.UUID(artifact_id))  # a registry id, never a path
        listed = sorted({(self.path(sha).name, int(size)) for sha, size in files})  # checked
        folder = self.root / "artifacts"
        folder.mkdir(parents=True, exist_ok=True)
        staging = folder / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
        staging.write_text("".join(f"{sha} {size}\n" for sha, size in listed))
        os.replace(staging, folder / name)

    def artifacts(self, *, limit: int = 1000) -> list[str]:
        """The recorded artifacts whose files are all still here (same size), most recently
        recorded first, at most ``limit``; a record whose files were pruned is dropped."""
        folder = self.root / "artifacts"
        if not folder.exists():
            return []
        records = []
        for path in folder.iterdir():
            with contextlib.suppress(ValueError, OSError):
                records.append((path.stat().st_mtime, str(uuid.UUID(path.name)), path))
        held: list[str] = []
        for _, artifact_id, path in sorted(records, reverse=True):
            if len(held) == limit:
                break
            try:
                lines = path.read_text().split("\n")
                files = [(sha, int(size)) for sha, size in (ln.split() for ln in lines if ln)]
                present = all(self._present(sha, size) for sha, size in files)
            except (OSError, ValueError):
                present = False
            if present and files:
                held.append(artifact_id)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()
        return held

    def _present(self, sha256: str, size: int) -> bool:
        """A cheap look (stat, no hash): reuse still checks each object in full."""
        try:
            return os.stat(self.path(sha256)).st_size == size
        except FileNotFoundError:
            return False

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
                try:
                    used = (self.stamps / path.parent.name / path.name).stat().st_mtime
                except FileNotFoundError:
                    used = st.st_mtime
                found.append(CacheEntry(path.name, st.st_size, used, st.st_nlink - 1, path))
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
        self._forget(matches[0].sha256)
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
            self._forget(entry.sha256)
            total -= entry.size
        if self.tmp.exists():
            cutoff = time.time() - stale_tmp_seconds
            for partial in self.tmp.iterdir():
                with contextlib.suppress(FileNotFoundError):
                    if partial.stat().st_mtime < cutoff:
                        partial.unlink()
        return removed
