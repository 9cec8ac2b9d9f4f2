"""JSON from clients and uploads, parsed with its nesting depth bounded.

``json.loads`` recurses once per level: a few thousand ``[`` raise RecursionError (a bug to
the caller, a 500 to the client), and values nested a few hundred deep still blow the stack of
whatever walks them later. ``loads`` turns both into ``JSONTooDeep``, a ``ValueError`` like
every other parse failure, so each caller keeps one ``except ValueError`` for bad input.
"""

from __future__ import annotations

import json
from typing import Any

# Real documents (Hugging Face configs, safetensors headers, cursors) nest fewer than 10 levels.
MAX_DEPTH = 64


class JSONTooDeep(ValueError):
    pass


def loads(raw: str | bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` that raises ``JSONTooDeep`` past ``max_depth`` nested arrays/objects."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise JSONTooDeep(f"JSON nested more than {max_depth} levels deep") from None
    # Iterative, so checking cannot overflow the stack either.
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > max_depth:
            raise JSONTooDeep(f"JSON nested more than {max_depth} levels deep")
        pending.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return value
