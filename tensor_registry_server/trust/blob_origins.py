"""The origins a resolve answer's URLs may point at, as the keys document signs them
(``blob_origins``): the registry's public URL and the origin of each backend's presigned GETs.
A node refuses any other (tensor_registry/trust/origins.py), so a tampered answer cannot point
vLLM at another host."""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from tensor_registry_server.settings import Settings
from tensor_registry_server.storage.base import Storage
from tensor_registry_server.storage.registry import StorageRegistry

log = logging.getLogger(__name__)
PROBE_KEY = "tensor-registry-origin-probe"

_known: dict[int, tuple[StorageRegistry, list[str]]] = {}


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme.lower()}://{host.lower()}"


async def blob_origins(settings: Settings, storages: StorageRegistry) -> list[str]:
    """Computed once per storage registry: presigning is local (no request to the store)."""
    known = _known.get(id(settings))
    if known is not None and known[0] is storages:
        return known[1]
    found = {origin_of(settings.public_base_url)}
    for name in storages.configured():
        try:
            backend = storages.get(name)
            if type(backend).download_url is Storage.download_url:
                continue
            url = await backend.download_url(PROBE_KEY, 60)
        except Exception as exc:  # a backend that cannot presign names no origin
            log.warning("no blob origin for storage %s: %s", name, type(exc).__name__)
            continue
        if url:
            found.add(origin_of(url))
    origins = sorted(found)
    _known[id(settings)] = (storages, origins)
    return origins
