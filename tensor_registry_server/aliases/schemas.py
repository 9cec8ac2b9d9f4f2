from __future__ import annotations

import re
import uuid
from datetime import datetime

from pydantic import Field

from tensor_registry_server.core.schemas import RequestSchema, Schema, VariantDefaults

ALIAS_RE = re.compile(r"^[a-z][a-z0-9._-]{0,63}$")
RESERVED = frozenset({"latest"})


class AliasSet(RequestSchema):
    version: int = Field(ge=1, le=2**31 - 1)
    default_variant: VariantDefaults | None = Field(
        default=None,
        description="The variant resolve serves through this alias when a request does not "
        "say (any of dtype, format, tensor_parallel_size, encrypted). Omitted: unchanged; "
        "null: cleared.",
    )


class AliasEventOut(Schema):
    alias: str
    from_version: int | None
    to_version: int | None
    actor: str | None
    created_at: datetime


class AliasOut(Schema):
    model_id: uuid.UUID
    alias: str
    version: int
    etag: str
    default_variant: VariantDefaults | None = None
    created_at: datetime
    updated_at: datetime
    history: list[AliasEventOut] = Field(default_factory=list)
