from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Index, String, Text, Uuid
from sqlalchemy.orm import Mapped, mapped_column

from tensor_registry_server.core.db import Base, UTCDateTime, utcnow


class Node(Base):
    """The latest check-in of one serving node (its agent's stable id)."""

    __tablename__ = "nodes"
    __table_args__ = (Index("ix_nodes_owner", "owner_id", "owner_scope"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(255))
    agent_version: Mapped[str] = mapped_column(String(64), default="")
    # The name of the token that checked in (who runs this node).
    token_name: Mapped[str] = mapped_column(String(200), default="")
    # Who owns the node (tensor_registry_server.nodes.service.owns): the root of the token chain
    # that first
    # checked it in, and that token's namespaces, sorted and comma-joined ("*": every
    # namespace). Only a token of the same root whose namespaces cover these may check it in
    # again; rows are counted per (owner_id, owner_scope) against nodes.max_per_owner.
    owner_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    owner_scope: Mapped[str] = mapped_column(Text)
    # When its agent said it stopped (a final check-in): left out of rollouts until it checks
    # in again. None: running.
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    gpus: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    # [{"model", "ref", "state": warm|pending|failed, "version", "artifact_id", "error"}]
    watches: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    # Artifact ids whose files are all in the node cache.
    cached: Mapped[list[str]] = mapped_column(JSON, default=list)
    # [{"artifact_id", "model", "version", "path", "seconds", "gbps", "verified"}]
    loaded: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    first_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
