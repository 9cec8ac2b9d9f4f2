"""Time on the node against the registry's: the skew allowed either way, and reading a
signed time."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from tensor_registry.trust.errors import TrustError

# How far the node's clock may be from the registry's when a binding's issued_at/expires_at
# or the keys document's issued_at are checked (docs/trust.md).
CLOCK_SKEW_SECONDS = 120
Clock = Callable[[], float]


def signed_time(text: Any, what: str) -> float:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise TrustError(f"{what} is not a time: {text!r}", code="bad_manifest") from None
