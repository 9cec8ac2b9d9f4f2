from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

from pydantic import Field

from tensor_registry_server.core.schemas import RequestSchema, Schema

Namespace = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")]
EventTypes = Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=32)]


class WebhookCreate(RequestSchema):
    namespace: Namespace
    url: Annotated[str, Field(min_length=8, max_length=2048)]
    events: EventTypes = Field(
        default_factory=list, description="Event types to receive; empty: every type."
    )
    description: Annotated[str, Field(max_length=1000)] = ""


class WebhookUpdate(RequestSchema):
    url: Annotated[str, Field(min_length=8, max_length=2048)] | None = None
    events: EventTypes | None = None
    description: Annotated[str, Field(max_length=1000)] | None = None
    enabled: bool | None = Field(
        default=None, description="true re-enables a webhook disabled after failures."
    )


class WebhookOut(Schema):
    id: uuid.UUID
    namespace: str
    url: str
    events: list[str]
    description: str
    enabled: bool
    disabled_reason: str | None
    consecutive_failures: int
    created_at: datetime
    updated_at: datetime


class WebhookCreated(WebhookOut):
    secret: str = Field(description="whsec_…: shown only in this response.")


class AttemptOut(Schema):
    at: datetime
    status_code: int | None
    duration_ms: int
    error: str | None


class DeliveryOut(Schema):
    id: uuid.UUID
    webhook_id: uuid.UUID
    event_id: int
    event_type: str
    status: str
    attempts: int
    next_attempt_at: datetime | None
    last_status_code: int | None
    last_error: str | None
    delivered_at: datetime | None
    created_at: datetime
    attempt_log: list[AttemptOut]
