from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import Field

from tensor_registry_server.core.schemas import Schema, VariantOut


class JobProgress(Schema):
    stage: str = Field(description="queued, starting, download, load, serialize, upload, publish…")
    bytes_done: int
    bytes_total: int | None


class JobError(Schema):
    """RFC 9457 problem, as the API renders errors."""

    type: str
    title: str
    status: int
    detail: str
    code: str


class JobOut(Schema):
    id: uuid.UUID
    kind: str = Field(description="tensorize | import | verify")
    status: str = Field(description="queued | running | succeeded | failed | cancelled")
    progress: JobProgress
    attempts: int
    error: JobError | None
    artifact_id: uuid.UUID | None
    model_id: uuid.UUID | None
    model_name: str | None = Field(
        default=None, description="`namespace/name` of model_id (filled in job lists)."
    )
    version_id: uuid.UUID | None
    queue: str
    worker: str | None = Field(description="'<worker id>/<pid>' of the process that ran it last")
    cancel_requested: bool
    variant: VariantOut | None = Field(
        default=None,
        description="What a tensorize or verify job makes: its artifact's variant, version and "
        "storage, read from the artifact row. null for an import job, and once the artifact is "
        "gone (deleted, or removed when its job was cancelled).",
    )
    params: dict[str, Any] = Field(
        description="The job's own parameters (an import's `source_uri`, a registration's "
        "`uri`, both redacted; `source_bytes`). **Deprecated keys**: `version`, `dtype`, "
        "`format`, `tensor_parallel_size`, `storage` and `encrypt` (tensorize) / `encrypted` "
        "(verify) are answered for older clients, derived from the artifact row like "
        "`variant`, and are no longer stored with the job: read `variant` instead."
    )
    result: dict[str, Any]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
