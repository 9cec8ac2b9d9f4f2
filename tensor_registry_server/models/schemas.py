from __future__ import annotations

import re
import uuid
from datetime import datetime

from pydantic import Field, field_validator

from tensor_registry_server.core.schemas import RequestSchema, Schema, VariantDefaults

NAME_RE = re.compile(r"^[a-z0-9._-]+/[a-z0-9._-]+$")
TAG_RE = re.compile(r"^[a-z0-9][a-z0-9._:-]{0,63}$")
MAX_TAGS = 32


def validate_name(value: str) -> str:
    if len(value) > 128 or not NAME_RE.match(value):
        raise ValueError(
            "must be 'namespace/name' of lower-case letters, digits, '.', '_', '-', "
            "at most 128 characters"
        )
    if any(part in {".", ".."} for part in value.split("/")):
        raise ValueError("'.' and '..' are not names")
    return value


def validate_tags(tags: list[str]) -> list[str]:
    if len(tags) > MAX_TAGS:
        raise ValueError(f"at most {MAX_TAGS} tags")
    for tag in tags:
        if not TAG_RE.match(tag):
            raise ValueError(f"tag {tag!r}: lower-case letters, digits, '.', '_', ':', '-'")
    return sorted(set(tags))


class ModelCreate(RequestSchema):
    name: str = Field(examples=["acme/llama-2-7b-chat"])
    description: str = Field(default="", max_length=10_000)
    tags: list[str] = Field(default_factory=list)

    _name = field_validator("name")(validate_name)
    _tags = field_validator("tags")(validate_tags)


class ModelUpdate(RequestSchema):
    description: str | None = Field(default=None, max_length=10_000)
    tags: list[str] | None = None
    default_variant: VariantDefaults | None = Field(
        default=None,
        description="The variant resolve serves when neither the request nor the alias says. "
        "Omitted: unchanged; null: cleared.",
    )

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else validate_tags(value)


class ModelSummary(Schema):
    latest_version: int | None = Field(
        default=None, description="Highest ready version (what `latest` resolves to)."
    )
    latest_size: int | None = Field(
        default=None, description="Bytes of the source files of the latest ready version."
    )
    version_count: int = Field(default=0, description="Versions in any state.")
    aliases: dict[str, int] = Field(
        default_factory=dict, description="Each alias and the version it points at."
    )
    variant_count: int = Field(default=0, description="Ready artifacts over all versions.")


class ModelOut(Schema):
    id: uuid.UUID
    name: str
    namespace: str
    description: str
    tags: list[str]
    created_at: datetime
    updated_at: datetime
    etag: str
    default_variant: VariantDefaults | None = None
    summary: ModelSummary | None = Field(
        default=None, description="Latest version, aliases, variants and size (list and read)."
    )
