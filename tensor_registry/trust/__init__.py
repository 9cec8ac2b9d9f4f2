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

One module per concern: ``errors`` (TrustError), ``clock`` (skew, signed times),
``node_settings`` (the environment), ``keys_document`` (the registry's keys document),
``state_files`` (the node's 0600 JSON state), ``pins`` (PinStore), ``manifest_keys`` (which
keys: configured or pinned on first use), ``seen_aliases`` (rollback state), ``manifest``
(fetching and checking a signed manifest), ``binding`` (the request and the ref's binding),
``model_signing`` (model.sig), ``resolution`` (``verify_resolution``), ``directory``
(``verify_directory``, offline). This package exports what callers use.
"""

from __future__ import annotations

from tensor_registry.trust.binding import check_answer, check_binding, check_request
from tensor_registry.trust.clock import CLOCK_SKEW_SECONDS, Clock
from tensor_registry.trust.directory import verify_directory
from tensor_registry.trust.errors import TrustError
from tensor_registry.trust.keys_document import (
    KEYS_DOCUMENT_MAX_AGE,
    KEYS_ROUTE,
    MAX_KEYS_DOCUMENT,
    UNTRUSTED_STATUSES,
    check_keys_document,
    endorsed_keys,
    fetch_keys_document,
    keys_from_document,
    signed_statuses,
)
from tensor_registry.trust.manifest import check_manifest, fetch_manifest, verify_version_manifest
from tensor_registry.trust.manifest_keys import configured_keys, parse_trusted, trusted_keys
from tensor_registry.trust.model_signing import (
    check_model_signature,
    configured_model_signing_keys,
    model_signing_keys,
    model_signing_keys_from_document,
)
from tensor_registry.trust.node_settings import (
    ALLOW_UNSIGNED_ENV,
    REQUIRE_SIGNED_ENV,
    TRUSTED_KEYS_ENV,
    allow_unsigned_default,
    require_signed_default,
)
from tensor_registry.trust.pins import PINS_FILE, PinStore
from tensor_registry.trust.resolution import verify_resolution
from tensor_registry.trust.seen_aliases import SEEN_FILE, SeenAliases

__all__ = [
    "ALLOW_UNSIGNED_ENV",
    "CLOCK_SKEW_SECONDS",
    "KEYS_DOCUMENT_MAX_AGE",
    "KEYS_ROUTE",
    "MAX_KEYS_DOCUMENT",
    "PINS_FILE",
    "REQUIRE_SIGNED_ENV",
    "SEEN_FILE",
    "TRUSTED_KEYS_ENV",
    "UNTRUSTED_STATUSES",
    "Clock",
    "PinStore",
    "SeenAliases",
    "TrustError",
    "allow_unsigned_default",
    "check_answer",
    "check_binding",
    "check_keys_document",
    "check_manifest",
    "check_model_signature",
    "check_request",
    "configured_keys",
    "configured_model_signing_keys",
    "endorsed_keys",
    "fetch_keys_document",
    "fetch_manifest",
    "keys_from_document",
    "model_signing_keys",
    "model_signing_keys_from_document",
    "parse_trusted",
    "require_signed_default",
    "signed_statuses",
    "trusted_keys",
    "verify_directory",
    "verify_resolution",
    "verify_version_manifest",
]
