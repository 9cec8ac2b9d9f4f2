"""``GET /.well-known/tensor-registry/keys``: the public keys artifact manifests are signed with.

``GET /.well-known/tensor-registry/model-signing.pem``: the P-256 key of every ``model.sig``.

No authentication: these are public keys, and a node needs them before it holds any token
(air-gapped verification, trust on first use). The private key never leaves
tensor_registry_server/trust/signing_keys.py.

``GET /api/v1/models/{model_id}/versions/{n}/manifest``: a ready version's files, signed with
the active key on request (a version's files never change once it is ready; the signature's
``signed_at`` is the only thing that differs between two answers).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Response

from tensor_registry.formats.model_signature import PEM_MEDIA_TYPE
from tensor_registry.formats.signed_manifest import ManifestFile
from tensor_registry_server.auth import ReadToken
from tensor_registry_server.core.db import SessionDep, utcnow
from tensor_registry_server.core.errors import Conflict, NotFound
from tensor_registry_server.core.redact import redact_uri
from tensor_registry_server.core.schemas import Schema
from tensor_registry_server.deps import SettingsDep, StoragesDep
from tensor_registry_server.models.service import get_model
from tensor_registry_server.rows.versions import VersionStatus
from tensor_registry_server.trust.blob_origins import blob_origins
from tensor_registry_server.trust.signing_keys import manifest_keys, model_signing_keys
from tensor_registry_server.trust.statements import signed_version_manifest
from tensor_registry_server.versions import service as versions

router = APIRouter(tags=["trust"])

KEYS_ROUTE = "/.well-known/tensor-registry/keys"
MODEL_SIGNING_KEY_ROUTE = "/.well-known/tensor-registry/model-signing.pem"


class EndorsementOut(Schema):
    keyid: str
    sig: str


class PublicKeyOut(Schema):
    keyid: str
    algorithm: str
    public_key: str
    status: str
    endorsements: list[EndorsementOut]


class ModelSigningKeyOut(Schema):
    keyid: str
    algorithm: str
    public_key_pem: str
    status: str
    endorsements: list[EndorsementOut]


class ManifestKeysOut(Schema):
    registry_id: str
    active: str
    keys: list[PublicKeyOut]
    model_signing_keys: list[ModelSigningKeyOut] = []
    blob_origins: list[str] = []
    signed: str


@router.get(
    KEYS_ROUTE,
    response_model=ManifestKeysOut,
    summary="Public Ed25519 keys of the registry's signed artifact manifests (no auth)",
    description="`active` signs new manifests; `previous` and `retired` keys still verify older "
    "ones. `public_key` is the base64 of the raw 32-byte key, `keyid` its sha256 (hex); the "
    "active key's `endorsements` are signatures by previous keys over "
    '`b"tensor-registry key endorsement v1\\0" + public_key`, so a client that pinned an '
    "older key can accept the new one. `registry_id` is the registry's stable identity (what "
    "nodes pin under, whatever URL or port it answers on); `signed` is a DSSE envelope by the "
    "active key over {registry_id, active, keys [{keyid, public_key, status}], issued_at, "
    "blob_origins} (predicate `https://tensor-registry.dev/keys/v1`): a node drops a key it "
    "sees `retired` there. `blob_origins`: the origins a resolve answer's URLs may point at "
    "(this registry's public URL, its object stores' presigned GETs); a node refuses any "
    "other. `model_signing_keys`: the ECDSA P-256 keys of the artifacts' `model.sig` (OpenSSF "
    "Model Signing), `keyid` the sha256 of `public_key_pem`, each endorsed by the manifest keys "
    'over `b"tensor-registry model-signing key v1\\0" + public_key_pem`. See docs/trust.md.',
)
async def manifest_public_keys(
    settings: SettingsDep, storages: StoragesDep, response: Response
) -> ManifestKeysOut:
    response.headers["Cache-Control"] = "public, max-age=300"
    origins = await blob_origins(settings, storages)
    document = {
        **manifest_keys(settings).document(issued_at=_iso(utcnow()) or "", blob_origins=origins),
        "model_signing_keys": model_signing_keys(settings).document(),
    }
    return ManifestKeysOut.model_validate(document)


_PEM: dict[int | str, dict[str, Any]] = {200: {"content": {PEM_MEDIA_TYPE: {}}}}


@router.get(
    MODEL_SIGNING_KEY_ROUTE,
    summary="The PEM public key that verifies every artifact's model.sig (no auth)",
    description="ECDSA P-256, SubjectPublicKeyInfo PEM: what `model_signing verify key "
    "--signature DIR/model.sig --public_key KEY.pem DIR` takes. The active key; after a "
    "rotation an older artifact's key is at `/.well-known/tensor-registry/model-signing/"
    "{keyid}.pem` (`keyid`: the bundle's `verificationMaterial.publicKey.hint`). "
    "See docs/trust.md.",
    response_class=Response,
    responses=_PEM,
)
async def model_signing_public_key(settings: SettingsDep) -> Response:
    return Response(
        model_signing_keys(settings).active_pem,
        media_type=PEM_MEDIA_TYPE,
        headers={"Cache-Control": "public, max-age=300"},
    )


@router.get(
    "/.well-known/tensor-registry/model-signing/{keyid}.pem",
    summary="One published model-signing public key by its key id (no auth)",
    response_class=Response,
    responses={**_PEM, 404: {}},
)
async def model_signing_public_key_by_id(
    keyid: Annotated[str, Path(pattern="^[0-9a-f]{64}$")], settings: SettingsDep
) -> Response:
    pem = model_signing_keys(settings).pem(keyid)
    if pem is None:
        raise NotFound(f"No model-signing key {keyid} is published.", code="key_not_found")
    return Response(
        pem, media_type=PEM_MEDIA_TYPE, headers={"Cache-Control": "public, max-age=300"}
    )


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment is not None else None


@router.get(
    "/api/v1/models/{model_id}/versions/{number}/manifest",
    summary="A ready version's files as a signed DSSE/in-toto statement",
    description="The DSSE envelope of an in-toto Statement v1 whose subjects are the version's "
    "files (path, sha256) and whose predicate (`https://tensor-registry.dev/version-manifest/v1`) "
    "carries the model, the version number, the files (path, size, sha256), `finalized_at` and "
    "the redacted source URI; signed with the active key of `/.well-known/tensor-registry/keys`. "
    "409 `version_not_ready` for a draft, importing or failed version. See docs/trust.md.",
    responses={200: {"content": {"application/json": {}}}},
)
async def version_manifest(
    model_id: uuid.UUID,
    number: Annotated[int, Path(ge=1, le=2**31 - 1)],
    session: SessionDep,
    principal: ReadToken,
    settings: SettingsDep,
) -> Response:
    model = await get_model(session, principal, model_id)
    version = await versions.get_version(session, model, number)
    if version.status != VersionStatus.READY:
        raise Conflict(
            f"Version {number} of '{model.name}' is {version.status}; only a ready version's "
            "files are signed.",
            code="version_not_ready",
        )
    data = signed_version_manifest(
        manifest_keys(settings),
        registry=settings.public_base_url,
        model_id=str(model.id),
        model=model.name,
        version_id=str(version.id),
        version=version.number,
        files=[ManifestFile(f.path, f.size, f.sha256) for f in version.files],
        finalized_at=_iso(version.finalized_at),
        source=redact_uri(version.source_uri) if version.source_uri else None,
        signed_at=_iso(utcnow()) or "",
    )
    return Response(data, media_type="application/json", headers={"Cache-Control": "no-store"})
