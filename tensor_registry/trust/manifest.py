"""The signed manifest of an artifact or a version: fetched once per content (bounded), its
signature, the artifact it names and its exact file list."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tensor_registry.api.client import RegistryClient
from tensor_registry.api.resolution import Resolution, ResolvedFile
from tensor_registry.formats.signed_manifest import (
    MANIFEST_FILE,
    MAX_MANIFEST_BYTES,
    VERSION_PREDICATE_TYPE,
    ManifestError,
    SignedManifest,
    verify,
)
from tensor_registry.trust.errors import TrustError
from tensor_registry.trust.manifest_keys import trusted_keys
from tensor_registry.trust.pins import PinStore

# Manifests already fetched, by sha256 (content-addressed, so a kept copy is as good as a
# fresh download); the signature and the bindings are still checked on every load.
_fetched: dict[str, bytes] = {}
_FETCHED_LIMIT = 64


def fetch_signed_file(client: RegistryClient, entry: ResolvedFile, what: str) -> bytes:
    """A signed file of a resolve answer (the manifest, ``model.sig``), kept by its sha256 for
    the next load in this process; the caller bounds ``entry.size`` first."""
    kept = _fetched.get(entry.sha256)
    if kept is not None:
        return kept
    data = client.fetch_resolved_file(entry, what)
    if len(_fetched) >= _FETCHED_LIMIT:
        _fetched.clear()
    _fetched[entry.sha256] = data
    return data


def fetch_manifest(client: RegistryClient, resolution: Resolution) -> bytes | None:
    entry = next((f for f in resolution.files if f.path == MANIFEST_FILE), None)
    if entry is None:
        return None
    if entry.size > MAX_MANIFEST_BYTES:
        raise TrustError(f"a manifest of {entry.size:,} bytes is implausible", code="bad_manifest")
    return fetch_signed_file(client, entry, "signed manifest")


def check_manifest(
    data: bytes,
    keys: Mapping[str, bytes],
    *,
    artifact_id: str | None,
    files: Iterable[tuple[str, int, str]],
    compatibility_key: str | None,
    what: str,
) -> SignedManifest:
    """Signature, binding to ``artifact_id`` and the exact file list; raises TrustError."""
    try:
        signed = verify(data, keys)
        if artifact_id is not None and signed.artifact_id != artifact_id:
            raise ManifestError(
                "manifest_mismatch",
                f"the signed manifest is for artifact {signed.artifact_id}, not {artifact_id}",
            )
        signed.check_files(files, what=what)
        if compatibility_key and signed.compatibility_key not in (None, compatibility_key):
            raise ManifestError(
                "compatibility_mismatch",
                f"the signed compatibility key {signed.compatibility_key} is not "
                f"{compatibility_key}",
            )
    except ManifestError as exc:
        raise TrustError.of(exc) from None
    return signed


def verify_version_manifest(
    client: RegistryClient,
    model_id: str,
    number: int,
    *,
    trusted: Iterable[str] | None = None,
    pins: PinStore | None = None,
) -> SignedManifest:
    """Fetch ``GET /api/v1/models/{model_id}/versions/{number}/manifest`` and check it against
    the trusted keys (as for artifacts) and that it is that version's; its ``files`` are then
    the version's signed file list. Raises TrustError."""
    data = client.request("GET", f"/api/v1/models/{model_id}/versions/{number}/manifest").content
    keys = trusted_keys(client, trusted=trusted, pins=pins)
    try:
        signed = verify(data, keys, predicate_type=VERSION_PREDICATE_TYPE)
        bound = signed.predicate.get("version") or {}
        if (str(bound.get("model_id")), bound.get("number")) != (str(model_id), number):
            raise ManifestError(
                "manifest_mismatch",
                f"the signed version manifest is for version {bound.get('number')} of model "
                f"{bound.get('model_id')}, not version {number} of {model_id}",
            )
    except ManifestError as exc:
        raise TrustError.of(exc) from None
    return signed
