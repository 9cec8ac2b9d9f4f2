"""Per-process memos on the resolve hot path: what would otherwise be recomputed per request.

- ``signing_secret``: the signing key's bytes, remembered per Settings object (reading them
  stats a file).
- ``rendered``: whole answers. One signed by the registry is a pure function of its inputs,
  signatures included (same ``exp``, same HMAC), so within one second every node asking the
  same question gets the same bytes; the key holds everything the answer depends on
  (``service.resolve`` builds it), the expiry second included, so nothing stale is served.
  Presigned S3 URLs are memoized the same way (issue 29 §5: resolve with presigned URLs ran at a
  third of the registry-signed rate, one presign per file per request): a URL presigned in
  second ``s`` with ``ttl`` expires at ``s + ttl`` or later, which is the answer's
  ``expires_at``, so handing it out again within that second promises nothing it cannot keep.

Both are bounded: past their limit they start empty again.
"""

from __future__ import annotations

from typing import Any

from tensor_registry_server.settings import Settings

_SECRETS_LIMIT = 64
RENDERED_LIMIT = 256

_secrets: dict[int, tuple[Settings, bytes]] = {}
_rendered: dict[tuple[Any, ...], tuple[bytes, str | None]] = {}


def signing_secret(settings: Settings) -> bytes:
    """``settings.signing_key_bytes()``, remembered per Settings object (it stats a file)."""
    known = _secrets.get(id(settings))
    if known is None or known[0] is not settings:
        if len(_secrets) > _SECRETS_LIMIT:
            _secrets.clear()
        known = _secrets[id(settings)] = (settings, settings.signing_key_bytes())
    return known[1]


def rendered(key: tuple[Any, ...]) -> tuple[bytes, str | None] | None:
    """A memoized answer (JSON bytes, key URL) for ``key``, or None."""
    return _rendered.get(key)


def remember_rendered(key: tuple[Any, ...], answer: tuple[bytes, str | None]) -> None:
    if len(_rendered) >= RENDERED_LIMIT:
        _rendered.clear()
    _rendered[key] = answer
