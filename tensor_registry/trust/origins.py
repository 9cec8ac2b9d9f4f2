"""Where a URL the node hands to another program may point (issue 33 §4): the registry's own
origin, or a blob host the registry's signed keys document names (``blob_origins``: its public
URL and the origins of its presigned object-store GETs). A resolve answer is unsigned where its
URLs are concerned (they carry short-lived signatures, not the manifest's), so a proxy or a
lying registry could otherwise point vLLM at any host; such an answer is refused here, before
anything is fetched or printed."""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from tensor_registry.api.client import RegistryClient
from tensor_registry.api.resolution import Resolution
from tensor_registry.trust.errors import TrustError
from tensor_registry.trust.keys_document import (
    fetch_keys_document,
    keys_from_document,
    signed_statuses,
)

DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_BLOB_ORIGINS = 32

# The keys document trusted_keys fetched last for a client (read again here, not fetched twice).
_documents: weakref.WeakKeyDictionary[RegistryClient, dict[str, Any]] = weakref.WeakKeyDictionary()


def remember_document(client: RegistryClient, document: dict[str, Any]) -> None:
    _documents[client] = document


def origin(url: str) -> str | None:
    """``scheme://host:port`` of an http(s) URL (default ports spelled out, host lower case),
    or None for anything else (another scheme, no host, userinfo, a malformed port)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname or "@" in parts.netloc:
        return None
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port or DEFAULT_PORTS[scheme]}"


def blob_origins(document: Mapping[str, Any], keys: Mapping[str, bytes], *, now: float) -> set[str]:
    """The ``blob_origins`` of ``document``'s signed copy checked with ``keys`` (none when no
    key of ``keys`` signed it)."""
    predicate = signed_statuses(document, keys, now=now)
    listed = (predicate or {}).get("blob_origins") or []
    if not isinstance(listed, list) or len(listed) > MAX_BLOB_ORIGINS:
        raise TrustError("the signed keys document's blob_origins is malformed", code="bad_keys")
    return {o for o in (origin(str(u)) for u in listed) if o is not None}


def allowed_origins(
    client: RegistryClient, keys: Mapping[str, bytes] | None, *, now: float
) -> set[str]:
    """The registry's own origin, and the blob origins its keys document signs with ``keys``
    (with None: with the document's own keys, for an unsigned answer the node accepted)."""
    own = origin(client.url)
    allowed = {own} if own else set()
    document = _documents.get(client)
    try:
        if document is None:
            document = fetch_keys_document(client)
        allowed |= blob_origins(
            document, keys if keys is not None else keys_from_document(document), now=now
        )
    except TrustError:
        if keys is not None:
            raise
    return allowed


def answer_urls(resolution: Resolution) -> Iterable[tuple[str, str]]:
    """(what, URL) for every URL of the answer a node fetches or prints."""
    data = resolution.data
    for entry in data.get("files") or []:
        if isinstance(entry, dict) and "url" in entry:
            yield f"the URL of {entry.get('path')!r}", str(entry["url"])
    if data.get("tensorizer_uri") is not None:
        yield "tensorizer_uri", str(data["tensorizer_uri"])
    for rank, uri in enumerate(data.get("tensorizer_uris") or []):
        yield f"tensorizer_uris[{rank}]", str(uri)
    if data.get("encryption_key_url") is not None:
        yield "encryption_key_url", str(data["encryption_key_url"])


def check_origins(resolution: Resolution, allowed: set[str]) -> None:
    """Every URL of the answer is on an allowed origin, or TrustError ``foreign_url``."""
    for what, url in answer_urls(resolution):
        if origin(url) not in allowed:
            shown = url.split("?", 1)[0][:200]
            raise TrustError(
                f"the resolve answer points {what} at {shown}, which is neither this "
                f"registry's origin nor a blob host its signed keys document names "
                f"({', '.join(sorted(allowed)) or 'none'}); refusing to fetch or print it",
                code="foreign_url",
            )


def check_answer_origins(
    resolution: Resolution,
    client: RegistryClient,
    keys: Mapping[str, bytes] | None,
    *,
    now: float,
) -> None:
    """``check_origins`` against ``allowed_origins``, which reads the keys document only when
    some URL leaves the registry's own origin: an answer that stays on it needs nothing more
    (and a registry that serves no keys document still answers such loads)."""
    own = origin(client.url)
    if own is not None and all(origin(url) == own for _, url in answer_urls(resolution)):
        return
    check_origins(resolution, allowed_origins(client, keys, now=now))
