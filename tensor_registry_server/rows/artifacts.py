from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    Uuid,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from tensor_registry.formats.variant import Variant
from tensor_registry_server.core.db import Base, UTCDateTime, new_id, utcnow
from tensor_registry_server.core.invalidation import ChangesResolve


class ArtifactStatus:
    PENDING = "pending"
    RUNNING = "running"
    READY = "ready"
    FAILED = "failed"
    LIVE = (PENDING, RUNNING, READY)


class Artifact(ChangesResolve, Base):
    __tablename__ = "artifacts"
    __table_args__ = (
        # At most one live (pending/running/ready) artifact per variant; failed ones are history.
        Index(
            "uq_artifacts_live_variant",
            "version_id",
            "dtype",
            "format",
            "tensor_parallel_size",
            "encrypted",
            unique=True,
            sqlite_where=text("status IN ('pending', 'running', 'ready')"),
            postgresql_where=text("status IN ('pending', 'running', 'ready')"),
        ),
        # The resolve hot path: newest ready artifact of a version matching the filters.
        Index("ix_artifacts_resolve", "version_id", "status", "created_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=new_id)
    model_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey("models.id", ondelete="CASCADE"), index=True
    )
    version_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey("versions.id", ondelete="CASCADE")
    )
    version_number: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(16))
    format: Mapped[str] = mapped_column(String(8))
    tensor_parallel_size: Mapped[int] = mapped_column(Integer, default=1)
    encrypted: Mapped[bool] = mapped_column(Boolean, default=False)
    key_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    encryption_algorithm: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # The artifact's tensorizer key, wrapped (envelope encryption) under the master key.
    wrapped_key: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    storage: Mapped[str] = mapped_column(String(16))
    storage_prefix: Mapped[str] = mapped_column(String(1024))
    status: Mapped[str] = mapped_column(String(16), default=ArtifactStatus.PENDING)
    origin: Mapped[str] = mapped_column(String(16), default="tensorize")
    source_uri: Mapped[str | None] = mapped_column(Text, nullable=True)
    tensorizer_version: Mapped[str | None] = mapped_column(String(32), nullable=True)
    torch_version: Mapped[str | None] = mapped_column(String(32), nullable=True)
    transformers_version: Mapped[str | None] = mapped_column(String(32), nullable=True)
    parameter_count: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    stats: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    job_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    ready_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    files: Mapped[list[ArtifactFile]] = relationship(
        lazy="raise",
        cascade="all, delete-orphan",
        passive_deletes=True,
        order_by="ArtifactFile.path",
    )

    @property
    def variant(self) -> Variant:
        """What this artifact is of its version (dtype, format, ranks, encrypted): the one
        typed value the worker builds it from and every door names it by."""
        return Variant(self.dtype, self.format, self.tensor_parallel_size, self.encrypted)


class ArtifactFile(Base):
    __tablename__ = "artifact_files"
    __table_args__ = (UniqueConstraint("artifact_id", "path"),)

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=new_id)
    artifact_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey("artifacts.id", ondelete="CASCADE"), index=True
    )
    path: Mapped[str] = mapped_column(String(512))
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    storage_key: Mapped[str] = mapped_column(String(1024))
