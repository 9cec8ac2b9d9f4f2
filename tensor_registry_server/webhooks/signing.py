"""Standard Webhooks signatures (https://www.standardwebhooks.com/).

The secret is ``whsec_`` + base64 of 32 random bytes. Each delivery carries ``webhook-id``,
``webhook-timestamp`` (Unix seconds) and ``webhook-signature: v1,<base64 HMAC-SHA256 of
"id.timestamp.body" under the secret's bytes>``, so receivers verify with the spec's published
libraries (``standardwebhooks.Webhook(secret).verify(body, headers)``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

SECRET_PREFIX = "whsec_"  # noqa: S105 - the spec's public prefix, not a secret
SECRET_BYTES = 32


def new_secret() -> tuple[str, bytes]:
    """(the secret as shown once to its owner, its raw bytes to store wrapped)."""
    raw = os.urandom(SECRET_BYTES)
    return SECRET_PREFIX + base64.b64encode(raw).decode(), raw


def signature(raw: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(raw, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(raw: bytes, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {
        "content-type": "application/json",
        "user-agent": "tensor-registry-webhooks",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(raw, msg_id, timestamp, body),
    }
