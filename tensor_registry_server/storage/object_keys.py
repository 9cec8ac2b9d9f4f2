"""Where things live in storage. Keys use only [A-Za-z0-9._/-]: no '%' ever reaches a URL."""

from __future__ import annotations

import uuid

# The relative-path rule is shared with the node, which applies it to every path it is sent.
from tensor_registry.formats.paths import (  # noqa: F401 - re-exported
    MAX_DEPTH,
    MAX_PATH_LENGTH,
    check_relative_path,
)


def version_prefix(version_id: uuid.UUID) -> str:
    return f"versions/{version_id}/"


def artifact_prefix(artifact_id: uuid.UUID) -> str:
    return f"artifacts/{artifact_id}/"
