from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from tensor_registry_server.core.schemas import Schema


class AuditEventOut(Schema):
    id: uuid.UUID
    created_at: datetime
    action: str
    actor_id: uuid.UUID | None
    actor_name: str | None
    target_type: str
    target_id: str | None
    model: str | None
    request_id: str | None
    detail: dict[str, Any]
