from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field

from tensor_registry_server.core.schemas import Schema


class WorkerOut(Schema):
    id: str = Field(
        description="'<hostname>:<pid>' of the worker's main process for admin tokens; an "
        "opaque stable handle ('worker-<hex>') for any other token"
    )
    hostname: str | None = Field(description="The worker's host; null unless the token is admin")
    queues: list[str]
    capabilities: dict[str, Any] = Field(
        description="cuda {available, device_count, devices [{index, name, total_memory}]}, "
        "cpu {count, memory_total, memory_available}, versions {tensorizer, torch, "
        "transformers, vllm, python}, formats, encryption, concurrency"
    )
    started_at: datetime
    last_seen_at: datetime
    live: bool


class WorkerList(Schema):
    items: list[WorkerOut]
