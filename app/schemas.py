"""Schemas shared across domains."""

from __future__ import annotations

from typing import Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

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
