from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import Float, ForeignKey, Index, Integer, String, Uuid, text
from sqlalchemy.orm import Mapped, mapped_column

from tensor_registry_server.core.db import Base, UTCDateTime, new_id, utcnow


class RetentionPolicy(Base):
    """What garbage collection keeps of a namespace's models, or of one model (which wins).

    No row anywhere (and no default in settings): nothing is ever removed."""

    __tablename__ = "retention_policies"
    __table_args__ = (
        # One policy per namespace (model_id NULL) and one per model.
        Index(
            "uq_retention_namespace",
            "namespace",
            unique=True,
            sqlite_where=text("model_id IS NULL"),
            postgresql_where=text("model_id IS NULL"),
        ),
        Index("uq_retention_model", "model_id", unique=True),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=new_id)
    namespace: Mapped[str] = mapped_column(String(128))
    model_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, ForeignKey("models.id", ondelete="CASCADE"), nullable=True
    )
    # The newest N ready versions stay.
    keep_last: Mapped[int] = mapped_column(Integer)
    # Versions an alias named, and artifacts a node reported, within this many days stay.
    keep_days: Mapped[float] = mapped_column(Float)
    updated_by: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
