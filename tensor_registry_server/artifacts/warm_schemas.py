"""Warm requests and warm bundles as the API shows them (docs/warm-state.md)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

from pydantic import Field

from tensor_registry_server.core.schemas import Dtype, Format, RequestSchema, Schema


class WarmRequest(RequestSchema):
    version: int | None = Field(
        default=None, ge=1, le=2**31 - 1, description="Version number; default: latest ready."
    )
    dtype: Dtype
    format: Format = "vllm"
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    encrypted: bool = False
    serve_args: Annotated[list[Annotated[str, Field(max_length=4200)]], Field(max_length=64)] = (
        Field(
            default_factory=list,
            description="Arguments for `vllm serve` that enter vLLM's compile-cache key "
            "(`--max-model-len=4096`, `--max-num-seqs 64`, `--compilation-config {...}` ...), "
            "from an allow-list; dtype and tensor_parallel_size come from the artifact.",
        )
    )


class WarmBundleOut(Schema):
    id: uuid.UUID
    artifact_id: uuid.UUID
    model_id: uuid.UUID
    status: str = Field(description="pending | running | ready | failed")
    serve_args: list[str] = Field(description="Normalized: `--flag=value`, sorted.")
    key: dict[str, Any] = Field(
        description="What vLLM's cache key was made of, as a node can check it before start: "
        "vllm_version, torch_version, gpu (compute capability), tensor_parallel_size, dtype, "
        "model (the string vLLM was given), serve_args."
    )
    cache: dict[str, Any] = Field(
        description="What vLLM computed: `dirs` (its hash directories under VLLM_CACHE_ROOT) "
        "and `factors` (its cache_key_factors.json per directory)."
    )
    size: int | None
    sha256: str | None
    job_id: uuid.UUID | None
    error: str | None
    created_at: datetime
    ready_at: datetime | None
