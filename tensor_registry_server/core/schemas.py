"""Schemas shared across domains."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from tensor_registry.formats.variant import MAX_TENSOR_PARALLEL_SIZE, Variant
from tensor_registry.formats.variant import Dtype as Dtype
from tensor_registry.formats.variant import Format as Format

T = TypeVar("T")


class Schema(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class RequestSchema(BaseModel):
    # Unknown fields are a client bug worth reporting, not ignoring.
    model_config = ConfigDict(extra="forbid")


class FileOut(Schema):
    path: str
    size: int
    sha256: str


class ListOut(BaseModel, Generic[T]):
    items: list[T]
    next_cursor: str | None = Field(default=None)


class VariantDefaults(BaseModel):
    """The variant an alias (or a model) serves when a resolve does not say: any of dtype,
    format, tensor_parallel_size, encrypted. What a request names wins field by field; the
    alias's defaults come before the model's; what neither names is chosen as before
    (unencrypted first, then the newest). So a new build never changes what a fleet loads
    until someone changes these."""

    model_config = ConfigDict(extra="forbid")

    dtype: Dtype | None = None
    format: Format | None = None
    tensor_parallel_size: int | None = Field(default=None, ge=1, le=MAX_TENSOR_PARALLEL_SIZE)
    encrypted: bool | None = None

    @classmethod
    def from_row(cls, stored: dict[str, Any] | None) -> VariantDefaults | None:
        return None if stored is None else cls.model_validate(stored)

    def stored(self) -> dict[str, Any] | None:
        """The fields given, as stored in the row (None when none is)."""
        given = self.model_dump(exclude_none=True)
        return given or None


class VariantOut(Schema):
    """The variant an artifact is of its version, and where it is stored: the artifact row's
    typed ``Artifact.variant`` (tensor_registry.formats.variant.Variant) with the version number
    and storage backend beside it. A job answers with its artifact's (``JobOut.variant``)."""

    version: int
    dtype: Dtype
    format: Format
    tensor_parallel_size: int
    encrypted: bool
    storage: str

    @classmethod
    def of(cls, variant: Variant, *, version: int, storage: str) -> VariantOut:
        return cls(
            version=version,
            dtype=variant.dtype,  # type: ignore[arg-type]
            format=variant.format,  # type: ignore[arg-type]
            tensor_parallel_size=variant.tensor_parallel_size,
            encrypted=variant.encrypted,
            storage=storage,
        )
