"""Keyset (cursor) pagination: stable under inserts, no OFFSET scans.

A cursor is the sort key of the last item returned, base64url-encoded JSON. New rows that sort
after the cursor show up on later pages; rows before it never shift what a page contains.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Generic, TypeVar

from fastapi import Query
from sqlalchemy import Select, and_, or_
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import InstrumentedAttribute

from tensor_registry_server.core import bounded_json
from tensor_registry_server.core.errors import BadRequest

T = TypeVar("T")
DEFAULT_LIMIT = 50
MAX_LIMIT = 500
# Cursors this registry hands out are well under 200 characters.
MAX_CURSOR_CHARS = 1024

# The query parameters every list route takes.
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Page size.")]
Cursor = Annotated[str | None, Query(description="Opaque cursor from a previous page.")]


@dataclass
class Page(Generic[T]):
    items: list[T]
    next_cursor: str | None


def _encode_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return {"d": value.isoformat()}
    if isinstance(value, uuid.UUID):
        return {"u": str(value)}
    return value


def _decode_value(value: Any) -> Any:
    if isinstance(value, dict):
        if "d" in value:
            stamp = datetime.fromisoformat(value["d"])
            if stamp.tzinfo is None:
                raise ValueError("naive datetime")
            return stamp
        if "u" in value:
            return uuid.UUID(value["u"])
    return value


def encode_cursor(values: Sequence[Any]) -> str:
    raw = json.dumps([_encode_value(v) for v in values], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, keys: Sequence[InstrumentedAttribute[Any]]) -> list[Any]:
    """The sort-key values in ``cursor``, each of its key's Python type, or 400 invalid_cursor."""
    try:
        if len(cursor) > MAX_CURSOR_CHARS:
            raise ValueError("too long")
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        values = bounded_json.loads(raw, max_depth=2)
        if not isinstance(values, list) or len(values) != len(keys):
            raise ValueError("width")
        decoded = [_decode_value(v) for v in values]
        for key, value in zip(keys, decoded, strict=True):
            # A null, a bool or a value of another type would reach SQL as a comparison that
            # fails (500) or silently matches nothing.
            expected = key.type.python_type
            if isinstance(value, bool) or not isinstance(value, expected):
                raise ValueError(f"{key.key} is not a {expected.__name__}")
        return decoded
    except (ValueError, TypeError, AttributeError) as exc:
        raise BadRequest("The cursor is malformed.", code="invalid_cursor") from exc


async def paginate(
    session: AsyncSession,
    stmt: Select[Any],
    *,
    keys: Sequence[InstrumentedAttribute[Any]],
    cursor: str | None,
    limit: int,
    descending: bool = False,
) -> Page[Any]:
    """Run ``stmt`` ordered by ``keys`` (last key unique) after ``cursor``."""
    if cursor:
        values = decode_cursor(cursor, keys)
        # (k1, k2, ...) > (v1, v2, ...) spelled out portably.
        clauses = []
        for i, key in enumerate(keys):
            equal = [keys[j] == values[j] for j in range(i)]
            beyond = key < values[i] if descending else key > values[i]
            clauses.append(and_(*equal, beyond))
        stmt = stmt.where(or_(*clauses))
    order = [k.desc() if descending else k.asc() for k in keys]
    rows = list((await session.execute(stmt.order_by(*order).limit(limit + 1))).scalars())
    next_cursor = None
    if len(rows) > limit:
        rows = rows[:limit]
        last = rows[-1]
        next_cursor = encode_cursor([getattr(last, k.key) for k in keys])
    return Page(items=rows, next_cursor=next_cursor)
