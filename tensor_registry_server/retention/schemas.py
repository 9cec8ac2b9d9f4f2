from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Literal

from pydantic import Field

from tensor_registry_server.core.schemas import RequestSchema, Schema

NAMESPACE_RE = re.compile(r"^[a-z0-9._-]{1,127}$")


class RetentionSet(RequestSchema):
    keep_last: int = Field(ge=1, le=100_000, description="The newest N ready versions always stay.")
    keep_days: float = Field(
        default=30.0,
        ge=0,
        le=36_500,
        description="Versions an alias named, and artifacts a node reported loading or "
        "caching, within this many days stay.",
    )


class RetentionPolicyOut(Schema):
    keep_last: int
    keep_days: float
    source: Literal["model", "namespace", "settings"]
    updated_by: str | None = None
    updated_at: datetime | None = None


class RetentionOut(Schema):
    """A namespace's or a model's own policy (null: none), and the one GC applies to it
    (a model's own, else its namespace's, else the settings' default; null: nothing goes)."""

    namespace: str
    model_id: uuid.UUID | None = None
    model: str | None = None
    policy: RetentionPolicyOut | None
    effective: RetentionPolicyOut | None
