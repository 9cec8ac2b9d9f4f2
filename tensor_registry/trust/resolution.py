"""A resolve answer checked end to end before anything loads: manifest, answer, request,
binding and ``model.sig``; unsigned answers refused once keys are pinned or configured; every
URL in it on the registry's own origin or a blob host its signed keys document names."""

from __future__ import annotations

import time
from collections.abc import Iterable

from tensor_registry.api.client import RegistryClient
from tensor_registry.api.resolution import Resolution
from tensor_registry.formats.signed_manifest import SignedManifest
from tensor_registry.trust.binding import check_answer, check_binding, check_request
from tensor_registry.trust.clock import Clock
from tensor_registry.trust.errors import TrustError
from tensor_registry.trust.manifest import check_manifest, fetch_manifest
from tensor_registry.trust.manifest_keys import configured_keys, trusted_keys
from tensor_registry.trust.model_signing import check_model_signature
from tensor_registry.trust.node_settings import allow_unsigned_default, require_signed_default
from tensor_registry.trust.origins import check_answer_origins
from tensor_registry.trust.pins import PinStore
from tensor_registry.trust.seen_aliases import SeenAliases


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
        check_answer_origins(resolution, client, None, now=clock())
        return None
    keys = trusted_keys(client, trusted=trusted, pins=pins, now=clock)
    check_answer_origins(resolution, client, keys, now=clock())
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
