from __future__ import annotations

import unicodedata
import uuid
from datetime import datetime

from pydantic import Field, field_validator

from tensor_registry_server.auth import SCOPES
from tensor_registry_server.core.schemas import RequestSchema, Schema
from tensor_registry_server.models.schemas import NAME_RE

NAMESPACE_RE = NAME_RE.pattern.split("/")[0] + "$"
# Unicode categories a token name may not hold: control (Cc: tabs, newlines, escapes), format
# (Cf: bidi overrides and isolates, zero-width spaces and joiners, the BOM), surrogates, and the
# line and paragraph separators.
HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


class TokenCreate(RequestSchema):
    name: str = Field(min_length=1, max_length=128)
    scopes: list[str] = Field(min_length=1)
    namespaces: list[str] | None = Field(
        default=None, description="Limit the token to these namespaces; omit for all."
    )
    expires_at: datetime | None = Field(
        default=None,
        description="Omitted or null: never, or the minting token's own expiry when it has one "
        "(a later one is refused with 422 expiry_exceeds_parent).",
    )
    ttl_seconds: int | None = Field(default=None, ge=60, le=10 * 365 * 24 * 3600)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        # A name is shown on the Tokens and Audit pages: right-to-left overrides, zero-width and
        # other format or control characters would make one token's name read as another's.
        for ch in value:
            if unicodedata.category(ch) in HIDDEN_CATEGORIES:
                raise ValueError(
                    f"token names may not hold control, format or separator characters "
                    f"(U+{ord(ch):04X} {unicodedata.name(ch, 'unnamed')})"
                )
        return value

    @field_validator("scopes")
    @classmethod
    def _scopes(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - set(SCOPES))
        if unknown:
            raise ValueError(f"unknown scope(s) {unknown}; known: {list(SCOPES)}")
        return sorted(set(value))

    @field_validator("namespaces")
    @classmethod
    def _namespaces(cls, value: list[str] | None) -> list[str] | None:
        import re

        if value is None:
            return None
        for ns in value:
            if not re.match(NAMESPACE_RE, ns) or ns in {".", ".."}:
                raise ValueError(f"namespace {ns!r}: lower-case letters, digits, '.', '_', '-'")
        return sorted(set(value))


class TokenOut(Schema):
    id: uuid.UUID
    name: str
    prefix: str
    scopes: list[str]
    namespaces: list[str] | None
    parent_id: uuid.UUID | None = Field(
        description="The token that minted this one; revoking it revokes this one."
    )
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None
    person_id: uuid.UUID | None = Field(
        default=None,
        description="The person (SSO) who made it; it works only within their current roles.",
    )


class TokenCreated(TokenOut):
    token: str = Field(description="The secret. Shown only in this response.")
