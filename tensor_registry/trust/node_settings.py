"""What a node's environment says about trust: the keys it configures, whether signatures
are required, and the explicit opt-out."""

from __future__ import annotations

import os
from collections.abc import Iterable

TRUSTED_KEYS_ENV = "TENSOR_REGISTRY_TRUSTED_KEYS"
REQUIRE_SIGNED_ENV = "TENSOR_REGISTRY_REQUIRE_SIGNED"
ALLOW_UNSIGNED_ENV = "TENSOR_REGISTRY_ALLOW_UNSIGNED"


def require_signed_default() -> bool:
    return os.environ.get(REQUIRE_SIGNED_ENV, "").strip().lower() in ("1", "true", "yes")


def allow_unsigned_default() -> bool:
    return os.environ.get(ALLOW_UNSIGNED_ENV, "").strip().lower() in ("1", "true", "yes")


def configured_values(trusted_keys: Iterable[str] | None) -> list[str]:
    """What the node configures as trusted keys: ``trusted_keys`` (CLI ``--trusted-key``)
    and TRUSTED_KEYS_ENV, each a comma-separated list of keys or keys-document/PEM paths."""
    values = list(trusted_keys or [])
    env = os.environ.get(TRUSTED_KEYS_ENV)
    if env:
        values.append(env)
    return values
