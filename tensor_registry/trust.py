"""Verifying what a node loads against the registry's signed manifest (docs/trust.md).

Which keys are trusted, in order:

1. configured: ``TENSOR_REGISTRY_TRUSTED_KEYS`` (comma-separated base64 Ed25519 public keys, or
   paths of a keys document as ``GET /.well-known/tensor-registry/keys`` serves it), or the
   ``trusted_keys`` argument (CLI ``--trusted-key``). When given, nothing else is trusted and
   no key is fetched: the air-gapped and the strict setup.
2. else pinned on first use: the first time a registry URL is seen its published keys are
   pinned in ``<config dir>/trusted-keys.json`` (``TENSOR_REGISTRY_CONFIG_DIR``, else
   ``$XDG_CONFIG_HOME/tensor-registry``, else ``~/.config/tensor-registry``). Later a key
   the pin lacks is accepted only when the registry publishes it endorsed (signed) by a key
   already pinned: a rotation the registry's operator made with the old key in hand. Any
   other new key — a registry whose keys were swapped — is refused.

What is checked (``verify_resolution``): the manifest's bytes hash to the sha256 the resolve
answer lists, its signature verifies with a trusted key, it names this artifact, every file
of the answer is in it with the same size and sha256 and nothing is missing, and its
compatibility key is the answer's. Bytes are then checked while they load or download: the
sha256 of every file (pull, the node cache) or the BLAKE3 chunk digests of the layout whose
sha256 the manifest signs (the load engine).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import sys
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tensor_registry.api.client import (
    RegistryClient,
    RegistryError,
    Resolution,
)
from tensor_registry.api.transfer import ResponseTooLarge, read_capped
from tensor_registry.formats import model_signature
from tensor_registry.formats.model_signature import IGNORED_PATHS, SignedModel
from tensor_registry.formats.paths import require_relative_path
from tensor_registry.formats.signed_manifest import (
    MANIFEST_FILE,
    MAX_MANIFEST_BYTES,
    SIGNATURE_FILE,
    VERSION_PREDICATE_TYPE,
    ManifestError,
    SignedManifest,
    ed25519_verify,
    endorsement_message,
    key_id,
    unb64,
    verify,
)

KEYS_ROUTE = "/.well-known/tensor-registry/keys"
PINS_FILE = "trusted-keys.json"
TRUSTED_KEYS_ENV = "TENSOR_REGISTRY_TRUSTED_KEYS"
REQUIRE_SIGNED_ENV = "TENSOR_REGISTRY_REQUIRE_SIGNED"
MAX_KEYS_DOCUMENT = 1 << 20


class TrustError(RegistryError):
    """A manifest or a file that fails verification; nothing was loaded or kept."""

    code = "untrusted_artifact"

    @classmethod
    def of(cls, exc: ManifestError) -> TrustError:
        return cls(exc.message, code=exc.code)


def config_dir() -> Path:
    configured = os.environ.get("TENSOR_REGISTRY_CONFIG_DIR")
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "tensor-registry"


def require_signed_default() -> bool:
    return os.environ.get(REQUIRE_SIGNED_ENV, "").strip().lower() in ("1", "true", "yes")


# ---------------------------------------------------------------------------------------------
# Keys


def keys_from_document(document: Any) -> dict[str, bytes]:
    """Key id → raw public key of a keys document (each id checked against its key)."""
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise TrustError("not a keys document (no `keys` list)", code="bad_keys")
    found: dict[str, bytes] = {}
    for entry in document["keys"]:
        if not isinstance(entry, dict):
            raise TrustError("a key entry is not an object", code="bad_keys")
        raw = _public(entry.get("public_key"))
        if entry.get("keyid") not in (None, key_id(raw)):
            raise TrustError("a key entry's keyid is not its key's sha256", code="bad_keys")
        found[key_id(raw)] = raw
    return found


def _public(text: Any) -> bytes:
    try:
        raw = unb64(text, "public key")
    except ManifestError as exc:
        raise TrustError.of(exc) from None
    if len(raw) != 32:
        raise TrustError("an Ed25519 public key is 32 bytes", code="bad_keys")
    return raw


def parse_trusted(values: Iterable[str]) -> dict[str, bytes]:
    """Keys given as base64 public keys or as paths of keys documents."""
    keys: dict[str, bytes] = {}
    for value in values:
        for item in (v.strip() for v in value.split(",")):
            if not item:
                continue
            path = Path(item).expanduser()
            if path.is_file():
                data = path.read_bytes()[:MAX_KEYS_DOCUMENT]
                if data.lstrip().startswith(b"-----BEGIN"):
                    continue  # a model-signing PEM (configured_model_signing_keys)
                keys.update(keys_from_document(json.loads(data)))
            else:
                raw = _public(item)
                keys[key_id(raw)] = raw
    return keys


def configured_keys(trusted_keys: Iterable[str] | None = None) -> dict[str, bytes] | None:
    values = list(trusted_keys or [])
    env = os.environ.get(TRUSTED_KEYS_ENV)
    if env:
        values.append(env)
    return parse_trusted(values) if values else None


def fetch_keys_document(client: RegistryClient) -> dict[str, Any]:
    # Read while streaming and refused past MAX_KEYS_DOCUMENT bytes (never whole first).
    try:
        response = read_capped(
            client.anonymous,
            "GET",
            client.url + KEYS_ROUTE,
            cap=MAX_KEYS_DOCUMENT,
            what="the registry's manifest keys",
            limits=client.limits,
        )
    except ResponseTooLarge:
        raise TrustError(
            "the registry's keys document is implausibly large", code="bad_keys"
        ) from None
    return dict(response.json())


class PinStore:
    """Per-registry pinned keys in the client config dir (mode 0600)."""

    def __init__(self, root: Path | None = None) -> None:
        self.path = (root or config_dir()) / PINS_FILE

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {"registries": {}}
        except ValueError:
            raise TrustError(f"{self.path} is not JSON", code="bad_keys") from None
        return data if isinstance(data, dict) else {"registries": {}}

    def get(self, registry: str) -> dict[str, bytes] | None:
        entry = self._read().get("registries", {}).get(registry.rstrip("/"))
        if not entry:
            return None
        return {kid: _public(b64) for kid, b64 in dict(entry.get("keys") or {}).items()}

    def put(self, registry: str, keys: Mapping[str, bytes]) -> None:
        data = self._read()
        entries = data.setdefault("registries", {})
        kept = dict(entries.get(registry.rstrip("/")) or {})
        kept["keys"] = {kid: base64.b64encode(raw).decode() for kid, raw in sorted(keys.items())}
        entries[registry.rstrip("/")] = kept
        self._write(data)

    def get_model_signing(self, registry: str) -> dict[str, bytes]:
        """The registry's pinned model-signing keys (key hint → public key PEM)."""
        entry = self._read().get("registries", {}).get(registry.rstrip("/")) or {}
        return {
            str(hint): str(pem).encode()
            for hint, pem in dict(entry.get("model_signing_keys") or {}).items()
        }

    def put_model_signing(self, registry: str, keys: Mapping[str, bytes]) -> None:
        data = self._read()
        entry = data.setdefault("registries", {}).setdefault(registry.rstrip("/"), {})
        entry["model_signing_keys"] = {h: pem.decode() for h, pem in sorted(keys.items())}
        self._write(data)

    def _write(self, data: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        staging = self.path.with_name(f".{PINS_FILE}.{uuid.uuid4().hex[:8]}")
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(data, fh, indent=1)
            os.replace(staging, self.path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                staging.unlink()


def endorsed_keys(document: Mapping[str, Any], pinned: Mapping[str, bytes]) -> dict[str, bytes]:
    """Keys of ``document`` that a pinned key endorsed (signed), plus the pinned ones."""
    accepted = dict(pinned)
    for entry in document.get("keys") or []:
        if not isinstance(entry, dict):
            continue
        raw = _public(entry.get("public_key"))
        kid = key_id(raw)
        if kid in accepted:
            continue
        for endorsement in entry.get("endorsements") or []:
            by = accepted.get(str(endorsement.get("keyid", "")).lower())
            if by is None:
                continue
            try:
                sig = unb64(endorsement.get("sig"), "endorsement")
            except ManifestError:
                continue
            if ed25519_verify(by, sig, endorsement_message(raw)):
                accepted[kid] = raw
                break
    return accepted


def trusted_keys(
    client: RegistryClient,
    *,
    trusted: Iterable[str] | None = None,
    want: str | None = None,
    pins: PinStore | None = None,
) -> dict[str, bytes]:
    """The keys to check ``client``'s manifests with; ``want`` is the key id a manifest names
    (a pin lacking it is refreshed through endorsements)."""
    configured = configured_keys(trusted)
    if configured is not None:
        return configured
    pins = pins or PinStore()
    pinned = pins.get(client.url)
    if pinned is None:
        pinned = keys_from_document(fetch_keys_document(client))
        pins.put(client.url, pinned)
        print(
            f"trusting the manifest keys of {client.url} from now on "
            f"({', '.join(k[:16] for k in sorted(pinned))}; pinned in {pins.path})",
            file=sys.stderr,
        )
        return pinned
    if want is not None and want not in pinned:
        grown = endorsed_keys(fetch_keys_document(client), pinned)
        if len(grown) > len(pinned):
            pins.put(client.url, grown)
        return grown
    return pinned


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
    values = list(trusted_keys or [])
    env = os.environ.get(TRUSTED_KEYS_ENV)
    if env:
        values.append(env)
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


# ---------------------------------------------------------------------------------------------
# Verification


def _envelope_key_id(data: bytes) -> str | None:
    with contextlib.suppress(ValueError, TypeError, KeyError, IndexError, AttributeError):
        return str(json.loads(data)["signatures"][0]["keyid"]).lower()
    return None


# Manifests already fetched, by sha256 (content-addressed, so a kept copy is as good as a
# fresh download); the signature and the bindings are still checked on every load.
_fetched: dict[str, bytes] = {}
_FETCHED_LIMIT = 64


def fetch_manifest(client: RegistryClient, resolution: Resolution) -> bytes | None:
    entry = next((f for f in resolution.files if f.path == MANIFEST_FILE), None)
    if entry is None:
        return None
    kept = _fetched.get(entry.sha256)
    if kept is not None:
        return kept
    if entry.size > MAX_MANIFEST_BYTES:
        raise TrustError(f"a manifest of {entry.size:,} bytes is implausible", code="bad_manifest")
    data = client.fetch_resolved_file(entry, "signed manifest")
    if len(_fetched) >= _FETCHED_LIMIT:
        _fetched.clear()
    _fetched[entry.sha256] = data
    return data


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


def verify_resolution(
    client: RegistryClient,
    resolution: Resolution,
    *,
    trusted: Iterable[str] | None = None,
    require: bool | None = None,
    pins: PinStore | None = None,
) -> SignedManifest | None:
    """Check a resolve answer against its signed manifest; None for an unsigned artifact,
    refused with ``unsigned_artifact`` when ``require`` (default: REQUIRE_SIGNED_ENV)."""
    data = fetch_manifest(client, resolution)
    if data is None:
        if require if require is not None else require_signed_default():
            raise TrustError(
                f"artifact {resolution.artifact_id} has no signed manifest (the registry "
                "predates manifests: backfill one), and signatures are required",
                code="unsigned_artifact",
            )
        return None
    keys = trusted_keys(client, trusted=trusted, want=_envelope_key_id(data), pins=pins)
    signed = check_manifest(
        data,
        keys,
        artifact_id=resolution.artifact_id,
        files=[(f.path, f.size, f.sha256) for f in resolution.files],
        compatibility_key=resolution.data.get("compatibility_key"),
        what="the resolve answer",
    )
    check_model_signature(client, resolution, keys, trusted=trusted, pins=pins)
    return signed


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
    data = _fetched.get(entry.sha256) or client.fetch_resolved_file(entry, SIGNATURE_FILE)
    _fetched[entry.sha256] = data
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
    keys = trusted_keys(client, trusted=trusted, want=_envelope_key_id(data), pins=pins)
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


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def verify_directory(
    directory: Path,
    keys: Mapping[str, bytes],
    *,
    artifact_id: str | None = None,
    allow_missing: Iterable[str] = (),
    hash_weights: bool = True,
    model_keys: Mapping[str, bytes] | None = None,
) -> SignedManifest:
    """Offline: ``directory``'s ``manifest.sig.json`` verifies with ``keys``, every signed
    file in it has the signed size and sha256 (files in ``allow_missing`` may be absent), and
    it holds no other file (what the client writes beside them, ``IGNORED_PATHS``, aside).
    Its ``model.sig``, when present and ``model_keys`` (hint → P-256 PEM) are given, verifies
    with one of them over exactly those files and the manifest.
    ``hash_weights=False`` checks weights by size only: for a caller that verifies their
    chunks against the signed layout while loading (one pass over the bytes, not two)."""
    path = directory / MANIFEST_FILE
    if not path.is_file():
        raise TrustError(f"{directory} has no {MANIFEST_FILE}", code="unsigned_artifact")
    data = path.read_bytes()
    try:
        signed = verify(data, keys)
    except ManifestError as exc:
        raise TrustError.of(exc) from None
    if artifact_id is not None and signed.artifact_id != artifact_id:
        raise TrustError(
            f"the signed manifest is for artifact {signed.artifact_id}, not {artifact_id}",
            code="manifest_mismatch",
        )
    skipped = set(allow_missing)
    present: list[tuple[str, int, str]] = []
    for name, entry in signed.files.items():
        local = directory / require_relative_path(name, what="a file path in the signed manifest")
        if not local.is_file():
            if name in skipped:
                present.append((name, entry.size, entry.sha256))
                continue
            raise TrustError(f"{local} is missing", code="manifest_mismatch")
        size = local.stat().st_size
        if size != entry.size:
            digest = "0" * 64
        elif not hash_weights and name.endswith(".tensors"):
            digest = entry.sha256
        else:
            digest = sha256_file(local)
        present.append((name, size, digest))
    try:
        signed.check_files(present, what=str(directory))
        known = {*signed.files, MANIFEST_FILE}
        added = [
            p for p in model_signature.directory_files(directory, IGNORED_PATHS) if p not in known
        ]
        if added:
            raise ManifestError(
                "manifest_mismatch",
                f"{directory} has {', '.join(added)}, which no signature of the artifact covers",
            )
        oms = directory / SIGNATURE_FILE
        if model_keys and oms.is_file():
            digests = {name: sha for name, _, sha in present}
            digests[MANIFEST_FILE] = hashlib.sha256(data).hexdigest()
            with oms.open("rb") as fh:
                bundle = fh.read(model_signature.MAX_SIGNATURE_BYTES + 1)
            model_signature.verify(bundle, model_keys).check_files(digests, what=str(directory))
    except ManifestError as exc:
        raise TrustError.of(exc) from None
    return signed
