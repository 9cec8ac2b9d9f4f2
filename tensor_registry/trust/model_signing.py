"""``model.sig`` (OpenSSF Model Signing) on the node: which P-256 keys are trusted, and the
check of an artifact's signature over its files."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tensor_registry.api.client import RegistryClient
from tensor_registry.api.resolution import Resolution
from tensor_registry.formats import model_signature
from tensor_registry.formats.model_signature import SignedModel
from tensor_registry.formats.signed_manifest import (
    SIGNATURE_FILE,
    ManifestError,
    ed25519_verify,
    unb64,
)
from tensor_registry.trust.errors import TrustError
from tensor_registry.trust.keys_document import (
    MAX_KEYS_DOCUMENT,
    fetch_keys_document,
    keys_from_document,
)
from tensor_registry.trust.manifest import fetch_signed_file
from tensor_registry.trust.node_settings import configured_values
from tensor_registry.trust.pins import PinStore


def model_signing_keys_from_document(
    document: Mapping[str, Any], trusted: Mapping[str, bytes]
) -> dict[str, bytes]:
    """Key hint → PEM of the document's ``model_signing_keys`` that a ``trusted`` Ed25519 key
    endorsed (each hint checked against its PEM; a P-256 key or nothing)."""
    found: dict[str, bytes] = {}
    for entry in document.get("model_signing_keys") or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("public_key_pem"), str):
            continue
        pem = entry["public_key_pem"].encode()
        hint = model_signature.key_hint(pem)
        if entry.get("keyid") != hint:
            continue
        try:
            model_signature.load_public_pem(pem)
        except ValueError:
            continue
        message = model_signature.endorsement_message(pem)
        for endorsement in entry.get("endorsements") or []:
            if not isinstance(endorsement, dict):
                continue
            by = trusted.get(str(endorsement.get("keyid", "")).lower())
            if by is None:
                continue
            try:
                sig = unb64(endorsement.get("sig"), "endorsement")
            except ManifestError:
                continue
            if ed25519_verify(by, sig, message):
                found[hint] = pem
                break
    return found


def configured_model_signing_keys(
    trusted_keys: Iterable[str] | None = None,
) -> dict[str, bytes] | None:
    """Model-signing keys from what ``configured_keys`` reads: a PEM file is trusted as is, a
    keys document for the keys it endorses; None when nothing is configured (a configuration of
    bare Ed25519 keys gives none: model.sig is then not checked, the manifest still is)."""
    values = configured_values(trusted_keys)
    if not values:
        return None
    keys: dict[str, bytes] = {}
    for value in values:
        for item in (v.strip() for v in value.split(",")):
            path = Path(item).expanduser() if item else None
            if path is None or not path.is_file():
                continue
            data = path.read_bytes()[:MAX_KEYS_DOCUMENT]
            if data.lstrip().startswith(b"-----BEGIN"):
                try:
                    key = model_signature.load_public_pem(data)
                except ValueError:
                    raise TrustError(f"{path} is not a P-256 public key", code="bad_keys") from None
                pem = model_signature.public_pem(key)
                keys[model_signature.key_hint(pem)] = pem
                continue
            document = json.loads(data)
            keys.update(model_signing_keys_from_document(document, keys_from_document(document)))
    return keys


def model_signing_keys(
    client: RegistryClient,
    manifest_keys: Mapping[str, bytes],
    *,
    trusted: Iterable[str] | None = None,
    want: str | None = None,
    pins: PinStore | None = None,
) -> dict[str, bytes]:
    """The keys to check ``client``'s model.sig files with: configured ones, else the pinned
    ones, grown (and pinned) from the registry's keys document by the keys that
    ``manifest_keys`` (already trusted) endorse when ``want`` is not among them."""
    configured = configured_model_signing_keys(trusted)
    if configured is not None:
        return configured
    pins = pins or PinStore()
    pinned = pins.get_model_signing(client.url)
    if want is not None and want in pinned:
        return pinned
    grown = {
        **pinned,
        **model_signing_keys_from_document(fetch_keys_document(client), manifest_keys),
    }
    if grown != pinned:
        pins.put_model_signing(client.url, grown)
    return grown


def check_model_signature(
    client: RegistryClient,
    resolution: Resolution,
    manifest_keys: Mapping[str, bytes],
    *,
    trusted: Iterable[str] | None = None,
    pins: PinStore | None = None,
) -> SignedModel | None:
    """The artifact's ``model.sig`` (OpenSSF Model Signing): signed by a trusted model-signing
    key, over exactly the answer's other files with their sha256. None when the artifact has
    none (not yet backfilled) or no model-signing key is configured (bare Ed25519 keys given:
    the signed manifest, checked before, binds every file). Raises TrustError."""
    entry = next((f for f in resolution.files if f.path == SIGNATURE_FILE), None)
    if entry is None:
        return None
    if entry.size > model_signature.MAX_SIGNATURE_BYTES:
        raise TrustError(f"a {SIGNATURE_FILE} of {entry.size:,} bytes", code="bad_signature")
    data = fetch_signed_file(client, entry, SIGNATURE_FILE)
    keys = model_signing_keys(
        client,
        manifest_keys,
        trusted=trusted,
        want=model_signature.bundle_hint(data),
        pins=pins,
    )
    if not keys and configured_model_signing_keys(trusted) is not None:
        return None
    try:
        signed = model_signature.verify(data, keys)
        signed.check_files({f.path: f.sha256 for f in resolution.files}, what="the resolve answer")
    except ManifestError as exc:
        raise TrustError.of(exc) from None
    return signed
