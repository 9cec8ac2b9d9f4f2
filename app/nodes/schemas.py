from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from app.schemas import RequestSchema

Short = Annotated[str, Field(max_length=255)]


class WatchIn(RequestSchema):
    model: Annotated[str, Field(max_length=128)]
    ref: Annotated[str, Field(max_length=64)]
    state: Literal["warm", "pending", "failed"]
    version: int | None = None
    artifact_id: uuid.UUID | None = None
    error: Annotated[str | None, Field(max_length=500)] = None


class GpuIn(RequestSchema):
    name: Short
    memory_bytes: int | None = Field(default=None, ge=0)


class LoadIn(RequestSchema):
    artifact_id: uuid.UUID
    model: Annotated[str | None, Field(max_length=128)] = None
    version: int | None = None
    path: Annotated[str, Field(max_length=64, description="engine, tensorizer, vllm ...")]
    seconds: float = Field(ge=0)
    gbps: float | None = Field(default=None, ge=0)
    verified: bool


class CheckIn(RequestSchema):
    node_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")]
    hostname: Short
    agent_version: Annotated[str, Field(max_length=64)] = ""
    gpus: Annotated[list[GpuIn], Field(max_length=64)] = Field(default_factory=list)
    watches: Annotated[list[WatchIn], Field(max_length=64)] = Field(default_factory=list)
    cached: Annotated[list[uuid.UUID], Field(max_length=1000)] = Field(default_factory=list)
    loaded: Annotated[list[LoadIn], Field(max_length=64)] = Field(default_factory=list)


class NodeOut(BaseModel):
    id: str
    hostname: str
    agent_version: str
    status: Literal["live", "stale"]
    gpus: list[dict[str, object]]
    watches: list[dict[str, object]]
    cached: list[str]
    loaded: list[dict[str, object]]
    first_seen_at: datetime
    last_seen_at: datetime


class RolloutNode(BaseModel):
    id: str
    hostname: str
    version: int | None
    artifact_id: str | None
    error: str | None
    last_seen_at: datetime


class RolloutOut(BaseModel):
    model: str
    alias: str
    version: int = Field(description="the alias's current target")
    watching: int = Field(description="live nodes that watch this alias")
    warm: list[RolloutNode] = Field(description="warm on the current target")
    previous: list[RolloutNode] = Field(description="still warm on another version")
    pending: list[RolloutNode]
    failed: list[RolloutNode] = Field(description="their pre-pull failed; error says why")
    warm_share: float = Field(description="warm / watching (1.0 when nobody watches)")
