"""Verifying what a node loads against the registry's signed manifest (docs/trust.md).

Which keys are trusted, in order:

1. configured: ``TENSOR_REGISTRY_TRUSTED_KEYS`` (comma-separated base64 Ed25519 public keys, or
   paths of a keys document as ``GET /.well-known/tensor-registry/keys`` serves it), or the
   ``trusted_keys`` argument (CLI ``--trusted-key``). When given, nothing else is trusted and
   no key is fetched: the air-gapped and the strict setup.
2. else pinned on first use: the first time a registry is seen its published keys are pinned
   under its ``registry_id`` (its stable identity, whatever URL or port it answers on) in
   ``config_dir()/trusted-keys.json`` (tensor_registry/config.py). Later a key the pin lacks
   is accepted only when the registry publishes it endorsed (signed) by a key already pinned:
   a rotation the registry's operator made with the old key in hand. Any other new key — a
   registry whose keys were swapped — is refused. A key the registry marks retired or revoked
   in its keys document, signed by a trusted key, is dropped for good.

What is checked (``verify_resolution``): the manifest's bytes hash to the sha256 the resolve
answer lists, its signature verifies with a trusted key, it names this artifact, every file
of the answer is in it with the same size and sha256 and nothing is missing, and its
compatibility key is the answer's; and (issue 26) that it is what the node asked for: the
model, the version of a number ref, the variant filters (``check_request``), the answer's
description of the artifact is the signed one (``check_answer``), and the ref's signed
``binding`` is fresh and does not roll an alias back (``check_binding``, ``SeenAliases``). An
answer without a manifest is refused once keys are pinned or configured (fail closed).
Bytes are then checked while they load or download: the
sha256 of every file (pull, the node cache) or the BLAKE3 chunk digests of the layout whose
sha256 the manifest signs (the load engine).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from tensor_registry.api.client import (
    RegistryClient,
    RegistryError,
    Resolution,
)
from tensor_registry.api.transfer import ResponseTooLarge, read_capped
from tensor_registry.config import config_dir, write_private
from tensor_registry.formats import model_signature
from tensor_registry.formats.digests import sha256_file
from tensor_registry.formats.model_signature import IGNORED_PATHS, SignedModel
from tensor_registry.formats.paths import require_relative_path
from tensor_registry.formats.signed_manifest import (
    BINDING_PREDICATE_TYPE,
    KEYS_PREDICATE_TYPE,
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
SEEN_FILE = "seen-aliases.json"
TRUSTED_KEYS_ENV = "TENSOR_REGISTRY_TRUSTED_KEYS"
REQUIRE_SIGNED_ENV = "TENSOR_REGISTRY_REQUIRE_SIGNED"
ALLOW_UNSIGNED_ENV = "TENSOR_REGISTRY_ALLOW_UNSIGNED"
MAX_KEYS_DOCUMENT = 1 << 20
# How far the node's clock may be from the registry's when a binding's issued_at/expires_at
# or the keys document's issued_at are checked (docs/trust.md).
CLOCK_SKEW_SECONDS = 120
# The keys document may come from a cache for its max-age (300 s) plus the skew.
KEYS_DOCUMENT_MAX_AGE = 300 + CLOCK_SKEW_SECONDS
# A key published with one of these statuses stops being trusted on the node for good.
UNTRUSTED_STATUSES = frozenset({"retired", "revoked"})

Clock = Callable[[], float]


class TrustError(RegistryError):
    """A manifest or a file that fails verification; nothing was loaded or kept."""

    code = "untrusted_artifact"

    @classmethod
    def of(cls, exc: ManifestError) -> TrustError:
        return cls(exc.message, code=exc.code)


def require_signed_default() -> bool:
    return os.environ.get(REQUIRE_SIGNED_ENV, "").strip().lower() in ("1", "true", "yes")


def allow_unsigned_default() -> bool:
    return os.environ.get(ALLOW_UNSIGNED_ENV, "").strip().lower() in ("1", "true", "yes")


# ---------------------------------------------------------------------------------------------
# Keys


def check_keys_document(document: Any) -> dict[str, Any]:
    """``document``'s shape, checked before anything is read from it: a clear ``bad_keys``
    error for a malformed document (a lying registry or proxy), never a traceback."""
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise TrustError("not a keys document (no `keys` list)", code="bad_keys")
    if len(document["keys"]) > 64:
        raise TrustError("the keys document lists more than 64 keys", code="bad_keys")
    for n, entry in enumerate(document["keys"]):
        if not isinstance(entry, dict):
            raise TrustError(f"keys[{n}] is not an object", code="bad_keys")
        if not isinstance(entry.get("public_key"), str):
            raise TrustError(f"keys[{n}].public_key is not a string", code="bad_keys")
        if not isinstance(entry.get("status", ""), str):
            raise TrustError(f"keys[{n}].status is not a string", code="bad_keys")
        endorsements = entry.get("endorsements", [])
        if not isinstance(endorsements, list) or len(endorsements) > 64:
            raise TrustError(f"keys[{n}].endorsements is not a list", code="bad_keys")
        for m, endorsement in enumerate(endorsements):
            if not (
                isinstance(endorsement, dict)
                and isinstance(endorsement.get("keyid"), str)
                and isinstance(endorsement.get("sig"), str)
            ):
                raise TrustError(
                    f"keys[{n}].endorsements[{m}] is not an object with a keyid and a sig",
                    code="bad_keys",
                )
    for field in ("registry_id", "signed", "active"):
        if document.get(field) is not None and not isinstance(document[field], str):
            raise TrustError(f"the keys document's {field} is not a string", code="bad_keys")
    if len(document.get("registry_id") or "") > 128:
        raise TrustError("the keys document's registry_id is implausibly long", code="bad_keys")
    return document


def keys_from_document(document: Any) -> dict[str, bytes]:
    """Key id → raw public key of a keys document (each id checked against its key); keys it
    marks retired or revoked are left out."""
    check_keys_document(document)
    found: dict[str, bytes] = {}
    for entry in document["keys"]:
        raw = _public(entry.get("public_key"))
        if entry.get("keyid") not in (None, key_id(raw)):
            raise TrustError("a key entry's keyid is not its key's sha256", code="bad_keys")
        if entry.get("status") in UNTRUSTED_STATUSES:
            continue
        found[key_id(raw)] = raw
    return found


def _public(text: Any) -> bytes:
    try:
        raw = unb64(text, "public key")
    except ManifestError as exc:
        raise TrustError(exc.message, code="bad_keys") from None
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
                try:
                    document = json.loads(data)
                except ValueError:
                    raise TrustError(
                        f"{path} is not a JSON keys document", code="bad_keys"
                    ) from None
                keys.update(keys_from_document(document))
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
    try:
        document = response.json()
    except ValueError:
        raise TrustError("the registry's keys document is not JSON", code="bad_keys") from None
    return check_keys_document(document)


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, (json.dumps(data, indent=1) + "\n").encode())


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {"registries": {}}
    except ValueError:
        raise TrustError(f"{path} is not JSON", code="bad_keys") from None
    if not isinstance(data, dict) or not isinstance(data.get("registries"), dict):
        return {"registries": {}}
    return data


class PinStore:
    """Pinned keys per registry identity, in ``config_dir()/trusted-keys.json`` (mode 0600):
    ``{"registries": {ID: {"keys": {keyid: base64}, "urls": [...], "revoked": [keyid]}}}``.

    ID is the ``registry_id`` the registry publishes with its keys (its stable identity, not
    its URL or port); the URLs it was reached at find it. Entries written before identities
    existed are keyed by URL and still read.
    """

    def __init__(self, root: Path | None = None) -> None:
        self.path = (root or config_dir()) / PINS_FILE

    def _read(self) -> dict[str, Any]:
        return _read_json(self.path)

    def find(self, registry: str) -> tuple[str, dict[str, Any]] | None:
        """The entry of a registry id or of a URL it was reached at: (its key, the entry)."""
        entries = self._read()["registries"]
        url = registry.rstrip("/")
        if isinstance(entries.get(url), dict):
            return url, entries[url]
        for ident, entry in entries.items():
            if isinstance(entry, dict) and url in (entry.get("urls") or []):
                return ident, entry
        return None

    def get(self, registry: str) -> dict[str, bytes] | None:
        found = self.find(registry)
        if found is None:
            return None
        return {kid: _public(b64) for kid, b64 in dict(found[1].get("keys") or {}).items()}

    def forget(self, registry: str) -> None:
        data = self._read()
        if data["registries"].pop(registry.rstrip("/"), None) is not None:
            _write_json(self.path, data)

    def holding(self, kid: str) -> dict[str, bytes] | None:
        """The pinned keys of the registry whose pins hold key ``kid`` (offline checks)."""
        for entry in self._read()["registries"].values():
            if isinstance(entry, dict) and kid in (entry.get("keys") or {}):
                return {k: _public(b64) for k, b64 in dict(entry["keys"]).items()}
        return None

    def put(
        self,
        registry: str,
        keys: Mapping[str, bytes],
        *,
        url: str | None = None,
        revoked: Iterable[str] = (),
        replace: bool = False,
    ) -> None:
        """Pin ``keys`` for ``registry`` (its id), reached at ``url``; ``replace`` (`trust
        --replace`, after an out-of-band check) also forgets the keys it had revoked."""
        data = self._read()
        registries = data["registries"]
        old = registries.get(registry.rstrip("/")) or {}
        if replace:
            old = {"urls": old.get("urls") or []}
        urls = set(old.get("urls") or [])
        if url is not None and url.rstrip("/") != registry.rstrip("/"):
            urls.add(url.rstrip("/"))
            for ident, entry in list(registries.items()):  # one registry per URL
                if ident != registry and isinstance(entry, dict):
                    entry["urls"] = [u for u in entry.get("urls") or [] if u != url.rstrip("/")]
        registries[registry.rstrip("/")] = {
            "keys": {kid: base64.b64encode(raw).decode() for kid, raw in sorted(keys.items())},
            "urls": sorted(urls),
            "revoked": sorted(set(old.get("revoked") or []) | set(revoked)),
            # The model-signing keys the manifest keys endorsed (model.sig), kept beside them.
            **{k: v for k, v in old.items() if k == "model_signing_keys"},
        }
        _write_json(self.path, data)

    def get_model_signing(self, registry: str) -> dict[str, bytes]:
        """The registry's pinned model-signing keys (key hint → public key PEM), found by its
        identity or a URL it was reached at, like its manifest keys."""
        found = self.find(registry)
        entry = found[1] if found is not None else {}
        return {
            str(hint): str(pem).encode()
            for hint, pem in dict(entry.get("model_signing_keys") or {}).items()
        }

    def put_model_signing(self, registry: str, keys: Mapping[str, bytes]) -> None:
        data = self._read()
        found = self.find(registry)
        ident = found[0] if found is not None else registry.rstrip("/")
        entry = data["registries"].setdefault(ident, {})
        entry["model_signing_keys"] = {h: pem.decode() for h, pem in sorted(keys.items())}
        _write_json(self.path, data)


def endorsed_keys(
    document: Mapping[str, Any], pinned: Mapping[str, bytes], revoked: Iterable[str] = ()
) -> dict[str, bytes]:
    """Keys of ``document`` that a pinned key endorsed (signed), plus the pinned ones; a key
    in ``revoked`` is never accepted again."""
    check_keys_document(document)
    barred = set(revoked)
    accepted = {kid: raw for kid, raw in pinned.items() if kid not in barred}
    for entry in document["keys"]:
        raw = _public(entry.get("public_key"))
        kid = key_id(raw)
        if kid in accepted or kid in barred or entry.get("status") in UNTRUSTED_STATUSES:
            continue
        for endorsement in entry.get("endorsements") or []:
            by = accepted.get(endorsement["keyid"].lower())
            if by is None:
                continue
            try:
                sig = unb64(endorsement["sig"], "endorsement")
            except ManifestError:
                continue
            if ed25519_verify(by, sig, endorsement_message(raw)):
                accepted[kid] = raw
                break
    return accepted


def _timestamp(text: Any, what: str) -> float:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise TrustError(f"{what} is not a time: {text!r}", code="bad_manifest") from None


def signed_statuses(
    document: Mapping[str, Any], keys: Mapping[str, bytes], *, now: float
) -> dict[str, Any] | None:
    """The keys document's signed copy (``signed``) checked with ``keys``: its predicate
    ({registry_id, active, keys [{keyid, status}], issued_at}), or None when no key of
    ``keys`` signed it (a registry whose key was swapped: nothing is learnt from it)."""
    signed = document.get("signed")
    if signed is None:
        return None
    try:
        statement = verify(signed.encode(), keys, predicate_type=KEYS_PREDICATE_TYPE)
    except ManifestError as exc:
        if exc.code == "untrusted_signing_key":
            return None
        raise TrustError(
            f"the registry's signed keys document: {exc.message}", code=exc.code
        ) from None
    predicate = statement.predicate
    listed = predicate.get("keys")
    if not isinstance(listed, list) or not all(
        isinstance(k, dict) and isinstance(k.get("keyid"), str) for k in listed
    ):
        raise TrustError("the signed keys document's key list is malformed", code="bad_keys")
    issued = _timestamp(predicate.get("issued_at"), "the keys document's issued_at")
    if issued < now - KEYS_DOCUMENT_MAX_AGE:
        raise TrustError(
            f"the registry's signed keys document was issued at {predicate.get('issued_at')}, "
            f"more than {KEYS_DOCUMENT_MAX_AGE} s ago: a replayed document (or a clock off "
            "by more than that)",
            code="keys_document_stale",
        )
    return predicate


def trusted_keys(
    client: RegistryClient,
    *,
    trusted: Iterable[str] | None = None,
    want: str | None = None,
    pins: PinStore | None = None,
    now: Clock | None = None,
) -> dict[str, bytes]:
    """The keys to check ``client``'s manifests with. Configured keys (``trusted`` or
    TRUSTED_KEYS_ENV) are all there is. Else the registry's keys document is fetched each
    time: the first time its keys are pinned under its ``registry_id``; later a new key is
    accepted when a pinned key endorsed it, and a key the document (signed by a trusted key)
    marks retired or revoked is dropped from the pins for good. ``want`` is unused (kept for
    callers)."""
    del want
    configured = configured_keys(trusted)
    if configured is not None:
        return configured
    pins = pins or PinStore()
    clock = now or time.time
    document = fetch_keys_document(client)
    ident = document.get("registry_id") or client.url
    found = pins.find(client.url) or pins.find(ident)
    if found is None:
        pinned = keys_from_document(document)
        statuses = signed_statuses(document, pinned, now=clock())
        if statuses is not None and statuses.get("registry_id") not in (None, ident):
            raise TrustError(
                "the keys document's signed registry_id is not the one it shows",
                code="bad_keys",
            )
        revoked = {
            key_id(_public(e["public_key"]))
            for e in document["keys"]
            if e.get("status") in UNTRUSTED_STATUSES
        }
        pins.put(ident, pinned, url=client.url, revoked=revoked)
        print(
            f"trusting the manifest keys of registry {ident} at {client.url} from now on "
            f"({', '.join(k[:16] for k in sorted(pinned))}; pinned in {pins.path})",
            file=sys.stderr,
        )
        return pinned
    pinned_as, entry = found
    pinned = {kid: _public(b64) for kid, b64 in dict(entry.get("keys") or {}).items()}
    revoked = set(entry.get("revoked") or [])
    accepted = endorsed_keys(document, pinned, revoked)
    statuses = signed_statuses(document, accepted, now=clock())
    if statuses is None and "signed" not in document and pinned_as != client.url.rstrip("/"):
        raise TrustError(
            f"the registry at {client.url} served its keys document without the signature it "
            "carried when its keys were pinned",
            code="bad_keys",
        )
    if statuses is not None:
        for listed in statuses["keys"]:
            if listed.get("status") in UNTRUSTED_STATUSES:
                revoked.add(listed["keyid"].lower())
    accepted = {kid: raw for kid, raw in accepted.items() if kid not in revoked}
    if (
        accepted != pinned
        or revoked != set(entry.get("revoked") or [])
        or client.url.rstrip("/") not in (entry.get("urls") or [pinned_as])
    ):
        pins.put(pinned_as, accepted, url=client.url, revoked=revoked)
    return accepted


class SeenAliases:
    """The newest move of each alias a node has been shown, per registry identity, in
    ``config_dir()/seen-aliases.json`` (mode 0600): ``{"registries": {ID: {"NS/NAME:ALIAS":
    {"moved_at", "revision", "version", "artifact"}}}}``. A signed binding whose alias move
    is older than the one recorded is a rollback (docs/trust.md)."""

    MAX_PER_REGISTRY = 10_000

    def __init__(self, root: Path | None = None) -> None:
        self.path = (root or config_dir()) / SEEN_FILE

    def check_and_record(
        self, registry_id: str, model: str, alias: Mapping[str, Any], *, version: int, artifact: str
    ) -> None:
        moved_at = _timestamp(alias.get("moved_at"), "the alias's moved_at")
        revision = alias.get("revision")
        if not isinstance(revision, int):
            raise TrustError(
                "the signed binding's alias revision is not a number", code="bad_binding"
            )
        data = _read_json(self.path)
        seen = data["registries"].setdefault(registry_id, {})
        name = f"{model}:{alias.get('name')}"
        before = seen.get(name)
        if isinstance(before, dict):
            older = (moved_at, revision) < (
                _timestamp(before.get("moved_at"), "a recorded moved_at"),
                int(before.get("revision") or 0),
            )
            if older:
                raise TrustError(
                    f"alias rollback: {name} now points at version {version} (alias moved "
                    f"{alias.get('moved_at')}, revision {revision}), but this node already saw "
                    f"it move later, to version {before.get('version')} ({before.get('moved_at')}, "
                    f"revision {before.get('revision')}); an old answer was replayed. "
                    f"If the registry was restored on purpose, remove the entry from {self.path}",
                    code="alias_rollback",
                )
            if (moved_at, revision) == (
                _timestamp(before.get("moved_at"), "a recorded moved_at"),
                int(before.get("revision") or 0),
            ):
                return
        if len(seen) >= self.MAX_PER_REGISTRY and name not in seen:
            seen.pop(next(iter(seen)))
        seen[name] = {
            "moved_at": alias.get("moved_at"),
            "revision": revision,
            "version": version,
            "artifact": artifact,
        }
        _write_json(self.path, data)


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


def _asked(resolution: Resolution) -> tuple[str | None, str, dict[str, Any]]:
    """What the node asked for (the request's own parameters, never the answer): the model,
    the ref and the variant filters given."""
    params = resolution.params
    filters: dict[str, Any] = {}
    for name in ("dtype", "format"):
        if params.get(name) is not None:
            filters[name] = str(params[name])
    if params.get("tensor_parallel_size") is not None:
        filters["tensor_parallel_size"] = int(params["tensor_parallel_size"])
    if params.get("encrypted") is not None:
        filters["encrypted"] = str(params["encrypted"]).lower() in ("true", "1")
    if params.get("artifact_id") is not None:
        filters["id"] = str(params["artifact_id"])
    model = params.get("model")
    return (str(model) if model is not None else None), str(params.get("ref", "latest")), filters


def check_answer(signed: SignedManifest, resolution: Resolution) -> None:
    """The answer's unsigned description of the artifact (model, version, dtype, format, TP
    size, encryption) is the signed one, so whatever a caller derives from the answer (the
    `vllm serve` command, the plugin's config) is derived from signed facts."""
    artifact, answer = signed.artifact, resolution.data.get("artifact") or {}
    pairs = {
        "model": (resolution.data.get("model"), artifact.get("model")),
        "version": (resolution.data.get("version"), artifact.get("version")),
        "dtype": (answer.get("dtype"), artifact.get("dtype")),
        "format": (answer.get("format"), artifact.get("format")),
        "tensor_parallel_size": (
            answer.get("tensor_parallel_size"),
            artifact.get("tensor_parallel_size"),
        ),
        "encrypted": (
            bool((answer.get("encryption") or {}).get("enabled")),
            bool((artifact.get("encryption") or {}).get("enabled")),
        ),
    }
    for name, (got, want) in pairs.items():
        if got != want:
            raise TrustError(
                f"the resolve answer says {name} {got!r}; the signed manifest says {want!r}",
                code="manifest_mismatch",
            )


def check_request(signed: SignedManifest, resolution: Resolution) -> None:
    """The signed manifest is what the node asked for: the model, the version a number ref
    names and every variant filter given. An intercepting proxy that answers with another
    namespace's validly signed artifact, or an older version's, is refused here."""
    model, ref, filters = _asked(resolution)
    artifact = signed.artifact
    if model is not None and artifact.get("model") != model:
        raise TrustError(
            f"the signed manifest is for model {artifact.get('model')!r}, but {model!r} was "
            "asked for: the answer is another model's artifact",
            code="ref_mismatch",
        )
    if ref.isdigit() and artifact.get("version") != int(ref):
        raise TrustError(
            f"the signed manifest is for version {artifact.get('version')} of {model}, but "
            f"version {ref} was asked for",
            code="ref_mismatch",
        )
    signed_variant = {
        "id": signed.artifact_id,
        "dtype": artifact.get("dtype"),
        "format": artifact.get("format"),
        "tensor_parallel_size": artifact.get("tensor_parallel_size"),
        "encrypted": bool((artifact.get("encryption") or {}).get("enabled")),
    }
    for name, value in filters.items():
        if signed_variant[name] != value:
            raise TrustError(
                f"the signed manifest's {name} is {signed_variant[name]!r}, but {value!r} was "
                "asked for",
                code="ref_mismatch",
            )


def check_binding(
    resolution: Resolution,
    signed: SignedManifest,
    manifest: bytes,
    keys: Mapping[str, bytes],
    *,
    now: float,
    seen: SeenAliases | None = None,
) -> dict[str, Any] | None:
    """The answer's signed ``binding``: what the ref resolved to, signed for a short while.
    Required for an alias or ``latest`` (a number is bound by the manifest itself); checked
    whenever present: it names the model, ref, version and artifact asked for and signed, its
    subject is this manifest, it has not expired (CLOCK_SKEW_SECONDS allowed either way), and
    an alias's move is not older than one this node saw (SeenAliases). Returns its predicate."""
    model, ref, _ = _asked(resolution)
    text = resolution.data.get("binding")
    if text is None:
        if ref.isdigit():
            return None
        raise TrustError(
            f"the answer for {model}:{ref} carries no signed binding of the ref to its "
            "artifact (a proxy stripped it, or the registry predates bindings)",
            code="unsigned_binding",
        )
    if not isinstance(text, str):
        raise TrustError("the answer's binding is not a string", code="bad_binding")
    try:
        bound = verify(text.encode(), keys, predicate_type=BINDING_PREDICATE_TYPE)
    except ManifestError as exc:
        if ref.isdigit() and exc.code == "untrusted_signing_key":
            # A number is bound by the manifest; the registry's active key, which signs
            # bindings, need not be among keys configured for older artifacts.
            return None
        raise TrustError(f"the answer's signed binding: {exc.message}", code=exc.code) from None
    predicate = bound.predicate
    subject = {f.path: f.sha256 for f in bound.files.values()}
    expected = {
        "model": (predicate.get("model"), model),
        "ref": (predicate.get("ref"), ref),
        "version": (predicate.get("version"), signed.artifact.get("version")),
        "artifact": ((predicate.get("artifact") or {}).get("id"), signed.artifact_id),
        "manifest": (subject.get(MANIFEST_FILE), hashlib.sha256(manifest).hexdigest()),
    }
    if signed.predicate.get("registry_id") is not None:
        expected["registry"] = (predicate.get("registry_id"), signed.predicate["registry_id"])
    for what, (got, want) in expected.items():
        if got != want:
            raise TrustError(
                f"the signed binding's {what} is {got!r}, not {want!r}: the answer binds "
                "another request or artifact",
                code="ref_mismatch",
            )
    expires = _timestamp(predicate.get("expires_at"), "the binding's expires_at")
    issued = _timestamp(predicate.get("issued_at"), "the binding's issued_at")
    if now > expires + CLOCK_SKEW_SECONDS:
        raise TrustError(
            f"the signed binding of {model}:{ref} expired at {predicate.get('expires_at')} "
            f"(more than {CLOCK_SKEW_SECONDS} s ago by this node's clock): a replayed answer",
            code="binding_expired",
        )
    if issued > now + CLOCK_SKEW_SECONDS:
        raise TrustError(
            f"the signed binding of {model}:{ref} was issued at {predicate.get('issued_at')}, "
            f"more than {CLOCK_SKEW_SECONDS} s in this node's future: fix the clock",
            code="binding_not_yet_valid",
        )
    alias = predicate.get("alias")
    if not ref.isdigit() and ref != "latest":
        if not isinstance(alias, dict) or alias.get("name") != ref:
            raise TrustError(
                f"the signed binding of {model}:{ref} does not name the alias's move",
                code="bad_binding",
            )
        (seen or SeenAliases()).check_and_record(
            str(predicate.get("registry_id") or predicate.get("registry")),
            str(predicate.get("model")),
            alias,
            version=int(predicate["version"]),
            artifact=signed.artifact_id,
        )
    return predicate


def verify_resolution(
    client: RegistryClient,
    resolution: Resolution,
    *,
    trusted: Iterable[str] | None = None,
    require: bool | None = None,
    pins: PinStore | None = None,
    seen: SeenAliases | None = None,
    now: Clock | None = None,
) -> SignedManifest | None:
    """Check a resolve answer against its signed manifest and what was asked for
    (``check_request``, ``check_binding``); None for an unsigned artifact.

    An answer without a manifest is refused (``unsigned_artifact``) when signatures are
    required: ``require=True`` or REQUIRE_SIGNED_ENV, and by default (fail closed) as soon as
    keys are configured or this registry's keys are pinned on the node. ``require=False``
    (CLI ``--allow-unsigned``, ALLOW_UNSIGNED_ENV) is the explicit opt-out."""
    clock = now or time.time
    data = fetch_manifest(client, resolution)
    if data is None:
        if require is None:
            require = require_signed_default() or (
                not allow_unsigned_default()
                and (
                    configured_keys(trusted) is not None
                    or (pins or PinStore()).find(client.url) is not None
                )
            )
        if require:
            raise TrustError(
                f"artifact {resolution.artifact_id} comes without a signed manifest, and "
                "signatures are required (this registry's keys are pinned here, or trusted "
                "keys are configured); an artifact published before manifests needs a "
                "backfill; --allow-unsigned (TENSOR_REGISTRY_ALLOW_UNSIGNED=1) accepts it",
                code="unsigned_artifact",
            )
        return None
    keys = trusted_keys(client, trusted=trusted, pins=pins, now=clock)
    signed = check_manifest(
        data,
        keys,
        artifact_id=resolution.artifact_id,
        files=[(f.path, f.size, f.sha256) for f in resolution.files],
        compatibility_key=resolution.data.get("compatibility_key"),
        what="the resolve answer",
    )
    check_answer(signed, resolution)
    check_request(signed, resolution)
    check_binding(resolution, signed, data, keys, now=clock(), seen=seen)
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
