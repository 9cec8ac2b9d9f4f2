"""Warm bundles: vLLM's compile cache for one artifact, made by a warm job (docs/warm-state.md).

A bundle belongs to its artifact (deleted with it; its tar lies under the artifact's storage
prefix, so it goes with the artifact's bytes) and to the token that asked for it (``token_id``,
SECURITY.md rule 10). ``key`` holds the parts of vLLM's cache key a node can check before it
starts (tensor_registry/formats/warm.py ``WarmKey``); ``cache`` what vLLM itself computed: the
hash directories it made and its recorded factors. ``statement`` is the signed DSSE envelope over
the tar and those facts.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, ForeignKey, Index, String, Text, Uuid, text
from sqlalchemy.orm import Mapped, mapped_column

from tensor_registry_server.core.db import Base, UTCDateTime, new_id, utcnow
from tensor_registry_server.core.invalidation import ChangesResolve


class BundleStatus:
    PENDING = "pending"
    RUNNING = "running"
    READY = "ready"
    FAILED = "failed"
    LIVE = (PENDING, RUNNING, READY)


class WarmBundle(ChangesResolve, Base):
    __tablename__ = "warm_bundles"
    __table_args__ = (
        # At most one live bundle per artifact and serve arguments (their fingerprint).
        Index(
            "uq_warm_bundles_live",
            "artifact_id",
            "fingerprint",
            unique=True,
            sqlite_where=text("status IN ('pending', 'running', 'ready')"),
            postgresql_where=text("status IN ('pending', 'running', 'ready')"),
        ),
        Index("ix_warm_bundles_artifact", "artifact_id", "status", "created_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=new_id)
    artifact_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey("artifacts.id", ondelete="CASCADE")
    )
    model_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey("models.id", ondelete="CASCADE"), index=True
    )
    status: Mapped[str] = mapped_column(String(16), default=BundleStatus.PENDING)
    # sha256 of the normalized serve arguments: what makes two warm requests the same bundle.
    fingerprint: Mapped[str] = mapped_column(String(64))
    serve_args: Mapped[list[str]] = mapped_column(JSON, default=list)
    key: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    cache: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    storage: Mapped[str] = mapped_column(String(16))
    storage_key: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    size: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    statement: Mapped[str | None] = mapped_column(Text, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    job_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, nullable=True)
    token_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    ready_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
