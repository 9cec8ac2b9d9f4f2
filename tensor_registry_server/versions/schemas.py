from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import Field

from tensor_registry_server.core.schemas import FileOut, RequestSchema, Schema


class VersionCreate(RequestSchema):
    source_uri: str | None = Field(
        default=None,
        description=(
            "Import instead of uploading; omit for a draft that accepts uploads. "
            "`s3://bucket/prefix/`: every object under the prefix, read with the registry's S3 "
            "endpoint and credentials. `https://…/manifest.json` (or `http://`): HTTP has no "
            'directory listing, so this names a JSON manifest `{"files": [{"path": '
            '"config.json", "url": "…", "sha256": "…", "size": 123}, …]}`; `url` defaults to '
            "`path` relative to the manifest and may be relative; `sha256` and `size`, when "
            "given, are verified. `file:///dir`: the files under a directory inside an "
            "allow-listed import root (`TENSOR_REGISTRY_STORAGE__IMPORT_ROOTS`). Hidden files "
            "(names starting with `.`) are skipped. The import runs as a job; on any error the "
            "version becomes `failed` and keeps no bytes."
        ),
    )
    storage: str | None = Field(default=None, description="Storage backend; default from settings.")


class DtypeCount(Schema):
    tensors: int
    parameters: int
    bytes: int


class RemoteCode(Schema):
    auto_map: dict[str, str]
    files: list[str]


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
    architecture: str | None = Field(
        default=None, description="config.json's first `architectures` entry (or `model_type`)."
    )
    parameter_count: int | None = Field(
        default=None, description="Elements of all safetensors tensors, counted at finalize."
    )
    remote_code: RemoteCode | None = Field(
        default=None,
        description="Executable content besides weights: config.json's `auto_map` and the "
        "`*.py` files. Loading this model with transformers or vLLM needs "
        "`trust_remote_code`/`--trust-remote-code`, which runs those files; null: none.",
    )
    dtype_breakdown: dict[str, DtypeCount] | None = Field(
        default=None,
        description="Per safetensors dtype (`BF16`, `F32`, …): tensors, parameters and bytes; "
        "null until finalize.",
    )
