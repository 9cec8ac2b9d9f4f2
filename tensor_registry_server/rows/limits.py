"""Per-namespace limit overrides set by an admin (issue 36 §2); defaults live in settings."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from tensor_registry_server.core.db import Base, UTCDateTime, utcnow


class NamespaceLimit(Base):
    """One namespace's overrides. A None column falls back to the settings' default; a value
    of 0 or more overrides it (there is no 'unlimited' override: set a large number)."""

    __tablename__ = "namespace_limits"

    namespace: Mapped[str] = mapped_column(String(128), primary_key=True)
    storage_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    upload_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    concurrent_jobs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
