"""The registry's keys document (``GET /.well-known/tensor-registry/keys``): its shape, its
keys, fetching it bounded, the keys a pinned key endorsed and the statuses it signs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tensor_registry.api.client import RegistryClient
from tensor_registry.api.transfer import ResponseTooLarge, read_capped
from tensor_registry.formats.signed_manifest import (
    KEYS_PREDICATE_TYPE,
    ManifestError,
    ed25519_verify,
    endorsement_message,
    key_id,
    unb64,
    verify,
)
from tensor_registry.trust.clock import CLOCK_SKEW_SECONDS, signed_time
from tensor_registry.trust.errors import TrustError

KEYS_ROUTE = "/.well-known/tensor-registry/keys"
MAX_KEYS_DOCUMENT = 1 << 20
# The keys document may come from a cache for its max-age (300 s) plus the skew.
KEYS_DOCUMENT_MAX_AGE = 300 + CLOCK_SKEW_SECONDS
# A key published with one of these statuses stops being trusted on the node for good.
UNTRUSTED_STATUSES = frozenset({"retired", "revoked"})


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
        raw = public_key(entry.get("public_key"))
        if entry.get("keyid") not in (None, key_id(raw)):
            raise TrustError("a key entry's keyid is not its key's sha256", code="bad_keys")
        if entry.get("status") in UNTRUSTED_STATUSES:
            continue
        found[key_id(raw)] = raw
    return found


def public_key(text: Any) -> bytes:
    try:
        raw = unb64(text, "public key")
    except ManifestError as exc:
        raise TrustError(exc.message, code="bad_keys") from None
    if len(raw) != 32:
        raise TrustError("an Ed25519 public key is 32 bytes", code="bad_keys")
    return raw


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


def endorsed_keys(
    document: Mapping[str, Any], pinned: Mapping[str, bytes], revoked: Iterable[str] = ()
) -> dict[str, bytes]:
    """Keys of ``document`` that a pinned key endorsed (signed), plus the pinned ones; a key
    in ``revoked`` is never accepted again."""
    check_keys_document(document)
    barred = set(revoked)
    accepted = {kid: raw for kid, raw in pinned.items() if kid not in barred}
    for entry in document["keys"]:
        raw = public_key(entry.get("public_key"))
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
    issued = signed_time(predicate.get("issued_at"), "the keys document's issued_at")
    if issued < now - KEYS_DOCUMENT_MAX_AGE:
        raise TrustError(
            f"the registry's signed keys document was issued at {predicate.get('issued_at')}, "
            f"more than {KEYS_DOCUMENT_MAX_AGE} s ago: a replayed document (or a clock off "
            "by more than that)",
            code="keys_document_stale",
        )
    return predicate
