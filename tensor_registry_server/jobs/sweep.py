"""The periodic sweep: remove bytes that no row points at, once they are old enough.

Deletes after commit (tensor_registry_server.storage.deferred_delete) cover the normal path; this
catches what a
crash leaves: an upload published whose row never committed, a delete that failed, a worker
killed while writing, temp files, unfinished S3 multipart uploads, half-written Redis chunk sets.

Kept, whatever their age: every object a version file row names; everything under the prefix
of an artifact row (pending and running artifacts are being written there); everything under
a version that is still ``importing`` (its rows appear only when the import ends). Everything
else under ``versions/``, ``artifacts/`` and ``tmp/`` goes once older than ``older_than``, which
must exceed the longest gap between bytes landing and their row committing (minutes).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tensor_registry_server.core.db import utcnow
from tensor_registry_server.core.errors import AppError
from tensor_registry_server.rows.artifacts import Artifact, ArtifactFile
from tensor_registry_server.rows.versions import Version, VersionFile, VersionStatus
from tensor_registry_server.storage.base import Storage, StorageError
from tensor_registry_server.storage.object_keys import version_prefix
from tensor_registry_server.storage.registry import StorageRegistry

log = logging.getLogger("tensor_registry.storage.sweep")

SWEPT_ROOTS = ("versions/", "artifacts/", "tmp/")


class _Live:
    """What the database points at in one backend."""

    def __init__(self) -> None:
        self.keys: set[str] = set()
        self.prefixes: set[str] = set()

    def holds(self, key: str) -> bool:
        return key in self.keys or any(key.startswith(p) for p in self._prefixes_for(key))

    def _prefixes_for(self, key: str) -> list[str]:
        # Prefixes are "<root>/<id>/": look up the key's own two-segment scope first.
        parts = key.split("/")
        scope = f"{parts[0]}/{parts[1]}/" if len(parts) > 2 else ""
        return (
            [scope] if scope in self.prefixes else [p for p in self.prefixes if key.startswith(p)]
        )


async def _live_sets(session: AsyncSession) -> dict[str, _Live]:
    live: dict[str, _Live] = {}
    rows = await session.execute(
        select(Version.storage, VersionFile.storage_key).join(
            VersionFile, VersionFile.version_id == Version.id
        )
    )
    for storage, key in rows:
        live.setdefault(storage, _Live()).keys.add(key)
    importing = await session.execute(
        select(Version.storage, Version.id).where(Version.status == VersionStatus.IMPORTING)
    )
    for storage, version_id in importing:
        live.setdefault(storage, _Live()).prefixes.add(version_prefix(version_id))
    artifacts = await session.execute(select(Artifact.storage, Artifact.storage_prefix))
    for storage, prefix in artifacts:
        live.setdefault(storage, _Live()).prefixes.add(
            prefix if prefix.endswith("/") else prefix + "/"
        )
    files = await session.execute(
        select(Artifact.storage, ArtifactFile.storage_key).join(
            ArtifactFile, ArtifactFile.artifact_id == Artifact.id
        )
    )
    for storage, key in files:
        live.setdefault(storage, _Live()).keys.add(key)
    return live


async def sweep_orphans(
    sessionmaker: async_sessionmaker[AsyncSession],
    storages: StorageRegistry,
    *,
    older_than: timedelta,
    dry_run: bool = False,
    found: list[str] | None = None,
    now: datetime | None = None,
) -> int:
    """Remove orphaned objects and temp leftovers older than ``older_than``; returns how many.

    Each orphan is appended to ``found`` (``storage:key``) when given; ``dry_run`` removes
    nothing (and leaves backend-private temp leftovers alone: they are not listed). ``now``:
    the clock (tests inject one)."""
    # The cutoff is fixed before the rows are read, and objects are listed after: an object
    # that is old enough was published before the snapshot, so its row (if any) is in it.
    cutoff = (now or utcnow()) - older_than
    async with sessionmaker() as session:
        live = await _live_sets(session)
    names = {storages.default, *live}
    removed = 0
    for name in sorted(names):
        try:
            backend = storages.get(name)
        except AppError:
            log.warning("rows name storage %r, which is not configured; not swept", name)
            continue
        try:
            removed += await _sweep_backend(
                backend, live.get(name, _Live()), cutoff, dry_run=dry_run, found=found
            )
        except StorageError as exc:
            log.warning("sweep of storage %s stopped: %s", name, exc)
    return removed


async def _sweep_backend(
    backend: Storage,
    live: _Live,
    cutoff: object,
    *,
    dry_run: bool = False,
    found: list[str] | None = None,
) -> int:
    removed = 0
    for root in SWEPT_ROOTS:
        async for info in backend.list(root):
            if info.modified is None or info.modified >= cutoff:  # type: ignore[operator]
                continue
            if root != "tmp/" and live.holds(info.key):
                continue
            if found is not None:
                found.append(f"{backend.name}:{info.key}")
            removed += 1
            if dry_run:
                continue
            await backend.delete(info.key)
            log.info("swept orphan %s:%s (%d bytes)", backend.name, info.key, info.size)
    if not dry_run:
        removed += await backend.purge_temp(cutoff)  # type: ignore[arg-type]
    return removed
