from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import Field

from tensor_registry_server.core.schemas import RequestSchema, Schema


class SsoConfigOut(Schema):
    enabled: bool
    issuer: str | None = None


class SsoRedeem(RequestSchema):
    code: str = Field(min_length=16, max_length=128)
    code_verifier: str = Field(min_length=43, max_length=128, pattern=r"^[A-Za-z0-9._~-]+$")


class PersonOut(Schema):
    id: uuid.UUID
    subject: str
    email: str | None
    name: str | None
    groups: list[str]
    grants: dict[str, str] = Field(description="namespace ('*': every one) -> role")
    checked_at: datetime


class SsoSession(Schema):
    token: str = Field(description="The session token (Bearer). Shown only in this response.")
    token_id: uuid.UUID
    expires_at: datetime
    person: PersonOut
