"""Short-lived bearer tokens of the distribution spec's token flow.

``GET /v2/token`` takes the registry's API token as the password of Basic auth and answers with
a bearer that names the API token (its id, not its secret) and an expiry, signed with the
registry's signing key (tensor_registry_server.storage.signing, purpose ``oci-bearer``). Presenting
it re-reads the
API token's chain (tensor_registry_server.auth.authenticate_token_id), so revoking the API token,
or any token up
its chain, stops its bearers at once; and a bearer never outlives the API token's own expiry.

Wire form: ``tro1.<token id hex>.<exp>.<signature>``; nothing secret is in it.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from tensor_registry_server.core.errors import AppError
from tensor_registry_server.storage import signing

PREFIX = "tro1."
PURPOSE = "oci-bearer"
_RE = re.compile(r"^tro1\.([0-9a-f]{32})\.([0-9]{1,12})\.([A-Za-z0-9_-]{43})$")


@dataclass(frozen=True)
class Bearer:
    token: str
    expires_in: int


def mint(secret: bytes, token_id: uuid.UUID, ttl: int, *, now: float | None = None) -> Bearer:
    signed = signing.sign(secret, purpose=PURPOSE, subject=token_id.hex, ttl=ttl, now=now)
    return Bearer(f"{PREFIX}{token_id.hex}.{signed.exp}.{signed.sig}", ttl)


def token_id_of(secret: bytes, bearer: str, *, now: float | None = None) -> uuid.UUID | None:
    """The API token id a valid, unexpired bearer names; None for anything else."""
    match = _RE.match(bearer)
    if match is None:
        return None
    token_hex, exp, sig = match.groups()
    try:
        signing.verify(secret, purpose=PURPOSE, subject=token_hex, exp=exp, sig=sig, now=now)
    except AppError:
        return None
    return uuid.UUID(hex=token_hex)
