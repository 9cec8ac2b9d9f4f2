from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import Field

from app.schemas import FileOut, RequestSchema, Schema


class VersionCreate(RequestSchema):
    source_uri: str | None = Field(
        default=None,
        description="Import from s3://bucket/prefix/, https://… (a manifest) or file:///…; "
        "omit for a draft that accepts uploads.",
    )
    storage: str | None = Field(default=None, description="Storage backend; default from settings.")


class VersionOut(Schema):
    id: uuid.UUID
    model_id: uuid.UUID
    version: int
    status: str
    storage: str
    source_uri: str | None
    job_id: uuid.UUID | None
    files: list[FileOut]
    size: int
    created_at: datetime
    finalized_at: datetime | None


class FinalizeProblem(Schema):
    path: str | None
    code: str
    message: str
