from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import Field, SecretStr

from tensor_registry_server.core.schemas import Dtype, FileOut, Format, RequestSchema, Schema

# tensorizer's chunked XSalsa20-Poly1305 (libsodium secretbox) over a raw 32-byte key.
ENCRYPTION_ALGORITHM = "tensorizer-xsalsa20-poly1305"


class TensorizeRequest(RequestSchema):
    version: int | None = Field(
        default=None, ge=1, le=2**31 - 1, description="Version number; default: latest ready."
    )
    dtype: Dtype
    format: Format = Field(
        default="hf",
        description="hf: Hugging Face names (plain tensorizer, vLLM's generic path); "
        "vllm: vLLM's own layout with the .vllm_tensorized_marker entry (needs a vLLM worker).",
    )
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    encrypt: bool = Field(default=False, description="A fresh 32-byte key for this artifact.")
    storage: str | None = Field(default=None, description="Storage backend; default from settings.")


class ArtifactRegister(RequestSchema):
    version: int = Field(ge=1, le=2**31 - 1)
    dtype: Dtype
    format: Format
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    uri: str = Field(
        max_length=4096,
        description="file:///dir/ (under the import roots), s3://bucket/prefix/ or https://…"
        "/model.tensors (a %03d template for tensor_parallel_size > 1). A directory or prefix "
        "may also hold config.json and tokenizer files; missing ones come from the version.",
    )
    encryption_key_b64: SecretStr | None = Field(
        default=None, description="The artifact's raw 32-byte tensorizer key, base64."
    )
    storage: str | None = Field(default=None, description="Storage backend; default from settings.")


class EncryptionOut(Schema):
    enabled: bool
    key_id: str | None
    algorithm: str | None


class ArtifactOut(Schema):
    id: uuid.UUID
    model_id: uuid.UUID
    version: int
    dtype: str
    format: str
    tensor_parallel_size: int
    encryption: EncryptionOut
    storage: str
    status: str = Field(description="pending | running | ready | failed")
    files: list[FileOut]
    tensorizer_version: str | None
    torch_version: str | None
    transformers_version: str | None
    parameter_count: int | None
    size: int = Field(description="Bytes of all files.")
    stats: dict[str, Any] = Field(
        description="tensor_count, tensor_bytes, seconds, bytes_per_second, device, header…"
    )
    origin: str = Field(description="tensorize | registered")
    source_uri: str | None
    error: str | None
    job_id: uuid.UUID | None
    created_at: datetime
    ready_at: datetime | None
