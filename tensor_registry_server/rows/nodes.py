from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, String
from sqlalchemy.orm import Mapped, mapped_column

from tensor_registry_server.core.db import Base, UTCDateTime, utcnow


class Node(Base):
    """The latest check-in of one serving node (its agent's stable id)."""

    __tablename__ = "nodes"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(255))
    agent_version: Mapped[str] = mapped_column(String(64), default="")
    # The name of the token that checked in (who runs this node).
    token_name: Mapped[str] = mapped_column(String(200), default="")
    gpus: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    # [{"model", "ref", "state": warm|pending|failed, "version", "artifact_id", "error"}]
    watches: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    # Artifact ids whose files are all in the node cache.
    cached: Mapped[list[str]] = mapped_column(JSON, default=list)
    # [{"artifact_id", "model", "version", "path", "seconds", "gbps", "verified"}]
    loaded: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    first_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
