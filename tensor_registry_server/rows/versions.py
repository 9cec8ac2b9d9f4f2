from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    Uuid,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from tensor_registry_server.core.db import Base, UTCDateTime, new_id, utcnow
from tensor_registry_server.core.invalidation import ChangesResolve


class VersionStatus:
    DRAFT = "draft"
    IMPORTING = "importing"
    READY = "ready"
    FAILED = "failed"


class Version(ChangesResolve, Base):
    __tablename__ = "versions"
    __table_args__ = (UniqueConstraint("model_id", "number"),)

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=new_id)
    model_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey("models.id", ondelete="CASCADE"), index=True
    )
    number: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default=VersionStatus.DRAFT)
    storage: Mapped[str] = mapped_column(String(16))
    source_uri: Mapped[str | None] = mapped_column(Text, nullable=True)
    job_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finalized_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # What finalize read from config.json and the safetensors headers, kept for the model page
    # (null for versions finalized before these columns existed, and for drafts).
    architecture: Mapped[str | None] = mapped_column(String(256), nullable=True)
    parameter_count: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    dtype_breakdown: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # Executable content the checkpoint carries ({"auto_map", "files"}), flagged so that
    # trust_remote_code is never a surprise; null: none (or finalized before this existed).
    remote_code: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    files: Mapped[list[VersionFile]] = relationship(
        lazy="raise",
        cascade="all, delete-orphan",
        passive_deletes=True,
        order_by="VersionFile.path",
    )


class VersionFile(Base):
    __tablename__ = "version_files"
    __table_args__ = (UniqueConstraint("version_id", "path"),)

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=new_id)
    version_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey("versions.id", ondelete="CASCADE"), index=True
    )
    path: Mapped[str] = mapped_column(String(512))
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    storage_key: Mapped[str] = mapped_column(String(1024))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
