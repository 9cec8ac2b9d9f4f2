"""People who sign in with OpenID Connect, and sign-ins on their way through the provider."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import JSON, String, Text, UniqueConstraint, Uuid
from sqlalchemy.orm import Mapped, mapped_column

from tensor_registry_server.core.db import Base, UTCDateTime, new_id, utcnow


class Person(Base):
    """One identity at the provider (issuer + subject); their roles as last confirmed there."""

    __tablename__ = "people"
    __table_args__ = (UniqueConstraint("issuer", "subject", name="uq_people_issuer_subject"),)

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=new_id)
    issuer: Mapped[str] = mapped_column(String(512))
    subject: Mapped[str] = mapped_column(String(255))
    email: Mapped[str | None] = mapped_column(String(320), nullable=True)
    name: Mapped[str | None] = mapped_column(String(255), nullable=True)
    groups: Mapped[list[str]] = mapped_column(JSON, default=list)
    # namespace ("*": every one) -> role, from sso.roles and the groups above.
    grants: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    # When the provider last confirmed the groups (sign-in or refresh grant).
    checked_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # The provider's refresh token, sealed under a key derived from the master key
    # (tensor_registry_server.people); None: the person's grants lapse once checked_at is
    # older than sso.recheck_seconds.
    refresh_token: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class SsoLogin(Base):
    """A sign-in between the redirect to the provider and the client's code exchange."""

    __tablename__ = "sso_logins"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=new_id)
    # sha256 of the state sent to the provider; then of the one-time code the client redeems.
    state_hash: Mapped[str] = mapped_column(String(64), unique=True)
    code_hash: Mapped[str | None] = mapped_column(String(64), unique=True, nullable=True)
    nonce: Mapped[str] = mapped_column(String(128))
    # PKCE towards the provider (the registry's verifier) and from the client (its challenge).
    verifier: Mapped[str] = mapped_column(String(128))
    client_challenge: Mapped[str] = mapped_column(String(128))
    # "web" or "cli"; where the one-time code goes (the UI, or the CLI's loopback listener).
    client: Mapped[str] = mapped_column(String(8))
    redirect_uri: Mapped[str] = mapped_column(String(512))
    client_state: Mapped[str | None] = mapped_column(String(256), nullable=True)
    person_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
