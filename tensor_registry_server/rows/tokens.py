from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import JSON, ForeignKey, String, Uuid
from sqlalchemy.orm import Mapped, mapped_column

from tensor_registry_server.core.db import Base, UTCDateTime, new_id, utcnow


class ApiToken(Base):
    __tablename__ = "api_tokens"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(128))
    # sha256 of the secret; the secret itself is shown once and never stored.
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    # First characters of the secret, to recognise a token in lists without revealing it.
    prefix: Mapped[str] = mapped_column(String(16))
    scopes: Mapped[list[str]] = mapped_column(JSON)
    # None: every namespace.
    namespaces: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    # The token that minted this one (None: bootstrap or `tensor-registry admin-token`). A token
    # works only while every ancestor is unrevoked and unexpired
    # (tensor_registry_server.auth.authenticate).
    parent_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, ForeignKey("api_tokens.id"), nullable=True, index=True
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
