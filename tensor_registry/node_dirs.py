"""Where a node keeps what it builds up: the cache root (``TENSOR_REGISTRY_CACHE_DIR``, else
``$XDG_CACHE_HOME/tensor-registry``, else ``~/.cache/tensor-registry``). The node cache's
objects (tensor_registry/node_cache.py) and the engine's compiled kernels
(tensor_registry/engine/kernels.py) both live under it, so a node that keeps that one folder
(a container's volume) keeps both across restarts."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    # The client reads its environment itself (it runs without the server's settings).
    configured = os.environ.get("TENSOR_REGISTRY_CACHE_DIR")
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "tensor-registry"
