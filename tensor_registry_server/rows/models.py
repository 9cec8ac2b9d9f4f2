from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Integer, String, Text, Uuid
from sqlalchemy.orm import Mapped, mapped_column, relationship

from tensor_registry_server.core.db import Base, UTCDateTime, new_id, utcnow
from tensor_registry_server.core.invalidation import ChangesResolve


class Model(ChangesResolve, Base):
    resolve_model_column = "id"
    __tablename__ = "models"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=new_id)
    # Full name "namespace/name"; namespace kept separately for namespace-limited tokens.
    name: Mapped[str] = mapped_column(String(128), unique=True)
    namespace: Mapped[str] = mapped_column(String(128), index=True)
    description: Mapped[str] = mapped_column(Text, default="")
    # The variant resolve serves when neither the request nor the alias says
    # (tensor_registry_server.core.schemas.VariantDefaults); None: the newest.
    default_variant: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    revision: Mapped[int] = mapped_column(Integer, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)

    tags: Mapped[list[ModelTag]] = relationship(
        lazy="raise", cascade="all, delete-orphan", passive_deletes=True, order_by="ModelTag.tag"
    )

    # Optimistic concurrency: every UPDATE checks and bumps the revision; it is the ETag.
    __mapper_args__ = {"version_id_col": revision}


class ModelTag(Base):
    __tablename__ = "model_tags"

    model_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey("models.id", ondelete="CASCADE"), primary_key=True
    )
    tag: Mapped[str] = mapped_column(String(64), primary_key=True, index=True)
