"""``GET /.well-known/tensor-registry/keys``: the public keys artifact manifests are signed with.

No authentication: these are public keys, and a node needs them before it holds any token
(air-gapped verification, trust on first use). The private key never leaves app/trust/keys.py.
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from app.deps import SettingsDep
from app.schemas import Schema
from app.trust.keys import manifest_keys

router = APIRouter(tags=["trust"])

KEYS_ROUTE = "/.well-known/tensor-registry/keys"


class EndorsementOut(Schema):
    keyid: str
    sig: str


class PublicKeyOut(Schema):
    keyid: str
    algorithm: str
    public_key: str
    status: str
    endorsements: list[EndorsementOut]


class ManifestKeysOut(Schema):
    active: str
    keys: list[PublicKeyOut]


@router.get(
    KEYS_ROUTE,
    response_model=ManifestKeysOut,
    summary="Public Ed25519 keys of the registry's signed artifact manifests (no auth)",
    description="`active` signs new manifests; `previous` and `retired` keys still verify older "
    "ones. `public_key` is the base64 of the raw 32-byte key, `keyid` its sha256 (hex); the "
    "active key's `endorsements` are signatures by previous keys over "
    "`b\"tensor-registry key endorsement v1\\0\" + public_key`, so a client that pinned an "
    "older key can accept the new one. See docs/trust.md.",
)
async def manifest_public_keys(settings: SettingsDep, response: Response) -> ManifestKeysOut:
    response.headers["Cache-Control"] = "public, max-age=300"
    return ManifestKeysOut.model_validate(manifest_keys(settings).document())
