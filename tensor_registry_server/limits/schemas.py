from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class LimitsIn(BaseModel):
    """A namespace's overrides; a field left out keeps its override, null returns it to the
    settings' default."""

    model_config = ConfigDict(extra="forbid")
    storage_bytes: int | None = Field(default=None, ge=0, le=2**63 - 1)
    upload_bytes: int | None = Field(default=None, ge=0, le=2**63 - 1)
    concurrent_jobs: int | None = Field(default=None, ge=0, le=2**31 - 1)


class LimitsOut(BaseModel):
    storage_bytes: int | None = Field(description="null: unlimited")
    upload_bytes: int | None = Field(description="null: unlimited")
    concurrent_jobs: int | None = Field(description="null: unlimited")


class UsageFigures(BaseModel):
    storage_bytes: int = Field(description="Bytes of every source and artifact file")
    active_jobs: int = Field(description="Jobs queued or running")
    models: int


class NamespaceUsageOut(BaseModel):
    namespace: str
    limits: LimitsOut
    usage: UsageFigures


class NamespaceListOut(BaseModel):
    items: list[NamespaceUsageOut]
