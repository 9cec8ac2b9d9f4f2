"""Where the CLI finds the registry URL and token: flags, then environment, then `login`'s file.

`tensor-registry login` stores ``{"url": ..., "token": ...}`` in
``config_dir()/config.json`` (``TENSOR_REGISTRY_CONFIG_DIR``, else
``$XDG_CONFIG_HOME/tensor-registry``, else ``~/.config/tensor-registry/``), the
folder 0700 and the file 0600 from its first byte, like ``hf auth login``. ``--token`` /
``TENSOR_REGISTRY_TOKEN`` (and ``--url`` / ``TENSOR_REGISTRY_URL``) win over the file, so a
script's explicit choice is never overridden by someone's earlier login.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensor_registry.api.client import DEFAULT_URL, normalize_url

CONFIG_NAME = "config.json"


def config_dir() -> Path:
    """The node's one config folder: ``TENSOR_REGISTRY_CONFIG_DIR``, else
    ``$XDG_CONFIG_HOME/tensor-registry``, else ``~/.config/tensor-registry``. `login`'s file,
    the pinned keys and the alias moves seen (tensor_registry/trust/) live here."""
    configured = os.environ.get("TENSOR_REGISTRY_CONFIG_DIR")
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "tensor-registry"


def config_path() -> Path:
    return config_dir() / CONFIG_NAME


def read_config() -> dict[str, Any]:
    try:
        data = json.loads(config_path().read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_config(data: dict[str, Any]) -> Path:
    folder = config_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    path = folder / CONFIG_NAME
    write_private(path, (json.dumps(data, indent=2) + "\n").encode())
    return path


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with mode 0600 from the first byte (atomic replace)."""
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(staging, 0o600)
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)


def forget_login() -> bool:
    """Remove the stored token (the file goes when nothing else is left in it)."""
    data = read_config()
    if "token" not in data:
        return False
    data.pop("token")
    data.pop("url", None)
    if data:
        write_config(data)
    else:
        config_path().unlink(missing_ok=True)
    return True


@dataclass(frozen=True)
class Connection:
    url: str
    token: str | None
    token_source: str  # "--token", "TENSOR_REGISTRY_TOKEN", the config file's path, or "none"


def connection(url_flag: str | None, token_flag: str | None) -> Connection:
    stored = read_config()
    url = url_flag or os.environ.get("TENSOR_REGISTRY_URL") or stored.get("url") or DEFAULT_URL
    if token_flag:
        token, source = token_flag, "--token"
    elif os.environ.get("TENSOR_REGISTRY_TOKEN"):
        token, source = os.environ["TENSOR_REGISTRY_TOKEN"], "TENSOR_REGISTRY_TOKEN"
    elif stored.get("token"):
        token, source = str(stored["token"]), str(config_path())
    else:
        token, source = None, "none"
    return Connection(normalize_url(str(url)), token, source)
