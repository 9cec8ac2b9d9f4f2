"""Ready artifacts made directly (no worker): tensorizer files in local storage plus their rows.

``make_artifact`` serializes a module or a state dict per rank with tensorizer (optionally
encrypted with a fresh 32-byte key), writes it with config/tokenizer files under
``artifacts/<id>/`` of the local storage directory, and inserts the Artifact and ArtifactFile
rows, the key wrapped under the registry's master key exactly as the pipeline stores it.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
from sqlalchemy import select, update

from tensor_registry.formats.layout import LAYOUT_FILE, ArtifactLayout, build_file_layout
from tensor_registry_server.core.db import create_engine, make_sessionmaker, session_scope, utcnow
from tensor_registry_server.core.key_wrapping import new_key_id, wrap_key
from tensor_registry_server.rows.artifacts import Artifact, ArtifactFile, ArtifactStatus
from tensor_registry_server.rows.models import Model
from tensor_registry_server.rows.versions import Version
from tensor_registry_server.settings import Settings
from tensor_registry_server.storage.object_keys import artifact_prefix

ALGORITHM = "tensorizer-xsalsa20-poly1305"
CONFIG = b'{"architectures": ["TinyForTest"], "model_type": "tiny"}'
TOKENIZER = b'{"version": "1.0", "model": {"type": "BPE"}}'


@dataclass
class MadeArtifact:
    id: uuid.UUID
    model_id: uuid.UUID
    version: int
    directory: Path
    key: bytes | None
    files: dict[str, bytes] = field(default_factory=dict)

    def sha256(self, path: str) -> str:
        return hashlib.sha256(self.files[path]).hexdigest()


def write_tensors(
    path: Path, source: torch.nn.Module | Mapping[str, torch.Tensor], *, key: bytes | None = None
) -> None:
    from tensorizer import EncryptionParams, TensorSerializer

    path.parent.mkdir(parents=True, exist_ok=True)
    serializer = TensorSerializer(
        str(path), encryption=EncryptionParams(key) if key is not None else None
    )
    try:
        if isinstance(source, torch.nn.Module):
            serializer.write_module(source)
        else:
            serializer.write_state_dict(dict(source))
    finally:
        serializer.close()


def layout_of(directory: Path, names: Sequence[str]) -> bytes:
    files = []
    for name in names:
        path = directory / name
        with path.open("rb") as fh:
            files.append(build_file_layout(fh, name, size=path.stat().st_size))
    return ArtifactLayout(files=tuple(files)).dumps()


def rank_state(rank: int, *, elements: int = 1024) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + rank)
    return {
        "layer.weight": torch.randn(elements, generator=generator),
        "layer.rank": torch.full((4,), float(rank)),
    }


async def make_artifact(
    settings: Settings,
    *,
    model: str,
    version: int,
    dtype: str = "float32",
    format: str = "hf",
    tensor_parallel_size: int = 1,
    encrypted: bool = False,
    sources: Sequence[torch.nn.Module | Mapping[str, torch.Tensor]] | None = None,
    extra_files: Mapping[str, bytes] | None = None,
    status: str = ArtifactStatus.READY,
    age_seconds: float = 0.0,
    stored_key: bytes | None = None,
    layout: bool = False,
) -> MadeArtifact:
    """A ready (or ``status``) artifact of ``model`` version ``version`` written by tensorizer.

    ``stored_key`` wraps a different key than the one the files were encrypted with (a registry
    holding the wrong key). ``layout`` also writes the layout manifest
    (tensor_registry.formats.layout).
    """
    artifact_id = uuid.uuid4()
    prefix = artifact_prefix(artifact_id)
    directory = settings.local_storage_root / prefix
    key = os.urandom(32) if encrypted else None
    if sources is None:
        sources = [rank_state(rank) for rank in range(tensor_parallel_size)]
    assert len(sources) == tensor_parallel_size
    names = (
        ["model.tensors"]
        if tensor_parallel_size == 1
        else [f"model-rank-{rank:03d}.tensors" for rank in range(tensor_parallel_size)]
    )
    for name, source in zip(names, sources, strict=True):
        write_tensors(directory / name, source, key=key)
    companions = {"config.json": CONFIG, "tokenizer.json": TOKENIZER, **(extra_files or {})}
    if layout:
        companions[LAYOUT_FILE] = layout_of(directory, names)
    for name, data in companions.items():
        (directory / name).write_bytes(data)
    contents = {name: (directory / name).read_bytes() for name in [*names, *companions]}

    engine = create_engine(settings.database_url)
    try:
        async with session_scope(make_sessionmaker(engine)) as session:
            model_id, version_id = (
                await session.execute(
                    select(Model.id, Version.id)
                    .join(Version, Version.model_id == Model.id)
                    .where(Model.name == model, Version.number == version)
                )
            ).one()
            created = utcnow() - timedelta(seconds=age_seconds)
            session.add(
                Artifact(
                    id=artifact_id,
                    model_id=model_id,
                    version_id=version_id,
                    version_number=version,
                    dtype=dtype,
                    format=format,
                    tensor_parallel_size=tensor_parallel_size,
                    encrypted=encrypted,
                    key_id=new_key_id() if encrypted else None,
                    encryption_algorithm=ALGORITHM if encrypted else None,
                    wrapped_key=(
                        wrap_key(
                            settings.master_key_bytes(), stored_key or key, artifact_id=artifact_id
                        )
                        if key is not None
                        else None
                    ),
                    storage="local",
                    storage_prefix=prefix,
                    status=status,
                    origin="tensorize",
                    tensorizer_version="2.12.1",
                    created_at=created,
                    ready_at=created if status == ArtifactStatus.READY else None,
                    files=[
                        ArtifactFile(
                            path=name,
                            size=len(data),
                            sha256=hashlib.sha256(data).hexdigest(),
                            storage_key=prefix + name,
                        )
                        for name, data in contents.items()
                    ],
                )
            )
    finally:
        await engine.dispose()
    return MadeArtifact(
        id=artifact_id,
        model_id=model_id,
        version=version,
        directory=directory,
        key=key,
        files=contents,
    )


async def replace_artifact_file(
    database_url: str, made: MadeArtifact, path: str, data: bytes
) -> None:
    """Storage AND the file's row changed: what an attacker with write access to both (but not
    the signing key) can do, or a test standing in for an older registry's output."""
    target = made.directory / path
    target.unlink()
    target.write_bytes(data)
    engine = create_engine(database_url)
    try:
        async with session_scope(make_sessionmaker(engine)) as session:
            await session.execute(
                update(ArtifactFile)
                .where(ArtifactFile.artifact_id == made.id, ArtifactFile.path == path)
                .values(size=len(data), sha256=hashlib.sha256(data).hexdigest())
            )
    finally:
        await engine.dispose()
