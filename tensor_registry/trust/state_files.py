"""The node's own trust state on disk: JSON files under ``config_dir()``, mode 0600."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tensor_registry.config import write_private
from tensor_registry.trust.errors import TrustError


def write_state(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, (json.dumps(data, indent=1) + "\n").encode())


def read_state(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {"registries": {}}
    except ValueError:
        raise TrustError(f"{path} is not JSON", code="bad_keys") from None
    if not isinstance(data, dict) or not isinstance(data.get("registries"), dict):
        return {"registries": {}}
    return data
