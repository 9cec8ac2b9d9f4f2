from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from tensor_registry_server.core.schemas import RequestSchema

Short = Annotated[str, Field(max_length=255)]

# What one check-in may carry (a node row holds no more): bounded so that the caps on rows
# (nodes.max_per_owner, nodes.max_total) bound the table too.
MAX_GPUS = 16
MAX_WATCHES = 32
MAX_CACHED = 256
MAX_LOADS_IN = 32


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
    """One load or pull of this node, done or failed (``error``)."""

    id: Annotated[
        str | None,
        Field(
            pattern=r"^[A-Za-z0-9._:-]{1,64}$",
            description="made by the node, one per load: a check-in repeated with the same "
            "load is counted once in the load-seconds histogram",
        ),
    ] = None
    by: Annotated[
        str | None, Field(max_length=32, description="who loaded: load, bench-load, pull, vllm")
    ] = None
    artifact_id: uuid.UUID | None = Field(default=None, description="None: the resolve failed")
    model: Annotated[str | None, Field(max_length=128)] = None
    ref: Annotated[str | None, Field(max_length=64, description="what was asked for")] = None
    version: int | None = None
    path: Annotated[str, Field(max_length=64, description="engine, tensorizer, pull ...")]
    seconds: float = Field(ge=0, le=7 * 24 * 3600)
    gbps: float | None = Field(default=None, ge=0, le=1e6)
    verified: bool
    rank: int | None = Field(default=None, ge=0, le=1024)
    error: Annotated[str | None, Field(max_length=500)] = None


class CheckIn(RequestSchema):
    """What a node says. A list left out is kept as the registry has it: the agent sends its
    ``watches`` and ``cached``, a load or pull its ``loaded`` entries (merged into the node's
    recent loads), and neither erases the other's."""

    node_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")]
    hostname: Short
    agent_version: Annotated[str, Field(max_length=64)] = ""
    gpus: Annotated[list[GpuIn], Field(max_length=MAX_GPUS)] = Field(default_factory=list)
    watches: Annotated[list[WatchIn] | None, Field(max_length=MAX_WATCHES)] = None
    cached: Annotated[list[uuid.UUID] | None, Field(max_length=MAX_CACHED)] = None
    loaded: Annotated[list[LoadIn] | None, Field(max_length=MAX_LOADS_IN)] = None
    stopped: bool = Field(
        default=False,
        description="the agent's last check-in as it stops: the node is left out of rollouts "
        "(it watches nothing any more) until it checks in again",
    )


class NodeOut(BaseModel):
    id: str
    hostname: str
    agent_version: str
    status: Literal["live", "stale", "stopped"]
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
    unmatched: list[RolloutNode] = Field(
        default_factory=list,
        description="those of `pending` that cannot become warm: no artifact of the current "
        "target matches their watch (error says why) until one is published",
    )
    warm_share: float = Field(description="warm / watching (1.0 when nobody watches)")
