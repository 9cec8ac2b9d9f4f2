"""Writing an artifact's layout manifest (tensor_registry.formats.layout): at publish, and as a
backfill.

At publish (tensorize and verify jobs) the weights are committed first, then read back from
storage once to hash their chunks (their sha256 came from the sinks), and the manifest is
stored beside them as ``tensors.layout.json``, one more file of the artifact: resolve signs a
URL for it like for any other file, so nothing else in the pipeline changes. Reading back costs
one pass over the weights (from the page cache for local storage, a download from S3); BLAKE3
on the worker's cores keeps that well under the serialize time.

``backfill_layout`` gives an artifact published before manifests existed its manifest: the
same build from its stored bytes, the object written under the artifact's prefix and a file row
added, the resolve cache invalidated after commit. It is idempotent (an artifact that already
has one is left alone).
"""

from __future__ import annotations

import os
import uuid
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload

from tensor_registry.formats.layout import (
    LAYOUT_FILE,
    ArtifactLayout,
    FileLayout,
    build_file_layout,
    is_weights,
)
from tensor_registry_server.jobs.lifecycle import PublishedFile
from tensor_registry_server.rows.artifacts import Artifact, ArtifactFile
from tensor_registry_server.storage.base import Storage, StoredObject

if TYPE_CHECKING:
    from tensor_registry_server.artifacts.making.attempt import Outputs


def _threads() -> int:
    return max(1, min(16, len(os.sched_getaffinity(0))))


def build_layout(storage: Storage, files: list[PublishedFile]) -> ArtifactLayout:
    """The manifest of the weights among ``files`` (committed objects in ``storage``)."""
    layouts: list[FileLayout] = []
    for f in sorted(files, key=lambda f: f.path):
        if not is_weights(f.path):
            continue
        with storage.open_source(f.storage_key) as source:
            layouts.append(
                build_file_layout(source, f.path, size=f.size, sha256=f.sha256, threads=_threads())
            )
    return ArtifactLayout(files=tuple(layouts))


def add_layout(outputs: Outputs, files: list[PublishedFile]) -> list[PublishedFile]:
    """Write the manifest of the committed ``files`` beside them; returns every file."""
    manifest = build_layout(outputs.storage, files)
    sink = outputs.sink(LAYOUT_FILE)
    sink.write(manifest.dumps())
    return outputs.commit_all()


async def backfill_layout(session: AsyncSession, storage: Storage, artifact_id: uuid.UUID) -> bool:
    """Give artifact ``artifact_id`` its layout manifest; False if it already had one.
    The caller commits ``session`` (the object is written first, the row after)."""
    artifact = (
        await session.execute(
            select(Artifact).where(Artifact.id == artifact_id).options(selectinload(Artifact.files))
        )
    ).scalar_one()
    if any(f.path == LAYOUT_FILE for f in artifact.files):
        return False
    files = [PublishedFile(f.path, f.size, f.sha256, f.storage_key) for f in artifact.files]
    store_artifact_file(storage, artifact, LAYOUT_FILE, build_layout(storage, files).dumps())
    await session.flush()
    return True


def write_object(storage: Storage, key: str, data: bytes) -> StoredObject:
    """``data`` stored whole under ``key`` (nothing left behind when it fails)."""
    sink = storage.open_sink(key)
    try:
        sink.write(data)
        return sink.commit()
    except BaseException:
        sink.abort()
        raise


def store_artifact_file(storage: Storage, artifact: Artifact, path: str, data: bytes) -> None:
    """Write one more file of a published artifact (a backfill) and add its row."""
    stored = write_object(storage, artifact.storage_prefix + path, data)
    artifact.files.append(
        ArtifactFile(path=path, size=stored.size, sha256=stored.sha256, storage_key=stored.key)
    )
