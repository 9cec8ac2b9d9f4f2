"""HMAC-signed, expiring URLs for blobs and keys (the auth travels in the URL).

A blob signature covers a *scope* — the first two segments of the key, i.e. one artifact's or
one version's prefix — not one file. That is what lets vLLM fill a ``%03d`` rank template into a
signed URL: every rank file of the artifact verifies, files of other artifacts do not.

URLs contain only [A-Za-z0-9._/-?=&:]: no percent-encoding, so vLLM's ``uri % rank`` is safe.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from dataclasses import dataclass

from tensor_registry_server.core.errors import Forbidden
from tensor_registry_server.core.metrics import SIGNED_URL_FAILURES


@dataclass(frozen=True)
class SignedQuery:
    exp: int
    sig: str

    def query(self) -> str:
        return f"exp={self.exp}&sig={self.sig}"


def blob_scope(key: str) -> str:
    """'artifacts/<id>/model.tensors' -> 'artifacts/<id>/'."""
    parts = key.split("/")
    if len(parts) < 3 or not parts[0] or not parts[1]:
        raise ValueError(f"key {key!r} has no artifact/version scope")
    return f"{parts[0]}/{parts[1]}/"


def _digest(secret: bytes, message: str) -> str:
    mac = hmac.new(secret, message.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")


def _message(purpose: str, subject: str, exp: int) -> str:
    return f"tensor-registry/v1\n{purpose}\n{subject}\n{exp}"


def sign(
    secret: bytes, *, purpose: str, subject: str, ttl: int, now: float | None = None
) -> SignedQuery:
    exp = int((now if now is not None else time.time()) + ttl)
    return SignedQuery(exp=exp, sig=_digest(secret, _message(purpose, subject, exp)))


def verify(
    secret: bytes,
    *,
    purpose: str,
    subject: str,
    exp: str | None,
    sig: str | None,
    now: float | None = None,
) -> None:
    """Raise 403 signature_invalid / signature_expired unless (exp, sig) is valid for subject."""
    if not exp or not sig or not exp.isdigit():
        SIGNED_URL_FAILURES.labels(purpose, "invalid").inc()
        raise Forbidden("The URL is not signed.", code="signature_invalid")
    expected = _digest(secret, _message(purpose, subject, int(exp)))
    # Check the MAC before the expiry, so an altered expiry reads as invalid, not expired.
    if not hmac.compare_digest(expected, sig):
        SIGNED_URL_FAILURES.labels(purpose, "invalid").inc()
        raise Forbidden("The URL signature does not match.", code="signature_invalid")
    if int(exp) < (now if now is not None else time.time()):
        SIGNED_URL_FAILURES.labels(purpose, "expired").inc()
        raise Forbidden("The signed URL has expired; resolve again.", code="signature_expired")


def blob_url(public_url: str, secret: bytes, *, storage: str, key: str, ttl: int) -> str:
    """Signed URL for ``key`` (which may hold a %03d template in its file name)."""
    scope = blob_scope(key)
    signed = sign(secret, purpose="blob", subject=f"{storage}:{scope}", ttl=ttl)
    return f"{public_url.rstrip('/')}/api/v1/blobs/{storage}/{key}?{signed.query()}"


def key_url(public_url: str, secret: bytes, *, artifact_id: str, ttl: int) -> str:
    signed = sign(secret, purpose="key", subject=artifact_id, ttl=ttl)
    return f"{public_url.rstrip('/')}/api/v1/keys/{artifact_id}?{signed.query()}"
