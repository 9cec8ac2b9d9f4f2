"""Which keys a node checks manifests with: configured ones, else the registry's, pinned on
first use and rotated only by endorsement (the module docstring of tensor_registry.trust)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from tensor_registry.api.client import RegistryClient
from tensor_registry.formats.signed_manifest import key_id
from tensor_registry.trust.clock import Clock
from tensor_registry.trust.errors import TrustError
from tensor_registry.trust.keys_document import (
    MAX_KEYS_DOCUMENT,
    UNTRUSTED_STATUSES,
    endorsed_keys,
    fetch_keys_document,
    keys_from_document,
    public_key,
    signed_statuses,
)
from tensor_registry.trust.node_settings import configured_values
from tensor_registry.trust.origins import remember_document
from tensor_registry.trust.pins import PinStore


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
                raw = public_key(item)
                keys[key_id(raw)] = raw
    return keys


def configured_keys(trusted_keys: Iterable[str] | None = None) -> dict[str, bytes] | None:
    values = configured_values(trusted_keys)
    return parse_trusted(values) if values else None


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
    remember_document(client, document)
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
            key_id(public_key(e["public_key"]))
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
    pinned = {kid: public_key(b64) for kid, b64 in dict(entry.get("keys") or {}).items()}
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
